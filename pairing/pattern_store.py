"""The pattern states of one partition kept as bytes (a partition of a changelog-backed
table): a `PatternStore` (pairing/pattern_partition.py) that decodes a key's state once,
keeps the recent ones decoded, and writes each state a step changed once, encoded, when
the step ends (`flush`). Pure: the bytes are the caller's.

A key is added to, advanced when its events are passed by the watermark and again when
its window closes, often within one step: its state is decoded and encoded once for all
of these, and holds every pattern of its key field (docs/patterns.md, Figures).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import orjson

from pairing.pattern_state import KeyState, decode, encode
from pairing.recent import remember

RECENT_STATES = 20_000
"""How many states a partition keeps decoded, as it last read or wrote them: a few
hundred bytes each decoded (more with many patterns a key field), some MiB a partition."""


class PartitionBytes(Protocol):
    """One partition of a bytes table, as a step reads and writes it."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


class MemoryBytes(dict[bytes, bytes]):
    """Bytes in memory, for a store outside a worker (the benchmarks, the tests)."""

    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value

    def delete(self, key: bytes) -> None:
        self.pop(key, None)


def state_key(field: str, key: str) -> bytes:
    """Where the state of `key` of key field `field` is stored: `@` and the two as a
    JSON array (any text, unambiguously). The partition's other entries (its clock)
    start with `~`."""
    return b"@" + orjson.dumps([field, key])


class StateNotStored(ValueError):
    """A state the step changed that its bytes refused (too large for a record, say),
    and the step's record that changed it last: the one to set aside."""

    def __init__(self, field: str, key: str, record: int, error: Exception) -> None:
        super().__init__(f"the state of {field} {key[:40]!r} cannot be stored: {error}")
        self.record = record


class EncodedPatternStore:
    """The states of one partition over its bytes. A state written is read back as
    written until `flush` encodes it; whoever drops the store unflushed drops the step's
    writes with it (a worker drops a step's processor with any step cut off).
    `record`: the caller's number for what it is processing, which `flush` names when
    the bytes refuse a state that changed."""

    __slots__ = ("_bytes", "_changed_by", "_recent", "_written", "record")

    def __init__(self, data: PartitionBytes) -> None:
        self._bytes = data
        self._recent: dict[tuple[str, str], KeyState] = {}
        self._written: dict[tuple[str, str], KeyState | None] = {}  # None: deleted
        self._changed_by: dict[tuple[str, str], int] = {}
        self.record = -1

    def get(self, field: str, key: str) -> KeyState | None:
        at = (field, key)
        written = self._written
        if at in written:
            return written[at]
        state = self._recent.get(at)
        if state is None:
            raw = self._bytes.get(state_key(field, key))
            if raw is None:
                return None
            state = decode(raw)
            self._remember(at, state)
        return state

    def put(self, state: KeyState) -> None:
        at = (state.field, state.key)
        self._written[at] = state
        self._changed_by[at] = self.record

    def delete(self, field: str, key: str) -> None:
        self._written[(field, key)] = None
        self._changed_by[(field, key)] = self.record

    def states(self) -> Iterator[KeyState]:
        """Every stored state (what is written and not flushed is not among them: read
        once, as a partition is loaded). ValueError, naming the entry, for one that is
        not a state of this format."""
        for raw_key, raw in self._bytes.items():
            if raw_key[:1] == b"~":
                continue
            try:
                state = decode(raw)
            except ValueError as exc:
                raise ValueError(f"pattern state {raw_key[:80]!r}: {exc}") from exc
            self._remember((state.field, state.key), state)
            yield state

    def flush(self) -> int:
        """Write what the step changed to the bytes, each state once; how many.
        StateNotStored if the bytes refuse one (the caller drops the store)."""
        written = self._written
        for (field, key), state in written.items():
            try:
                if state is None:
                    self._bytes.delete(state_key(field, key))
                    self._recent.pop((field, key), None)
                else:
                    self._bytes.put(state_key(field, key), encode(state))
                    self._remember((field, key), state)
            except ValueError as exc:
                raise StateNotStored(field, key, self._changed_by[(field, key)], exc) from exc
        count = len(written)
        written.clear()
        self._changed_by.clear()
        return count

    def _remember(self, at: tuple[str, str], state: KeyState) -> None:
        remember(self._recent, at, state, RECENT_STATES)
