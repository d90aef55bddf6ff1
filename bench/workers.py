"""Two pairstream workers against one over the same pre-produced input: what a second
worker (here, the machine's second core) adds, and whether the pairs stay the same."""

from __future__ import annotations

import asyncio
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from app.kafka.admin import ensure_topics
from app.kafka.connection import KafkaConnection
from bench.measure import cpu_seconds
from bench.pairstream import worker_run
from bench.quix import (
    committed,
    committed_until_every_pair,
    count_visible,
    exited_at,
    expected_pairs,
)
from bench.stalls import log_excerpt
from bench.workload import pre_produce
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import Record
from tools.ports import free_port


@dataclass(frozen=True)
class WorkersResult:
    workers: int
    commit_interval: float
    steady_rate: float  # keyed records committed by the pairing stage per second, 10% to 90%
    seconds: float  # first worker start to the last pair visible
    cpu_seconds: float  # of all the workers' processes
    pairs: int  # visible to a read_committed consumer
    expected_pairs: int
    restarts: int  # workers that exited on their own and were started again


async def run_workers(
    bootstrap: str, records: list[Record], commit_interval: float, workers: int, timeout: float
) -> WorkersResult:
    """Start `workers` workers of one app at once over `records` and run them until every
    pair is visible. Progress is the group's committed offsets on the keyed topic, not
    /stats: a partition moved in a rebalance leaves one worker's counters and is counted
    again by the other from the last commit."""
    run = worker_run("bench-workers", bootstrap, commit_interval)
    await pre_produce(bootstrap, run.conf.events_topic, records)
    await ensure_topics(run.conf)
    wanted = expected_pairs(records)
    seen = [0]
    reader = asyncio.ensure_future(count_visible(bootstrap, run.conf.pairs_topic, seen))
    admin = AIOKafkaAdminClient(**KafkaConnection(bootstrap).aiokafka())
    await admin.start()
    processes: list[tuple[subprocess.Popen[bytes], Path]] = []
    # Each worker its own state directory and web port; the rest is shared.
    envs = [
        {"PAIRSTREAM_DATA_DIR": f"{run.conf.data_dir}-{n}", "PAIRSTREAM_WEB_PORT": str(free_port())}
        for n in range(workers)
    ]
    restarts = Restarts(processes, envs)
    started = time.monotonic()
    try:
        for n, env in enumerate(envs):
            log_path = run.log_path.with_name(f"{run.log_path.stem}-{n}.log")
            processes.append((start_worker(log_path, env), log_path))
        for process, log_path in processes:
            await wait_ready(log_path, process)
        keyed = run.conf.keyed_topic
        progress = await committed_until_every_pair(
            admin, run.conf.app_id, keyed.__eq__, processes, seen, wanted, started, timeout,
            restarts.restart,
        )  # fmt: skip
        seconds = time.monotonic() - started
        # The last keyed records are committed with or before the last pair.
        summed = await committed(admin, run.conf.app_id)
        progress.samples.append((seconds, summed.get(run.conf.keyed_topic, 0)))
        cpu = sum(cpu_seconds(process.pid) for process, _ in processes)  # the live ones
        # A pair out twice (a rebalance that broke exactly-once) would come within a
        # commit or two of the last one.
        await asyncio.sleep(2 * commit_interval + 1)
    finally:
        for process, _ in processes:
            stop_worker(process)
        reader.cancel()
        with suppress(asyncio.CancelledError):
            await reader
        await admin.close()
    await run.discard()
    return WorkersResult(
        workers,
        commit_interval,
        progress.steady_rate(progress.samples[-1][1]),
        seconds,
        cpu,
        seen[0],
        wanted,
        restarts.count,
    )


@dataclass
class Restarts:
    """A worker that exits on its own is started again on its state directory, as a
    supervisor would, at most `limit` times in a run; each is printed with its log and
    counted in the report. Exactly-once must hold through it: the pairs are counted all
    the same."""

    processes: list[tuple[subprocess.Popen[bytes], Path]]
    envs: list[dict[str, str]]
    limit: int = 2
    count: int = 0

    def restart(self, n: int) -> None:
        process, log_path = self.processes[n]
        if self.count == self.limit:
            exited_at(self.processes)(n)
        self.count += 1
        print(
            f"worker {n} exited ({process.returncode}); started again. Its log:\n"
            + log_excerpt(log_path, lines=15),
            flush=True,
        )
        self.processes[n] = (start_worker(log_path, self.envs[n]), log_path)
