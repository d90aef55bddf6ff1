"""A worker reading Debezium's change records of the events table
(PAIRSTREAM_EVENTS_FORMAT=debezium, docs/cdc.md), as the connector writes them: keyed by
primary key, a snapshot's rows and re-sent changes among them, updates and deletes of
rows, and invalid records. The outputs equal the reference model's over the same records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pairing.events import Event, parse_event
from tests.integration.harness import Pipeline, compare, finish, read_partitions
from tools.generate import Record, StreamShape, generate

pytestmark = pytest.mark.broker

SOURCE = {"connector": "postgresql", "db": "pairstream", "schema": "public", "table": "events"}


def envelope(op: str, before: dict[str, str] | None, after: dict[str, str] | None) -> bytes:
    return json.dumps({"before": before, "after": after, "source": SOURCE, "op": op}).encode()


def as_changes(records: list[Record], seed: int) -> list[Record]:
    """The generator's events as the connector would send the rows they are: a row per
    valid event (its identity the primary key; a duplicate event is the same row sent
    again, as Connect does after a crash), some read by a snapshot, some updated or
    deleted later; invalid records left as they are (invalid changes)."""
    rng = random.Random(seed)
    changes: list[Record] = []
    for key, raw in records:
        event = parse_event(raw, 65_536)
        if not isinstance(event, Event):
            changes.append((key, raw))
            continue
        row = {"id": event.identity, "type": event.type, "ts": event.key, "value": str(event.value)}
        row_key = json.dumps({"id": event.identity}).encode()
        changes.append((row_key, envelope(rng.choice("cccr"), None, row)))
        draw = rng.random()
        if draw < 0.02:
            changes.append((row_key, envelope("u", row, {**row, "value": "0"})))
        elif draw < 0.03:
            changes.append((row_key, envelope("d", {"id": row["id"]}, None)))
    return changes


async def test_change_records_pair_as_their_rows_and_changed_rows_are_dead_lettered(
    broker: str, tmp_path: Path
) -> None:
    # No conflicts: rows keyed by primary key spread one timestamp's A events over
    # partitions, and which of two different ones is first would be the partitioning's.
    changes = as_changes(generate(StreamShape(count=3000, seed=23, conflicts=0)), seed=23)
    pipeline = await Pipeline(broker, tmp_path, PAIRSTREAM_EVENTS_FORMAT="debezium").create_topics()
    await pipeline.produce(changes)  # a stream already in the topic when the worker starts
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        expected = await pipeline.expected()
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}
    reasons = [letter["reason"] for letter in outputs.dead_letters]
    updates = sum(r.startswith("update of events row") for r in reasons)
    deletes = sum(r.startswith("delete of events row") for r in reasons)
    assert updates > 20 and deletes > 10, (updates, deletes)
    assert sum(expected.pairs.values()) > 500 and expected.pending
    spread = [len(p) for p in await read_partitions(pipeline.conf, pipeline.conf.events_topic)]
    assert len(spread) == 8 and min(spread) > 0, spread
