"""The same workload through a Quix Streams app (bench/quix_app.py), exactly-once, in
its own venv: how fast its second stage gets through it, and whether it found every
pair."""

from __future__ import annotations

import asyncio
import fcntl
import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from app.kafka.connection import KafkaConnection
from bench.measure import Samples, cpu_seconds
from bench.pairstream import discard_run
from bench.stalls import log_excerpt
from bench.workload import create_topic, delete_topics
from tools.generate import Record

ROOT = Path(__file__).resolve().parent.parent
QUIXSTREAMS = "quixstreams==3.28.1"
VENV = ROOT / ".cache" / "quix-venv"
APP = Path(__file__).with_name("quix_app.py")


@dataclass(frozen=True)
class QuixResult:
    commit_interval: float
    events: int
    steady_rate: float  # second-stage records committed per second, 10% to 90%
    through_rate: float  # the same, from the first committed to the last
    seconds: float  # app start to the last pair visible
    first_through: float | None  # app start to the first second-stage commit
    cpu_seconds: float  # of the app's process
    pairs: int  # visible to a read_committed consumer
    expected_pairs: int


def python() -> Path:
    """The venv's Python, the venv made on first use, under a lock (two runs of the
    suite may start at once). Making it takes minutes and blocks: call it before any
    Kafka client starts, or their requests time out meanwhile."""
    interpreter = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with (VENV.parent / "quix-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (VENV / ".installed").exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            subprocess.run(
                [str(interpreter), "-m", "pip", "install", "-q", QUIXSTREAMS], check=True
            )
            (VENV / ".installed").write_text(QUIXSTREAMS)
    return interpreter


def expected_pairs(records: list[Record]) -> int:
    """Timestamps that have both an A and a B: the pairs any correct app finds."""
    kinds: dict[str, set[str]] = defaultdict(set)
    for _, value in records:
        assert value is not None  # the benchmark workload has no invalid records
        event = json.loads(value)
        kinds[event["timestamp"]].add(event["type"])
    return sum(1 for found in kinds.values() if len(found) == 2)


async def committed(admin: AIOKafkaAdminClient, group: str) -> dict[str, int]:
    """The group's committed offsets summed per topic."""
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:  # before the group's first commit, on a fresh broker
        return {}
    summed: dict[str, int] = defaultdict(int)
    for tp, meta in offsets.items():
        summed[tp.topic] += max(meta.offset, 0)
    return summed


# What to do about the process at this index of the list, which exited.
Exited = Callable[[int], None]


def exited_at(processes: list[tuple[subprocess.Popen[bytes], Path]]) -> Exited:
    """Fail: the process's exit code and its log."""

    def fail(n: int) -> None:
        process, log_path = processes[n]
        raise RuntimeError(f"exited {process.returncode}; {log_path}:\n{log_excerpt(log_path)}")

    return fail


async def committed_until_every_pair(
    admin: AIOKafkaAdminClient,
    group: str,
    counted: Callable[[str], bool],
    processes: list[tuple[subprocess.Popen[bytes], Path]],
    seen: list[int],
    wanted: int,
    started: float,
    timeout: float,
    exited: Exited | None = None,
) -> Samples:
    """Sample `group`'s committed offsets on the topics `counted` names every 0.25 s until
    `seen` (pairs visible) reaches `wanted`. A process that exits is `exited`'s to handle
    (by default it fails the run at once); a run past `timeout` fails."""
    on_exit = exited or exited_at(processes)
    progress = Samples()
    while seen[0] < wanted:
        elapsed = time.monotonic() - started
        summed = await committed(admin, group)
        progress.samples.append((elapsed, sum(n for t, n in summed.items() if counted(t))))
        for n, (process, _) in enumerate(processes):
            if process.poll() is not None:
                on_exit(n)
        if elapsed > timeout:
            raise TimeoutError(f"{seen[0]} of {wanted} pairs in {elapsed:.0f} s")
        await asyncio.sleep(0.25)
    return progress


def committed_reader(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    """A read_committed consumer of `topic` from its start, of no group."""
    return AIOKafkaConsumer(
        topic,
        **KafkaConnection(bootstrap).aiokafka(),
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
    )


async def count_visible(bootstrap: str, topic: str, seen: list[int]) -> None:
    consumer = committed_reader(bootstrap, topic)
    await consumer.start()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            seen[0] += sum(len(records) for records in batches.values())
    finally:
        await consumer.stop()


def state_dir(group: str) -> Path:
    return ROOT / ".run" / group


def start_app(
    bootstrap: str, source: str, sink: str, group: str, commit_interval: float
) -> tuple[subprocess.Popen[bytes], Path]:
    """The app as consumer `group`, from `source` to `sink`: its process and its log."""
    interpreter = python()
    log_path = ROOT / ".run" / f"{group}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        app = subprocess.Popen(
            [str(interpreter), str(APP), bootstrap, source, sink, group,
             str(commit_interval), str(state_dir(group))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return app, log_path


async def run_quix(
    bootstrap: str, source: str, records: list[Record], commit_interval: float, timeout: float
) -> QuixResult:
    """Run the app over `source` (already holding `records`) until every pair is out."""
    group = f"bench-quix-{uuid.uuid4().hex[:8]}"
    sink = f"{group}-pairs"
    await create_topic(bootstrap, sink)
    wanted = expected_pairs(records)
    seen = [0]
    reader = asyncio.ensure_future(count_visible(bootstrap, sink, seen))
    admin = AIOKafkaAdminClient(**KafkaConnection(bootstrap).aiokafka())
    await admin.start()
    app, log_path = start_app(bootstrap, source, sink, group, commit_interval)
    started = time.monotonic()
    try:
        progress = await committed_until_every_pair(
            admin,
            group,
            lambda topic: topic.startswith("repartition__"),
            [(app, log_path)],
            seen,
            wanted,
            started,
            timeout,
        )
        seconds = time.monotonic() - started
        cpu = cpu_seconds(app.pid)
    finally:
        app.terminate()
        app.wait()
        reader.cancel()
        with suppress(asyncio.CancelledError):
            await reader
        await admin.close()
    await delete_topics(bootstrap, group)
    discard_run(state_dir(group))
    # Transaction markers count in the committed offsets: at most one per partition and
    # commit, a fraction of a percent here.
    total = progress.samples[-1][1]
    return QuixResult(
        commit_interval,
        len(records),
        progress.steady_rate(total),
        progress.through_rate(total),
        seconds,
        progress.first_at(),
        cpu,
        seen[0],
        wanted,
    )
