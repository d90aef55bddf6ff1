"""The patterns' state (docs/patterns.md): two changelog-backed RocksDB tables, written
inside the steps' transactions like the pairing state. Imported only with a pattern file.

- `pattern-progress`, partitioned like the pattern inputs: each input partition's
  event-time progress (agents/event_time.py), so stamps go on from it after a restart.
- `pattern-state`, partitioned like the pattern events topic: partition p holds the
  state of each key routed to p, one for all the patterns of its key field
  (pairing/pattern_store.py, `state_key`), and p's event clock under `~clock`.
"""

from __future__ import annotations

from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from pairing.pattern_store import EncodedPatternStore
from pairing.records import CLOCK_KEY, decode_clock, encode_clock
from pairing.watermarks import EventClock
from tables import TableWriter, bytes_table

conf = settings()
assert conf.patterns is not None and conf.patterns.input is not None  # imported with a file

progress = bytes_table("pattern-progress", conf.partitions, conf.patterns.input.topics)
states = bytes_table("pattern-state", conf.partitions, [conf.pattern_events_topic])


class PatternTable:
    """One partition of the pattern events' state: its `PatternStore` and its clock,
    written into the step's transaction by `flush` as the step ends. It lives as long as
    its partition task's processor, which goes with any step cut off."""

    __slots__ = ("_table", "store")

    def __init__(self, task: PartitionTask) -> None:
        self._table = TableWriter(states, task)
        self.store = EncodedPatternStore(self._table)

    def clock(self) -> EventClock:
        return decode_clock(self._table.get(CLOCK_KEY))

    def flush(self, clock: EventClock | None) -> None:
        """The step's writes: the states it changed, and the clock if it moved."""
        self.store.flush()
        if clock is not None:
            self._table.put(CLOCK_KEY, encode_clock(clock))
