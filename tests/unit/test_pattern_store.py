"""The pattern states of a partition over its bytes (pairing/pattern_store.py): a step
reads its own writes, and its writes reach the bytes once each, when it flushes."""

from __future__ import annotations

import pytest

from pairing import pattern_store
from pairing.pattern_state import PatternEvent, PatternState, decode
from pairing.pattern_store import EncodedPatternStore, MemoryBytes, state_key


def state(key: str, *times: int) -> PatternState:
    events = tuple(PatternEvent(t, f"e{t}", {"account": key}) for t in times)
    return PatternState(key, None, None, events, ())


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
    store.put("p", state("1", 5))
    store.put("p", state("1", 5, 6))
    store.put("q", state("1", 7))
    assert store.get("p", "1") == state("1", 5, 6) and data == {}
    assert store.flush() == 2
    assert data.puts == 2
    assert decode(data[state_key("p", "1")]) == state("1", 5, 6)
    store.delete("p", "1")
    assert store.get("p", "1") is None and state_key("p", "1") in data
    store.flush()
    assert set(data) == {state_key("q", "1")}
    assert store.get("p", "1") is None and store.get("q", "1") == state("1", 7)


def test_a_new_store_over_the_bytes_reads_each_state_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = CountingBytes()
    first = EncodedPatternStore(data)
    for n in range(5):
        first.put("p", state(str(n), n))
    first.flush()
    data[b"~clock"] = b"not a state"
    again = EncodedPatternStore(data)
    assert sorted(again.states(), key=lambda s: s[1].key) == [
        ("p", state(str(n), n)) for n in range(5)
    ]
    data.reads = 0
    assert again.get("p", "3") == state("3", 3) and data.reads == 0  # decoded as loaded
    # Beyond RECENT_STATES decoded, the store forgets them and reads the bytes again.
    monkeypatch.setattr(pattern_store, "RECENT_STATES", 2)
    small = EncodedPatternStore(data)
    assert len(list(small.states())) == 5
    assert small.get("p", "0") == state("0", 0) and data.reads == 1
    assert small.get("p", "9") is None


def test_a_store_dropped_unflushed_leaves_the_bytes_as_they_were() -> None:
    data = MemoryBytes()
    store = EncodedPatternStore(data)
    store.put("p", state("1", 5))
    store.flush()
    before = dict(data)
    store.put("p", state("1", 5, 6))
    store.delete("p", "1")
    assert data == before
    assert EncodedPatternStore(data).get("p", "1") == state("1", 5)


class SmallBytes(MemoryBytes):
    """Bytes that refuse a value past 200 bytes, as a changelog refuses a record."""

    def put(self, key: bytes, value: bytes) -> None:
        if len(value) > 200:
            raise ValueError(f"{len(value)} bytes > 200")
        super().put(key, value)


def test_a_state_the_bytes_refuse_names_the_record_that_changed_it_last() -> None:
    store = EncodedPatternStore(SmallBytes())
    store.record = 0
    store.put("p", state("big", 1))
    store.put("p", state("small", 1))
    store.record = 1
    store.put("p", state("big", *range(1, 10)))  # too large encoded
    store.record = 2
    store.put("p", state("small", 1, 2))
    with pytest.raises(pattern_store.StateNotStored, match="p/big cannot be stored") as refused:
        store.flush()
    assert refused.value.record == 1
