"""How many replicas the topics a worker creates get, and a warning at its start for
internal topics that have fewer than the cluster would give them.

With PAIRSTREAM_REPLICATION_FACTOR unset a topic gets the cluster's
default.replication.factor, as Kafka Streams' internal topics do (KIP-733). The broker
applies its default itself only to a CreateTopics of version 4 or later, and aiokafka
(which faust creates its topics with too) sends versions 0-3: so a worker reads the
default from a broker (DescribeConfigs, which needs DESCRIBE_CONFIGS on the cluster)
and asks for that number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from app.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_FACTOR = "default.replication.factor"
MIN_INSYNC = "min.insync.replicas"
# With fewer brokers one cannot ask for more: a single test broker is no risk to name.
BROKERS_FOR_DURABILITY = 3


@dataclass(frozen=True, slots=True)
class ClusterReplication:
    """What the cluster's brokers give a topic created without replication settings."""

    brokers: int
    default_factor: int
    min_insync: int


class ClusterConfigUnreadable(RuntimeError):
    pass


async def cluster_replication(admin: AIOKafkaAdminClient) -> ClusterReplication:
    """The cluster's broker count, and the replication defaults of one of its brokers
    (brokers of one cluster are configured alike, or their topics differ by chance)."""
    cluster = await admin.describe_cluster()
    brokers = cluster["brokers"]
    node = str(cluster["controller_id"] if cluster["controller_id"] >= 0 else brokers[0]["node_id"])
    wanted = {DEFAULT_FACTOR: None, MIN_INSYNC: None}
    [response] = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, node, wanted)]
    )
    [resource] = response.to_object()["resources"]
    if resource["error_code"] != 0:
        raise ClusterConfigUnreadable(
            f"the broker did not say its {DEFAULT_FACTOR} (error {resource['error_code']}"
            f"{': ' + resource['error_message'] if resource['error_message'] else ''}): grant"
            " DESCRIBE_CONFIGS on the cluster (python -m tools.kafka_acls), or set"
            " PAIRSTREAM_REPLICATION_FACTOR"
        )
    values = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
    return ClusterReplication(len(brokers), int(values[DEFAULT_FACTOR]), int(values[MIN_INSYNC]))


async def replication_factor(conf: Settings, admin: AIOKafkaAdminClient) -> int:
    """What the topics a worker creates are created with: PAIRSTREAM_REPLICATION_FACTOR,
    or the cluster's default."""
    if conf.replication_factor is not None:
        return conf.replication_factor
    return (await cluster_replication(admin)).default_factor


def weakly_replicated(cluster: ClusterReplication, replicas: Mapping[str, int]) -> list[str]:
    """What puts the state of `replicas` (topic -> its fewest replicas of a partition)
    at risk, one line each: fewer replicas than the cluster's default, or a broker loss
    that would leave a committed record on one broker only."""
    found = [
        f"{topic} has {count} replica{'s' * (count != 1)}, the cluster's default is"
        f" {cluster.default_factor}"
        for topic, count in sorted(replicas.items())
        if count < cluster.default_factor
    ]
    if cluster.brokers >= BROKERS_FOR_DURABILITY and cluster.min_insync == 1 and replicas:
        found.append(
            f"{MIN_INSYNC} is 1 on a cluster of {cluster.brokers} brokers: a record acknowledged"
            f" by one broker is lost with it ({', '.join(sorted(replicas))})"
        )
    return found


async def warn_if_weakly_replicated(admin: AIOKafkaAdminClient, topics: Iterable[str]) -> None:
    """Log a warning per risk `weakly_replicated` finds in those of `topics` that exist.
    A start goes on either way: an operator may have chosen so."""
    try:
        cluster = await cluster_replication(admin)
    except ClusterConfigUnreadable as exc:
        log.warning("replication of the internal topics not checked: %s", exc)
        return
    described: list[Any] = await admin.describe_topics(sorted(topics))
    replicas = {
        t["topic"]: min(len(p["replicas"]) for p in t["partitions"])
        for t in described
        if t["error_code"] == 0 and t["partitions"]
    }
    for risk in weakly_replicated(cluster, replicas):
        log.warning("state at risk: %s (docs/deploy.md, 'Replication')", risk)
