"""What a benchmark run measures: CPU time of a process, and the steady rate of
progress sampled over time."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def median(rates: Iterable[float]) -> float:
    """The median of the rates that could be read (NaN: a run over too soon); NaN if
    none could."""
    readable = [rate for rate in rates if math.isfinite(rate)]
    return statistics.median(readable) if readable else math.nan


@dataclass
class Samples:
    """(seconds since start, records done) samples."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def steady_rate(self, total: int) -> float:
        """Records per second between 10% and 90% of `total`: start-up and the tail
        left out."""
        at = next(i for i, s in enumerate(self.samples) if s[1] >= total * 0.1)
        low = self.samples[at]
        high = next(s for s in self.samples if s[1] >= total * 0.9)
        if high[0] <= low[0]:
            # A short run (the smoke run) can pass both marks between two samples: the
            # rate across the samples around them, if there is one before.
            if at == 0:
                return float("nan")
            low = self.samples[at - 1]
        return (high[1] - low[1]) / (high[0] - low[0])

    def first_at(self) -> float | None:
        return next((t for t, n in self.samples if n > 0), None)

    def through_rate(self, total: int) -> float:
        """Records per second from the first sample with any done to the first with all
        `total` done: the start-up left out, and no phase of the run left out either
        (a steady rate of a two-stage run can end in the second stage's phase alone)."""
        first = next(((t, n) for t, n in self.samples if n > 0), None)
        last = next((s for s in self.samples if s[1] >= total), None)
        if first is None or last is None or last[0] <= first[0]:
            return float("nan")
        return (last[1] - first[1]) / (last[0] - first[0])
