"""The change data capture chain (docs/cdc.md) as the benchmark suite measures it: rows
of the events table, through PostgreSQL's log, Debezium's connector on one Kafka Connect
worker and one pairstream worker, to pairs.

- Throughput: rows committed while the connector is paused (a backlog in the log, as the
  JSON part's input is pre-produced), then the connector resumed: rows per second through
  both of the worker's stages, first to last, beside one worker over the same events as
  JSON produced to Kafka, the runs one right after the other. Before the chain's run, its
  two halves alone on the same rows: Connect filling a change topic with no worker
  running (which also warms its JVM up), then a worker over that topic.
- Latency: partners inserted at fixed rates of rows, each key's A and B in one
  transaction; each pair's latency from that COMMIT's return to the pair visible to a
  read_committed consumer.

    python -m bench.cdc --bootstrap 127.0.0.1:9092 [--rows 200000] [--rates 1000,5000]
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from faust.types import TP

from app.kafka.admin import end_offsets, ensure_topics
from app.settings import Settings
from bench.cli import part_parser
from bench.latency import (
    DEFAULT_COMMIT_INTERVAL,
    LatencyResult,
    Level,
    Setup,
    Watched,
    measure_levels,
    paced,
    pairstream_pairs,
    partner_time,
    watched_pids,
)
from bench.measure import Samples, cpu_seconds
from bench.pairstream import WorkerRun, run_worker, through_pairing, worker_commits, worker_run
from bench.workload import delete_topics, workload
from tools import connect, postgres
from tools.cdc import Row, rows_of
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import Record
from tools.ports import free_port
from tools.read_outputs import OutputReader

COPY_ROWS = 1_000  # rows a transaction in the throughput part's backlog
CDC_SETUP = Setup("pairstream, CDC chain", DEFAULT_COMMIT_INTERVAL)
INSERT = "INSERT INTO events (id, type, ts, value) VALUES (%s, %s, %s, %s)"


@dataclass(frozen=True)
class CdcThroughput:
    rows: int
    rate: float  # rows/s through both of the worker's stages, first to last
    connect_rate: float  # rows/s into the change topic, Connect alone
    drain_rate: float  # rows/s through the worker over the filled change topic
    json_events: int  # the JSON run's, right before: its input, duplicates included
    json_rate: float  # events/s, first to last
    insert_rate: float  # rows/s committed into the table for the backlog
    cpu: dict[str, float]  # CPU seconds from the resume to the last row through


@dataclass(frozen=True)
class Chain:
    """PostgreSQL and a Connect worker, started for a part of the suite; each run on them
    has its own connector, slot, change topic and pairstream worker."""

    bootstrap: str
    cluster: postgres.Cluster
    worker: connect.Worker


@asynccontextmanager
async def chain(bootstrap: str) -> AsyncIterator[Chain]:
    """The chain's database and Connect worker for the block; once it succeeded, nothing
    of theirs is left (Connect's topics and files: a failed one's stay to look at)."""
    tag = uuid.uuid4().hex[:8]
    cluster = postgres.Cluster(f"bench-cdc-{tag}", free_port())
    worker = connect.Worker(f"bench-cdc-{tag}", free_port())
    postgres.start(cluster)
    try:
        connect.start(worker, Settings(broker=f"kafka://{bootstrap}").kafka)
        try:
            yield Chain(bootstrap, cluster, worker)
        finally:
            connect.stop(worker)
        await delete_topics(bootstrap, worker.group_id)
        shutil.rmtree(worker.home)
    finally:
        postgres.clean(cluster)


@dataclass(frozen=True)
class CdcRun:
    """One run on a chain: a pairstream worker's settings, reading its own connector's
    change topic."""

    run: WorkerRun
    conf: Settings
    connector: connect.Connector


async def cdc_run(on: Chain, kind: str) -> CdcRun:
    """A connector of the run's own on an empty table, registered and running, its change
    topic created with the partitions of the JSON part's input."""
    run = worker_run(kind, on.bootstrap, DEFAULT_COMMIT_INTERVAL)
    run_id = Path(run.conf.data_dir).name
    loaded = connect.load_connector()
    connector = connect.Connector(
        f"events-{run_id}",
        {**loaded.config, "topic.prefix": run_id, "slot.name": f"slot_{run_id.replace('-', '_')}"},
    )
    settings = {
        "PAIRSTREAM_EVENTS_FORMAT": "debezium",
        "PAIRSTREAM_EVENTS_TOPIC": connector.change_topic,
    }
    run = WorkerRun(run.conf, run.log_path, run.stats_url, {**run.env, **settings})
    conf = run.conf.model_copy(
        update={"events_format": "debezium", "events_topic": connector.change_topic}
    )
    await ensure_topics(conf)
    with psycopg.connect(postgres.dsn(on.cluster, postgres.SUPERUSER)) as owner:
        owner.execute("TRUNCATE events")  # the runs before: a new connector would snapshot them
    connect.register(
        on.worker, connect.postgres_database(on.cluster.name, on.cluster.port), connector
    )
    state = connect.check(on.worker, connector)
    if not state.running:
        raise RuntimeError(f"the connector does not run: {state.summary}")
    return CdcRun(run, conf, connector)


async def discard(on: Chain, cdc: CdcRun) -> None:
    connect.request(on.worker, "DELETE", f"/connectors/{cdc.connector.name}")
    await cdc.run.discard()


def set_paused(on: Chain, connector: connect.Connector, paused: bool, timeout: float = 60) -> None:
    """Pause or resume the connector, and wait until its task says so."""
    verb, wanted = ("pause", "PAUSED") if paused else ("resume", "RUNNING")
    connect.request(on.worker, "PUT", f"/connectors/{connector.name}/{verb}")
    deadline = time.monotonic() + timeout
    while True:
        status = connect.request(on.worker, "GET", f"/connectors/{connector.name}/status")
        states = {status["connector"]["state"], *(task["state"] for task in status["tasks"])}
        if states == {wanted}:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"connector {connector.name} not {wanted}: {status}")
        time.sleep(0.2)


def copy_rows(cluster: postgres.Cluster, rows: Sequence[Row]) -> float:
    """Commit `rows` in transactions of `COPY_ROWS`; rows committed a second."""
    started = time.monotonic()
    with psycopg.connect(postgres.dsn(cluster, postgres.APP)) as connection:
        for at in range(0, len(rows), COPY_ROWS):
            with (
                connection.transaction(),
                connection.cursor() as cursor,
                cursor.copy("COPY events (id, type, ts, value) FROM STDIN") as copy,
            ):
                for row in rows[at : at + COPY_ROWS]:
                    copy.write_row((row.id, row.type, row.ts, row.value))
    return len(rows) / (time.monotonic() - started)


@asynccontextmanager
async def running_worker(cdc: CdcRun) -> AsyncIterator[int]:
    """The run's pairstream worker, ready; its pid. Stopped at the end."""
    worker = start_worker(cdc.run.log_path, cdc.run.env)
    try:
        await wait_ready(cdc.run.log_path, worker)
        yield worker.pid
    finally:
        stop_worker(worker)


async def fill_change_topic(on: Chain, cdc: CdcRun, rows: Sequence[Row], timeout: float) -> float:
    """The rows as a backlog, the connector resumed with no worker running: rows/s into
    the change topic, from the first seen there to the last (its partitions' last stable
    offsets summed, a transaction's markers among them: one per partition it wrote)."""
    set_paused(on, cdc.connector, paused=True)
    copy_rows(on.cluster, rows)
    partitions = [TP(cdc.connector.change_topic, p) for p in range(cdc.conf.events_partitions)]
    set_paused(on, cdc.connector, paused=False)
    progress = Samples()
    started = time.monotonic()
    while (written := sum((await end_offsets(cdc.conf, partitions)).values())) < len(rows):
        progress.samples.append((time.monotonic() - started, written))
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{written:,} of {len(rows):,} rows in {cdc.connector.change_topic}")
        await asyncio.sleep(0.1)
    progress.samples.append((time.monotonic() - started, written))
    return progress.through_rate(len(rows))


async def rows_through(cdc: CdcRun, rows: int, timeout: float) -> float:
    """Rows/s through both of the run's worker's stages (running), first to last."""
    started = time.monotonic()
    progress = Samples()
    while (done := await through_pairing(cdc.run.stats_url)) < rows:
        progress.samples.append((time.monotonic() - started, done))
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{done:,} of {rows:,} rows through; see {cdc.run.log_path}")
        await asyncio.sleep(0.25)
    progress.samples.append((time.monotonic() - started, done))
    return progress.through_rate(rows)


async def run_cdc_throughput(on: Chain, records: list[Record], timeout: float) -> CdcThroughput:
    """One JSON run over `records`; Connect alone, then a worker alone, over their rows;
    then the chain over them."""
    json_run = await run_worker(on.bootstrap, records, DEFAULT_COMMIT_INTERVAL, timeout)
    rows = rows_of(records)
    halves = await cdc_run(on, "bench-cdc-halves")
    connect_rate = await fill_change_topic(on, halves, rows, timeout)
    async with running_worker(halves):
        drain_rate = await rows_through(halves, len(rows), timeout)
    await discard(on, halves)
    cdc = await cdc_run(on, "bench-cdc")
    set_paused(on, cdc.connector, paused=True)
    insert_rate = copy_rows(on.cluster, rows)
    async with running_worker(cdc) as pid:
        connect_pid = connect.alive(on.worker)
        assert connect_pid is not None
        before = {"worker": cpu_seconds(pid), "Connect": cpu_seconds(connect_pid)}
        set_paused(on, cdc.connector, paused=False)
        chain_rate = await rows_through(cdc, len(rows), timeout)
        after = {"worker": cpu_seconds(pid), "Connect": cpu_seconds(connect_pid)}
    await discard(on, cdc)
    return CdcThroughput(
        len(rows),
        chain_rate,
        connect_rate,
        drain_rate,
        json_run.events,
        json_run.through_rate,
        insert_rate,
        {name: after[name] - before[name] for name in before},
    )


@dataclass
class RowLoad:
    """Partners inserted into the events table: each key's A and B rows in one
    transaction with the other keys due, one transaction every `TICK`."""

    connection: psycopg.AsyncConnection[tuple[object, ...]]

    async def _commit(self, numbers: range) -> float:
        """The rows of keys `numbers`, committed; when the COMMIT returned."""
        rows = [
            (f"{kind}-{number}", kind, partner_time(number), "1")
            for number in numbers
            for kind in ("A", "B")
        ]
        async with self.connection.transaction(), self.connection.cursor() as cursor:
            await cursor.executemany(INSERT, rows)
        return time.monotonic()

    async def first(self) -> str:
        await self._commit(range(1))
        return "A-0"

    async def offer(self, rate: float, seconds: float, first: int) -> dict[str, float]:
        sent: dict[str, float] = {}
        async for numbers in paced(rate, seconds, first):
            if numbers:
                committed = await self._commit(numbers)
                sent.update((f"A-{number}", committed) for number in numbers)
        return sent


async def run_cdc_latency(on: Chain, offered: list[Level], seconds: float) -> list[LatencyResult]:
    """The chain at each level in turn: COMMIT to the pair visible. A first level at the
    highest rate, not returned, warms Connect's JVM up: fresh, its first seconds under
    load lagged by seconds (JIT compilation), which a level's warm-up does not cover."""
    cdc = await cdc_run(on, "bench-cdc-latency")
    async with (
        running_worker(cdc) as pid,
        OutputReader(cdc.conf) as reader,
        await psycopg.AsyncConnection.connect(postgres.dsn(on.cluster, postgres.APP)) as db,
    ):
        connect_pid = connect.alive(on.worker)
        pids = watched_pids(on.bootstrap, pid)
        if connect_pid is not None:
            pids["Connect"] = connect_pid
        results = await measure_levels(
            RowLoad(db),
            pairstream_pairs(reader),
            CDC_SETUP,
            [max(offered, key=lambda level: level.rate), *offered],
            seconds,
            Watched(pids, lambda: worker_commits(cdc.run.stats_url)),
        )
    await discard(on, cdc)
    return results[1:]


def main(argv: list[str] | None = None) -> None:
    parser = part_parser("python -m bench.cdc", __doc__)
    parser.add_argument(
        "--rows", type=int, default=200_000, help="records generated (default 200,000)"
    )
    parser.add_argument("--rates", default="1000,5000", help="rows/s for the latency levels")
    parser.add_argument("--seconds", type=float, default=30.0, help="of each latency level")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args(argv)

    async def measure() -> None:
        async with chain(args.bootstrap) as on:
            if not args.skip_throughput:
                found = await run_cdc_throughput(on, workload(args.rows), 3600)
                print(
                    f"CDC chain {found.rate:,.0f} rows/s first to last ({found.rows:,} rows),"
                    f" JSON {found.json_rate:,.0f} events/s ({found.json_events:,} events):"
                    f" {found.rate / found.json_rate:.2f}x; alone: Connect"
                    f" {found.connect_rate:,.0f} rows/s, the worker {found.drain_rate:,.0f}"
                    f" rows/s ({found.drain_rate / found.json_rate:.2f}x); backlog committed at"
                    f" {found.insert_rate:,.0f} rows/s; CPU s "
                    + ", ".join(f"{name} {cpu:.1f}" for name, cpu in found.cpu.items()),
                    flush=True,
                )
            levels = [Level(float(rate)) for rate in args.rates.split(",")]
            for result in await run_cdc_latency(on, levels, args.seconds):
                print(
                    f"{result.level.rate:,.0f} rows/s: {result.pairs:,} pairs,"
                    f" p50 {result.p50:.3f} s,"
                    f" p90 {result.p90:.3f} s, p99 {result.p99:.3f} s, max {result.max:.3f} s; CPU "
                    + ", ".join(f"{name} {share:.0%}" for name, share in result.cpu.items()),
                    flush=True,
                )

    asyncio.run(measure())


if __name__ == "__main__":
    main()
