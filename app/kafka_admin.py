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


class InputPartitionsMismatch(RuntimeError):
    pass


async def check_input_partitions(conf: Settings) -> None:
    """The input topic must have the partitions the settings say: its partition
    count sizes the state that tracks each partition's event-time progress."""
    admin = AIOKafkaAdminClient(bootstrap_servers=conf.bootstrap_servers)
    await admin.start()
    try:
        [described] = await admin.describe_topics([conf.events_topic])
        found = len(described["partitions"])
    finally:
        await admin.close()
    if found != conf.events_partitions:
        raise InputPartitionsMismatch(
            f"input topic {conf.events_topic!r} has {found} partitions, but"
            f" PAIRSTREAM_EVENTS_PARTITIONS is {conf.events_partitions}: set it to {found}"
            " (changing an input topic's partitions needs a new app id: docs/event-time.md)"
        )


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
