"""Spark jobs on local[2] against the real broker and real Delta tables."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pyspark.sql import SparkSession

from analytics.ingest import ingest, sources
from analytics.lake import Lake
from analytics.reconcile import reconcile
from analytics.windows import outcomes, window_tables, windows
from app.exactly_once.handoff import FENCE_KEY
from app.settings import Settings
from pairing.events import Event, parse_event
from pairing.records import HANDED_WATERMARK_KEY, TICK, WATERMARK_KEY, decode_keyed_event
from tests.integration.harness import (
    ROOT,
    Pipeline,
    expected_total,
    kill_group,
    read_partitions,
    wait_for_outputs,
)
from tools import spark_cluster
from tools.generate import Record, StreamShape, generate
from tools.ports import free_port
from tools.read_outputs import OutputReader

pytestmark = pytest.mark.broker

# Keyed records that are no event: watermarks (read or handed) and the hand-off's fences.
CONTROL_KEYS = (WATERMARK_KEY, HANDED_WATERMARK_KEY, FENCE_KEY)


async def processed_pipeline(broker: str, tmp: Path) -> Pipeline:
    """A pipeline that has processed a generated stream; its worker is stopped."""
    pipeline = await Pipeline(broker, tmp).create_topics()
    records = generate(StreamShape(count=3000, seed=44))
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await pipeline.produce(records)
        async with OutputReader(pipeline.conf) as reader:
            await wait_for_outputs(reader, expected_total(await pipeline.expected()), 180)
        worker.stop()
    finally:
        worker.kill()
    return pipeline


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipeline(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    """Shared by the tests that only read its topics; a test that adds records to a
    topic or moves the group's offsets makes its own."""
    return await processed_pipeline(broker, tmp_path_factory.mktemp("analytics"))


async def read_all(pipeline: Pipeline, topic: str) -> list[Record]:
    return [r for partition in await read_partitions(pipeline.conf, topic) for r in partition]


def lake_conf(pipeline: Pipeline, lake: Path, **extra: Any) -> Settings:
    return pipeline.conf.model_copy(update={"lake_dir": lake, **extra})


def bronze_offsets(spark: SparkSession, conf: Settings, name: str) -> list[tuple[int, int]]:
    rows = spark.read.format("delta").load(Lake.of(conf).bronze(name)).collect()
    return [(row.partition, row.offset) for row in rows]


async def topic_size(pipeline: Pipeline, topic: str) -> int:
    return len(await read_all(pipeline, topic))


@pytest.mark.asyncio(loop_scope="module")
async def test_ingest_twice_picks_up_only_new_records(
    spark: SparkSession, broker: str, tmp_path: Path
) -> None:
    pipeline = await processed_pipeline(broker, tmp_path)
    conf = lake_conf(pipeline, tmp_path / "lake")
    first = await asyncio.to_thread(ingest, spark, conf)
    assert first["events"] == await topic_size(pipeline, conf.events_topic)
    assert first["pairs"] == await topic_size(pipeline, conf.pairs_topic) > 0
    more = generate(StreamShape(count=200, seed=45))
    await pipeline.produce(more)
    second = await asyncio.to_thread(ingest, spark, conf)
    assert second["events"] == first["events"] + len(more)
    assert second["pairs"] == first["pairs"]  # no worker ran: nothing new there
    offsets = bronze_offsets(spark, conf, "events")
    assert len(offsets) == len(set(offsets)) == second["events"]


@pytest.mark.asyncio(loop_scope="module")
async def test_ingest_killed_mid_write_then_rerun_loses_and_duplicates_nothing(
    spark: SparkSession, pipeline: Pipeline, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    env = {
        **os.environ,
        **pipeline.env_vars,
        "PAIRSTREAM_LAKE_DIR": str(lake),
        "PAIRSTREAM_SPARK_MASTER": "local[2]",
        "PAIRSTREAM_INGEST_MAX_RECORDS_PER_BATCH": "300",  # many small Delta commits
    }
    command = [sys.executable, "-m", "analytics", "ingest"]
    log = (tmp_path / "ingest.log").open("wb")
    job = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    events_log = lake / "bronze" / "events" / "_delta_log"
    deadline = time.monotonic() + 300
    while len(list(events_log.glob("*.json"))) < 3:  # killed after some commits, mid-run
        assert job.poll() is None, (tmp_path / "ingest.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "ingest made no progress"
        await asyncio.sleep(0.05)  # polling the Delta log
    kill_group(job)  # with its JVM, which otherwise commits on into the rerun's batches
    # The rerun takes the rest in one batch per topic: small batches were only needed
    # to have a kill land between commits. It runs in the tests' session: the killed
    # run was the CLI already, and a second cold JVM took 60-120 s of the test.
    conf = lake_conf(pipeline, lake)
    await asyncio.to_thread(ingest, spark, conf)
    for name, topic in sources(conf).items():
        offsets = bronze_offsets(spark, conf, name)
        assert len(offsets) == len(set(offsets)), f"{name}: duplicated rows"
        assert len(offsets) == await topic_size(pipeline, topic), f"{name}: lost rows"


def windows_by_hand(
    times: dict[str, list[datetime]], conf: Settings
) -> dict[str, dict[datetime, Counter[str]]]:
    """The same windows in plain Python: window start -> counts per kind."""
    tumbling: dict[datetime, Counter[str]] = {}
    hopping: dict[datetime, Counter[str]] = {}
    session: dict[datetime, Counter[str]] = {}
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    size = timedelta(seconds=conf.tumbling_window_seconds)
    hop, slide = (
        timedelta(seconds=conf.hopping_window_seconds),
        timedelta(seconds=conf.hopping_slide_seconds),
    )
    everything = sorted((t, kind) for kind, ts in times.items() for t in ts)
    gap = timedelta(seconds=conf.session_gap_seconds)
    start = end = None
    for t, kind in everything:
        tumbling.setdefault(epoch + (t - epoch) // size * size, Counter())[kind] += 1
        last_start = epoch + (t - epoch) // slide * slide
        s = last_start
        while s > t - hop:
            hopping.setdefault(s, Counter())[kind] += 1
            s -= slide
        if end is None or t >= end:
            start = t
        end = t + gap if end is None or t + gap > end else end
        assert start is not None
        session.setdefault(start, Counter())[kind] += 1
    return {"tumbling": tumbling, "hopping": hopping, "session": session}


def sliding_by_hand(times: dict[str, list[datetime]], seconds: int) -> dict[datetime, int]:
    """Pairs in [t - seconds, t] for each distinct event time t."""
    pairs = sorted(times["pair"])
    instants = sorted({t for ts in times.values() for t in ts})
    span = timedelta(seconds=seconds)
    return {t: sum(1 for p in pairs if t - span <= p <= t) for t in instants}


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.asyncio(loop_scope="module")
async def test_windows_match_a_plain_python_computation(
    spark: SparkSession, pipeline: Pipeline, tmp_path: Path
) -> None:
    conf = lake_conf(pipeline, tmp_path / "lake")
    await asyncio.to_thread(ingest, spark, conf)
    await asyncio.to_thread(windows, spark, conf)
    async with OutputReader(pipeline.conf) as reader:
        outputs = await reader.read_available()
    keyed = await read_all(pipeline, sources(conf)["keyed"])
    times: dict[str, list[datetime]] = {
        "pair": [parse_time(p["timestamp"]) for p in outputs.pairs],
        "expired": [
            parse_time(u["timestamp"]) for u in outputs.unpaired if u["reason"] == "expired"
        ],
        "late": [parse_time(u["timestamp"]) for u in outputs.unpaired if u["reason"] == "late"],
        "valid": [
            parse_time(decode_keyed_event(v).event.key)
            for k, v in keyed
            if v and k not in CONTROL_KEYS and v != TICK
        ],
    }
    assert all(times.values())
    expected = windows_by_hand(times, conf)
    lake = Lake.of(conf)
    for kind in ("tumbling", "hopping", "session"):
        rows = spark.read.format("delta").load(lake.gold(f"windows_{kind}")).collect()
        got = {
            row.window_start.replace(tzinfo=UTC): (row.pairs, row.expired, row.late, row.valid)
            for row in rows
        }
        want = {
            start: (c["pair"], c["expired"], c["late"], c["valid"])
            for start, c in expected[kind].items()
        }
        assert got == want, kind
    sliding = spark.read.format("delta").load(lake.gold("windows_sliding")).collect()
    got_sliding = {row.window_end.replace(tzinfo=UTC): row.pairs for row in sliding}
    assert got_sliding == sliding_by_hand(times, conf.sliding_window_seconds)
    assert lake.chart.stat().st_size > 0


def test_window_sums_are_exact_or_counted_apart(spark: SparkSession, tmp_path: Path) -> None:
    """Sums `decimal(38,18)` holds exactly are summed; the others (1e30 + 12.34, 400
    digits, 22 places) are counted in pairs_unsummed, never rounded or taken for 0."""
    conf = Settings(lake_dir=tmp_path / "lake")
    lake = Lake.of(conf)
    at = "2024-02-09T21:00:00.000000Z"
    sums = ["12.34", "-2.000000000000000001", "1000000000000000000000000000012.34",
            "9" * 400, "0.1234567890123456789012"]  # fmt: skip
    pairs = [
        (f'{{"timestamp": "{at}", "sum": {text}, "a_id": "a{i}", "b_id": "b{i}",'
         f' "paired_at": "{at}"}}').encode()
        for i, text in enumerate(sums)
    ]  # fmt: skip
    schema = (
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"
    )
    for name, values in (("pairs", pairs), ("unpaired", []), ("keyed", [])):
        rows = [("t", 0, offset, datetime.now(UTC), None, v) for offset, v in enumerate(values)]
        spark.createDataFrame(rows, schema).write.format("delta").save(lake.bronze(name))
    windows(spark, conf)
    for kind in ("tumbling", "sliding"):
        (row,) = spark.read.format("delta").load(lake.gold(f"windows_{kind}")).collect()
        assert (row.pairs, row.pairs_unsummed) == (5, 3), kind
        assert row.pair_sum == Decimal("10.339999999999999999"), kind
        assert abs(row.pair_mean - row.pair_sum / 2) < Decimal("1e-17"), kind  # of 2 sums


def write_pairs(spark: SparkSession, lake: Lake, times: list[datetime]) -> None:
    """Bronze pairs at `times` (unpaired and keyed empty), as ingest lands them."""
    schema = (
        "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"
    )
    pairs = []
    for i, t in enumerate(times):
        at = t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        pairs.append(
            f'{{"timestamp": "{at}", "sum": 1, "a_id": "a{i}", "b_id": "b{i}",'
            f' "paired_at": "{at}"}}'.encode()
        )
    for name, values in (("pairs", pairs), ("unpaired", []), ("keyed", [])):
        rows = [("t", 0, offset, datetime.now(UTC), None, v) for offset, v in enumerate(values)]
        spark.createDataFrame(rows, schema).write.format("delta").save(lake.bronze(name))


def test_sliding_and_session_windows_are_spread_and_exact_across_buckets(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Pairs over five hours, many within a look-back of an hour's start (where the
    buckets meet): each sliding window counts exactly the pairs in [t - 300 s, t], each
    session window those of its session, and no plan of the gold windows has a
    single-partition exchange (a window over no partition moves every row to one task)."""
    conf = Settings(lake_dir=tmp_path / "lake")
    lake = Lake.of(conf)
    rng = random.Random(78)
    start = datetime(2024, 2, 9, 21, 0, tzinfo=UTC)
    times = [start + timedelta(seconds=rng.randrange(5 * 3600)) for _ in range(400)]
    times += [start + timedelta(hours=h, seconds=s) for h in (1, 2, 3) for s in (-300, -1, 0, 1)]
    write_pairs(spark, lake, times)
    windows(spark, conf)
    sliding = spark.read.format("delta").load(lake.gold("windows_sliding")).collect()
    got = {row.window_end.replace(tzinfo=UTC): row.pairs for row in sliding}
    assert got == sliding_by_hand({"pair": times}, conf.sliding_window_seconds)
    session = spark.read.format("delta").load(lake.gold("windows_session")).collect()
    got_sessions = {row.window_start.replace(tzinfo=UTC): row.pairs for row in session}
    by_hand = windows_by_hand({"pair": times}, conf)["session"]
    assert got_sessions == {start: counts["pair"] for start, counts in by_hand.items()}
    assert len(got_sessions) > 3  # sessions that end, and ones across buckets
    for name, table in window_tables(outcomes(spark, lake), conf).items():
        plan = table._jdf.queryExecution().executedPlan().toString()
        assert "SinglePartition" not in plan, f"{name}:\n{plan}"


def input_event(kind: str, at: str, identity: str, value: int) -> bytes:
    return json.dumps({"type": kind, "timestamp": at, "value": value, "id": identity}).encode()


def pairing_key(raw: bytes) -> str:
    event = parse_event(raw, 65536)
    assert isinstance(event, Event)
    return event.key


# Valid inputs the pipeline will be said to have consumed, in this order on one input
# partition: before the stream's first event time (late there), then after its last
# (on time: each is the largest event time of its partition so far).
INPUTS = [
    input_event("A", "2024-02-09 20:59:30", "lost-1", 7),
    input_event("A", "2024-02-09 20:59:40", "late-a", 1),
    input_event("B", "2024-02-09 20:59:40", "late-b", 2),
    input_event("A", "2024-02-09 23:00:00", "on-time-a", 3),
    input_event("B", "2024-02-09 23:00:00", "on-time-b", 4),
]
LATE_KEY, ON_TIME_KEY = pairing_key(INPUTS[1]), pairing_key(INPUTS[3])


def wrong_outputs(conf: Settings) -> list[tuple[str, bytes]]:
    """For those inputs: none for lost-1; a pair of the two late events; and for the
    on-time A and B, what a pipeline that took them for late would give."""
    late_pair = {"timestamp": LATE_KEY, "a_value": 1, "b_value": 2, "sum": 3, "a_id": "late-a"}
    late_pair |= {"b_id": "late-b", "paired_at": "2024-02-09T21:30:00Z"}
    late_a = {"timestamp": ON_TIME_KEY, "type": "A", "value": 3, "id": "on-time-a"}
    expired_b = {"timestamp": ON_TIME_KEY, "type": "B", "value": 4, "id": "on-time-b"}
    return [
        (conf.pairs_topic, json.dumps(late_pair).encode()),
        (conf.unpaired_topic, json.dumps(late_a | {"reason": "late"}).encode()),
        (conf.unpaired_topic, json.dumps(expired_b | {"reason": "expired"}).encode()),
    ]


async def write(conf: Settings, records: list[tuple[str, bytes]], partition: int | None) -> int:
    """Straight to the topics, outside any transaction; the offset of the last."""
    producer = AIOKafkaProducer(**conf.kafka.aiokafka())
    await producer.start()
    try:
        for topic, value in records:
            sent = await producer.send_and_wait(topic, value, partition=partition)
    finally:
        await producer.stop()
    return int(sent.offset)


@pytest.mark.asyncio(loop_scope="module")
async def test_reconciliation_is_clean_then_a_cluster_run_reports_exactly_the_injected_faults(
    spark: SparkSession, broker: str, tmp_path: Path
) -> None:
    pipeline = await processed_pipeline(broker, tmp_path)
    conf = lake_conf(pipeline, tmp_path / "lake")
    await asyncio.to_thread(ingest, spark, conf)
    clean = await asyncio.to_thread(reconcile, spark, conf)
    assert clean.ok, clean.summary()
    assert clean.counts["settled"] > 1000  # most of the stream is past the watermark
    # Real late and expired events were judged, and found right.
    assert clean.counts["unpaired_late"] > 0 and clean.counts["unpaired_expired"] > 0

    # A duplicate pair, and the injected inputs with their wrong outputs. The group's
    # committed offset moves past the inputs: "consumed".
    async with OutputReader(pipeline.conf) as reader:
        pair = (await reader.read_available()).pairs[0]
    pair_bytes = next(
        v for _, v in await read_all(pipeline, conf.pairs_topic) if v and pair["a_id"].encode() in v
    )
    await write(conf, [(conf.pairs_topic, pair_bytes), *wrong_outputs(conf)], None)
    last = await write(conf, [(conf.events_topic, raw) for raw in INPUTS], 0)
    await commit_group_offset(conf, TopicPartition(conf.events_topic, 0), last + 1)

    # The faulty run is the CLI's, every job on a standalone cluster: it must exit 1,
    # and record the same verdict as the function would return.
    run = tmp_path / "spark"
    master = await asyncio.to_thread(spark_cluster.start, free_port(), run)
    try:
        env = {**os.environ, **pipeline.env_vars, "PAIRSTREAM_LAKE_DIR": str(conf.lake_dir)}
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "analytics", "all", "--master", master],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        spark_cluster.stop(run)
    assert cli.returncode == 1, cli.stdout[-3000:] + cli.stderr[-3000:]
    assert "DISCREPANCIES FOUND" in cli.stdout
    # The executors ran on the standalone worker, not in the driver.
    assert list((run / "work").glob("app-*")), "no application ran on the worker"
    runs = spark.read.format("delta").load(Lake.of(conf).gold("reconciliation_runs")).collect()
    assert sorted(row.ok for row in runs) == [False, True]
    found = next(row for row in runs if not row.ok).asDict()
    counts = {k.removesuffix("_count"): n for k, n in found.items() if k.endswith("_count")}
    assert {kind: n for kind, n in counts.items() if n} == {
        "duplicate_pair": 1,
        "missing": 1,
        "unexpected_pair": 1,
        "pair_mismatch": 1,  # the pipeline never keyed the late pair's events either
        "wrongly_unpaired": 2,
    }
    detail = spark.read.format("delta").load(Lake.of(conf).gold("reconciliation_discrepancies"))
    subjects = {(row.kind, row.subject, row.detail) for row in detail.collect()}
    assert subjects == {
        ("duplicate_pair", pair["timestamp"], "2"),
        ("missing", "lost-1", "lost-1"),
        ("unexpected_pair", LATE_KEY, "late-a,late-b"),
        ("pair_mismatch", LATE_KEY, "late-a,late-b"),
        ("wrongly_unpaired", "on-time-a", "late"),
        ("wrongly_unpaired", "on-time-b", "expired"),
    }


async def commit_group_offset(conf: Settings, tp: TopicPartition, offset: int) -> None:
    consumer = AIOKafkaConsumer(
        **conf.kafka.aiokafka(), group_id=conf.app_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_reconciliation_that_checks_nothing_does_not_pass(
    spark: SparkSession, pipeline: Pipeline, tmp_path: Path
) -> None:
    # A wrong app id: the group has no committed offsets, so no input counts as consumed.
    conf = lake_conf(pipeline, tmp_path / "lake", app_id="not-the-pairing-app")
    await asyncio.to_thread(ingest, spark, conf)
    verdict = await asyncio.to_thread(reconcile, spark, conf)
    assert not verdict.ok
    assert verdict.discrepancies["nothing_consumed"] == 1
    assert verdict.counts["inputs_consumed"] == 0
    assert verdict.counts["inputs_in_lake"] == await topic_size(pipeline, conf.events_topic)
