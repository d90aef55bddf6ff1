"""What a worker may do on the cluster: the ACLs it needs (granted by
`python -m tools.kafka_acls`), and a check at its start that it can connect and has
them, so that a wrong password, an untrusted certificate or a missing ACL stops it at
once with one message that says what to do (docs/deploy.md), before it joins its group
or writes anything.
Topic permissions are read from the broker's answer to a metadata request of version 8
(authorized_operations.py).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.conn import create_conn
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest

from app.kafka.authorized_operations import AuthorizedOperations
from app.kafka.connection import KafkaConnection
from app.settings import Settings

EX_CONFIG = 78  # sysexits.h: a configuration error, which a restart does not mend
CLUSTER_NAME = "kafka-cluster"  # the one name of Kafka's cluster resource


class ResourceType(IntEnum):  # Kafka's AclResourceType codes
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class Pattern(IntEnum):  # Kafka's PatternType codes
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):  # Kafka's AclOperation codes
    READ = 3
    WRITE = 4
    CREATE = 5
    ALTER = 7
    DESCRIBE_CONFIGS = 10


@dataclass(frozen=True)
class Permission:
    """One ACL: `operation` allowed on the resources `name` names (or starts with)."""

    resource: ResourceType
    name: str
    operation: Operation
    pattern: Pattern = Pattern.LITERAL

    @property
    def prefixed(self) -> bool:
        return self.pattern is Pattern.PREFIXED

    def covers(self, topic: str) -> bool:
        return topic.startswith(self.name) if self.prefixed else topic == self.name

    def __str__(self) -> str:
        kind = "prefix" if self.prefixed else "name"
        return f"{self.operation.name} on {self.resource.name} {kind} {self.name!r}"


class KafkaAccessError(RuntimeError):
    """The worker cannot connect, or may not do what it must: the message says why and
    what to do."""


def internal_prefix(conf: Settings) -> str:
    """Internal topics (changelogs, re-keyed streams) and transactional ids start so."""
    return f"{conf.app_id}-"


def progress_changelog(conf: Settings) -> str:
    """The changelog of the source-progress table (tables/source_progress.py): a worker
    grows it like the input topic (app/exactly_once/input_partitions.py)."""
    return f"{internal_prefix(conf)}source-progress-changelog"


def worker_topics(conf: Settings) -> tuple[set[str], set[str]]:
    """The topics a worker reads, and those it writes, apart from its internal ones."""
    reads = {conf.events_topic, conf.keyed_topic}
    writes = {conf.keyed_topic, conf.pairs_topic, conf.unpaired_topic, conf.dead_letter_topic}
    if conf.delivery_enabled:
        reads.add(conf.delivery_source)
        writes |= {conf.delivery_dead_letter_topic, conf.delivery_uncertain_topic}
    if conf.chain_enabled:
        reads |= {conf.deposits_topic, conf.accounts_topic}
        writes |= {conf.validated_topic, conf.deposits_dead_letter_topic}
    if conf.enrichment_enabled:
        reads.add(conf.sources_topic)
        writes |= {conf.enriched_topic, conf.sources_dead_letter_topic}
    if conf.patterns is not None:
        inputs, matches = conf.pattern_topics()
        reads |= {*inputs, conf.pattern_events_topic}
        writes |= {conf.pattern_events_topic, *matches}
    return reads, writes


def worker_permissions(conf: Settings) -> list[Permission]:
    """Exactly what a worker needs. CREATE on each of its topics: it creates the missing
    ones, and faust asks the broker to create its declared topics at every start, which
    the broker refuses without it even when they exist."""
    reads, writes = worker_topics(conf)
    prefix = internal_prefix(conf)
    topic, group, txn = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    return [
        *(Permission(topic, name, Operation.READ) for name in sorted(reads)),
        *(Permission(topic, name, Operation.WRITE) for name in sorted(writes)),
        *(Permission(topic, name, Operation.CREATE) for name in sorted(reads | writes)),
        *(
            Permission(topic, prefix, operation, Pattern.PREFIXED)
            for operation in (Operation.READ, Operation.WRITE, Operation.CREATE)
        ),
        # Partitions added to the input are added to this changelog too.
        Permission(topic, progress_changelog(conf), Operation.ALTER),
        Permission(group, conf.app_id, Operation.READ),
        Permission(txn, prefix, Operation.WRITE, Pattern.PREFIXED),
        # The cluster's default.replication.factor, when no setting replaces it (replication.py).
        *(
            [Permission(ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE_CONFIGS)]
            if conf.replication_factor is None
            else []
        ),
    ]


def analytics_permissions(conf: Settings) -> list[Permission]:
    """What the Spark jobs need: read the pipeline's topics, with consumer groups of
    Spark's own naming, and read the pairing group's committed offsets."""
    topics = [
        conf.events_topic,
        conf.keyed_topic,
        conf.pairs_topic,
        conf.unpaired_topic,
        conf.dead_letter_topic,
        *(name for names in conf.pattern_topics() for name in names),
    ]
    return [
        *(Permission(ResourceType.TOPIC, name, Operation.READ) for name in sorted(set(topics))),
        Permission(ResourceType.GROUP, conf.app_id, Operation.READ),
        Permission(ResourceType.GROUP, "spark-kafka-source-", Operation.READ, Pattern.PREFIXED),
    ]


# The connection


async def check_connection(kafka: KafkaConnection, timeout: float) -> None:
    """Connect (TLS, SASL) to a bootstrap server; retry an unreachable one until
    `timeout`, but fail at once on what retrying cannot mend."""
    deadline = time.monotonic() + timeout
    while True:
        unreachable = []
        for host, port in _hosts(kafka.bootstrap_servers):
            try:
                connection = await create_conn(host, port, **_connection_options(kafka))
                try:
                    # A broker answers ApiVersions before SASL: ask what it answers after.
                    await connection.send(MetadataRequest([]))
                finally:
                    connection.close()
            except ssl.SSLError as exc:
                raise KafkaAccessError(_tls_advice(host, port, exc)) from None
            except UnsupportedSaslMechanismError as exc:
                # The broker's answer is final: no retry mends it. aiokafka's message,
                # when it has one, lists the mechanisms the broker enables.
                said = [f" ({arg})" for arg in exc.args[:1] if isinstance(arg, str)]
                raise KafkaAccessError(
                    f"the broker at {host}:{port} does not enable SASL mechanism"
                    f" {kafka.sasl_mechanism}{''.join(said)}: set"
                    " PAIRSTREAM_KAFKA_SASL_MECHANISM to one its listener enables"
                    " (the broker's sasl.enabled.mechanisms)"
                ) from None
            except SaslAuthenticationFailed as exc:
                raise KafkaAccessError(
                    f"the broker at {host}:{port} refused user {kafka.username!r}"
                    f" ({kafka.sasl_mechanism}): {exc.args[0] if exc.args else exc}; check"
                    " PAIRSTREAM_KAFKA_USERNAME, the password (PAIRSTREAM_KAFKA_PASSWORD or"
                    " PAIRSTREAM_KAFKA_PASSWORD_FILE) and PAIRSTREAM_KAFKA_SASL_MECHANISM"
                ) from None
            except (TimeoutError, OSError, KafkaError) as exc:
                # Down, starting, or speaking another protocol (plaintext to a TLS port).
                unreachable.append(f"{host}:{port} ({exc!r})")
                continue
            return
        if time.monotonic() > deadline:
            raise KafkaAccessError(
                f"no broker answered within {timeout:.0f}s: {'; '.join(unreachable)}; check"
                " PAIRSTREAM_BROKER and PAIRSTREAM_KAFKA_SECURITY_PROTOCOL"
            )
        await asyncio.sleep(1)  # a broker that is starting


def _hosts(bootstrap_servers: str) -> list[tuple[str, int]]:
    hosts = []
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def _connection_options(kafka: KafkaConnection) -> dict[str, Any]:
    options = kafka.aiokafka()
    del options["bootstrap_servers"]
    return {**options, "request_timeout_ms": 10_000}


def _tls_advice(host: str, port: int, exc: ssl.SSLError) -> str:
    reason = getattr(exc, "verify_message", None) or str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError) and "mismatch" in reason.lower():
        return (
            f"the broker's certificate at {host}:{port} is not for {host!r} ({reason}):"
            " connect by a name the certificate holds (PAIRSTREAM_BROKER)"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the broker's certificate at {host}:{port} is not trusted ({reason}): set"
            " PAIRSTREAM_KAFKA_CA_FILE to the CA certificate (PEM) that signed it"
        )
    return (
        f"TLS with the broker at {host}:{port} failed ({reason}): is that listener TLS?"
        " Check PAIRSTREAM_KAFKA_SECURITY_PROTOCOL and the port"
    )


# The permissions


async def check_permissions(
    kafka: KafkaConnection, permissions: Iterable[Permission], internal_topics: Iterable[str]
) -> None:
    """Raise KafkaAccessError naming every permission the broker does not grant. On a
    topic that does not exist yet only CREATE can be checked (a creation the broker
    validates but does not carry out); the rest shows when it is used."""
    needed = list(permissions)
    literal = {p.name for p in needed if p.resource is ResourceType.TOPIC and not p.prefixed}
    topics = sorted(literal | set(internal_topics))
    client = AIOKafkaClient(**kafka.aiokafka(), request_timeout_ms=10_000)
    await client.bootstrap()
    try:
        allowed = await _topic_operations(client, topics)
        missing = [
            f"{permission.operation.name} on topic {topic!r}"
            for permission in needed
            if permission.resource is ResourceType.TOPIC
            for topic, operations in allowed.items()
            if permission.covers(topic) and permission.operation not in operations
        ]
        for permission in needed:
            if permission.resource is ResourceType.GROUP and not permission.prefixed:
                missing += await _group_missing(client, permission)
    finally:
        await client.close()
    creates = [p for p in needed if p.operation is Operation.CREATE]
    to_create = [t for t in topics if t not in allowed and any(p.covers(t) for p in creates)]
    missing += [f"CREATE on topic {topic!r}" for topic in await _uncreatable(kafka, to_create)]
    for permission in needed:
        if permission.resource is ResourceType.TRANSACTIONAL_ID:
            missing += await _transactional_id_missing(kafka, permission)
    if missing:
        raise KafkaAccessError(
            f"user {kafka.username!r} lacks {', '.join(missing)}: grant what docs/deploy.md"
            " lists (python -m tools.kafka_acls)"
        )


async def _uncreatable(kafka: KafkaConnection, topics: list[str]) -> list[str]:
    """Of `topics` (which do not exist), those the broker would not let the caller create;
    an admin client only when there are any (a restart finds its topics there)."""
    if not topics:
        return []
    admin = AIOKafkaAdminClient(**kafka.aiokafka(), request_timeout_ms=10_000)
    await admin.start()
    try:
        refused = []
        for topic in topics:
            response: Any = await admin.create_topics([NewTopic(topic, 1, 1)], validate_only=True)
            [(_, error_code, *_)] = response.topic_errors
            if error_code == TOPIC_AUTHORIZATION_FAILED:
                refused.append(topic)
        return refused
    finally:
        await admin.close()


async def _group_missing(client: AIOKafkaClient, permission: Permission) -> list[str]:
    deadline = time.monotonic() + COORDINATOR_WAIT_SECONDS
    while True:
        try:
            await client.coordinator_lookup(CoordinationType.GROUP, permission.name)
        except GroupAuthorizationFailedError:
            return [str(permission)]
        except KafkaError as exc:
            # The first lookup on a new cluster creates the offsets topic.
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        return []


async def _transactional_id_missing(kafka: KafkaConnection, permission: Permission) -> list[str]:
    """Start a transactional producer under an id of the prefix: that only registers the
    id with its coordinator, and writes no record."""
    producer = AIOKafkaProducer(
        **kafka.aiokafka(), transactional_id=f"{permission.name}access-check"
    )
    try:
        await producer.start()
    except TransactionalIdAuthorizationFailed:
        return [str(permission)]
    finally:
        await producer.stop()
    return []


TOPIC_AUTHORIZATION_FAILED = 29
COORDINATOR_WAIT_SECONDS = 30
UNKNOWN_TOPIC = 3


async def _topic_operations(
    client: AIOKafkaClient, topics: list[str]
) -> dict[str, frozenset[Operation]]:
    """Per existing topic the operations the caller may do on it (none: not even
    DESCRIBE). Topics that do not exist are left out."""
    response: Any = await client.send(client.get_random_node(), AuthorizedOperations(topics))
    found: dict[str, frozenset[Operation]] = {}
    for error_code, topic, _, _, operations in response.topics:
        if error_code == TOPIC_AUTHORIZATION_FAILED:
            found[topic] = frozenset()
        elif error_code != UNKNOWN_TOPIC:
            found[topic] = frozenset(o for o in Operation if operations & (1 << o))
    return found


async def check_access(
    kafka: KafkaConnection,
    permissions: Iterable[Permission],
    internal_topics: Iterable[str] = (),
    timeout: float = 60.0,
) -> None:
    """Connect, then check `permissions`: what a worker (app/worker.py) and the Spark
    jobs (analytics/__main__.py) do before anything else."""
    await check_connection(kafka, timeout)
    try:
        await check_permissions(kafka, permissions, internal_topics)
    except KafkaError as exc:
        raise KafkaAccessError(f"checking permissions failed: {exc!r}") from None
