"""Topic creation, shared by the worker, the demo and the tests."""

from __future__ import annotations

from contextlib import suppress

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from app.settings import Settings


def topic_partitions(conf: Settings) -> dict[str, int]:
    return {
        conf.events_topic: conf.events_partitions,
        conf.keyed_topic: conf.partitions,
        conf.pairs_topic: conf.partitions,
        conf.unpaired_topic: conf.partitions,
        conf.dead_letter_topic: conf.partitions,
    }


async def ensure_topics(conf: Settings) -> None:
    """Create the pipeline's missing topics (the broker does not auto-create)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=conf.bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        for name, partitions in topic_partitions(conf).items():
            if name not in existing:
                with suppress(TopicAlreadyExistsError):  # another worker made it first
                    topic = NewTopic(name, partitions, conf.replication_factor)
                    await admin.create_topics([topic])
    finally:
        await admin.close()
