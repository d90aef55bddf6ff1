"""When the periodic commits fall (app/consumer.py runs them).

An output is visible only once its transaction commits, so it waits for the next
commit: the commits keep to the clock, one every commit interval counted from the
start (faust's timer starts each interval when the commit before it has ended, and
wakes late when the event loop is busy: at 1 s its commits were 1.02-1.11 s apart).
In between, the partitions whose records another stage of the worker reads (ingest's
re-keyed events, read_committed by pairing) commit every handoff interval, so that a
pair waits for about one commit interval, not two. A commit that overruns skips the
times it missed.
"""

from __future__ import annotations

import math


class CommitSchedule:
    __slots__ = ("handoff", "interval", "next_everything", "start")

    def __init__(self, start: float, interval: float, handoff: float) -> None:
        self.start = start  # monotonic clock
        self.interval = interval  # every partition commits
        # The handing-off partitions commit; None: only with everything, when it would
        # not come more often.
        self.handoff = handoff if handoff < interval else None
        self.next_everything = start + interval

    def next_after(self, now: float) -> tuple[float, bool]:
        """The next commit after `now`: when, and whether every partition commits then
        (or only the handing-off ones). A commit of everything that came due while
        another ran is at once; handoff commits missed are skipped."""
        everything_at = self.next_everything
        if self.handoff is not None:
            handoff_at = self._after(now, self.handoff)
            # One that would come just before a commit of everything is left to it.
            if handoff_at < everything_at - self.handoff / 2:
                return handoff_at, False
        self.next_everything = self._after(max(now, everything_at), self.interval)
        return max(now, everything_at), True

    def _after(self, now: float, every: float) -> float:
        return self.start + (math.floor((now - self.start) / every) + 1) * every
