"""The project's PostgreSQL cluster (tools/postgres.py), real: a logical write-ahead log, the
table and publication of the change capture, least privilege for the connector, and a
start/stop that keeps the data. Needs PostgreSQL 15 (`make postgres`), not Kafka."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from tools import postgres
from tools.ports import free_port

# A Debezium-style row: NUMERIC beyond a double's precision, microsecond event time.
ROW = (
    "e-1",
    "A",
    datetime(2026, 12, 5, 6, 0, 0, 123456, tzinfo=UTC),
    Decimal("1234567.000000000000000001"),
)
INSERT = "INSERT INTO events (id, type, ts, value) VALUES (%s, %s, %s, %s)"


def unique_cluster() -> postgres.Cluster:
    return postgres.Cluster(f"test-{uuid.uuid4().hex[:8]}", free_port())


@pytest.fixture(scope="module")
def cluster() -> Iterator[postgres.Cluster]:
    started = unique_cluster()
    postgres.start(started, timeout=60)
    yield started
    postgres.clean(started)


def connect(cluster: postgres.Cluster, role: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(postgres.dsn(cluster, role), autocommit=True)


def test_the_log_is_logical_and_the_server_on_loopback(cluster: postgres.Cluster) -> None:
    with connect(cluster, postgres.SUPERUSER) as admin:
        shown = {
            name: admin.execute(f"SHOW {name}").fetchone()
            for name in ("wal_level", "listen_addresses", "port", "password_encryption")
        }
        slots = admin.execute("SHOW max_replication_slots").fetchone()
        senders = admin.execute("SHOW max_wal_senders").fetchone()
    assert shown == {
        "wal_level": ("logical",),
        "listen_addresses": ("127.0.0.1",),
        "port": (str(cluster.port),),
        "password_encryption": ("scram-sha-256",),
    }
    assert slots is not None and int(slots[0]) >= 10
    assert senders is not None and int(senders[0]) >= 10


def test_the_table_and_its_publication(cluster: postgres.Cluster) -> None:
    with connect(cluster, postgres.SUPERUSER) as admin:
        columns = admin.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_name = 'events' ORDER BY ordinal_position"
        ).fetchall()
        key = admin.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = 'events'::regclass AND i.indisprimary"
        ).fetchall()
        published = admin.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables"
            " WHERE pubname = 'pairstream_events'"
        ).fetchall()
    assert columns == [
        ("id", "text", "NO"),
        ("type", "text", "NO"),
        ("ts", "timestamp with time zone", "NO"),
        ("value", "numeric", "NO"),
    ]
    assert key == [("id",)]
    assert published == [("public", "events")]


def test_the_app_writes_events_exactly(cluster: postgres.Cluster) -> None:
    with connect(cluster, postgres.APP) as app:
        app.execute(INSERT, ROW)
        assert app.execute("SELECT * FROM events WHERE id = %s", [ROW[0]]).fetchone() == ROW
        with pytest.raises(psycopg.errors.CheckViolation):
            app.execute(INSERT, ("e-2", "C", ROW[2], 1))
        with pytest.raises(psycopg.errors.UniqueViolation):
            app.execute(INSERT, ROW)
        assert app.execute("UPDATE events SET value = 2 WHERE id = %s", [ROW[0]]).rowcount == 1
        assert app.execute("DELETE FROM events WHERE id = %s", [ROW[0]]).rowcount == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("CREATE TABLE mine (x int)")


def test_debezium_reads_and_replicates_but_writes_nothing(cluster: postgres.Cluster) -> None:
    with connect(cluster, postgres.APP) as app:
        app.execute(INSERT, ("e-3", "B", ROW[2], 3))
    with connect(cluster, postgres.DEBEZIUM) as debezium:
        assert debezium.execute("SELECT id FROM events").fetchall() == [("e-3",)]
        for statement in (
            "INSERT INTO events VALUES ('e-4', 'A', now(), 4)",
            "DELETE FROM events",
            "CREATE PUBLICATION mine FOR TABLE events",
            "CREATE TABLE mine (x int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                debezium.execute(statement)
        attributes = debezium.execute(
            "SELECT rolreplication, rolsuper, rolcreatedb, rolcreaterole FROM pg_roles"
            " WHERE rolname = current_user"
        ).fetchone()
    assert attributes == (True, False, False, False)
    # What the connector does first: a logical replication connection, a pgoutput slot.
    replication = postgres.dsn(cluster, postgres.DEBEZIUM) + " replication=database"
    with psycopg.connect(replication, autocommit=True) as stream:
        slot = psycopg.ClientCursor(stream).execute(
            "CREATE_REPLICATION_SLOT unit_slot TEMPORARY LOGICAL pgoutput"
        )
        assert slot.fetchone() is not None


def test_passwords_are_checked_and_the_superuser_has_no_tcp_access(
    cluster: postgres.Cluster,
) -> None:
    tcp = f"host=127.0.0.1 port={cluster.port} dbname=pairstream"
    for attempt in (
        f"{tcp} user=pairstream_app password=wrong",
        f"{tcp} user=debezium password={postgres.password(cluster, postgres.APP)}",
        f"{tcp} user=postgres password=",
        f"host=127.0.0.1 port={cluster.port} dbname=postgres user=pairstream_app"
        f" password={postgres.password(cluster, postgres.APP)}",
    ):
        with pytest.raises(psycopg.OperationalError, match=r"password authentication|no pg_hba"):
            psycopg.connect(attempt).close()


def test_a_taken_port_is_refused() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = postgres.Cluster(f"test-{uuid.uuid4().hex[:8]}", holder.getsockname()[1])
        with pytest.raises(postgres.PostgresError, match=f"taken by another process: {taken.port}"):
            postgres.start(taken)
    assert not taken.home.exists()


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.postgres", *args], capture_output=True, text=True, timeout=120
    )


def postmaster_started(cluster: postgres.Cluster) -> object:
    with connect(cluster, postgres.SUPERUSER) as admin:
        found = admin.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert found is not None
    return found[0]


def test_start_stop_start_keeps_the_data_and_clean_deletes_it() -> None:
    cluster = unique_cluster()
    named = ["--name", cluster.name]
    try:
        assert tool("status", *named).returncode == 1
        started = tool("start", *named, "--port", str(cluster.port))
        assert started.returncode == 0, started.stderr
        assert stat.S_IMODE(cluster.passwords_file.stat().st_mode) == 0o600
        # No password in what start prints; env prints them, for the port it was started on.
        password = postgres.password(cluster, postgres.APP)
        assert password not in started.stdout + started.stderr
        env = tool("env", *named).stdout
        assert f"export PAIRSTREAM_POSTGRES_PASSWORD={password}\n" in env
        assert f"export PAIRSTREAM_POSTGRES_PORT={cluster.port}\n" in env

        first = postmaster_started(cluster)
        postgres.start(cluster)  # running: nothing happens
        assert tool("start", *named).returncode == 0
        assert postmaster_started(cluster) == first
        with connect(cluster, postgres.APP) as app:
            app.execute(INSERT, ROW)

        assert tool("stop", *named).returncode == 0
        assert not postgres.answers(cluster) and tool("status", *named).returncode == 1
        postgres.stop(cluster)  # stopped: nothing happens
        postgres.start(cluster)
        assert postmaster_started(cluster) != first
        with connect(cluster, postgres.APP) as app:
            assert app.execute("SELECT * FROM events").fetchall() == [ROW]
        assert postgres.password(cluster, postgres.APP) == password
        assert tool("status", *named).returncode == 0

        assert tool("clean", *named).returncode == 0
        assert not cluster.home.exists() and not postgres.answers(cluster)
    finally:
        postgres.clean(cluster)
