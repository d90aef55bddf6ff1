"""The whole change data capture chain, with faults (docs/cdc.md): rows committed in
PostgreSQL, in transactions of mixed sizes, some rolled back; Debezium on Kafka Connect;
a pairstream worker reading the change topic; the Delta replica. Mid-stream the Connect
worker is killed with SIGKILL, PostgreSQL restarted, a column added to the table and the
pairstream worker killed with SIGKILL. Every committed row gives exactly one outcome,
nothing of a rolled-back transaction appears anywhere, and the replica equals the table."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from analytics.replica import reconcile_replica, replicate
from app.settings import Settings
from pairing.changes import parse_change
from pairing.events import Event
from tests.integration.harness import (
    Pipeline,
    compare,
    database_settings,
    dead_lettered_bytes,
    finish,
    read_partitions,
)
from tests.reference_model import Expected
from tools import connect, postgres
from tools.cdc import Inserted, Row, insert, rows_of
from tools.generate import StreamShape, generate
from tools.ports import free_port

pytestmark = [pytest.mark.broker, pytest.mark.fault]

RECORDS = 50_000
RATE = 2_500.0  # rows a second: faults strike while changes flow
TAG = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def connect_worker(broker: str) -> Iterator[connect.Worker]:
    worker = connect.Worker(f"test-{TAG}", free_port())
    connect.start(worker, Settings(broker=f"kafka://{broker}").kafka)
    yield worker
    connect.stop(worker, grace=5)


def kill_connect(worker: connect.Worker, conf: Settings) -> None:
    pid = connect.alive(worker)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while connect.alive(worker):
        time.sleep(0.05)  # until the kernel has reaped it
    connect.start(worker, conf.kafka)


async def test_every_committed_row_one_outcome_through_kills(
    broker: str,
    tmp_path: Path,
    database: postgres.Cluster,
    connect_worker: connect.Worker,
    spark: SparkSession,
) -> None:
    loaded = connect.load_connector()
    connector = connect.Connector(
        f"events-{TAG}",
        {**loaded.config, "topic.prefix": f"cdc{TAG}", "slot.name": f"slot_{TAG}"},
    )
    pipeline = Pipeline(
        broker,
        tmp_path,
        PAIRSTREAM_EVENTS_FORMAT="debezium",
        PAIRSTREAM_EVENTS_TOPIC=connector.change_topic,
    )
    await pipeline.create_topics()  # the change topic too, with its 8 partitions
    conf = pipeline.conf.model_copy(
        update={"lake_dir": tmp_path / "lake", **database_settings(database)}
    )
    rows = rows_of(generate(StreamShape(count=RECORDS, seed=41, conflicts=0)))
    cut = [int(len(rows) * share) for share in (0.1, 0.35, 0.6, 0.8)]
    phases = [rows[a:b] for a, b in zip([0, *cut], [*cut, len(rows)], strict=True)]
    done = Inserted([], [])

    def add(part: list[Row], seed: int) -> None:
        inserted = insert(conf, part, seed, RATE)
        done.committed.extend(inserted.committed)
        done.rolled_back.extend(inserted.rolled_back)

    add(phases[0], 1)  # in the table before the connector: its snapshot reads them
    connect.register(connect_worker, connect.postgres_database(database.name), connector)
    assert connect.check(connect_worker, connector).running
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await asyncio.to_thread(add, phases[1], 2)
        await asyncio.to_thread(kill_connect, connect_worker, conf)
        await asyncio.to_thread(add, phases[2], 3)
        postgres.stop(database)
        postgres.start(database)
        # The table changes shape mid-stream: the connector, the worker and the replica
        # read the columns they know and pass over the new one.
        with psycopg.connect(postgres.dsn(database, postgres.SUPERUSER)) as owner:
            owner.execute("ALTER TABLE events ADD COLUMN note text DEFAULT 'added mid-stream'")
        await asyncio.to_thread(add, phases[3], 4)
        worker.kill()
        worker.start()
        await asyncio.to_thread(add, phases[4], 5)
        state = connect.check(connect_worker, connector, timeout=120)
        assert state.running, state.summary
        expected = await wait_for_changes(pipeline, done)
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}

    committed = {row.id for row in done.committed}
    rolled_back = {row.id for row in done.rolled_back}
    outcomes = Counter(
        [p["a_id"] for p in outputs.pairs]
        + [p["b_id"] for p in outputs.pairs]
        + [u["id"] for u in outputs.unpaired]
        + [d["id"] for d in outputs.dead_letters if d["reason"].startswith("conflict")]
        # A committed row that is no valid event (the generator's year-9999 one).
        + [dead_row(d) for d in outputs.dead_letters if not d["reason"].startswith("conflict")]
    )
    print(
        f"\n{len(committed):,} rows committed, {len(rolled_back):,} rolled back;"
        f" {sum(outcomes.values()):,} outcomes, {len(expected.pending):,} pending,"
        f" {len(expected.held_late):,} late and held"
    )
    assert len(rolled_back) > 100 and not outcomes.keys() & rolled_back
    assert all(count == 1 for count in outcomes.values())
    # The rest wait: pending, or late and held until their key closes (the model's too).
    waiting = expected.pending | expected.held_late
    assert outcomes.keys() | waiting == committed
    assert not outcomes.keys() & waiting

    replicate(spark, conf)
    verdict = reconcile_replica(spark, conf)
    print(verdict.summary())
    assert verdict.ok and verdict.table_rows == len(committed)


def dead_row(letter: dict[str, Any]) -> str:
    """The id of the row whose change a (non-conflict) dead letter holds."""
    change = json.loads(dead_lettered_bytes(letter) or b"null")
    row: dict[str, str] = change["after"] or change["before"]
    return row["id"]


async def wait_for_changes(pipeline: Pipeline, done: Inserted, timeout: float = 180) -> Expected:
    """The model over the change topic once every committed row is in it; no row of a
    rolled-back transaction may be."""
    committed = {row.id for row in done.committed}
    rolled_back = {row.id for row in done.rolled_back}
    deadline = time.monotonic() + timeout
    while True:
        landed = await read_partitions(pipeline.conf, pipeline.conf.events_topic)
        events = [parse_change(value, 65_536) for partition in landed for _, value in partition]
        ids = {event.identity for event in events if isinstance(event, Event)}
        assert not ids & rolled_back
        if committed <= ids:
            return pipeline.model([[value for _, value in partition] for partition in landed])
        assert time.monotonic() < deadline, (
            f"{len(committed - ids)} committed rows not in the topic"
        )
        await asyncio.sleep(2)  # polling the change topic
