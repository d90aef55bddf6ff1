"""What this worker process has done since it started: counters per source
partition, throughput, commit times and durations. Updated once per acked event (a few
dict increments) and once per commit, read by the web views."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable

from faust.types import TP


class Throughput:
    """Events per second over the last 1, 10 or 60 whole seconds: one bucket
    per second of a rolling minute, so adding is O(1)."""

    SPAN = 60

    def __init__(self) -> None:
        self._counts = [0] * self.SPAN
        self._seconds = [-1] * self.SPAN  # which second each bucket counts

    def add(self, n: int, now: float) -> None:
        second = int(now)
        slot = second % self.SPAN
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._counts[slot] = 0
        self._counts[slot] += n

    def rate(self, window: int, now: float) -> float:
        """Mean rate over the `window` whole seconds before the current one."""
        assert 0 < window <= self.SPAN
        current = int(now)
        first = current - window
        total = sum(
            count
            for count, second in zip(self._counts, self._seconds, strict=True)
            if first <= second < current
        )
        return total / window


DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Durations:
    """A cumulative histogram of durations in seconds, in Prometheus' shape."""

    def __init__(self) -> None:
        self.buckets = [0] * len(DURATION_BUCKETS)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        for i, bound in enumerate(DURATION_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def status(self) -> dict[str, object]:
        return {
            "buckets": dict(zip(DURATION_BUCKETS, self.buckets, strict=True)),
            "count": self.count,
            "sum": self.sum,
        }


class Stats:
    def __init__(self) -> None:
        self.started_at = time.time()
        self.partitions: defaultdict[TP, Counter[str]] = defaultdict(Counter)
        self.process: Counter[str] = Counter()  # not tied to a partition (e.g. skips)
        self.throughput: defaultdict[str, Throughput] = defaultdict(Throughput)  # by topic
        self.last_commit_at: dict[TP, float] = {}
        # Each commit that committed, from taking its partitions to sending what steps
        # made meanwhile: what a record waits on top of the commit interval.
        self.commits = Durations()

    def processed(self, tp: TP, counts: Counter[str], now: float, records: int = 1) -> None:
        """An event of tp (or a run of `records`) was acked with what it sent; `counts`
        says what it was."""
        self.partitions[tp].update(counts)
        self.throughput[tp.topic].add(records, now)

    def count(self, name: str, n: int = 1) -> None:
        self.process[name] += n

    def committed(self, tps: Iterable[TP], now: float) -> None:
        for tp in tps:
            self.last_commit_at[tp] = now
