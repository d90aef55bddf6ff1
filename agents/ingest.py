"""Ingest: validate each input record once, dead-letter what is invalid, and
re-key valid events by pairing key so A and B of one timestamp meet.

Each event is stamped with its input partition's event-time progress, and every
keyed partition is told how far each input partition has got (watermark records,
inside that partition's transactions): docs/event-time.md.
"""

from __future__ import annotations

import time
from typing import Any

from faust.types import TP

from agents.event_time import EventTimeTeller, record_source
from app.exactly_once.in_order import runs_once
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stage import Stage
from app.exactly_once.step import RunRecords, run_once, still_current
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, events, keyed_events
from pairing.changes import parser_for
from pairing.events import Rejection, read_event
from pairing.records import HANDED, KeyedEvent, encode_keyed_event
from pairing.routing import partition_for
from pairing.watermarks import WatermarkUpdate
from tables.source_progress import table as progress_table

conf = settings()
PARSE = parser_for(conf.events_format)  # JSON events, or Debezium's change records


def keyed_partitions() -> list[TP]:
    keyed = keyed_events.get_topic_name()
    return [TP(keyed, k) for k in range(conf.partitions)]


class HandToPairing:
    """Progress handed to the keyed partitions paired here (app/exactly_once/handoff.py)."""

    def hand_update(self, update: WatermarkUpdate, now: float) -> set[int]:
        handoff = app.partition_tasks.handoff
        handoff.handed_by(update.source)
        handed = set()
        for tp in keyed_partitions():
            if handoff.is_open(tp):
                handoff.hand(tp, (update, now))
                handed.add(tp.partition)
        return handed

    def claimed_idle(self, source: int) -> None:
        app.partition_tasks.handoff.claimed_idle(source)


# The input's partitions are its sources, numbered as they are; the count grows with the
# input (agents/input_growth.py).
EVENT_TIME = EventTimeTeller(
    app,
    topics=[conf.events_topic],
    keyed_topic=keyed_events.get_topic_name(),
    partitions=conf.partitions,
    number=lambda tp: tp.partition,
    count=lambda: app.input_size.count,
    progress_table=progress_table,
    interval=conf.watermark_interval_seconds,
    handing=HandToPairing(),
)


STAGE = Stage(
    conf.events_topic,
    in_runs=True,
    hands_over=True,
    before_commit=EVENT_TIME.before_commit,
    on_revoke=EVENT_TIME.on_revoke,
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
    source = EVENT_TIME.source(task)
    stored = source.progress_us
    # Counted once a run: a count a record was 1.7% of a worker's CPU.
    outbox.count("events_in", len(records))
    rejected = 0
    for record in records.each():
        raw: bytes | None = record.value
        source_of, timestamp_ms = record_source(task, record, now_ms)
        parsed = read_event(record.key, raw, timestamp_ms, sizes, max_ahead_us, PARSE)
        if isinstance(parsed, Rejection):
            rejected += 1
            outbox.dead_letter(dlq_topic, parsed.reason, record.key, raw, source_of)
            continue
        assert raw is not None  # a valid event has a body
        stamp = source.observe(parsed.time_us, now)
        if source.must_announce:
            # Newly assigned, or back from idle: ahead of its event, so that no keyed
            # partition takes this partition as idle when the event arrives (told as
            # idle, which it was until this event, it went on counting as idle until
            # its next progress reached them with a commit).
            outbox.send_all(EVENT_TIME.tell(task, source, now))
        keyed_partition = partition_for(parsed.key, conf.partitions)
        key = parsed.key.encode()
        if handed[keyed_partition]:
            event = KeyedEvent(parsed, raw, source_of, stamp)
            handoff.hand(keyed[keyed_partition], (event, now))
            key = HANDED + key  # the keyed topic keeps every valid event, for the record
        outbox.send(
            keyed_topic,
            key,
            encode_keyed_event(parsed, raw, source_of, stamp),
            keyed_partition,
        )
    outbox.count("valid", len(records) - rejected)
    if rejected:
        outbox.count("dead_lettered", rejected)
    if source.progress_us is not None and source.progress_us != stored:
        # Once per run: the run commits as one, and a restart goes on from the progress
        # of its last event.
        EVENT_TIME.store(task, source.progress_us)


LOOK_EVERY_SECONDS = EVENT_TIME.look_every


@app.timer(interval=LOOK_EVERY_SECONDS)
async def tell_caught_up_partitions() -> None:
    """Caught-up input partitions tell their progress, and go idle (agents/event_time.py)."""
    await EVENT_TIME.tell_caught_up()
