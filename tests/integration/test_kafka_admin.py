"""The read_committed probes that recovery relies on, against the real broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from app.kafka_admin import end_offsets, last_committed_records
from app.settings import Settings

pytestmark = pytest.mark.broker


async def test_the_last_committed_record_is_found_behind_markers_and_aborted_records(
    broker: str,
) -> None:
    conf = Settings(broker=f"kafka://{broker}")
    topic = f"it-{uuid.uuid4().hex[:10]}-tails"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 4, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{topic}-tx")
    await producer.start()
    try:
        # Partition 0: a committed transaction, then an aborted one after it.
        async with producer.transaction():
            for _ in range(5):
                await producer.send_and_wait(topic, b"committed", partition=0)
        await producer.begin_transaction()
        for _ in range(30):
            await producer.send_and_wait(topic, b"aborted", partition=0)
        await producer.abort_transaction()
        # Partition 1: only an aborted transaction. Partition 2: committed records
        # further back than the window. Partition 3: nothing.
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted", partition=1)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed", partition=2)
        await producer.begin_transaction()
        for _ in range(40):
            await producer.send_and_wait(topic, b"aborted", partition=2)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    tps = [TP(topic, p) for p in range(4)]
    ends = await end_offsets(conf, tps)
    # 5 records + marker, 30 aborted + marker; 1 aborted + marker; 1 + marker, 40 + marker
    assert ends == {tps[0]: 37, tps[1]: 2, tps[2]: 43, tps[3]: 0}
    assert await last_committed_records(conf, ends, window=40) == {tps[0]: 4}
    assert await last_committed_records(conf, ends, window=100) == {tps[0]: 4, tps[2]: 0}
