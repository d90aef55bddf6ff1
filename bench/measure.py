"""What a benchmark run measures: CPU time of a process, the CPU the host took from this
machine, and the steady rate of progress sampled over time."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def quiet_since(pid: int, window: float = 1.0, busy: float = 0.1) -> float:
    """When a live process stopped working: the start (time.monotonic) of the first
    `window` seconds in which it used less than `busy` of a core, sampled every quarter
    of it (an idle worker uses about 0.03, docs/BENCHMARKS.md)."""
    samples = deque([(time.monotonic(), cpu_seconds(pid))])
    while True:
        await asyncio.sleep(window / 4)
        now, cpu = time.monotonic(), cpu_seconds(pid)
        samples.append((now, cpu))
        while len(samples) > 2 and samples[1][0] <= now - window:
            samples.popleft()
        since, cpu_then = samples[0]
        if now - since >= window and cpu - cpu_then < busy * (now - since):
            return since


def stolen_seconds(stat: str = "/proc/stat") -> float:
    """CPU time the hypervisor gave to others while this machine's cores wanted it (the
    steal column of /proc/stat, summed over the cores); NaN where it is not kept. On a
    shared host it is one reason two runs of the same code minutes apart differ."""
    try:
        with open(stat) as lines:
            first = lines.readline().split()
    except OSError:
        return math.nan
    # cpu user nice system idle iowait irq softirq steal ...
    return int(first[8]) / TICKS if first[:1] == ["cpu"] and len(first) > 8 else math.nan


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off in this process while it times something:
    in the latency part's process (the load and the reader of outputs) its full
    collections, over about 100,000 objects, paused it for up to 0.1 s every few seconds,
    which every pair seen meanwhile carried (measured with gc.callbacks). Reference
    counting frees what the timing allocates; the few cycles it makes go at the end."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


def listening_pid(port: int) -> int | None:
    """The process here that listens on TCP `port` (from /proc), if this user sees it."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state, inode = (row.split()[i] for i in (1, 3, 9))
            if state == "0A" and int(local.rpartition(":")[2], 16) == port:  # 0A: LISTEN
                sockets.add(f"socket:[{inode}]")
    for process in Path("/proc").iterdir() if sockets else ():
        if not process.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in sockets for fd in (process / "fd").iterdir()):
                return int(process.name)
        except OSError:  # gone, or not ours to read
            continue
    return None


STOLEN = "stolen"  # CpuShares' name for what the host took from the machine's cores


class CpuShares:
    """The CPU each of some processes used from `start()` on, as a share of one core
    (NaN for one that ended meanwhile), and under `STOLEN` the CPU the host took from
    all the machine's cores meanwhile, in the same unit."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._began = time.monotonic()
        self._before: dict[str, float] = {}
        self._stolen_before = math.nan

    def start(self) -> None:
        self._began = time.monotonic()
        self._before = {name: _cpu_or_nan(pid) for name, pid in self._pids.items()}
        self._stolen_before = stolen_seconds()

    def shares(self) -> dict[str, float]:
        elapsed = time.monotonic() - self._began
        shares = {
            name: (_cpu_or_nan(pid) - self._before[name]) / elapsed
            for name, pid in self._pids.items()
        }
        shares[STOLEN] = (stolen_seconds() - self._stolen_before) / elapsed
        return shares


def _cpu_or_nan(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return math.nan


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
