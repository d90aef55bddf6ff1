"""Pairing: apply the pairing rules to the keyed events of each partition and
publish pairs, unpaired events and conflicts, exactly once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from app.exactly_once import Step, events_once, exactly_once
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, keyed_events, pairs, unpaired
from pairing.events import format_time
from pairing.records import (
    TICK,
    WATERMARK_KEY,
    KeyedEvent,
    conflict_record,
    decode_keyed_event,
    decode_watermark,
    loads,
    pair_record,
    unpaired_record,
)
from pairing.rules import (
    Conflict,
    Duplicate,
    Outcome,
    Paired,
    PairingPartition,
    PendingSummary,
    Unpaired,
)
from tables.pairing_state import PartitionState

conf = settings()

# Rule engines of the partitions this worker owns; rebuilt from the table after
# every rebalance (their heaps are derived from it).
engines: dict[int, tuple[PairingPartition, PartitionState]] = {}


@app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types receivers as a Union mypy cannot match
async def forget_engines(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
    engines.clear()


def engine_for(partition: int) -> tuple[PairingPartition, PartitionState]:
    if partition not in engines:
        state = PartitionState(partition)
        engine = PairingPartition.load(state, conf.pairing, state.clock(), time.time())
        engines[partition] = (engine, state)
    return engines[partition]


def pending_by_partition() -> dict[int, tuple[PendingSummary, int | None]]:
    """Pending events and watermark of each partition whose engine is loaded."""
    return {p: (engine.pending(), engine.watermark_us) for p, (engine, _) in engines.items()}


@app.agent(keyed_events)
async def pair(stream: Any) -> None:
    async for event in events_once(app, stream):
        async with exactly_once(app, event) as step:
            engine, state = engine_for(event.message.partition)
            state.step = step
            now = time.time()
            value = event.message.value
            assert value is not None  # written by ingest or the tick timer, never empty
            keyed = None
            if event.message.key == WATERMARK_KEY:
                step.count("watermarks")
                outcomes: list[Outcome] = engine.observe(decode_watermark(loads(value)), now)
                state.set_clock(engine.clock)
            elif value == TICK:
                step.count("ticks")
                outcomes = engine.expire_waiting(now)
            else:
                step.count("events_in")
                keyed = decode_keyed_event(value)
                outcomes = engine.process(keyed.event, keyed.progress_us, now)
            publish(outcomes, keyed, step, now)


def publish(outcomes: list[Outcome], keyed: KeyedEvent | None, step: Step, now: float) -> None:
    for outcome in outcomes:
        key = outcome.key.encode()
        if isinstance(outcome, Paired):
            step.count("pairs")
            paired_at = format_time(datetime.fromtimestamp(now, UTC))
            step.send(pairs.get_topic_name(), key, pair_record(outcome, paired_at), None)
        elif isinstance(outcome, Unpaired):
            step.count(outcome.reason)
            step.send(unpaired.get_topic_name(), key, unpaired_record(outcome), None)
        elif isinstance(outcome, Conflict):
            assert keyed is not None  # only an arriving event conflicts
            step.count("conflicts")
            step.send(dead_letters.get_topic_name(), key, conflict_record(outcome, keyed), None)
        elif isinstance(outcome, Duplicate):
            step.count("duplicates")


@app.timer(interval=conf.tick_interval_seconds, on_leader=True)
async def tick() -> None:
    """Let quiet partitions expire events that waited longer than max_wait while
    the watermark stood still. Ticks are triggers, not data: a duplicate tick
    changes nothing."""
    for partition in range(conf.partitions):
        await app.producer.send(
            keyed_events.get_topic_name(), b"~tick", TICK, partition, None, None
        )
