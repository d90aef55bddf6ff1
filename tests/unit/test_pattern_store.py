"""The pattern states of a partition over its bytes (pairing/pattern_store.py): a step
reads its own writes, and its writes reach the bytes once each, when it flushes."""

from __future__ import annotations

import pytest

from pairing import pattern_store
from pairing.pattern_state import KeyState, PatternEvent, decode
from pairing.pattern_store import EncodedPatternStore, MemoryBytes, state_key


def state(key: str, *times: int, field: str = "account") -> KeyState:
    events = tuple(PatternEvent(t, f"e{t}", {field: key}) for t in times)
    return KeyState(field, key, None, None, events, {}, {})


class CountingBytes(MemoryBytes):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.puts = 0

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        self.reads += 1
        return super().get(key, default)

    def put(self, key: bytes, value: bytes) -> None:
        self.puts += 1
        super().put(key, value)


def test_a_step_reads_its_writes_and_they_reach_the_bytes_once_each_at_its_end() -> None:
    data = CountingBytes()
    store = EncodedPatternStore(data)
    store.put(state("1", 5))
    store.put(state("1", 5, 6))
    store.put(state("1", 7, field="value"))
    assert store.get("account", "1") == state("1", 5, 6) and data == {}
    assert store.flush() == 2
    assert data.puts == 2
    assert decode(data[state_key("account", "1")]) == state("1", 5, 6)
    store.delete("account", "1")
    assert store.get("account", "1") is None and state_key("account", "1") in data
    store.flush()
    assert set(data) == {state_key("value", "1")}
    assert store.get("account", "1") is None
    assert store.get("value", "1") == state("1", 7, field="value")
    # Any field and key, unambiguously; never where the partition's clock is.
    assert state_key("a/b", "c") != state_key("a", "b/c") and state_key("~", "")[:1] == b"@"


def test_a_new_store_over_the_bytes_reads_each_state_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = CountingBytes()
    first = EncodedPatternStore(data)
    for n in range(5):
        first.put(state(str(n), n))
    first.flush()
    data[b"~clock"] = b"not a state"
    again = EncodedPatternStore(data)
    assert sorted(again.states(), key=lambda s: s.key) == [state(str(n), n) for n in range(5)]
    data.reads = 0
    assert again.get("account", "3") == state("3", 3) and data.reads == 0  # decoded as loaded
    # Beyond RECENT_STATES decoded, the store forgets them and reads the bytes again.
    monkeypatch.setattr(pattern_store, "RECENT_STATES", 2)
    small = EncodedPatternStore(data)
    assert len(list(small.states())) == 5
    assert small.get("account", "0") == state("0", 0) and data.reads == 1
    assert small.get("account", "9") is None
    # A state an earlier version wrote (one per pattern and key) stops the load, named.
    data[b"p/1"] = b'[2, "1", null, null, [], [], 0]'
    with pytest.raises(ValueError, match=r"p/1.*format 1 or 2"):
        list(EncodedPatternStore(data).states())


def test_a_store_dropped_unflushed_leaves_the_bytes_as_they_were() -> None:
    data = MemoryBytes()
    store = EncodedPatternStore(data)
    store.put(state("1", 5))
    store.flush()
    before = dict(data)
    store.put(state("1", 5, 6))
    store.delete("account", "1")
    assert data == before
    assert EncodedPatternStore(data).get("account", "1") == state("1", 5)


class SmallBytes(MemoryBytes):
    """Bytes that refuse a value past 200 bytes, as a changelog refuses a record."""

    def put(self, key: bytes, value: bytes) -> None:
        if len(value) > 200:
            raise ValueError(f"{len(value)} bytes > 200")
        super().put(key, value)


def test_a_state_the_bytes_refuse_names_the_record_that_changed_it_last() -> None:
    store = EncodedPatternStore(SmallBytes())
    store.record = 0
    store.put(state("big", 1))
    store.put(state("small", 1))
    store.record = 1
    store.put(state("big", *range(1, 10)))  # too large encoded
    store.record = 2
    store.put(state("small", 1, 2))
    with pytest.raises(pattern_store.StateNotStored, match="account 'big' cannot be") as refused:
        store.flush()
    assert refused.value.record == 1
