"""The outbox of a partition task: the records one event causes (outputs, re-keyed
events, changelog writes), sent together into the transaction that carries the
event's offset."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from faust.types import TP, AppT

from app.exactly_once import internals
from pairing.grammar import Sizes
from pairing.records import Source, dead_letter

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


class RecordTooLarge(ValueError):
    """A record larger than `Sizes.record_bytes`: a processing error of the record that
    made it (app/exactly_once/step.py dead-letters that one), never sent, so never a
    failed transaction."""


def check_size(topic: str, key: bytes | None, value: bytes | None, limit: int) -> None:
    size = (0 if key is None else len(key)) + (0 if value is None else len(value))
    if size > limit:
        raise RecordTooLarge(f"a record for {topic} of {size} bytes > {limit}")


class Outbox:
    """What the event being processed sends, and what it counted as (counted only
    once it is acked)."""

    __slots__ = ("counts", "record_bytes", "records", "sizes")

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.record_bytes = sizes.record_bytes
        self.records: list[Record] = []
        self.counts: Counter[str] = Counter()

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        # `check_size` only past the cheap test: a call per record was 0.2 us, timeit.
        if len(value or b"") + len(key or b"") > self.record_bytes:
            check_size(topic, key, value, self.record_bytes)
        self.records.append((topic, key, value, partition))

    def send_all(self, records: list[Record]) -> None:
        """Records of the worker's own making, small by construction (watermarks)."""
        self.records.extend(records)

    def dead_letter(
        self,
        topic: str,
        reason: str,
        key: bytes | None,
        value: bytes | None,
        source: Source,
        identity: str | None = None,
    ) -> None:
        """An input record to `topic`, with the reason (`pairing.records.dead_letter`:
        small enough to send, whatever the input's size)."""
        dead_key, dead_value = dead_letter(reason, key, value, source, self.sizes, identity)
        self.records.append((topic, dead_key, dead_value, None))

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def clear(self) -> None:
        self.records.clear()
        self.counts.clear()


# The transactional producers faust keeps: one per active input partition
# (transport.ConcurrentTransactionManager formats it).
PARTITION_TRANSACTIONAL_ID = "{group_id}-{tpg.topic}-{tpg.partition}"


def partition_transactional_id(app: AppT, tp: TP) -> str:
    return PARTITION_TRANSACTIONAL_ID.format(group_id=app.conf.id, tpg=tp)


def worker_transactional_id(app: AppT) -> str:
    """The id of the producer whose transaction carries every offset and record of this
    worker's partitions (`PartitionTasks.transactional_id`); SendFailed between two
    assignments, when there is none."""
    tid: str | None = cast(Any, app).partition_tasks.transactional_id
    if tid is None:
        raise SendFailed("no transaction is open: no partition is assigned")
    return tid


async def send_in_transaction(app: AppT, tp: TP, records: list[Record]) -> list[SendReceipt]:
    """Send into the open transaction, which carries tp's offsets, and return the
    records' receipts. The caller holds the lock of tp's task
    (PartitionTask.lock), so no commit of tp comes in between. With
    `bench_without_transactions` (no transactions) the same sends go through the
    app's plain producer, which faust flushes before each commit."""
    if not app.in_transaction:
        failed = _crash_on_failure(app, "(none: the bench without transactions)")
        return await _send(internals.plain_producer(app.producer), records, failed)
    tid = worker_transactional_id(app)
    failed = _crash_on_failure(app, tid)
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
