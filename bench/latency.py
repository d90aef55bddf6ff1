"""End-to-end latency under load: one app (a pairstream worker, or the Quix Streams app of
bench/quix_app.py) on empty topics, A/B partners produced at steady rates (each B right
after its A, no producer key), and each pair's latency from the send of its second event
to the pair being visible to a read_committed consumer."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.kafka.admin import ensure_topics
from app.kafka.connection import KafkaConnection
from app.settings import Settings
from bench.ceiling import BatchedSink
from bench.cli import part_parser
from bench.measure import CpuShares, collector_paused, listening_pid
from bench.pairstream import WorkerRun, discard_run, worker_commits, worker_run
from bench.quix import committed_reader, start_app, state_dir
from bench.workload import INPUT_PARTITIONS, create_topic, delete_topics
from pairing.records import HANDED
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import BASE_TIME
from tools.read_outputs import OutputReader

SPACING = timedelta(milliseconds=1)  # between keys: each key's timestamp is its own
WARM_UP = 3.0  # seconds of each level left out of its figures
DRAIN_SECONDS = 120.0  # after a level, for its last pairs
READY_SECONDS = 120.0  # for the first pair: the app's start, topics and assignment
TICK = 0.005  # seconds between two hand-overs of the load generator
# What a smoke run's loads are shares of: its parts run side by side, so no rate it
# measures is worth basing them on.
SMOKE_LATENCY_BASIS = 1_000.0
DEFAULT_COMMIT_INTERVAL: float = Settings.model_fields["commit_interval_seconds"].default


@dataclass(frozen=True)
class Level:
    """A rate offered: a fixed one, or a share (`load`) of the measured maximum."""

    rate: float  # events/s
    load: float | None = None


def levels(basis: float, rates: list[float], loads: list[float]) -> list[Level]:
    """The fixed `rates` and the `loads` of `basis`, lowest rate first."""
    return sorted(
        [*(Level(rate) for rate in rates), *(Level(basis * load, load) for load in loads)],
        key=lambda level: level.rate,
    )


@dataclass(frozen=True)
class Setup:
    """An app as the latency part runs it."""

    app: str  # as the report names it
    commit_interval: float
    env: dict[str, str] = field(default_factory=dict)  # a worker's settings besides


PAIRSTREAM_DEFAULT = Setup("pairstream default", DEFAULT_COMMIT_INTERVAL)
# Commits closer together than the default.
PAIRSTREAM_LOW_LATENCY = Setup("pairstream low latency", 0.01)
QUIX = Setup("Quix Streams", DEFAULT_COMMIT_INTERVAL)  # its own defaults besides


@dataclass(frozen=True)
class Watched:
    """What a level's load is watched for besides latency: the CPU of the app, the
    broker and this process (the load and the reader), by those names; and, for a
    pairstream worker, its commits so far and their seconds in all."""

    pids: dict[str, int]
    commits: Callable[[], Awaitable[tuple[int, float]]] | None = None


@dataclass(frozen=True)
class LatencyResult:
    app: str
    commit_interval: float
    level: Level
    pairs: int  # measured (after the warm-up)
    p50: float  # seconds
    p90: float
    p99: float
    max: float
    # While the level's load was offered: each watched process's CPU, as a share of one
    # core; the worker's commits a second and their mean duration (None for Quix).
    cpu: dict[str, float]
    commit_rate: float | None
    commit_mean: float | None


@dataclass(frozen=True)
class WaitPart:
    """One part of a pair's time, over the pairs of a level."""

    part: str
    p50: float  # seconds
    p90: float
    p99: float


# Where a pair's time goes: from the send of its events to the broker's append of the later
# of them (the input record's LogAppendTime), to ingest's writing it re-keyed (the keyed
# record's CreateTime), to that record readable by read_committed consumers (seen by ours),
# to pairing's writing the pair (the pair record's CreateTime), to the pair readable (seen
# by ours).
WAIT_PARTS = (
    "the load's send: linger and produce",
    "ingest: fetch, queue and step",
    "ingest's transaction commits",
    "pairing: fetch, queue and step",
    "pairing's transaction commits",
)
# A pair whose keyed partition ingest handed its events to (app/exactly_once/handoff.py):
# from the broker's append of the later event to pairing's writing the pair, then one
# transaction.
HANDED_WAIT_PARTS = (
    WAIT_PARTS[0],
    "ingest and pairing: fetch, queue and steps",
    "the transaction commits",
)


def percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


ID_FIELD = b'"id":"'  # the last field of append_partners' values


def pair_id_of(value: bytes) -> str:
    """The id its pair is known by (the A's) of an event append_partners made."""
    return "A" + value.rsplit(ID_FIELD, 1)[1][1:-2].decode()


def partner_time(number: int) -> datetime:
    """Key `number`'s timestamp, its own."""
    return BASE_TIME + number * SPACING


def append_partners(sink: BatchedSink, number: int) -> str:
    """Key `number`'s A and B, each to a partition at random, as aiokafka's partitioner
    sends a record with no key; the A's id, by which its pair is known."""
    stamp = partner_time(number).strftime("%Y-%m-%d %H:%M:%S.%f")
    for kind in ("A", "B"):
        value = f'{{"type":"{kind}","timestamp":"{stamp}","value":1,"id":"{kind}-{number}"}}'
        sink.append(random.randrange(INPUT_PARTITIONS), None, value.encode())
    return f"A-{number}"


async def paced(rate: float, seconds: float, first: int) -> AsyncIterator[range]:
    """The keys due, every `TICK` for `seconds`, from `first` on, at `rate` events/s (two
    events a key): what a load hands over at once."""
    keys_per_second = rate / 2
    started = time.monotonic()
    n = first
    while (elapsed := time.monotonic() - started) < seconds:
        due = max(n, first + int(elapsed * keys_per_second))
        yield range(n, due)
        n = due
        await asyncio.sleep(TICK)


class Load(Protocol):
    """What the latency part offers an app: partners at a rate, each pair's second event
    handed over when its A id is noted (the monotonic clock)."""

    async def first(self) -> str:
        """One pair, delivered; its A id."""
        ...

    async def offer(self, rate: float, seconds: float, first: int) -> dict[str, float]:
        """Keys `first`, `first + 1`, ... at `rate` events/s for `seconds`: when each
        pair's second event was handed over, by its A id."""
        ...


@dataclass
class KafkaLoad:
    """Partners produced to an input topic."""

    producer: AIOKafkaProducer
    topic: str

    async def first(self) -> str:
        sink = BatchedSink(self.producer, self.topic)
        first_pair = append_partners(sink, 0)
        await sink.hand_over()
        await sink.delivered()
        return first_pair

    async def offer(self, rate: float, seconds: float, first: int) -> dict[str, float]:
        """What is due is handed over every `TICK`, in one batch per partition: through
        `send`, an await per record, the generator took 39-58% of a core at 8,000
        events/s, beside the worker on this machine's two."""
        sent: dict[str, float] = {}
        sink = BatchedSink(self.producer, self.topic)
        async for numbers in paced(rate, seconds, first):
            keys = [append_partners(sink, number) for number in numbers]
            await sink.hand_over()
            handed_over = time.monotonic()
            sent.update((key, handed_over) for key in keys)
        await sink.delivered()
        return sent


@asynccontextmanager
async def kafka_load(bootstrap: str, topic: str) -> AsyncIterator[KafkaLoad]:
    producer = AIOKafkaProducer(
        **KafkaConnection(bootstrap).aiokafka(), enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        yield KafkaLoad(producer, topic)
    finally:
        await producer.stop()


# The A ids of the pairs an app made visible, a poll's at a time: how the latency part
# reads one app's output.
PairIds = AsyncIterator[list[str]]


async def note_visible(pairs: PairIds, seen: dict[str, float]) -> None:
    async for ids in pairs:
        now = time.monotonic()
        for id_ in ids:
            seen[id_] = now


async def visible(
    keys: list[str], seen: dict[str, float], timeout: float, reading: asyncio.Future[None]
) -> None:
    deadline = time.monotonic() + timeout
    while missing := [key for key in keys if key not in seen]:
        if reading.done():
            reading.result()  # the reader's error
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} pairs not visible, e.g. {missing[:3]}")
        await asyncio.sleep(0.5)


async def measure_levels(
    load: Load,
    pairs: PairIds,
    setup: Setup,
    offered: list[Level],
    seconds: float,
    watched: Watched,
    timings: Timings | None = None,
) -> list[LatencyResult]:
    """Each level in turn offered by `load` to a running app, for `seconds`; `pairs`
    what it made visible. One pair first, until visible: the app's start and first
    assignment, which the warm-up need not cover, stay out of the figures. `timings`, if
    given, keeps when each pair measured was sent and seen."""
    seen: dict[str, float] = {}
    reading = asyncio.ensure_future(note_visible(pairs, seen))
    try:
        await visible([await load.first()], seen, READY_SECONDS, reading)
        results = []
        first = 1
        cpu = CpuShares(watched.pids)
        for level in offered:
            with collector_paused():
                commits_before = await watched.commits() if watched.commits else None
                cpu.start()
                sent = await load.offer(level.rate, seconds, first)
                shares = cpu.shares()
                commit_rate = commit_mean = None
                if watched.commits and commits_before is not None:
                    count, total = await watched.commits()
                    done = count - commits_before[0]
                    commit_rate = done / seconds
                    commit_mean = (total - commits_before[1]) / done if done else math.nan
                first += len(sent)
                measured = list(sent.items())[int(len(sent) * WARM_UP / seconds) :]
                await visible([key for key, _ in measured], seen, DRAIN_SECONDS, reading)
            ordered = sorted(seen[key] - at for key, at in measured)
            if timings is not None:
                timings.pairs.extend((key, at, seen[key]) for key, at in measured)
            results.append(
                LatencyResult(
                    setup.app,
                    setup.commit_interval,
                    level,
                    len(ordered),
                    percentile(ordered, 0.5),
                    percentile(ordered, 0.9),
                    percentile(ordered, 0.99),
                    ordered[-1],
                    shares,
                    commit_rate,
                    commit_mean,
                )
            )
        return results
    finally:
        reading.cancel()
        with suppress(asyncio.CancelledError):
            await reading


async def pairstream_pairs(reader: OutputReader) -> PairIds:
    while True:
        before = len(reader.outputs.pairs)
        await reader.poll()
        yield [pair["a_id"] for pair in reader.outputs.pairs[before:]]


@dataclass
class Timings:
    """What the wait profile is computed from: the measured pairs (A id, sent, seen; the
    monotonic clock), when the broker appended the later of their events (the input
    topic's LogAppendTime), and by pairing key the keyed records' and pairs' Kafka
    timestamps and when ours saw them (the wall clock)."""

    pairs: list[tuple[str, float, float]] = field(default_factory=list)
    appended: dict[str, float] = field(default_factory=dict)  # A id: later of A and B
    # By pairing key, of the later of A and B: written, readable, handed.
    keyed: dict[bytes, tuple[float, float, bool]] = field(default_factory=dict)
    made: dict[str, tuple[bytes, float]] = field(default_factory=dict)  # A id: key, CreateTime


async def timed_input(consumer: AIOKafkaConsumer, timings: Timings) -> None:
    """Each pair's events: when the broker appended the later of them."""
    appended = timings.appended
    while True:
        batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
        for records in batches.values():
            for record in records:
                pair_id = pair_id_of(record.value)
                at = record.timestamp / 1000
                appended[pair_id] = max(at, appended.get(pair_id, at))


async def timed_keyed(consumer: AIOKafkaConsumer, timings: Timings) -> None:
    """Each pairing key's keyed records: the later CreateTime of its A and B (ingest's
    write), when the later one became readable, and whether they were handed."""
    keyed = timings.keyed
    while True:
        batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
        now = time.time()
        for records in batches.values():
            for record in records:
                written = record.timestamp / 1000
                key = record.key.removeprefix(HANDED)
                before = keyed.get(key)
                later = written if before is None else max(before[0], written)
                keyed[key] = (later, now, key != record.key)


async def timed_pairs(consumer: AIOKafkaConsumer, timings: Timings) -> PairIds:
    while True:
        batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
        ids = []
        for records in batches.values():
            for record in records:
                pair = json.loads(record.value)
                timings.made[pair["a_id"]] = (record.key, record.timestamp / 1000)
                ids.append(pair["a_id"])
        yield ids


def wait_profile(timings: Timings, wall_minus_monotonic: float) -> list[WaitPart]:
    """`WAIT_PARTS` over the measured pairs whose input and keyed records were seen, or
    `HANDED_WAIT_PARTS` if more of them were handed."""
    through: list[list[float]] = [[] for _ in WAIT_PARTS]
    handed: list[list[float]] = [[] for _ in HANDED_WAIT_PARTS]
    for a_id, sent, seen in timings.pairs:
        key, made = timings.made[a_id]
        if key not in timings.keyed or a_id not in timings.appended:
            continue
        rekeyed, readable, was_handed = timings.keyed[key]
        sent_at, appended = sent + wall_minus_monotonic, timings.appended[a_id]
        seen_at = seen + wall_minus_monotonic
        moments = (
            (sent_at, appended, made, seen_at)
            if was_handed
            else (sent_at, appended, rekeyed, readable, made, seen_at)
        )
        parts = handed if was_handed else through
        for part, (earlier, later) in zip(parts, itertools.pairwise(moments), strict=True):
            part.append(later - earlier)
    names, parts = (
        (HANDED_WAIT_PARTS, handed) if len(handed[0]) > len(through[0]) else (WAIT_PARTS, through)
    )
    if not parts[0]:
        raise RuntimeError("no measured pair's input and keyed records were seen")
    return [
        WaitPart(name, *(percentile(sorted(part), share) for share in (0.5, 0.9, 0.99)))
        for name, part in zip(names, parts, strict=True)
    ]


def watched_pids(bootstrap: str, app: int) -> dict[str, int]:
    """The app, the broker (when it runs here) and this process."""
    broker = listening_pid(int(bootstrap.split(",")[0].rpartition(":")[2]))
    return {"app": app, **({"broker": broker} if broker else {}), "load": os.getpid()}


def worker_watched(bootstrap: str, pid: int, run: WorkerRun) -> Watched:
    return Watched(watched_pids(bootstrap, pid), lambda: worker_commits(run.stats_url))


async def run_latency(
    bootstrap: str, setup: Setup, offered: list[Level], seconds: float
) -> list[LatencyResult]:
    """One pairstream worker over all the levels."""
    run = worker_run("bench-latency", bootstrap, setup.commit_interval, setup.env)
    conf, log_path = run.conf, run.log_path
    await create_topic(bootstrap, conf.events_topic)
    await ensure_topics(conf)
    worker = start_worker(log_path, run.env)
    try:
        await wait_ready(log_path, worker)
        async with OutputReader(conf) as reader, kafka_load(bootstrap, conf.events_topic) as load:
            results = await measure_levels(
                load,
                pairstream_pairs(reader),
                setup,
                offered,
                seconds,
                worker_watched(bootstrap, worker.pid, run),
            )
    finally:
        stop_worker(worker)
    await run.discard()
    return results


async def run_wait_profile(
    bootstrap: str, setup: Setup, level: Level, seconds: float
) -> list[WaitPart]:
    """Where a pair's time goes, at one level: the worker's own topics read by ours, each
    record's Kafka timestamp (when the worker wrote it) beside when ours could read it;
    the input's timestamps are the broker's (LogAppendTime), which ingest only carries
    along."""
    run = worker_run("bench-wait", bootstrap, setup.commit_interval, setup.env)
    conf, log_path = run.conf, run.log_path
    await create_topic(bootstrap, conf.events_topic, {"message.timestamp.type": "LogAppendTime"})
    await ensure_topics(conf)
    worker = start_worker(log_path, run.env)
    readers = [
        committed_reader(bootstrap, topic)
        for topic in (conf.events_topic, conf.keyed_topic, conf.pairs_topic)
    ]
    events, keyed, pairs = readers
    timings = Timings()
    wall_minus_monotonic = time.time() - time.monotonic()
    reading: asyncio.Future[Any] | None = None
    try:
        await asyncio.gather(*(reader.start() for reader in readers))
        reading = asyncio.gather(timed_input(events, timings), timed_keyed(keyed, timings))
        await wait_ready(log_path, worker)
        async with kafka_load(bootstrap, conf.events_topic) as load:
            await measure_levels(
                load,
                timed_pairs(pairs, timings),
                setup,
                [level],
                seconds,
                worker_watched(bootstrap, worker.pid, run),
                timings,
            )
    finally:
        if reading is not None:
            reading.cancel()
            with suppress(asyncio.CancelledError):
                await reading
        await asyncio.gather(*(reader.stop() for reader in readers))
        stop_worker(worker)
    await run.discard()
    return wait_profile(timings, wall_minus_monotonic)


async def quix_pairs(consumer: AIOKafkaConsumer) -> PairIds:
    while True:
        batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
        values: list[dict[str, Any]] = [
            json.loads(record.value) for records in batches.values() for record in records
        ]
        yield [value["a_id"] for value in values]


async def run_quix_latency(
    bootstrap: str, setup: Setup, offered: list[Level], seconds: float
) -> list[LatencyResult]:
    """The Quix Streams app over all the levels, its input produced into as it runs."""
    group = f"bench-quix-latency-{uuid.uuid4().hex[:8]}"
    source, sink = f"{group}-input", f"{group}-pairs"
    for topic in (source, sink):
        await create_topic(bootstrap, topic)
    app, log_path = start_app(bootstrap, source, sink, group, setup.commit_interval)
    consumer = committed_reader(bootstrap, sink)
    try:
        await consumer.start()
        async with kafka_load(bootstrap, source) as load:
            results = await measure_levels(
                load,
                quix_pairs(consumer),
                setup,
                offered,
                seconds,
                Watched(watched_pids(bootstrap, app.pid)),
            )
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {log_path}") from exc
    finally:
        app.terminate()
        app.wait()
        await consumer.stop()
    await delete_topics(bootstrap, group)
    discard_run(state_dir(group))
    return results


def main(argv: list[str] | None = None) -> None:
    """One level on its own, for comparing two versions of the worker in turn."""
    parser = part_parser(
        "python -m bench.latency",
        "Latency at one rate: one worker, a steady load, p50/p90/p99/max from send to"
        " visible (the suite's latency part at one level).",
    )
    parser.add_argument("rate", type=float, help="events per second offered")
    parser.add_argument("--seconds", type=float, default=25.0, help="of load (default 25)")
    parser.add_argument("--commit-interval", type=float, default=DEFAULT_COMMIT_INTERVAL)
    parser.add_argument(
        "--wait-profile", action="store_true", help="where a pair's time goes, in five parts"
    )
    args = parser.parse_args(argv)
    setup = Setup("pairstream", args.commit_interval)
    if args.wait_profile:
        level = Level(args.rate)
        parts = asyncio.run(run_wait_profile(args.bootstrap, setup, level, args.seconds))
        for part in parts:
            print(f"{part.part}: p50 {part.p50:.3f} s, p90 {part.p90:.3f} s, p99 {part.p99:.3f} s")
        return
    [result] = asyncio.run(run_latency(args.bootstrap, setup, [Level(args.rate)], args.seconds))
    print(
        f"{args.rate:,.0f} events/s offered, {result.pairs} pairs measured:"
        f" p50 {result.p50:.3f} s, p90 {result.p90:.3f} s, p99 {result.p99:.3f} s,"
        f" max {result.max:.3f} s; CPU (share of a core): "
        + ", ".join(f"{name} {share:.0%}" for name, share in result.cpu.items())
        + f"; {result.commit_rate or math.nan:.1f} commits/s,"
        f" {result.commit_mean or math.nan:.3f} s each"
    )


if __name__ == "__main__":
    main()
