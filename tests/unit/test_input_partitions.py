"""The input topic as it is (app/exactly_once/input_partitions.py): the count the worker tells, and
assignments made while the source-progress changelog is smaller than the input."""

from __future__ import annotations

from faust.assignor import PartitionAssignor

from app.exactly_once.input_partitions import InputSize, capped
from app.kafka.access import progress_changelog
from app.settings import settings
from tables import source_progress

conf = settings()
CHANGELOG = progress_changelog(conf)


class Cluster:
    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.partitions.get(topic)
        return None if count is None else set(range(count))


def groups(cluster: object) -> dict[int, list[set[str]]]:
    topics = {conf.events_topic, CHANGELOG, conf.keyed_topic}
    subscriptions = {"a": sorted(topics), "b": sorted(topics)}
    found = PartitionAssignor._get_copartitioned_groups(topics, cluster, subscriptions)  # type: ignore[arg-type]
    return {n: [set(g) for g in grouped] for n, grouped in found.items()}


def test_the_changelog_named_is_the_source_progress_table_s() -> None:
    assert source_progress.table.changelog_topic.get_topic_name() == CHANGELOG


def test_the_input_is_assigned_with_its_changelog_while_the_changelog_is_smaller() -> None:
    grown = Cluster({conf.events_topic: 8, CHANGELOG: 4, conf.keyed_topic: 4})
    # As faust sees it: input partitions 4-7 without changelog partitions, and 0-3 in
    # a group apart from their changelog's, so to other workers.
    assert groups(grown) == {8: [{conf.events_topic}], 4: [{CHANGELOG, conf.keyed_topic}]}
    # Capped: the input's first four partitions with their changelog, the rest to no one.
    assert groups(capped(grown, conf)) == {4: [{conf.events_topic, CHANGELOG, conf.keyed_topic}]}
    assert capped(grown, conf).partitions_for_topic(conf.events_topic) == {0, 1, 2, 3}


def test_once_the_changelog_has_grown_every_input_partition_is_assigned() -> None:
    cluster = Cluster({conf.events_topic: 8, CHANGELOG: 8, conf.keyed_topic: 4})
    assert capped(cluster, conf).partitions_for_topic(conf.events_topic) == set(range(8))
    assert groups(capped(cluster, conf)) == groups(cluster)


def test_an_input_without_its_changelog_in_the_metadata_is_left_as_it_is() -> None:
    cluster = Cluster({conf.events_topic: 8, conf.keyed_topic: 4})
    assert capped(cluster, conf).partitions_for_topic(conf.events_topic) == set(range(8))
    assert capped(cluster, conf).partitions_for_topic("other") is None


def test_the_input_size_only_grows() -> None:
    size = InputSize(4)
    assert not size.grew_to(None)
    assert not size.grew_to(3)
    assert not size.grew_to(4)
    assert size.grew_to(8) and size.count == 8
