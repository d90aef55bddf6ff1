"""The input topic as it is: a worker takes its partition count from the broker, and
partitions added while it runs join the watermark (docs/event-time.md).

The source-progress table is partitioned like the input (tables/source_progress.py),
and faust's assignor gives input partition i and that table's changelog partition i to
one worker only while both topics have as many partitions (it groups topics by their
partition count). So the changelog is sized like the input when a worker starts, it is
grown before the input's new partitions are processed, and an assignment made while it
is smaller than the input leaves the input's partitions beyond it out (`capped`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import NewPartitions
from aiokafka.errors import InvalidPartitionsError
from faust.assignor import PartitionAssignor

from app.kafka.access import progress_changelog
from app.kafka.admin import admin_client, described_partitions, wait_until_ready
from app.settings import Settings, settings

log = logging.getLogger(__name__)

PROGRESS_TABLE = "source-progress"  # its changelog: app.kafka.access.progress_changelog


class InputSize:
    """How many partitions the input topic has, as this worker last saw it: what every
    watermark record says (`WatermarkUpdate.sources`). Only grows."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count

    def grew_to(self, found: int | None) -> bool:
        """Take a partition count seen in the broker's metadata; whether it is news."""
        if found is None or found <= self.count:
            return False
        self.count = found
        return True


class ChangelogLargerThanInput(RuntimeError):
    pass


async def size_at_start(conf: Settings, changelog_topic: Any, input_size: InputSize) -> None:
    """Before the changelogs are declared: the input's partition count from the broker
    (the setting when the input does not exist yet: it is created so), and the
    source-progress changelog created with it, or grown to it."""
    changelog = changelog_topic.get_topic_name()
    found = await described_partitions(conf, [conf.events_topic, changelog])
    input_size.count = found.get(conf.events_topic, conf.events_partitions)
    changelog_topic.partitions = input_size.count
    have = found.get(changelog)
    if have is not None and have > input_size.count:
        raise ChangelogLargerThanInput(
            f"changelog {changelog!r} has {have} partitions, the input topic"
            f" {conf.events_topic!r} {input_size.count}: the input was made again with fewer"
            " partitions (Kafka cannot shrink one); its progress is stale: use a new app id"
        )
    if have is not None and have < input_size.count:
        await grow(conf, changelog, input_size.count)


async def grow(conf: Settings, topic: str, count: int) -> None:
    """Grow `topic` to `count` partitions (another worker may have done so already),
    and wait until the broker's metadata shows them."""
    async with admin_client(conf) as admin:
        try:
            await admin.create_partitions({topic: NewPartitions(count)})
            log.info("changelog %s grown to %d partitions, like the input topic", topic, count)
        except InvalidPartitionsError:
            pass  # it has them (or more) already: grown by another worker
    await wait_until_ready(conf, {topic: count}, conf.topics_ready_timeout_seconds)


class _CappedCluster:
    """The cluster metadata, with the input's partitions beyond its changelog's left out."""

    def __init__(self, cluster: Any, sized_like: Mapping[str, str]) -> None:
        self._cluster = cluster
        self._sized_like = sized_like

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        partitions: set[int] | None = self._cluster.partitions_for_topic(topic)
        like = self._sized_like.get(topic)
        if partitions is None or like is None:
            return partitions
        limit = len(self._cluster.partitions_for_topic(like) or ())
        return {p for p in partitions if p < limit} if limit else partitions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


def capped(cluster: Any, conf: Settings) -> Any:
    """`cluster` as an assignment must see it: input partitions whose changelog partition
    does not exist yet are assigned to no one (the input grew, the changelog not yet:
    the group joins again once it has). The input in the same group as its changelog."""
    return _CappedCluster(cluster, {conf.events_topic: progress_changelog(conf)})


class InputSizedAssignor(PartitionAssignor):
    """faust's assignor over `capped` metadata."""

    def assign(self, cluster: Any, member_metadata: Any) -> Any:
        return super().assign(capped(cluster, settings()), member_metadata)
