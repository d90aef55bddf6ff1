"""The input topic as it is (docs/event-time.md): a worker takes an existing input's
partition count from the broker, whatever PAIRSTREAM_EVENTS_PARTITIONS says, and an
input grown while workers run (or while they are stopped) goes on under the same app
id. The outputs equal the model over the partitions as they landed."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewPartitions, NewTopic

from app.kafka.admin import admin_client
from app.kafka.connection import KafkaConnection
from app.kafka.partitioner import default_partition
from app.settings import Settings
from pairing.events import Event
from pairing.grammar import Sizes
from pairing.records import HANDED_WATERMARK_KEY, WATERMARK_KEY, decode_watermark, loads
from tests.integration.harness import (
    Pipeline,
    Worker,
    compare,
    finish,
    secured_pipeline,
    stop_workers,
    wait_for_outputs,
)
from tests.integration.test_event_time import DRAINS, LIVE_RATE, RECORDS, stream
from tests.reference_model import Reading
from tools import broker as local_broker
from tools.generate import Record
from tools.read_outputs import OutputReader

pytestmark = pytest.mark.broker

BEFORE, AFTER = 4, 8
MAX_BYTES = 1 << 20  # above any generated record
# Events as ingest reads them, the clock guard included: the generator's far-future event
# is refused, so it neither moves a partition's progress nor stands as the largest time.
READ = Reading(Sizes(value_bytes=MAX_BYTES), max_ahead_us=int(Settings().max_ahead_seconds * 1e6))
# The stream pauses while the workers learn of the growth and the group rebalances
# twice: max wait, timed on the keyed records, must not close keys meanwhile.
SETTINGS = {**DRAINS, "PAIRSTREAM_MAX_WAIT_SECONDS": "60"}


async def grow_input(pipeline: Pipeline, partitions: int) -> None:
    async with admin_client(pipeline.conf) as admin:
        await admin.create_partitions({pipeline.conf.events_topic: NewPartitions(partitions)})


async def told_everywhere(pipeline: Pipeline, sources: int, timeout: float = 120) -> None:
    """Wait until every keyed partition has a watermark record that counts `sources`
    input partitions: from then on the new ones hold the watermark."""
    conf = pipeline.conf
    consumer = AIOKafkaConsumer(**conf.kafka.aiokafka(), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(conf.keyed_topic, p) for p in range(conf.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        waiting = set(partitions)
        deadline = time.monotonic() + timeout
        while waiting:
            assert time.monotonic() < deadline, f"{sorted(waiting)} not told of {sources}"
            batches = await consumer.getmany(*waiting, timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    is_watermark = record.key in (WATERMARK_KEY, HANDED_WATERMARK_KEY)
                    if is_watermark and told(record.value, sources):
                        waiting.discard(tp)
    finally:
        await consumer.stop()


def told(value: bytes | None, sources: int) -> bool:
    doc = loads(value or b"{}")
    return "watermark" in doc and decode_watermark(doc).sources >= sources


def placed(records: list[Record], partitions: int, seed: int) -> list[tuple[Record, int]]:
    """Each record with its partition: by key as the producer's partitioner places it,
    at random when it has none."""
    rng = random.Random(seed)
    every = list(range(partitions))
    return [
        (r, default_partition(r[0], every) if r[0] is not None else rng.choice(every))
        for r in records
    ]


def joining_at_the_watermark(
    records: list[tuple[Record, int]], new: set[int], watermark_us: int, expiry_us: int
) -> tuple[list[tuple[Record, int]], int]:
    """The records, without those that a partition added while the stream ran cannot
    take on time: a new partition joins the watermark as it stands (docs/event-time.md),
    so an event there that is on time by its own partition's progress, yet whose key's
    window the watermark had closed before the partition was heard of, comes out late,
    where the model (every partition there from the start) takes it on time. Of the
    generator's stream those are the first held-back events to land on a new partition
    (about 1% of events are held back by more than the expiry). Returns the records
    kept and how many were left out."""
    progress: dict[int, int] = {}
    kept: list[tuple[Record, int]] = []
    for (key, value), partition in records:
        event = READ.read(value)
        if partition in new and isinstance(event, Event):
            stamp = max(progress.get(partition, event.time_us), event.time_us)
            on_time = stamp - event.time_us <= expiry_us
            if on_time and event.time_us + expiry_us <= watermark_us:
                continue
            progress[partition] = stamp
        kept.append(((key, value), partition))
    return kept, len(records) - len(kept)


async def produce_placed(
    kafka: KafkaConnection, topic: str, records: list[tuple[Record, int]], rate: float
) -> None:
    producer = AIOKafkaProducer(**kafka.aiokafka(), enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        started = time.monotonic()
        for n, ((key, value), partition) in enumerate(records, 1):
            await producer.send(topic, value, key=key, partition=partition)
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
        await producer.flush()
    finally:
        await producer.stop()


def largest_time_us(records: list[Record]) -> int:
    times = [e.time_us for _, v in records if isinstance(e := READ.read(v), Event)]
    return max(times)


async def test_an_input_grown_from_4_to_8_partitions_while_it_flows_matches_the_model(
    secure_broker: list[local_broker.Node], tmp_path: Path
) -> None:
    """On the secured broker, so also: the workers grow the source-progress changelog
    with the ACLs docs/deploy.md lists, and no more."""
    overrides = {"PAIRSTREAM_EVENTS_PARTITIONS": str(BEFORE), **SETTINGS}
    await grows_while_it_flows(await secured_pipeline(secure_broker, tmp_path, **overrides))


async def grows_while_it_flows(pipeline: Pipeline) -> None:
    """Two workers on the 4-partition input with a backlog, the stream going on live,
    the input grown to 8, the rest of the stream over all 8."""
    conf = pipeline.conf
    records = stream(RECORDS)
    backlog, live, grown = (
        records[: RECORDS // 4],
        records[RECORDS // 4 : RECORDS // 2],
        records[RECORDS // 2 :],
    )
    await pipeline.produce(backlog)  # in the topic when the workers start
    workers: list[Worker] = [pipeline.worker(i) for i in range(2)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            await worker.wait_ready()
        await pipeline.produce(live, rate=LIVE_RATE)
        await grow_input(pipeline, AFTER)
        await told_everywhere(pipeline, AFTER)
        expiry_us = int(conf.expiry_seconds * 1_000_000)
        kept, left_out = joining_at_the_watermark(
            placed(grown, AFTER, seed=7),
            set(range(BEFORE, AFTER)),
            largest_time_us(backlog + live),
            expiry_us,
        )
        await produce_placed(conf.kafka, conf.events_topic, kept, LIVE_RATE)
        landed = await pipeline.input_partitions()
        assert len(landed) == AFTER and all(landed[p] for p in range(AFTER))
        expected = await pipeline.expected(drained=True)
        outputs = await finish(pipeline, workers, expected)
    finally:
        for worker in workers:
            worker.kill()
    assert compare(outputs, expected) == {}
    assert left_out < RECORDS // 100
    late = sum(n for key, n in expected.unpaired.items() if key[3] == "late")
    assert late > 0 and expected.pairs.total() > RECORDS // 3


async def partition_counts(pipeline: Pipeline, topics: list[str]) -> dict[str, int]:
    async with admin_client(pipeline.conf) as admin:
        described = await admin.describe_topics(topics)
    return {t["topic"]: len(t["partitions"]) for t in described}


async def test_an_existing_input_is_taken_as_it_is_and_may_grow_while_the_worker_is_stopped(
    broker: str, tmp_path: Path
) -> None:
    """The setting says 8, the input has 3: the worker runs on 3. Stopped part-way,
    the input grows to 5 and the stream goes on over all 5; started again, the worker
    grows its source-progress changelog to 5 before it joins."""
    # No pause while the stream flows here: the worker learns of the growth as it starts.
    pipeline = Pipeline(broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="8", **DRAINS)
    conf = pipeline.conf
    async with admin_client(conf) as admin:
        await admin.create_topics([NewTopic(conf.events_topic, 3, 1)])
    await pipeline.create_topics()
    records = stream(RECORDS)
    first, rest = records[: RECORDS // 2], records[RECORDS // 2 :]
    await pipeline.produce(first)
    changelog = f"{conf.app_id}-source-progress-changelog"
    worker = pipeline.worker()
    try:
        worker.start()
        await worker.wait_ready()
        async with OutputReader(conf) as reader:
            await wait_for_outputs(reader, RECORDS // 10, timeout=300)
        await stop_workers([worker])
        assert await partition_counts(pipeline, [conf.events_topic, changelog]) == {
            conf.events_topic: 3,
            changelog: 3,
        }
        await grow_input(pipeline, 5)
        kept, left_out = joining_at_the_watermark(
            placed(rest, 5, seed=11), {3, 4}, largest_time_us(first), int(conf.expiry_seconds * 1e6)
        )
        await produce_placed(conf.kafka, conf.events_topic, kept, LIVE_RATE)
        worker.start()
        expected = await pipeline.expected(drained=True)
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}
    assert left_out < RECORDS // 100
    assert await partition_counts(pipeline, [changelog]) == {changelog: 5}
    landed = await pipeline.input_partitions()
    assert len(landed) == 5 and all(landed)
