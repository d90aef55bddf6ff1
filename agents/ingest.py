"""Ingest: validate each input record once, dead-letter what is invalid, and
re-key valid events by pairing key so A and B of one timestamp meet.

Each event is stamped with its input partition's event-time progress, and every
keyed partition is told how far each input partition has got (watermark records,
inside that partition's transactions): docs/event-time.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from faust.types import TP

from app.exactly_once import Record, before_commit, caught_up, events_once, exactly_once
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, events, keyed_events
from pairing.events import Rejection, parse_event
from pairing.records import (
    WATERMARK_KEY,
    Source,
    dead_letter_record,
    encode_keyed_event,
    encode_watermark,
)
from pairing.routing import partition_for
from pairing.watermarks import SourceProgress
from tables.source_progress import store_progress, stored_progress

conf = settings()
log = logging.getLogger(__name__)


class Sources:
    """The progress of each input partition assigned here, from the stored progress
    on first use in an assignment; dropped when the partition is revoked."""

    def __init__(self) -> None:
        self._by_partition: dict[int, SourceProgress] = {}

    def of(self, partition: int) -> SourceProgress:
        source = self._by_partition.get(partition)
        if source is None:
            source = SourceProgress(stored_progress(partition), time.time())
            self._by_partition[partition] = source
        return source

    def get(self, partition: int) -> SourceProgress | None:
        return self._by_partition.get(partition)

    def forget(self, partitions: set[int]) -> None:
        for partition in partitions:
            self._by_partition.pop(partition, None)


sources = Sources()


def watermark_records(partition: int, source: SourceProgress) -> list[Record]:
    """One watermark record for every keyed partition."""
    value = encode_watermark(source.update(partition, conf.events_partitions))
    keyed = keyed_events.get_topic_name()
    return [(keyed, WATERMARK_KEY, value, k) for k in range(conf.partitions)]


def tell_before_commit(tp: TP) -> list[Record]:
    """Committed progress reaches the keyed partitions in the same transaction."""
    source = sources.get(tp.partition)
    if source is None or not source.untold():
        return []
    records = watermark_records(tp.partition, source)
    source.told()
    return records


before_commit(conf.events_topic, tell_before_commit)


@app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types receivers as a Union mypy cannot match
async def forget_sources(sender: Any, revoked: set[TP], *args: Any, **kwargs: Any) -> None:
    sources.forget({tp.partition for tp in revoked if tp.topic == conf.events_topic})


@app.agent(events)
async def ingest(stream: Any) -> None:
    keyed_topic = keyed_events.get_topic_name()
    dlq_topic = dead_letters.get_topic_name()
    async for event in events_once(app, stream):
        message = event.message
        raw: bytes | None = message.value
        record_source = Source(message.topic, message.partition, message.offset)
        async with exactly_once(app, event) as step:
            step.count("events_in")
            parsed = parse_event(raw, conf.max_event_bytes)
            if isinstance(parsed, Rejection):
                step.count("dead_lettered")
                step.send(
                    dlq_topic,
                    message.key,
                    dead_letter_record(parsed.reason, raw, record_source),
                    None,
                )
                continue
            assert raw is not None  # a valid event has a body
            step.count("valid")
            source = sources.of(message.partition)
            before = source.progress_us
            stamp = source.observe(parsed.time_us, time.time())
            if stamp != before:
                store_progress(message.partition, stamp, step)
            if source.must_announce:
                # Newly assigned, or back from idle: ahead of its event, so that no
                # keyed partition takes this partition as idle when the event arrives.
                step.send_all(watermark_records(message.partition, source))
                source.told()
            partition = partition_for(parsed.key, conf.partitions)
            step.send(
                keyed_topic,
                parsed.key.encode(),
                encode_keyed_event(parsed, raw, record_source, stamp),
                partition,
            )


@app.timer(interval=min(1.0, conf.idle_timeout_seconds / 2))
async def declare_idle_partitions() -> None:
    """Input partitions assigned here that are caught up and quiet stop holding the
    watermark back. Sent outside any transaction: an idle partition has everything
    it processed committed, and claims no progress beyond that."""
    if app.in_recovery:
        return
    now = time.time()
    for tp in app.consumer.assignment():
        if tp.topic != conf.events_topic:
            continue
        source = sources.of(tp.partition)
        if not source.goes_idle(now, conf.idle_timeout_seconds) or not await caught_up(app, tp):
            continue
        source.went_idle()
        log.info("input partition %s is idle: it stops holding the watermark back", tp)
        for topic, key, value, partition in watermark_records(tp.partition, source):
            await app.producer.send(topic, key, value, partition, None, None)
