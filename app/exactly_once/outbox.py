"""The outbox of a partition task: the records one event causes (outputs, re-keyed
events, changelog writes), sent together into the transaction that carries the
event's offset."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from faust.types import TP, AppT

from app.exactly_once import internals

Record = tuple[str, bytes | None, bytes | None, int | None]  # topic, key, value, partition
# Where a sent record's ack shows: the future that reports it (its batch's, or its
# own for a record that opened a batch), and its offset after the one that reports.
SendReceipt = tuple["asyncio.Future[Any]", int]


def acked_offset(receipt: SendReceipt) -> int | None:
    """The record's offset once the broker acked it; None before, or if it failed."""
    future, after = receipt
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    offset: int = future.result().offset
    return offset + after


class SendFailed(RuntimeError):
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

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def clear(self) -> None:
        self.records.clear()
        self.counts.clear()


def transactional_id(app: AppT, tp: TP) -> str:
    """The id of the producer whose transaction carries tp's offsets: one per input
    partition (ConcurrentTransactionManager.transactional_id_format)."""
    return f"{app.conf.id}-{tp.topic}-{tp.partition}"


async def send_in_transaction(app: AppT, tp: TP, records: list[Record]) -> list[SendReceipt]:
    """Send into the open transaction that carries tp's offsets, and return the
    records' receipts. The caller holds the lock of tp's task
    (PartitionTask.lock), so no commit of tp comes in between. With
    `bench_without_transactions` (no transactions) the same sends go through the
    app's plain producer, which faust flushes before each commit."""
    tid = transactional_id(app, tp)
    failed = _crash_on_failure(app, tid)
    if not app.in_transaction:
        return await _send(internals.plain_producer(app.producer), records, failed)
    transaction = internals.transaction_producer(tid)
    if transaction is None:
        # Sending without the transaction would break exactly-once: stop instead.
        raise SendFailed(f"no open transaction {tid} for {tp}")
    producer, lock = transaction
    async with lock:
        return await _send(producer, records, failed)


async def _send(
    producer: Any, records: list[Record], failed: Callable[[asyncio.Future[Any]], None]
) -> list[SendReceipt]:
    """Hand the records to an aiokafka producer in order: appended to the batch open
    for their partition, or to one opened behind the full ones
    (`internals.append_to_open_batches`); through its `send` only for a partition the
    producer does not know yet or that has many batches waiting. No await, future or
    metadata look-up per record: they were about a fifth of a worker's CPU. `failed`
    watches each batch once, not each record (a callback per record was 5% of the
    CPU)."""
    receipts: list[SendReceipt] = []
    watched: set[asyncio.Future[Any]] = set()

    def watch(batch: asyncio.Future[Any]) -> None:
        if batch not in watched:
            watched.add(batch)
            batch.add_done_callback(failed)

    index = internals.append_to_open_batches(producer, records, 0, receipts, watch)
    while index < len(records):
        topic, key, value, partition = records[index]
        own = await producer.send(topic, value, key=key, partition=partition)
        own.add_done_callback(failed)
        receipts.append((own, 0))
        index = internals.append_to_open_batches(producer, records, index + 1, receipts, watch)
    return receipts


def _crash_on_failure(app: Any, tid: str) -> Callable[[asyncio.Future[Any]], None]:
    def check(delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is not None:
            # The transaction cannot commit; crash so it aborts and replays.
            failed = SendFailed(f"transaction {tid}: {delivery.exception()!r}")
            app.add_future(app.crash(failed))

    return check
