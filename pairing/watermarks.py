"""Event time across the partitions of the input topic. Pure: no Faust, no Kafka.

Each input partition (a *source*) has a *progress*: the largest valid event time
seen there. Ingest stamps every event with its source's progress as of that event
(`SourceProgress`), and tells every keyed partition how far each source has got
(`WatermarkUpdate` records, inside the source's transactions). A keyed partition
keeps what it was told (`EventClock`); its *watermark* is the minimum progress over
the sources that are not idle (caught up and quiet), and never moves backwards.

docs/event-time.md says why the answer then depends on the data only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WatermarkUpdate:
    """What one source tells every keyed partition: a watermark record."""

    source: int  # the input partition
    sources: int  # how many partitions the input topic has
    progress_us: int | None  # its largest valid event time; None: none yet
    idle: bool  # caught up and quiet: it stops holding the watermark back


@dataclass(frozen=True, slots=True)
class SourceMark:
    """What a keyed partition knows of one source."""

    progress_us: int | None
    idle: bool


class EventClock:
    """A keyed partition's event time: each source's progress and the watermark.

    The watermark is undefined until every source has been heard from (a source
    not heard from could hold anything). Idle sources do not count; when all are
    idle, everything there is has been read, and the watermark is the largest
    progress of any source.
    """

    __slots__ = ("marks", "sources", "watermark_us")

    def __init__(
        self,
        sources: int | None = None,
        marks: dict[int, SourceMark] | None = None,
        watermark_us: int | None = None,
    ) -> None:
        self.sources = sources
        self.marks: dict[int, SourceMark] = dict(marks or {})
        self.watermark_us = watermark_us

    def observe(self, update: WatermarkUpdate) -> bool:
        """Take a watermark record; whether the watermark advanced."""
        # A source heard from exists, whatever count its owner had seen yet.
        self.sources = max(self.sources or 0, update.sources, update.source + 1)
        known = self.marks.get(update.source)
        progress = update.progress_us
        if known is not None and known.progress_us is not None:
            progress = known.progress_us if progress is None else max(progress, known.progress_us)
        self.marks[update.source] = SourceMark(progress, update.idle)
        candidate = self._minimum()
        if candidate is None or (self.watermark_us is not None and candidate <= self.watermark_us):
            return False
        self.watermark_us = candidate
        return True

    def _minimum(self) -> int | None:
        if self.sources is None:
            return None
        active: list[int] = []
        quiet: list[int] = []
        for source in range(self.sources):
            mark = self.marks.get(source)
            if mark is None:
                return None
            if mark.idle:
                if mark.progress_us is not None:
                    quiet.append(mark.progress_us)
            elif mark.progress_us is None:
                return None
            else:
                active.append(mark.progress_us)
        if active:
            return min(active)
        # Every source is caught up and quiet: the stream has been read to its end.
        return max(quiet) if quiet else None


class SourceProgress:
    """Ingest's view of one source within an assignment: its progress, whether the
    keyed partitions have been told of it, and whether it has gone idle.

    The keyed partitions are told in the source's own transactions: at once when
    the source was idle or newly assigned (`must_announce`), and otherwise with a
    commit that moved it (`tell_due`), at most once per interval: each tell is a
    record for every keyed partition to process, and ingest commits often. What is
    left untold when the source is caught up is told then, outside any transaction.
    """

    __slots__ = (
        "idle",
        "looked_at",
        "must_announce",
        "progress_us",
        "seen_at",
        "told_at",
        "told_us",
    )

    def __init__(self, progress_us: int | None, now: float) -> None:
        self.progress_us = progress_us
        self.told_us: int | None = None
        self.told_at = float("-inf")  # wall clock of the last tell
        self.must_announce = True
        self.idle = False
        self.seen_at = now  # wall clock of its last record, or of the assignment
        self.looked_at = now  # wall clock of the last look at whether it is quiet

    def observe(self, time_us: int, now: float) -> int:
        """A valid event of this source; its stamp: the progress including it."""
        self.seen_at = now
        if self.progress_us is None or time_us > self.progress_us:
            self.progress_us = time_us
        return self.progress_us

    def untold(self) -> bool:
        return self.progress_us is not None and self.progress_us != self.told_us

    def tell_due(self, now: float, every: float) -> bool:
        """Whether progress not yet told should be told now, at most once per `every`
        seconds; an idle source told its progress when it went idle."""
        return not self.idle and self.untold() and now - self.told_at >= every

    def told(self, now: float) -> None:
        self.told_us = self.progress_us
        self.told_at = now
        self.must_announce = False
        self.idle = False

    def look(self, now: float, every_s: float) -> None:
        """A look at whether the source is quiet, due every `every_s` seconds. Quiet
        time counts only while the worker could see records come: a look more than two
        of those after the last means it stood still meanwhile (a long pause, a frozen
        VM, a zombie brought back), knows nothing of that time, and would go by a fetch
        as old as the stall. So the quiet clock starts again."""
        if now - self.looked_at > 2 * every_s:
            self.seen_at = max(self.seen_at, now)
        self.looked_at = now

    def goes_idle(self, now: float, idle_timeout_s: float) -> bool:
        """Whether a source that is caught up should now be declared idle: quiet for
        the idle timeout, counted from the assignment when it has had no record since.
        Also when it never had a valid event: declared idle at once, the empty
        partitions of a topic a live stream is about to fill would wake up behind a
        watermark the others had moved on, at any lag between their first records."""
        if self.idle:
            return False
        return now - self.seen_at >= idle_timeout_s

    def went_idle(self) -> None:
        self.idle = True
        self.must_announce = True  # its next event tells the keyed partitions at once

    def handed_over(self) -> bool:
        """The source is given up (a rebalance or a stop). Whether the keyed partitions
        must be told that it is no longer idle: records that land on it before its next
        owner has caught up on them must not meet a watermark that ran ahead without
        them, so it holds the watermark again until that owner declares it idle."""
        if not self.idle:
            return False
        self.idle = False
        return True

    def update(self, source: int, sources: int) -> WatermarkUpdate:
        return WatermarkUpdate(source, sources, self.progress_us, self.idle)

    def announcement(self, source: int, sources: int, now: float) -> WatermarkUpdate:
        """Its progress, told now (with an event, a commit, or caught up): no longer
        idle."""
        self.told(now)
        return self.update(source, sources)
