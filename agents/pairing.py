"""Pairing: apply the pairing rules to the keyed events of each partition and
publish pairs, unpaired events and conflicts, exactly once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from app.exactly_once.handed_steps import keep_applying, write_fences
from app.exactly_once.handoff import FENCE_KEY
from app.exactly_once.in_order import runs_once
from app.exactly_once.outbox import Outbox
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stage import Stage
from app.exactly_once.step import RunRecords, run_once
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, keyed_events, pairs, unpaired
from pairing.events import format_time
from pairing.key_state import Conflict, Duplicate, Outcome, Paired, Unpaired
from pairing.records import (
    HANDED,
    TICK,
    WATERMARK_KEY,
    KeyedEvent,
    decode_keyed_event,
    decode_watermark,
    loads,
    pair_record,
    unpaired_record,
)
from pairing.rules import PairingPartition, PendingSummary
from pairing.watermarks import WatermarkUpdate
from tables.pairing_state import PartitionState

conf = settings()
# How often a keyed partition here whose hand-off is not open is sent a fence: the first
# goes at most this long after an assignment, whose input waits for it.
FENCE_EVERY_SECONDS = 0.05


class KeyedPartition:
    """The pairing rules of one keyed partition over its state (a partition task's
    processor): rebuilt from the table after every rebalance, since the engine's
    heaps are derived from it."""

    __slots__ = ("engine", "state")

    def __init__(self, task: PartitionTask) -> None:
        self.state = PartitionState(task)
        self.engine = PairingPartition.load(
            self.state, conf.pairing, self.state.clock(), time.time()
        )


def pending_by_partition() -> dict[int, tuple[PendingSummary, int | None]]:
    """Pending events and watermark of each keyed partition whose engine is loaded."""
    found: dict[int, tuple[PendingSummary, int | None]] = {}
    for task in app.partition_tasks:
        keyed = task.loaded(KeyedPartition)
        if keyed is not None:
            found[task.tp.partition] = (keyed.engine.pending(), keyed.engine.watermark_us)
    return found


def pair_handed(
    task: PartitionTask, items: list[tuple[KeyedEvent | WatermarkUpdate, float]]
) -> None:
    """Apply the rules to what ingest handed this keyed partition (app/exactly_once/handoff.py):
    its events and event-time progress, each with the time it was handed."""
    outbox = task.outbox
    keyed_partition = task.processor(KeyedPartition, KeyedPartition)
    engine = keyed_partition.engine
    paired_at = format_time(datetime.now(UTC))
    updates = 0
    for item, now in items:
        if isinstance(item, KeyedEvent):
            outcomes = engine.process(item.event, item.progress_us, now)
            if outcomes:
                publish(outcomes, item, outbox, paired_at)
        else:
            updates += 1
            outcomes = observe(keyed_partition, item, now, outbox)
            if outcomes:
                publish(outcomes, None, outbox, paired_at)
    outbox.count("events_in", len(items) - updates)


def observe(
    keyed_partition: KeyedPartition, update: WatermarkUpdate, now: float, outbox: Outbox
) -> list[Outcome]:
    """A source's progress, read or handed."""
    outbox.count("watermarks")
    outcomes = keyed_partition.engine.observe(update, now)
    keyed_partition.state.set_clock(keyed_partition.engine.clock)
    return outcomes


STAGE = Stage(
    keyed_events.get_topic_name(),
    in_runs=True,
    receive_handed=pair_handed if conf.local_handoff else None,
)


@app.agent(keyed_events)
async def pair(stream: Any) -> None:
    """Each run of a keyed partition's records in one step (app/exactly_once/runs.py)."""
    dlq_topic = dead_letters.get_topic_name()
    async for event, records in runs_once(app, stream):
        await run_once(app, event, records, pair_run, dead_letters=dlq_topic)


def pair_run(task: PartitionTask, records: RunRecords) -> None:
    """Apply the rules to a run's keyed events, watermarks and ticks."""
    outbox = task.outbox
    keyed_partition = task.processor(KeyedPartition, KeyedPartition)
    engine = keyed_partition.engine
    handoff = app.partition_tasks.handoff
    # When the run's pairs were made: one clock read and format per run.
    paired_at = format_time(datetime.now(UTC))
    controls = 0  # watermarks and ticks: events_in counts the rest, once a run
    for record in records.each():
        # Max wait's clock: when ingest (or the tick timer) wrote the record. On the
        # wall clock a pairing stage that falls behind took its own lag for the
        # watermark standing still, and closed keys whose partner was right behind.
        now = record.timestamp / 1000
        value = record.value
        assert value is not None  # written by ingest or the tick timer, never empty
        keyed = None
        if record.key == WATERMARK_KEY:
            controls += 1
            update = decode_watermark(loads(value))
            if update.idle and handoff.stale_claim(task.tp, update.source):
                outbox.count("stale_idle_claims")
                continue
            outcomes: list[Outcome] = observe(keyed_partition, update, now, outbox)
        elif record.key.startswith(HANDED):
            controls += 1  # paired as ingest handed it (app/exactly_once/handoff.py)
            continue
        elif record.key == FENCE_KEY:
            controls += 1
            handoff.fenced(task.tp, value)
            continue
        elif value == TICK:
            controls += 1
            outbox.count("ticks")
            outcomes = engine.expire_waiting(now)
        else:
            keyed = decode_keyed_event(value)
            outcomes = engine.process(keyed.event, keyed.progress_us, now)
        if outcomes:
            publish(outcomes, keyed, outbox, paired_at)
    outbox.count("events_in", len(records) - controls)


def publish(
    outcomes: list[Outcome], keyed: KeyedEvent | None, outbox: Outbox, paired_at: str
) -> None:
    for outcome in outcomes:
        key = outcome.key.encode()
        if isinstance(outcome, Paired):
            outbox.count("pairs")
            outbox.send(pairs.get_topic_name(), key, pair_record(outcome, paired_at), None)
        elif isinstance(outcome, Unpaired):
            outbox.count(outcome.reason)
            outbox.send(unpaired.get_topic_name(), key, unpaired_record(outcome), None)
        elif isinstance(outcome, Conflict):
            assert keyed is not None  # only an arriving event conflicts
            outbox.count("conflicts")
            reason, identity = f"conflict: {outcome.detail}", outcome.event.identity
            topic = dead_letters.get_topic_name()
            outbox.dead_letter(topic, reason, key, keyed.raw, keyed.source, identity)
        elif isinstance(outcome, Duplicate):
            outbox.count("duplicates")


@app.task
async def apply_handed_items() -> None:
    """What ingest hands the keyed partitions paired here, applied as it comes."""
    await keep_applying(app, app.partition_tasks)


@app.timer(interval=FENCE_EVERY_SECONDS)
async def open_handoff() -> None:
    """A fence to each keyed partition here whose hand-off is not open yet."""
    await write_fences(app, app.partition_tasks)


@app.timer(interval=conf.tick_interval_seconds, on_leader=True)
async def tick() -> None:
    """Let quiet partitions expire events that waited longer than max_wait while
    the watermark stood still. Ticks are triggers, not data: a duplicate tick
    changes nothing."""
    for partition in range(conf.partitions):
        await app.producer.send(
            keyed_events.get_topic_name(), b"~tick", TICK, partition, None, None
        )
