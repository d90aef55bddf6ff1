"""The benchmark workload: A/B events under random producer keys over a
multi-partition input, 5% of keys missing a partner, 2% of events sent twice,
pre-produced before any worker starts."""

from __future__ import annotations

from collections.abc import Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.kafka.connection import KafkaConnection
from tools.generate import Record, StreamShape, generate, produce

INPUT_PARTITIONS = 4


def workload(count: int, seed: int = 14) -> list[Record]:
    shape = StreamShape(
        count=count,
        missing=0.05,
        duplicates=0.02,
        conflicts=0.0,
        late=0.0,
        invalid=0.0,
        source_keys=0.0,
        random_keys=1.0,
        seed=seed,
    )
    return generate(shape)


async def create_topic(bootstrap: str, topic: str, config: Mapping[str, str] | None = None) -> None:
    """A topic of INPUT_PARTITIONS partitions (the broker does not auto-create), with the
    topic `config` given."""
    admin = AIOKafkaAdminClient(**KafkaConnection(bootstrap).aiokafka())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, INPUT_PARTITIONS, 1, topic_configs=config)])
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, mark: str) -> None:
    """Delete every topic whose name holds `mark` (a run's unique id): a suite run's
    topics took 3.9 GiB of the broker's disk, and the broker never deletes them."""
    admin = AIOKafkaAdminClient(**KafkaConnection(bootstrap).aiokafka())
    await admin.start()
    try:
        doomed = [topic for topic in await admin.list_topics() if mark in topic]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


async def pre_produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    await create_topic(bootstrap, topic)
    await produce(records, KafkaConnection(bootstrap), topic, rate=0, progress=False)
