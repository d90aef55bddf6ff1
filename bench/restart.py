"""Restart with many keys pending: one worker takes N A-events that find no partner,
is killed with SIGKILL and started again at once, as a supervisor would; how long
until it is back to processing (the first pair of a probe visible to a read_committed
consumer), with its local RocksDB intact and with it deleted. Also the worker's
resident memory and local disk with the N keys pending."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from app.kafka.admin import ensure_topics
from app.settings import Settings
from bench.pairstream import through_pairing, worker_run
from bench.workload import pre_produce
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import BASE_TIME, Record, produce
from tools.read_outputs import OutputReader

SPACING = timedelta(milliseconds=10)  # 1,000,000 keys span under 3 hours of event time
HOLD_SECONDS = 86_400  # expiry and max wait: every key stays pending for the run
PROBES = 64  # B events sent after each restart, partners of keys spread over all of them


@dataclass(frozen=True)
class RestartResult:
    pending: int
    build_seconds: float  # worker start to all N events processed
    rss_mib: float  # the worker's resident memory with N keys pending
    disk_mib: float  # its local state directory
    intact_first: float  # SIGKILL to the first probe pair visible, local state kept
    intact_all: float  # ... to every probe pair visible
    deleted_first: float  # the same with the local state deleted before the restart
    deleted_all: float


def event(kind: str, n: int) -> bytes:
    stamp = (BASE_TIME + n * SPACING).strftime("%Y-%m-%d %H:%M:%S.%f")
    return f'{{"type":"{kind}","timestamp":"{stamp}","value":{n % 500}}}'.encode()


def pending_records(count: int) -> list[Record]:
    """A-events without a key (the producer spreads them over the partitions)."""
    return [(None, event("A", n)) for n in range(count)]


def probe_records(count: int, round_: int) -> list[Record]:
    """B partners of PROBES pending keys, a different set each round."""
    step = count // PROBES
    return [(None, event("B", i * step + round_)) for i in range(PROBES)]


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return kib / 1024


def disk_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def kill(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()


async def back_to_processing(
    conf: Settings, probes: list[Record], killed_at: float, timeout: float
) -> tuple[float, float]:
    """Send the probes, then read pairs until all of theirs are visible: seconds from
    the kill to the first and to the last."""
    async with OutputReader(conf) as reader:
        await reader.read_available()  # the pairs of earlier rounds
        before = len(reader.outputs.pairs)
        await produce(probes, conf.kafka, conf.events_topic, rate=0, progress=False)
        first: float | None = None
        while len(reader.outputs.pairs) - before < len(probes):
            if time.monotonic() - killed_at > timeout:
                found = len(reader.outputs.pairs) - before
                raise TimeoutError(f"{found} of {len(probes)} probe pairs after {timeout:.0f} s")
            await reader.poll()
            if first is None and len(reader.outputs.pairs) > before:
                first = time.monotonic() - killed_at
        assert first is not None
        return first, time.monotonic() - killed_at


async def run_restart(bootstrap: str, pending: int, timeout: float) -> RestartResult:
    hold = str(HOLD_SECONDS)
    run = worker_run(
        "bench-restart",
        bootstrap,
        1.0,
        {"PAIRSTREAM_EXPIRY_SECONDS": hold, "PAIRSTREAM_MAX_WAIT_SECONDS": hold},
    )
    conf, log_path = run.conf, run.log_path
    await pre_produce(bootstrap, conf.events_topic, pending_records(pending))
    await ensure_topics(conf)
    data_dir = Path(conf.data_dir)
    worker = start_worker(log_path, run.env)
    started = time.monotonic()
    try:
        await wait_ready(log_path, worker)
        while await through_pairing(run.stats_url) < pending:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{pending} pending events not processed in {timeout:.0f} s")
            await asyncio.sleep(0.5)
        build = time.monotonic() - started
        await asyncio.sleep(2 * float(conf.commit_interval_seconds))  # committed, flushed
        rss, disk = resident_mib(worker.pid), disk_mib(data_dir)

        kill(worker)
        killed_at = time.monotonic()
        worker = start_worker(log_path, run.env)
        intact = await back_to_processing(conf, probe_records(pending, 0), killed_at, timeout)

        kill(worker)
        killed_at = time.monotonic()
        shutil.rmtree(data_dir)
        worker = start_worker(log_path, run.env)
        deleted = await back_to_processing(conf, probe_records(pending, 1), killed_at, timeout)
    finally:
        if worker.poll() is None:
            stop_worker(worker)
    await run.discard()
    return RestartResult(pending, build, rss, disk, *intact, *deleted)
