"""Where processing of one input partition stands within an assignment.

Records of a partition must be processed in offset order, starting at the committed
offset, each once. faust does not guarantee that by itself: records can reach an agent
before the partition has been sought to its committed offset, records fetched before a
seek are still delivered after it, and a record may be delivered again. Its commit then
takes the longest run of acked offsets, and it accepts one unacked offset at the head of
that run (it takes it for a transaction marker). So a record that was delivered, skipped,
and then passed over by a later one is lost.

`OffsetOrder` decides, per delivered record, whether it is the next to process, and
remembers the records it had to skip so that a later one cannot jump over them.
Offsets that were never delivered (transaction markers, aborted records) may be jumped.
"""

from __future__ import annotations

from enum import Enum


class Verdict(Enum):
    PROCESS = "process"
    UNSOUGHT = "unsought"  # before this assignment's seek to the committed offsets
    REDELIVERED = "redelivered"  # at or before a record already processed or committed
    OUT_OF_ORDER = "out_of_order"  # an earlier delivered record is still unprocessed


class OffsetOrder:
    __slots__ = ("anchored", "next", "unprocessed")

    def __init__(self) -> None:
        # The lowest offset that may be processed; None until the partition has been
        # sought to its committed offset in this assignment.
        self.next: int | None = None
        # Offsets delivered, skipped, and not yet processed (all at or after `next`).
        self.unprocessed: set[int] = set()
        # Whether a record has been processed since the last seek.
        self.anchored = False

    def sought_to_committed(self, committed: int) -> None:
        # A seek mid-assignment delivers again what was processed but not yet committed.
        self.next = committed if self.next is None else max(self.next, committed)
        self.anchored = False
        if self.unprocessed:
            self.unprocessed = {o for o in self.unprocessed if o >= self.next}

    def verdict(self, offset: int) -> Verdict:
        if self.next is None:
            return Verdict.UNSOUGHT
        if offset < self.next:
            return Verdict.REDELIVERED
        if self.unprocessed and any(o < offset for o in self.unprocessed):
            return Verdict.OUT_OF_ORDER
        return Verdict.PROCESS

    def jumps_from_seek(self, offset: int) -> bool:
        """Whether `offset`, to be processed first after a seek, leaves out offsets
        after the sought one: more than the one marker a commit usually leaves there.
        Records can be fetched and thrown away unseen (see ExactlyOnceConsumer), so such
        a jump is worth checking against the broker once."""
        return not self.anchored and self.next is not None and offset > self.next + 1

    def skipped(self, offset: int) -> None:
        """A record delivered and not processed, that will be delivered again."""
        if self.next is None or offset >= self.next:
            self.unprocessed.add(offset)

    def processed(self, offset: int) -> None:
        self.next = offset + 1
        self.anchored = True
        if self.unprocessed:
            self.unprocessed = {o for o in self.unprocessed if o > offset}
