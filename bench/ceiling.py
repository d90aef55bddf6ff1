"""The ceiling: a bare aiokafka consume -> produce loop over the same input, one stage,
no state, no parsing; with transactions (offsets committed in them) or without."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.workload import create_topic


@dataclass(frozen=True)
class CeilingResult:
    transactional: bool
    events: int
    seconds: float  # from the first record fetched to the last committed
    cpu_seconds: float  # of this process, which does nothing else meanwhile

    @property
    def rate(self) -> float:
        return self.events / self.seconds


async def consume_produce(
    bootstrap: str, source: str, total: int, transactional: bool, commit_interval: float
) -> CeilingResult:
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    sink = f"{group}-out"
    await create_topic(bootstrap, sink)
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=5,
        transactional_id=group if transactional else None,
    )
    await consumer.start()
    await producer.start()
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
                for record in records:
                    await producer.send(sink, record.value, key=record.key)
                positions[tp] = records[-1].offset + 1
                done += len(records)
            if started and (time.monotonic() - last_commit >= commit_interval or done >= total):
                if transactional:
                    await producer.send_offsets_to_transaction(positions, group)
                    await producer.commit_transaction()
                    if done < total:
                        await producer.begin_transaction()
                else:
                    await producer.flush()
                    await consumer.commit(positions)
                last_commit = time.monotonic()
        return CeilingResult(
            transactional, done, time.monotonic() - started, time.process_time() - cpu_started
        )
    finally:
        await producer.stop()
        await consumer.stop()
