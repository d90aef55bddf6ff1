"""What a worker warns about at its start: internal topics with fewer replicas than the
cluster's default, and min.insync.replicas of 1 where three brokers could do better."""

from __future__ import annotations

from app.kafka.replication import ClusterReplication, weakly_replicated
from app.settings import Settings

PRODUCTION = ClusterReplication(brokers=3, default_factor=3, min_insync=2)


def test_a_well_replicated_cluster_has_nothing_to_say() -> None:
    assert weakly_replicated(PRODUCTION, {"app-pairing-changelog": 3, "app-keyed": 3}) == []


def test_each_topic_with_fewer_replicas_than_the_default_is_named() -> None:
    risks = weakly_replicated(PRODUCTION, {"b-changelog": 1, "a-keyed": 2, "c-changelog": 3})
    assert risks == [
        "a-keyed has 2 replicas, the cluster's default is 3",
        "b-changelog has 1 replica, the cluster's default is 3",
    ]


def test_min_insync_of_one_is_a_risk_on_three_brokers_only() -> None:
    loose = ClusterReplication(brokers=3, default_factor=3, min_insync=1)
    [risk] = weakly_replicated(loose, {"b": 3, "a": 3})
    assert risk.startswith("min.insync.replicas is 1 on a cluster of 3 brokers")
    assert risk.endswith("(a, b)")
    single = ClusterReplication(brokers=1, default_factor=1, min_insync=1)
    assert weakly_replicated(single, {"a": 1}) == []


def test_the_setting_is_unset_by_default() -> None:
    """Unset, the worker asks the cluster (its default.replication.factor)."""
    assert Settings().replication_factor is None
    assert Settings(replication_factor=3).replication_factor == 3
