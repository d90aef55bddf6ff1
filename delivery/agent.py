"""Delivery: each record of the delivery topic (by default the pairs) POSTed once to a
third-party API that is not idempotent (docs/delivery.md). Imported only when
PAIRSTREAM_DELIVERY_ENABLED is set.

    pairs ──route──▶ deliveries-by-id ──deliver──▶ store: intent ─▶ (commit) ─▶ HTTP call
      │  (key: identity)         ▲                                      │
      ▼                          └──── deliveries-log ◀─ attempt, failed, outcome
    deliveries.dlq (invalid, rejected)      deliveries.uncertain (parked)

* **route** parses each record once, dead-letters what cannot be delivered, and
  re-keys the rest by message identity, so every copy of a message meets the same
  partition of the processed-message store whatever key or partition it came with.
* **deliver** writes the intent (`queued`, with the body) for a message the store
  has not seen, inside the transaction that consumes it; the dispatcher
  (delivery/dispatcher.py) calls the API once that transaction has committed. It also
  applies the delivery log to the store, and dead-letters or parks final outcomes,
  exactly once.
"""

from __future__ import annotations

import heapq
from typing import Any

from faust.types import TP

from app.exactly_once.in_order import events_once
from app.exactly_once.stage import Stage
from app.exactly_once.step import before_step, exactly_once, still_current
from app.faust_app import app
from app.kafka.admin import end_offsets
from app.settings import settings
from app.topics import bytes_topic, pairs
from delivery.client import ApiClient
from delivery.dispatcher import Dispatcher, PartitionDeliveries
from delivery.rules import (
    Entry,
    LogRecord,
    Status,
    apply,
    decode_log,
    encode_log,
    idempotency_key,
    identity,
    parse_order,
)
from delivery.store import DeliveryStore, stored_entries
from pairing.grammar import oversize_invalid
from pairing.records import Source
from pairing.routing import partition_for

conf = settings()
BY_ID = conf.delivery_by_id_topic
LOG = conf.delivery_log_topic
DLQ = conf.delivery_dead_letter_topic
EXPIRED_PER_STEP = 100  # bounds the extra work of one step


source = (
    pairs
    if conf.delivery_source == conf.pairs_topic
    else bytes_topic(conf.delivery_source, internal=False)
)
decisions = bytes_topic(BY_ID, LOG, internal=True)  # deliver consumes both, co-partitioned


async def send_log(partition: int, record: LogRecord) -> None:
    """A delivery log record, outside any transaction, acknowledged by the broker."""
    delivered = await app.producer.send(
        LOG, record.identity.encode(), encode_log(record), partition, None, None
    )
    await delivered


dispatcher = Dispatcher(conf, ApiClient(conf), send_log)


def key_of(message_identity: str) -> str:
    return idempotency_key(conf.app_id, message_identity)


@app.agent(source)
async def route(stream: Any) -> None:
    for_dlq = conf.delivery_dead_letter_topic
    async for event in events_once(app, stream):
        message = event.message
        value: bytes | None = message.value
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            outbox = task.outbox
            parsed = oversize_invalid(message.key, value, conf.sizes) or parse_order(value)
            if isinstance(parsed, str):
                outbox.count("invalid")
                where = Source(message.topic, message.partition, message.offset)
                outbox.dead_letter(for_dlq, parsed, message.key, value, where)
                continue
            assert value is not None  # parse_order rejects an empty record
            message_identity = identity(value, parsed, conf.delivery_id_field)
            outbox.count("orders")
            partition = partition_for(message_identity, conf.partitions)
            outbox.send(BY_ID, message_identity.encode(), value, partition)


@app.agent(decisions)
async def deliver(stream: Any) -> None:
    tasks = app.partition_tasks
    async for event in events_once(app, stream):
        message = event.message
        partition = message.partition
        deliveries = dispatcher.partition(partition)
        if deliveries is None or (
            message.topic == BY_ID and dispatcher.full() and deliveries.caught_up
        ):
            task = tasks.get(message.tp)
            assert task is not None  # events_once yields records of assigned partitions
            await before_step(
                app, open_partition(partition) if deliveries is None else dispatcher.room()
            )
            opened = dispatcher.partition(partition)
            # Not opened if the flow stopped first: an assignment is ending.
            if not still_current(app, event, task, ready=opened is not None):
                continue
            assert opened is not None  # ready
            deliveries = opened
        caught_up = False
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            store = DeliveryStore(task)
            if message.topic == BY_ID:
                take(store, deliveries, message)
            else:
                apply_log(store, deliveries, message)
                caught_up = dispatcher.log_consumed(partition, message.offset + 1)
        if caught_up:
            resume(deliveries)


def take(store: DeliveryStore, deliveries: PartitionDeliveries, message: Any) -> None:
    """A message to deliver: its intent, unless the store knows it already."""
    outbox = store.outbox
    message_identity = message.key.decode()
    at_ms = int(message.timestamp * 1000)
    expire(store, deliveries, at_ms)
    if store.get(message_identity) is not None:
        outbox.count("duplicates")
        return
    body: bytes = message.value
    store.put(message_identity, Entry(Status.QUEUED, at_ms, body))
    outbox.count("accepted")
    dispatcher.intent(
        deliveries.partition, message_identity, body, key_of(message_identity), message.offset
    )


def expire(store: DeliveryStore, deliveries: PartitionDeliveries, at_ms: int) -> None:
    """Forget final entries older than the retention, by record time."""
    deliveries.stream_time_ms = max(deliveries.stream_time_ms, at_ms)
    horizon = deliveries.stream_time_ms - int(conf.delivery_retention_seconds * 1000)
    finals = deliveries.finals
    for _ in range(EXPIRED_PER_STEP):
        if not finals or finals[0][0] >= horizon:
            return
        _, message_identity = heapq.heappop(finals)
        entry = store.get(message_identity)
        if entry is not None and entry.terminal and entry.at_ms < horizon:
            store.delete(message_identity)
            store.outbox.count("forgotten")


def apply_log(store: DeliveryStore, deliveries: PartitionDeliveries, message: Any) -> None:
    outbox = store.outbox
    record = decode_log(message.value)
    entry = store.get(record.identity)
    applied = apply(entry, record)
    if applied is None:
        return
    store.put(record.identity, applied.entry)
    if applied.outcome is None:
        return
    assert entry is not None  # apply changes existing entries only
    heapq.heappush(deliveries.finals, (entry.at_ms, record.identity))
    outbox.count(applied.outcome.value)
    key = record.identity.encode()
    where = Source(message.topic, message.partition, message.offset)
    if applied.outcome is Status.DEAD:
        topic = conf.delivery_dead_letter_topic
        outbox.dead_letter(topic, record.reason, key, entry.body, where, record.identity)
    elif applied.outcome is Status.PARKED:
        topic = conf.delivery_uncertain_topic
        outbox.dead_letter(topic, record.reason, key, entry.body, where, record.identity)


def resume(deliveries: PartitionDeliveries) -> None:
    """The log is caught up: decide about every stored message not yet final."""
    number = deliveries.partition
    tasks = app.partition_tasks
    writers = [
        task.writes for tp in (TP(BY_ID, number), TP(LOG, number)) if (task := tasks.get(tp))
    ]
    stored = list(stored_entries(tasks.local_state, number, writers))
    deliveries.finals = [(e.at_ms, i) for i, e in stored if e.terminal]
    heapq.heapify(deliveries.finals)
    deliveries.stream_time_ms = max((e.at_ms for _, e in stored), default=0)
    dispatcher.resume(number, stored, key_of)


async def open_partition(partition: int) -> None:
    """Make a store partition this worker's in the dispatcher: nothing of it is called
    until the delivery log is consumed to where it ends now."""
    tasks = app.partition_tasks
    async with dispatcher.opening(partition):
        await tasks.restored.wait()  # the store must be restored before it is scanned
        if dispatcher.partition(partition) is not None or tasks.closing:
            return
        log_tp = TP(LOG, partition)
        ends = await end_offsets(conf, [log_tp])
        deliveries = dispatcher.open(partition, ends[log_tp])
        log_task = tasks.get(log_tp)
        consumed = None if log_task is None else log_task.offsets.next
        if consumed is not None and dispatcher.log_consumed(partition, consumed):
            resume(deliveries)


@app.timer(interval=0.5)
async def catch_up() -> None:
    """Partitions whose delivery log has nothing left to consume are caught up (no log
    step would say so)."""
    if app.in_recovery or not app.partition_tasks.restored.is_set():
        return
    for task in app.partition_tasks:
        tp = task.tp
        if tp.topic != LOG or task.offsets.next is None:
            continue
        deliveries = dispatcher.partition(tp.partition)
        if deliveries is None:
            await open_partition(tp.partition)
        elif dispatcher.log_consumed(tp.partition, task.offsets.next):
            resume(deliveries)


def committed(offsets: dict[TP, int]) -> None:
    for tp, offset in offsets.items():
        if tp.topic == BY_ID:
            dispatcher.committed(tp.partition, offset)


async def revoked(tps: set[TP]) -> None:
    numbers = {tp.partition for tp in tps if tp.topic in (BY_ID, LOG)}
    await dispatcher.close(numbers, conf.delivery_timeout_seconds + 5)


STAGE = Stage(BY_ID, on_commit=committed, on_revoke=revoked)


@app.task
async def run_dispatcher() -> None:
    await dispatcher.run()
