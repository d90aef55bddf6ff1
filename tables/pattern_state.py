"""The patterns' state (docs/patterns.md): two changelog-backed RocksDB tables, written
inside the steps' transactions like the pairing state. Imported only with a pattern file.

- `pattern-progress`, partitioned like the pattern inputs: each input partition's
  event-time progress (agents/event_time.py), so stamps go on from it after a restart.
- `pattern-state`, partitioned like the pattern events topic: partition p holds the
  state of each (pattern, key) routed to p, under `<pattern>/<key>` (a pattern's name
  has no `/`), and p's event clock under `~clock` (no pattern name starts with `~`).
"""

from __future__ import annotations

from collections.abc import Iterator

from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from pairing.pattern_state import PatternState, decode, encode
from pairing.records import CLOCK_KEY, decode_clock, encode_clock
from pairing.watermarks import EventClock
from tables import TableWriter, bytes_table

conf = settings()
assert conf.patterns is not None and conf.patterns.input is not None  # imported with a file

progress = bytes_table("pattern-progress", conf.partitions, conf.patterns.input.topics)
states = bytes_table("pattern-state", conf.partitions, [conf.pattern_events_topic])


def _key(pattern: str, key: str) -> bytes:
    return f"{pattern}/{key}".encode()


class PatternTable:
    """The `PatternStore` of one partition of the pattern events, and its clock."""

    __slots__ = ("_table",)

    def __init__(self, task: PartitionTask) -> None:
        self._table = TableWriter(states, task)

    def get(self, pattern: str, key: str) -> PatternState | None:
        raw = self._table.get(_key(pattern, key))
        return None if raw is None else decode(raw)

    def put(self, pattern: str, state: PatternState) -> None:
        self._table.put(_key(pattern, state.key), encode(state))

    def delete(self, pattern: str, key: str) -> None:
        self._table.delete(_key(pattern, key))

    def states(self) -> Iterator[tuple[str, PatternState]]:
        for raw_key, raw in self._table.items():
            if raw_key != CLOCK_KEY:
                yield raw_key.decode().split("/", 1)[0], decode(raw)

    def clock(self) -> EventClock:
        return decode_clock(self._table.get(CLOCK_KEY))

    def set_clock(self, clock: EventClock) -> None:
        self._table.put(CLOCK_KEY, encode_clock(clock))
