"""Where a step's records go: the worker's transaction, or, with the benchmark switch
that turns transactions off, the app's plain producer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition
from faust.types import TP

from app.exactly_once.outbox import Record, SendFailed, send_in_transaction
from tests.unit.unstarted_producer import producer_knowing

RECORDS: list[Record] = [
    ("pairs", b"k", b"v", None),
    ("keyed", b"k2", b"w", 3),
    ("pairs", b"k", b"x", None),
]


def fake_app(in_transaction: bool, transactional_id: str | None = "bench-app-events-2") -> Any:
    plain = producer_knowing({"pairs": 4, "keyed": 4})  # faust's plain producer
    return SimpleNamespace(
        in_transaction=in_transaction,
        producer=SimpleNamespace(_ensure_producer=lambda: plain),
        plain=plain,
        conf=SimpleNamespace(id="bench-app"),
        partition_tasks=SimpleNamespace(transactional_id=transactional_id),
    )


def queued(producer: AIOKafkaProducer) -> dict[TopicPartition, int]:
    batches = producer._message_accumulator._batches
    return {tp: sum(batch.record_count for batch in queue) for tp, queue in batches.items()}


async def test_without_transactions_records_go_through_the_plain_producer() -> None:
    app = fake_app(in_transaction=False)
    deliveries = await send_in_transaction(app, TP("events", 2), RECORDS)
    assert len(deliveries) == len(RECORDS) and len(set(deliveries)) == len(RECORDS)
    key_partition = app.plain._partition("pairs", None, b"k", None, b"k", None)
    assert queued(app.plain) == {
        TopicPartition("pairs", key_partition): 2,  # the second appended to the first's batch
        TopicPartition("keyed", 3): 1,
    }


async def test_with_transactions_a_missing_transaction_stops_the_step() -> None:
    app = fake_app(in_transaction=True)
    with pytest.raises(SendFailed, match="no open transaction bench-app-events-2"):
        await send_in_transaction(app, TP("events", 2), RECORDS)
    between_assignments = fake_app(in_transaction=True, transactional_id=None)
    with pytest.raises(SendFailed, match="no transaction is open"):
        await send_in_transaction(between_assignments, TP("events", 2), RECORDS)
    assert queued(app.plain) == queued(between_assignments.plain) == {}  # nothing went around


async def test_a_failed_batch_crashes_the_worker() -> None:
    app = fake_app(in_transaction=False)
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    app.crash = crash
    app.add_future = asyncio.ensure_future
    for topic, key, value, partition in RECORDS:  # batches open: every record is appended
        await app.plain.send(topic, value, key=key, partition=partition)
    await send_in_transaction(app, TP("events", 2), RECORDS)
    for queue in app.plain._message_accumulator._batches.values():
        for batch in queue:
            batch.failure(RuntimeError("broker says no"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert crashes and all("broker says no" in str(exc) for exc in crashes)
