"""Topic creation and checks, shared by the worker, the demo and the tests, and a
read_committed probe of a partition."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from faust.types import TP

from app.kafka.replication import replication_factor
from app.settings import Settings

log = logging.getLogger(__name__)
# How long leaving read_committed waits for its consumer to stop; the rest goes on in
# the background (`_stop_in_background`).
STOP_WAIT_SECONDS = 1.0
# The stops still under way: the event loop keeps only weak references to tasks. Not
# processing state: nothing reads it.
_stops_under_way: set[asyncio.Task[None]] = set()


def topic_partitions(conf: Settings) -> dict[str, int]:
    topics = {
        conf.events_topic: conf.events_partitions,
        conf.keyed_topic: conf.partitions,
        conf.pairs_topic: conf.partitions,
        conf.unpaired_topic: conf.partitions,
        conf.dead_letter_topic: conf.partitions,
    }
    extra: list[str] = []
    if conf.delivery_enabled:
        extra += [
            conf.delivery_source,
            conf.delivery_by_id_topic,
            conf.delivery_log_topic,
            conf.delivery_dead_letter_topic,
            conf.delivery_uncertain_topic,
        ]
    if conf.chain_enabled:
        extra += [
            conf.deposits_topic,
            conf.accounts_topic,
            conf.validated_topic,
            conf.deposits_dead_letter_topic,
            conf.deposits_by_account_topic,
            conf.accounts_by_account_topic,
        ]
    if conf.enrichment_enabled:
        extra += [
            conf.sources_topic,
            conf.enriched_topic,
            conf.sources_dead_letter_topic,
            conf.sources_by_partition_topic,
        ]
    if conf.patterns is not None:
        inputs, matches = conf.pattern_topics()
        extra += [*inputs, conf.pattern_events_topic, *matches]
    for name in extra:
        topics.setdefault(name, conf.partitions)
    return topics


def compacted_topics(conf: Settings) -> set[str]:
    """Topics that are tables: only the latest record per key is kept."""
    compacted = {conf.accounts_topic} if conf.chain_enabled else set()
    return compacted | ({conf.sources_topic} if conf.enrichment_enabled else set())


@asynccontextmanager
async def admin_client(conf: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(**conf.kafka.aiokafka())
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def described_partitions(conf: Settings, topics: list[str]) -> dict[str, int]:
    """Each existing topic's partition count; topics that do not exist are left out."""
    async with admin_client(conf) as admin:
        described = await admin.describe_topics(topics)
    return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}


class KeyedPartitionsMismatch(RuntimeError):
    pass


async def check_keyed_partitions(conf: Settings, topics: list[str]) -> None:
    """The keyed topics, the pattern inputs and the changelogs of the state partitioned
    like them, where they exist, have PAIRSTREAM_PARTITIONS partitions: a key's state
    lives in the partition its key routes to over that count, so the count cannot
    change in place."""
    found = await described_partitions(conf, topics)
    wrong = sorted(
        f"{name} has {count}" for name, count in found.items() if count != conf.partitions
    )
    if wrong:
        raise KeyedPartitionsMismatch(
            f"PAIRSTREAM_PARTITIONS is {conf.partitions}, but {', '.join(wrong)}: set it back,"
            " or move the state to more partitions under a new app id (docs/keyed-move.md);"
            " a pattern input has as many partitions too (docs/patterns.md)"
        )


class TopicsNotReady(RuntimeError):
    pass


async def wait_until_ready(conf: Settings, partitions: Mapping[str, int], timeout: float) -> None:
    """Wait until the broker's metadata shows each topic with its `partitions`, each with
    a leader. A topic just created can be missing from it for seconds (seen for 7-10 s on
    a loaded machine), and faust's assignor leaves the partitions of a changelog it does
    not see out of the assignment: the tables then start empty, with no restore."""
    if partitions:
        async with admin_client(conf) as admin:
            await _wait_until_ready(admin, partitions, timeout)


async def _wait_until_ready(
    admin: AIOKafkaAdminClient, partitions: Mapping[str, int], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while missing := await _not_ready(admin, partitions):
        if time.monotonic() > deadline:
            raise TopicsNotReady(
                f"not in the broker's metadata after {timeout:.0f}s: {sorted(missing)}"
            )
        await asyncio.sleep(0.2)  # polling the broker's metadata


async def _not_ready(admin: AIOKafkaAdminClient, partitions: Mapping[str, int]) -> set[str]:
    described = await admin.describe_topics(list(partitions))
    ready = {
        topic["topic"]
        for topic in described
        if topic["error_code"] == 0
        and len(topic["partitions"]) >= partitions[topic["topic"]]
        and all(p["error_code"] == 0 and p["leader"] >= 0 for p in topic["partitions"])
    }
    return set(partitions) - ready


async def ensure_topics(conf: Settings) -> None:
    """Create the pipeline's missing topics (the broker does not auto-create), and wait
    until the broker's metadata shows them."""
    async with admin_client(conf) as admin:
        existing = set(await admin.list_topics())
        compacted = compacted_topics(conf)
        missing = {n: p for n, p in topic_partitions(conf).items() if n not in existing}
        replicas = await replication_factor(conf, admin) if missing else 0
        for name, partitions in missing.items():
            with suppress(TopicAlreadyExistsError):  # another worker made it first
                configs = {"cleanup.policy": "compact"} if name in compacted else {}
                topic = NewTopic(name, partitions, replicas, topic_configs=configs)
                await admin.create_topics([topic])
        if missing:
            await _wait_until_ready(admin, missing, conf.topics_ready_timeout_seconds)


@asynccontextmanager
async def read_committed(conf: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    """A started consumer outside any group that sees committed records only."""
    consumer = AIOKafkaConsumer(
        **conf.kafka.aiokafka(),
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        yield consumer
    finally:
        await _stop_in_background(consumer)


async def _stop_in_background(consumer: AIOKafkaConsumer) -> None:
    """Stop the consumer, waiting at most STOP_WAIT_SECONDS. A TLS connection that uvloop
    closes while a fetch's answer comes in completes its close only after uvloop's SSL
    shutdown timeout, 30 s (5 stops of 40 on the secured broker; none on asyncio's
    loop); the probes after a restart stop such consumers with a partition's steps
    waiting behind them, and a secured worker gave no output for 30 or 60 s."""
    task = asyncio.ensure_future(consumer.stop())
    _stops_under_way.add(task)
    task.add_done_callback(_stopped)
    done, _ = await asyncio.wait({task}, timeout=STOP_WAIT_SECONDS)
    if not done:
        log.info("a read_committed consumer goes on closing its connections in the background")


def _stopped(task: asyncio.Task[None]) -> None:
    _stops_under_way.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("stopping a read_committed consumer failed: %r", task.exception())


async def end_offsets(conf: Settings, tps: list[TP]) -> dict[TP, int]:
    """Each partition's last stable offset, asked of the broker."""
    async with read_committed(conf) as consumer:
        ends = await consumer.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])
    return {TP(tp.topic, tp.partition): offset for tp, offset in ends.items()}


async def committed_records_between(conf: Settings, tp: TP, first: int, last: int) -> bool:
    """Whether a read_committed consumer finds a record in offsets first..last."""
    async with read_committed(conf) as consumer:
        partition = TopicPartition(tp.topic, tp.partition)
        consumer.assign([partition])
        consumer.seek(partition, first)
        deadline = time.monotonic() + 30
        while await consumer.position(partition) <= last:
            if time.monotonic() > deadline:
                return True  # unknown: do not let the restore end on a guess
            batch = await consumer.getmany(partition, timeout_ms=500)
            if any(record.offset <= last for record in batch.get(partition, ())):
                return True
        return False


async def unread_committed(conf: Settings, offsets: Mapping[TP, int], timeout: float) -> set[TP]:
    """Of the partitions in `offsets` (partition -> an offset), those with a committed
    record at or after their offset. Transaction markers and aborted records take offsets
    but are no records. Partitions not found so within `timeout` are left out."""
    found: set[TP] = set()
    if not offsets:
        return found
    async with read_committed(conf) as consumer:
        partitions = {TopicPartition(tp.topic, tp.partition): tp for tp in offsets}
        ends = await consumer.end_offsets(list(partitions))
        reading = {p: ends[p] for p, tp in partitions.items() if ends[p] > offsets[tp]}
        consumer.assign(list(reading))
        for partition in reading:
            consumer.seek(partition, offsets[partitions[partition]])
        deadline = time.monotonic() + timeout
        while reading and time.monotonic() < deadline:
            batches = await consumer.getmany(*reading, timeout_ms=200)
            for partition, records in batches.items():
                if records:
                    found.add(partitions[partition])
                    reading.pop(partition, None)
            for partition, end in list(reading.items()):
                if await consumer.position(partition) >= end:
                    del reading[partition]
    return found


async def last_committed_records(
    conf: Settings, ends: Mapping[TP, int], window: int = 2000
) -> dict[TP, int]:
    """The offset of the last committed record of each partition, found among the
    `window` offsets before its end (a last stable offset); partitions with none there
    are left out. One consumer reads all partitions' tails at once."""
    found: dict[TP, int] = {}
    tails = {TopicPartition(tp.topic, tp.partition): end for tp, end in ends.items() if end > 0}
    if not tails:
        return found
    async with read_committed(conf) as consumer:
        consumer.assign(list(tails))
        for partition, end in tails.items():
            consumer.seek(partition, max(0, end - window))
        deadline = time.monotonic() + 10
        reading = set(tails)
        while reading and time.monotonic() < deadline:
            batches = await consumer.getmany(*reading, timeout_ms=200)
            for partition, records in batches.items():
                end = tails[partition]
                offsets = [r.offset for r in records if r.offset < end]
                if offsets:
                    found[TP(partition.topic, partition.partition)] = max(offsets)
            for partition in list(reading):
                if await consumer.position(partition) >= tails[partition]:
                    reading.discard(partition)
    return found
