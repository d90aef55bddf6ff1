"""Debezium's PostgreSQL connector on a Kafka Connect worker of tools/connect.py, against
the real broker and a PostgreSQL cluster of tools/postgres.py: committed rows reach the
change topic once each, exact, and rolled-back ones never; a restart of PostgreSQL is
survived; a dropped publication or slot is reported with its cause. On the secured broker,
a worker holding only its own ACLs (connect_permissions) runs the connector, and without
WRITE on the change topics its task delivers nothing and fails saying so."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import SecretStr

from app.kafka.access import Operation, Pattern, Permission, ResourceType
from app.kafka.admin import read_committed
from app.kafka.connection import KafkaConnection
from app.settings import ROOT, Settings
from tools import broker as local_broker
from tools import connect, postgres
from tools.kafka_acls import grant, revoke
from tools.ports import free_port

pytestmark = pytest.mark.broker

Change = tuple[dict[str, Any], dict[str, Any]]  # a record's key and value


@pytest.fixture
def cluster() -> Iterator[postgres.Cluster]:
    cluster = postgres.cluster("connect-it", free_port())
    postgres.clean(cluster)  # an earlier run's, if it was cut short
    postgres.start(cluster)
    try:
        yield cluster
    finally:
        postgres.clean(cluster)


@pytest.fixture
def worker(broker: str) -> Iterator[connect.Worker]:
    worker = connect.Worker(f"it-{uuid.uuid4().hex[:8]}", free_port())
    try:
        connect.start(worker, KafkaConnection(broker), timeout=180)
        yield worker
    finally:
        connect.stop(worker)
        shutil.rmtree(worker.home, ignore_errors=True)
        asyncio.run(_delete_topics(KafkaConnection(broker), worker.group_id))


async def _delete_topics(kafka: KafkaConnection, *prefixes: str) -> None:
    """The worker's own topics and its change topic: named after its group, or `prefixes`."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka())
    await admin.start()
    try:
        topics = await admin.list_topics()
        doomed = [topic for topic in topics if topic.startswith(prefixes)]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


def _execute(dsn: str, *statements: str, commit: bool = True) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as session,
        session.transaction(force_rollback=not commit),
    ):
        for statement in statements:
            session.execute(statement.encode())


async def _changes(conf: Settings, connector: connect.Connector, wanted: int) -> list[Change]:
    """Every committed record of the change topic, once at least `wanted` have arrived."""
    deadline = time.monotonic() + 90
    topic = connector.change_topic
    count = int(connector.config["topic.creation.default.partitions"])  # made by Connect
    partitions = [TopicPartition(topic, partition) for partition in range(count)]
    async with read_committed(conf) as consumer:
        while topic not in await consumer.topics():
            assert time.monotonic() < deadline, f"no topic {topic}"
            await asyncio.sleep(0.5)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        found: list[Change] = []
        while len(found) < wanted:
            assert time.monotonic() < deadline, f"{len(found)} of {wanted} changes: {found}"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += [(json.loads(r.key), json.loads(r.value)) for r in records]
        # Then to the end: whatever else was committed before them is read too.
        ends = await consumer.end_offsets(partitions)
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += [(json.loads(r.key), json.loads(r.value)) for r in records]
        return found


def _rows(changes: list[Change]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each change's op and row by its key's id; each id once."""
    ids = [key["id"] for key, _ in changes]
    assert len(ids) == len(set(ids)), f"a row twice: {sorted(ids)}"
    return {key["id"]: (value["op"], value["after"]) for key, value in changes}


def _failure(worker: connect.Worker, name: str, unlike: str = "", timeout: float = 120) -> str:
    """The connector's failure, once Connect reports one (other than `unlike`)."""
    deadline = time.monotonic() + timeout
    while True:
        now = connect.state(connect.request(worker, "GET", f"/connectors/{name}/status"))
        if now.failure is not None and now.failure != unlike:
            return now.failure
        assert time.monotonic() < deadline, f"no failure: {now.summary}"
        time.sleep(1)


def _slot_released(superuser: str, timeout: float = 60) -> None:
    """Until no replication connection holds the slot (a failed task's closes)."""
    deadline = time.monotonic() + timeout
    query = "SELECT active FROM pg_replication_slots WHERE slot_name = 'pairstream_events'"
    while True:
        with psycopg.connect(superuser) as session:
            if session.execute(query).fetchone() == (False,):
                return
        assert time.monotonic() < deadline, "the slot is still in use"
        time.sleep(0.5)


def _cli_check(
    worker: connect.Worker, cluster: postgres.Cluster
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.connect", "check", "--name", worker.name,
         "--rest-port", str(worker.rest_port), "--postgres", cluster.name,
         "--postgres-port", str(cluster.port), "--timeout", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_committed_rows_arrive_once_and_failures_say_why(
    broker: str, cluster: postgres.Cluster, worker: connect.Worker
) -> None:
    conf = Settings(broker=f"kafka://{broker}")
    app, superuser = postgres.dsn(cluster), postgres.dsn(cluster, postgres.SUPERUSER)
    database = connect.postgres_database(cluster.name, cluster.port)
    repo = connect.load_connector()
    # A change topic of this worker's own, not the repository's pairstream.public.events.
    connector = replace(repo, config={**repo.config, "topic.prefix": worker.group_id})
    insert = "INSERT INTO events VALUES ('{}', '{}', '{}', {})"
    _execute(app, insert.format("before", "B", "2024-02-09 21:00:00+00", "'12.30'"))

    wrong = replace(database, password=SecretStr("not-the-password"))
    with pytest.raises(connect.ConnectError, match="refused: authentication failed: password"):
        connect.register(worker, wrong, connector)

    # PostgreSQL down when the connector is registered: refused, saying so; up, it goes.
    postgres.stop(cluster)
    with pytest.raises(connect.ConnectError, match="refused: cannot connect to PostgreSQL"):
        connect.register(worker, database, connector)
    postgres.start(cluster)

    connect.register(worker, database, connector)
    assert connect.check(worker, connector, database, timeout=120).running
    _execute(
        app,
        insert.format("rolled-back-1", "A", "2024-02-09 21:00:01+00", 1),
        insert.format("rolled-back-2", "B", "2024-02-09 21:00:01+00", 2),
        commit=False,
    )
    _execute(
        app,
        insert.format("c-1", "A", "2024-02-09 23:00:02.123456+02", "'0.1'"),
        insert.format("c-2", "B", "2024-02-09 21:00:02+00", "'12345678901234567890.000000000001'"),
        insert.format("c-3", "A", "2024-02-09 21:00:03+00", "1e-30"),
    )
    changes = asyncio.run(_changes(conf, connector, 4))
    assert _rows(changes) == {
        "before": ("r", {"id": "before", "type": "B", "ts": "2024-02-09T21:00:00.000000Z",
                         "value": "12.30"}),
        "c-1": ("c", {"id": "c-1", "type": "A", "ts": "2024-02-09T21:00:02.123456Z",
                      "value": "0.1"}),
        "c-2": ("c", {"id": "c-2", "type": "B", "ts": "2024-02-09T21:00:02.000000Z",
                      "value": "12345678901234567890.000000000001"}),
        "c-3": ("c", {"id": "c-3", "type": "A", "ts": "2024-02-09T21:00:03.000000Z",
                      "value": "0.000000000000000000000000000001"}),
    }  # fmt: skip
    key, value = next(change for change in changes if change[0]["id"] == "c-1")
    assert key == {"id": "c-1"}
    assert value["before"] is None
    assert value["source"]["table"] == "events"

    # PostgreSQL down: Connect still says RUNNING (Debezium retries), the slot says why.
    postgres.stop(cluster)
    down = connect.check(worker, connector, database, timeout=15)
    assert not down.running
    assert "but not streaming: cannot connect to PostgreSQL: connection to" in str(down.failure)
    postgres.start(cluster)
    assert connect.check(worker, connector, database, timeout=120).running
    _execute(app, insert.format("after-restart", "B", "2024-02-09 21:00:04+00", 4))
    rows = _rows(asyncio.run(_changes(conf, connector, 5)))
    assert sorted(rows) == ["after-restart", "before", "c-1", "c-2", "c-3"]

    # An operator drops the publication: the task fails, and check says why, exit 1.
    _execute(superuser, "DROP PUBLICATION pairstream_events")
    _execute(app, insert.format("unpublished", "A", "2024-02-09 21:00:05+00", 5))
    dropped = _failure(worker, connector.name)
    assert dropped.startswith("task 0 FAILED: publication missing: ")
    checked = _cli_check(worker, cluster)
    assert checked.returncode == 1
    assert checked.stdout.startswith("task 0 FAILED: publication missing: "), checked

    # ... and the slot: the connector's position is gone with it.
    _execute(superuser, "CREATE PUBLICATION pairstream_events FOR TABLE events")
    _slot_released(superuser)
    _execute(superuser, "SELECT pg_drop_replication_slot('pairstream_events')")
    connect.restart(worker, connector.name)
    assert _failure(worker, connector.name, unlike=dropped).startswith(
        "task 0 FAILED: replication slot missing/dropped: the connector's position, LSN "
    )
    password = database.password.get_secret_value()
    assert password not in worker.log_file.read_text() + checked.stdout + checked.stderr


def test_connect_runs_the_connector_with_only_its_acls_on_the_secured_broker(
    secure_broker: list[local_broker.Node], database: postgres.Cluster
) -> None:
    """A SCRAM user of its own holding exactly connect_permissions: the worker starts and
    the connector's rows arrive (read_committed). WRITE on the change topics taken away:
    the next row is not delivered, and the task fails naming the refusal. Granted again
    and the worker restarted (its topics exist now, so it checks their cleanup policy),
    the row arrives, once, and Connect logged no other refusal."""
    tag = uuid.uuid4().hex[:8]
    security = local_broker.security(secure_broker[0].name)
    bootstrap = local_broker.bootstrap_servers(secure_broker)
    admin = security.connection(bootstrap)
    env = security.environment(bootstrap, "admin")  # the change topic read as the super user
    conf = Settings(**{k.removeprefix("PAIRSTREAM_").lower(): v for k, v in env.items()})
    user, worker = f"connect-{tag}", connect.Worker(f"acl-{tag}", free_port())
    repo = connect.load_connector()
    prefix = f"acl{tag}"
    # The failed task's transaction stays open until it times out, and Debezium's stop
    # reads the offsets behind it (read_committed) before the task shows FAILED: 10 s,
    # not the producer's default of 60.
    timeout = {"producer.override.transaction.timeout.ms": "10000"}
    config = {**repo.config, "topic.prefix": prefix, "slot.name": f"slot_{tag}", **timeout}
    connector = connect.Connector(f"events-{tag}", config)
    permissions = connect.connect_permissions(worker, prefix, connector.name)
    kafka = asyncio.run(security.add_user(bootstrap, user))
    asyncio.run(grant(admin, f"User:{user}", permissions))
    app = postgres.dsn(database)
    source = connect.postgres_database(database.name, database.port)
    insert = "INSERT INTO events VALUES ('{}', 'A', '2024-02-09 21:00:0{}+00', {})"
    started = time.monotonic()
    try:
        connect.start(worker, kafka, timeout=180)
        connect.register(worker, source, connector)
        assert connect.check(worker, connector, source, timeout=120).running
        _execute(app, *(insert.format(f"r-{i}", i, i) for i in range(3)))
        assert sorted(_rows(asyncio.run(_changes(conf, connector, 3)))) == ["r-0", "r-1", "r-2"]
        print(f"\nrows delivered {time.monotonic() - started:.1f} s after the start")
        refusals = ("Unable to use admin client", "AuthorizationException", "Not authorized")
        assert [line for line in worker.log_file.read_text().splitlines()
                if any(refusal in line for refusal in refusals)] == []  # fmt: skip

        write = Permission(ResourceType.TOPIC, f"{prefix}.", Operation.WRITE, Pattern.PREFIXED)
        assert write in permissions
        asyncio.run(revoke(admin, f"User:{user}", [write]))
        _execute(app, insert.format("denied", 5, 5))
        failure = _failure(worker, connector.name, timeout=60)
        print(f"without {write}: {failure} ({time.monotonic() - started:.1f} s)")
        assert failure == (
            "task 0 FAILED: Kafka ACL missing: Not authorized to access topics:"
            f" [{connector.change_topic}]"
        )
        checked = connect.check(worker, connector, source, timeout=30)
        assert not checked.running and checked.failure == failure, checked
        assert sorted(_rows(asyncio.run(_changes(conf, connector, 3)))) == ["r-0", "r-1", "r-2"]

        asyncio.run(grant(admin, f"User:{user}", [write]))
        log_before = len(worker.log_file.read_text().splitlines())
        connect.stop(worker, grace=10)
        connect.start(worker, kafka, timeout=180)  # the failed task starts again with it
        assert connect.check(worker, connector, source, timeout=120).running
        rows = _rows(asyncio.run(_changes(conf, connector, 4)))  # each once
        assert sorted(rows) == ["denied", "r-0", "r-1", "r-2"]
        restarted = worker.log_file.read_text().splitlines()[log_before:]
        # TopicAdmin logs at info (connect/log4j2.properties): the cleanup policy checked.
        assert [line for line in restarted if any(refusal in line for refusal in refusals)] == []
        print(f"delivered once after the restart ({time.monotonic() - started:.1f} s)")
    finally:
        connect.stop(worker, grace=5)
        shutil.rmtree(worker.home, ignore_errors=True)
        asyncio.run(revoke(admin, f"User:{user}", permissions))
        asyncio.run(security.remove_user(bootstrap, user))
        asyncio.run(_delete_topics(admin, worker.group_id, f"{prefix}."))
