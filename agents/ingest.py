"""Ingest: validate each input record once, dead-letter what is invalid, and
re-key valid events by pairing key so A and B of one timestamp meet.

Each event is stamped with its input partition's event-time progress, and every
keyed partition is told how far each input partition has got (watermark records,
inside that partition's transactions): docs/event-time.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container
from typing import Any

from faust.types import TP

from app.exactly_once.backlog import caught_up
from app.exactly_once.in_order import runs_once
from app.exactly_once.outbox import Record
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stage import Stage
from app.exactly_once.step import RunRecords, run_once, still_current
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, events, keyed_events
from pairing.changes import parser_for
from pairing.events import Rejection, read_event
from pairing.records import (
    HANDED,
    HANDED_WATERMARK_KEY,
    WATERMARK_KEY,
    KeyedEvent,
    Source,
    encode_keyed_event,
    encode_watermark,
)
from pairing.routing import partition_for
from pairing.watermarks import SourceProgress, WatermarkUpdate
from tables.source_progress import store_progress, stored_progress

conf = settings()
PARSE = parser_for(conf.events_format)  # JSON events, or Debezium's change records
log = logging.getLogger(__name__)


def load_source(task: PartitionTask) -> SourceProgress:
    """An input partition's progress, as last committed (a partition task's processor)."""
    return SourceProgress(stored_progress(task), time.time())


def watermark_records(update: WatermarkUpdate, handed: Container[int] = ()) -> list[Record]:
    """One watermark record for every keyed partition: marked for those in `handed`, which
    took the update from the hand-off and skip the record (app/exactly_once/handoff.py)."""
    value = encode_watermark(update)
    keyed = keyed_events.get_topic_name()
    return [
        (keyed, HANDED_WATERMARK_KEY if k in handed else WATERMARK_KEY, value, k)
        for k in range(conf.partitions)
    ]


def keyed_partitions() -> list[TP]:
    keyed = keyed_events.get_topic_name()
    return [TP(keyed, k) for k in range(conf.partitions)]


def tell(update: WatermarkUpdate, now: float) -> list[Record]:
    """The update handed to the keyed partitions paired here, and its records."""
    handoff = app.partition_tasks.handoff
    handoff.handed_by(update.source)
    handed = set()
    for tp in keyed_partitions():
        if handoff.is_open(tp):
            handoff.hand(tp, (update, now))
            handed.add(tp.partition)
    return watermark_records(update, handed)


def tell_before_commit(task: PartitionTask) -> list[Record]:
    """Committed progress reaches the keyed partitions in the same transaction, at most
    once per watermark interval."""
    source = task.loaded(SourceProgress)
    now = time.time()
    if source is None or not source.tell_due(now, conf.watermark_interval_seconds):
        return []
    return tell(source.announcement(task.tp.partition, app.input_size.count, now), now)


async def hold_handed_over_sources(revoked: set[TP]) -> None:
    """Idle input partitions given up hold the watermark again (docs/event-time.md):
    told outside any transaction, like their idleness, and in the keyed partitions
    before the revocation ends, so before their next owner reads anything."""
    handed_over = []
    for tp in sorted(revoked):
        task = app.partition_tasks.get(tp) if tp.topic == conf.events_topic else None
        source = None if task is None else task.loaded(SourceProgress)
        if source is not None and source.handed_over():
            handed_over.append((tp, source))
    if not handed_over:
        return
    try:
        deliveries = []
        for tp, source in handed_over:
            update = source.update(tp.partition, app.input_size.count)
            for topic, key, value, partition in watermark_records(update):
                deliveries.append(await app.producer.send(topic, key, value, partition, None, None))
        await asyncio.gather(*deliveries)
    except Exception as exc:  # a stop may have closed the producer: go on stopping
        log.warning(
            "idle input partitions %s handed over, but the keyed partitions may not know: %r;"
            " their records that land before the next owner reads them can come out late",
            [tp for tp, _ in handed_over],
            exc,
        )


STAGE = Stage(
    conf.events_topic,
    in_runs=True,
    hands_over=True,
    before_commit=tell_before_commit,
    on_revoke=hold_handed_over_sources,
)


@app.agent(events)
async def ingest(stream: Any) -> None:
    """Each run of an input partition's records in one step (app/exactly_once/runs.py)."""
    dlq_topic = dead_letters.get_topic_name()
    tasks = app.partition_tasks
    async for event, records in runs_once(app, stream):
        task = tasks.get(event.message.tp)
        # The consumer holds the input paused until the keyed partitions paired here have
        # read what came before the assignment (app/exactly_once/handoff.py): never more.
        if task is not None and not still_current(app, event, task, tasks.handoff.all_open()):
            continue
        await run_once(app, event, records, ingest_run, dead_letters=dlq_topic)


def ingest_run(task: PartitionTask, records: RunRecords) -> None:
    """Validate and re-key a run's records; what is invalid is dead-lettered. An event
    whose keyed partition is paired here is also handed to it (and written marked)."""
    keyed_topic = keyed_events.get_topic_name()
    dlq_topic = dead_letters.get_topic_name()
    now = time.time()
    now_ms = int(now * 1000)
    sizes, max_ahead_us = conf.sizes, conf.max_ahead_us
    outbox = task.outbox
    handoff = app.partition_tasks.handoff
    keyed = keyed_partitions()
    handed = [handoff.is_open(tp) for tp in keyed]
    handoff.handed_by(task.tp.partition)
    source = task.processor(SourceProgress, load_source)
    stored = source.progress_us
    # Counted once a run: a count a record was 1.7% of a worker's CPU.
    outbox.count("events_in", len(records))
    rejected = 0
    topic, partition = task.tp
    for record in records.each():
        raw: bytes | None = record.value
        timestamp_ms: int | None = record.timestamp
        record_source = Source(topic, partition, record.offset, timestamp_ms)
        if timestamp_ms is None or timestamp_ms < 0:
            timestamp_ms = now_ms  # a record without one: the guard reads the worker's clock
        parsed = read_event(record.key, raw, timestamp_ms, sizes, max_ahead_us, PARSE)
        if isinstance(parsed, Rejection):
            rejected += 1
            outbox.dead_letter(dlq_topic, parsed.reason, record.key, raw, record_source)
            continue
        assert raw is not None  # a valid event has a body
        stamp = source.observe(parsed.time_us, now)
        if source.must_announce:
            # Newly assigned, or back from idle: ahead of its event, so that no keyed
            # partition takes this partition as idle when the event arrives (told as
            # idle, which it was until this event, it went on counting as idle until
            # its next progress reached them with a commit).
            update = source.announcement(partition, app.input_size.count, now)
            outbox.send_all(tell(update, now))
        keyed_partition = partition_for(parsed.key, conf.partitions)
        key = parsed.key.encode()
        if handed[keyed_partition]:
            event = KeyedEvent(parsed, raw, record_source, stamp)
            handoff.hand(keyed[keyed_partition], (event, now))
            key = HANDED + key  # the keyed topic keeps every valid event, for the record
        outbox.send(
            keyed_topic,
            key,
            encode_keyed_event(parsed, raw, record_source, stamp),
            keyed_partition,
        )
    outbox.count("valid", len(records) - rejected)
    if rejected:
        outbox.count("dead_lettered", rejected)
    if source.progress_us is not None and source.progress_us != stored:
        # Once per run: the run commits as one, and a restart goes on from the progress
        # of its last event.
        store_progress(task, source.progress_us)


LOOK_EVERY_SECONDS = min(1.0, conf.idle_timeout_seconds / 2)


@app.timer(interval=LOOK_EVERY_SECONDS)
async def tell_caught_up_partitions() -> None:
    """Input partitions assigned here that are caught up tell the keyed partitions the
    progress their commits left untold (told at most once per commit interval), and
    once quiet for the idle timeout they stop holding the watermark back. Sent outside
    any transaction: a caught-up partition has everything it processed committed, and
    claims no progress beyond that."""
    if app.in_recovery or not app.partition_tasks.restored.is_set():
        return  # the stored progress may not be restored yet
    for task in app.partition_tasks:
        tp = task.tp
        if tp.topic != conf.events_topic:
            continue
        source = task.processor(SourceProgress, load_source)
        now = time.time()
        source.look(now, LOOK_EVERY_SECONDS)
        goes_idle = source.goes_idle(now, conf.idle_timeout_seconds)
        if not goes_idle and not source.tell_due(now, conf.watermark_interval_seconds):
            continue
        # Idle is the one claim here that can pass the records of others: where the
        # partition ends is asked of the broker before it is made.
        if not await caught_up(app, tp, ask_broker=goes_idle):
            continue
        if goes_idle:
            source.went_idle()
            log.info("input partition %s is idle: it stops holding the watermark back", tp)
            update = source.update(tp.partition, app.input_size.count)
        else:
            update = source.announcement(tp.partition, app.input_size.count, now)
        if goes_idle:
            # Read after what the partition hands next, the claim is stale: the keyed
            # partitions paired here skip it (app/exactly_once/handoff.py).
            app.partition_tasks.handoff.claimed_idle(tp.partition)
        for topic, key, value, partition in watermark_records(update):
            await app.producer.send(topic, key, value, partition, None, None)
