"""The outbox of a partition task: the records one event causes (outputs, re-keyed
events, changelog writes), sent together into the transaction that carries the
event's offset."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from faust.types import TP, AppT

from app import internals

Record = tuple[str, bytes | None, bytes | None, int | None]  # topic, key, value, partition


class DeliveryFailed(RuntimeError):
    pass


class Outbox:
    """What the event being processed sends, and what it counted as (counted only
    once it is acked)."""

    __slots__ = ("counts", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.counts: Counter[str] = Counter()

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        self.records.append((topic, key, value, partition))

    def send_all(self, records: list[Record]) -> None:
        self.records.extend(records)

    def count(self, name: str) -> None:
        self.counts[name] += 1

    def clear(self) -> None:
        self.records.clear()
        self.counts.clear()


def transactional_id(app: AppT, tp: TP) -> str:
    """The id of the producer whose transaction carries tp's offsets: one per input
    partition (ConcurrentTransactionManager.transactional_id_format)."""
    return f"{app.conf.id}-{tp.topic}-{tp.partition}"


async def send_in_transaction(
    app: AppT, tp: TP, records: list[Record]
) -> list[asyncio.Future[Any]]:
    """Send into the open transaction that carries tp's offsets, and return the
    records' deliveries. The caller holds the lock of tp's task
    (PartitionTask.lock), so no commit of tp comes in between. With
    `bench_without_transactions` (no transactions) the same sends go through the
    app's plain producer, which faust flushes before each commit."""
    tid = transactional_id(app, tp)
    deliveries = []
    if not app.in_transaction:
        for topic, key, value, partition in records:
            delivery: Any = await app.producer.send(topic, key, value, partition, None, None)
            delivery.add_done_callback(_crash_on_failure(app, tid))
            deliveries.append(delivery)
        return deliveries
    transaction = internals.transaction_producer(tid)
    if transaction is None:
        # Sending without the transaction would break exactly-once: stop instead.
        raise DeliveryFailed(f"no open transaction {tid} for {tp}")
    producer, lock = transaction
    async with lock:
        for topic, key, value, partition in records:
            delivery = await producer.send(topic, value, key=key, partition=partition)
            delivery.add_done_callback(_crash_on_failure(app, tid))
            deliveries.append(delivery)
    return deliveries


def _crash_on_failure(app: Any, tid: str) -> Any:
    def check(delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is not None:
            # The transaction cannot commit; crash so it aborts and replays.
            failed = DeliveryFailed(f"transaction {tid}: {delivery.exception()!r}")
            app.add_future(app.crash(failed))

    return check
