"""Moving the pairing state to another number of keyed partitions. Pure: no Faust, no
Kafka; `tools/move_keyed.py` reads the old changelogs and writes the new ones.

Each pairing key goes to the partition ingest routes it to (`pairing.routing`) over the
new count, with its state as it is. Each new partition gets one event clock, merged
from the old partitions' clocks (`merge_clocks`): docs/deploy.md says why the merge is
safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pairing.records import CLOCK_KEY, decode_clock, encode_clock
from pairing.routing import partition_for
from pairing.watermarks import EventClock, SourceMark, WatermarkUpdate


class MoveRefused(RuntimeError):
    """The state cannot be moved as it is; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class OldPartition:
    """One old keyed partition: its state table's entries (the changelog's latest value
    of each key, clock included) and the watermark records of the keyed topic that its
    pairing stage had not yet read."""

    entries: Mapping[bytes, bytes]
    unread_watermarks: tuple[WatermarkUpdate, ...] = ()


def merge_clocks(clocks: Iterable[EventClock]) -> EventClock:
    """One clock that says no more than any of `clocks`.

    * A source's progress: the largest any partition knows. Every progress told to a
      keyed partition is a committed progress of that source, and every event the source
      gives from now on is stamped at least that much.
    * A source is idle only if every partition knows it idle: not idle holds the
      watermark back, which only delays.
    * The watermark: the least of the partitions' watermarks (undefined if any is). A
      watermark too high would close windows early; too low only delays their closing
      until the next watermark record, which recomputes it from the marks.
    """
    clocks = list(clocks)
    if not clocks:
        return EventClock()
    sources: int | None = None
    marks: dict[int, SourceMark] = {}
    for clock in clocks:
        if clock.sources is not None:
            sources = max(sources or 0, clock.sources)
    for source in sorted({s for clock in clocks for s in clock.marks}):
        progress: int | None = None
        idle = True
        for clock in clocks:
            mark = clock.marks.get(source)
            if mark is None:
                idle = False  # not heard of there: it holds that partition back
                continue
            if mark.progress_us is not None:
                progress = mark.progress_us if progress is None else max(progress, mark.progress_us)
            idle = idle and mark.idle
        marks[source] = SourceMark(progress, idle)
    watermarks = [clock.watermark_us for clock in clocks]
    watermark = (
        None if any(w is None for w in watermarks) else min(w for w in watermarks if w is not None)
    )
    return EventClock(sources, marks, watermark)


def caught_up_clock(partition: OldPartition) -> EventClock:
    """An old partition's clock with the watermark records it had not read folded into
    its marks, its watermark left as its pairing stage last moved it (the keys' state
    reflects that one)."""
    clock = decode_clock(partition.entries.get(CLOCK_KEY))
    watermark = clock.watermark_us
    for update in partition.unread_watermarks:
        clock.observe(update)
    return EventClock(clock.sources, clock.marks, watermark)


def repartition(old: Mapping[int, OldPartition], partitions: int) -> dict[int, dict[bytes, bytes]]:
    """The new state tables: every key of every old partition in the partition ingest
    routes it to over `partitions`, and every new partition's clock the merge of all the
    old ones. Refuses a key found in a partition ingest would not have sent it to (the
    old partition count is not the one given), or in two partitions."""
    if partitions < 1:
        raise MoveRefused(f"the new partition count must be at least 1, not {partitions}")
    count = len(old)
    if sorted(old) != list(range(count)):
        raise MoveRefused(f"old partitions {sorted(old)} are not 0..{count - 1}")
    new: dict[int, dict[bytes, bytes]] = {p: {} for p in range(partitions)}
    seen: dict[bytes, int] = {}
    for number, partition in sorted(old.items()):
        for key, value in partition.entries.items():
            if key == CLOCK_KEY:
                continue
            name = key.decode()
            if partition_for(name, count) != number:
                raise MoveRefused(
                    f"key {name!r} is in old partition {number}, but ingest routes it to"
                    f" {partition_for(name, count)} of {count}: the old partition count is wrong"
                )
            if key in seen:
                raise MoveRefused(f"key {name!r} is in old partitions {seen[key]} and {number}")
            seen[key] = number
            new[partition_for(name, partitions)][key] = value
    clock = merge_clocks(caught_up_clock(partition) for partition in old.values())
    encoded = encode_clock(clock)
    for entries in new.values():
        entries[CLOCK_KEY] = encoded
    return new
