"""The ceiling: a bare aiokafka consume -> produce loop over the same input, one stage,
no state, no parsing; with transactions (offsets committed in them) or without; each
record through `send` (a future and an await per record), or appended to batches of
the producer's public batch API, as a worker's outbox appends to the batches open
(app/exactly_once/outbox.py): what the client itself costs a record at least."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.producer.message_accumulator import BatchBuilder

from app.kafka.connection import KafkaConnection
from bench.workload import create_topic, delete_topics


@dataclass(frozen=True)
class CeilingResult:
    transactional: bool
    batched: bool  # appended to batches (create_batch, send_batch), not sent one by one
    events: int
    seconds: float  # from the first record fetched to the last committed
    cpu_seconds: float  # of this process, which does nothing else meanwhile

    @property
    def rate(self) -> float:
        return self.events / self.seconds


class BatchedSink:
    """Records appended to one open batch per output partition, without an await; the
    batches handed to the producer when the poll's records are all in, as a worker's
    runs are."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self._producer = producer
        self._topic = topic
        self._open: dict[int, BatchBuilder] = {}
        self._full: list[tuple[int, BatchBuilder]] = []
        self._sent: list[asyncio.Future[Any]] = []

    def append(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        batch = self._open.get(partition)
        if batch is None:
            batch = self._open[partition] = self._producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:  # full
            self._full.append((partition, batch))
            batch = self._open[partition] = self._producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)

    async def hand_over(self) -> None:
        for partition, batch in [*self._full, *self._open.items()]:
            sent = await self._producer.send_batch(batch, self._topic, partition=partition)
            self._sent.append(sent)
        self._full.clear()
        self._open.clear()

    async def delivered(self) -> None:
        await asyncio.gather(*self._sent)
        self._sent.clear()


async def consume_produce(
    bootstrap: str,
    source: str,
    total: int,
    transactional: bool,
    commit_interval: float,
    batched: bool = False,
) -> CeilingResult:
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    sink = f"{group}-out"
    await create_topic(bootstrap, sink)
    consumer = AIOKafkaConsumer(
        source,
        **KafkaConnection(bootstrap).aiokafka(),
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(
        **KafkaConnection(bootstrap).aiokafka(),
        enable_idempotence=True,
        linger_ms=5,
        transactional_id=group if transactional else None,
    )
    await consumer.start()
    await producer.start()
    sink_partitions = len(await producer.partitions_for(sink))
    batches_out = BatchedSink(producer, sink) if batched else None
    try:
        done, started, last_commit = 0, 0.0, 0.0
        cpu_started = 0.0
        positions: dict[TopicPartition, int] = {}
        if transactional:
            await producer.begin_transaction()
        while done < total:
            batches = await consumer.getmany(timeout_ms=100, max_records=2000)
            if batches and not started:
                started = last_commit = time.monotonic()
                cpu_started = time.process_time()
            for tp, records in batches.items():
                if batches_out is None:
                    for record in records:
                        await producer.send(sink, record.value, key=record.key)
                else:
                    partition = tp.partition % sink_partitions
                    for record in records:
                        batches_out.append(partition, record.key, record.value)
                positions[tp] = records[-1].offset + 1
                done += len(records)
            if batches_out is not None:
                await batches_out.hand_over()
            if started and (time.monotonic() - last_commit >= commit_interval or done >= total):
                if batches_out is not None:
                    await batches_out.delivered()
                if transactional:
                    await producer.send_offsets_to_transaction(positions, group)
                    await producer.commit_transaction()
                    if done < total:
                        await producer.begin_transaction()
                else:
                    await producer.flush()
                    await consumer.commit(positions)
                last_commit = time.monotonic()
        result = CeilingResult(
            transactional,
            batched,
            done,
            time.monotonic() - started,
            time.process_time() - cpu_started,
        )
    finally:
        await producer.stop()
        await consumer.stop()
    await delete_topics(bootstrap, group)
    return result
