"""The pattern states of one partition kept as bytes (a partition of a changelog-backed
table): a `PatternStore` (pairing/pattern_partition.py) that decodes a state once, keeps
the recent ones decoded, and writes each state a step changed once, encoded, when the
step ends (`flush`). Pure: the bytes are the caller's.

A key is added to, advanced when its events are passed by the watermark and again when
its window closes, often within one step, and with ten patterns an event is ten keys:
each state is decoded and encoded once for all of these (docs/patterns.md, Figures).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from pairing.pattern_state import PatternState, decode, encode
from pairing.recent import remember

RECENT_STATES = 20_000
"""How many states a partition keeps decoded, as it last read or wrote them: a few
hundred bytes each decoded, so some MiB a partition."""


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


def state_key(pattern: str, key: str) -> bytes:
    """Where (pattern, key) is stored: a pattern's name has no `/`, and none starts with
    `~`, which the partition's other entries (its clock) do."""
    return f"{pattern}/{key}".encode()


class StateNotStored(ValueError):
    """A state the step changed that its bytes refused (too large for a record, say),
    and the step's record that changed it last: the one to set aside."""

    def __init__(self, pattern: str, key: str, record: int, error: Exception) -> None:
        super().__init__(f"the state of {pattern}/{key[:40]} cannot be stored: {error}")
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
        self._recent: dict[tuple[str, str], PatternState] = {}
        self._written: dict[tuple[str, str], PatternState | None] = {}  # None: deleted
        self._changed_by: dict[tuple[str, str], int] = {}
        self.record = -1

    def get(self, pattern: str, key: str) -> PatternState | None:
        at = (pattern, key)
        written = self._written
        if at in written:
            return written[at]
        state = self._recent.get(at)
        if state is None:
            raw = self._bytes.get(state_key(pattern, key))
            if raw is None:
                return None
            state = decode(raw)
            self._remember(at, state)
        return state

    def put(self, pattern: str, state: PatternState) -> None:
        self._written[(pattern, state.key)] = state
        self._changed_by[(pattern, state.key)] = self.record

    def delete(self, pattern: str, key: str) -> None:
        self._written[(pattern, key)] = None
        self._changed_by[(pattern, key)] = self.record

    def states(self) -> Iterator[tuple[str, PatternState]]:
        """Every stored state, by its pattern's name (what is written and not flushed is
        not among them: read once, as a partition is loaded)."""
        for raw_key, raw in self._bytes.items():
            if raw_key[:1] != b"~":
                pattern, key = raw_key.decode().split("/", 1)
                state = decode(raw)
                self._remember((pattern, key), state)
                yield pattern, state

    def flush(self) -> int:
        """Write what the step changed to the bytes, each state once; how many.
        StateNotStored if the bytes refuse one (the caller drops the store)."""
        written = self._written
        for (pattern, key), state in written.items():
            try:
                if state is None:
                    self._bytes.delete(state_key(pattern, key))
                    self._recent.pop((pattern, key), None)
                else:
                    self._bytes.put(state_key(pattern, key), encode(state))
                    self._remember((pattern, key), state)
            except ValueError as exc:
                raise StateNotStored(pattern, key, self._changed_by[(pattern, key)], exc) from exc
        count = len(written)
        written.clear()
        self._changed_by.clear()
        return count

    def _remember(self, at: tuple[str, str], state: PatternState) -> None:
        remember(self._recent, at, state, RECENT_STATES)
