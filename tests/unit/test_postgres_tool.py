"""The PostgreSQL tool's pure parts: the server's configuration, who may connect how, the
connection settings it hands out, and its command line. tests/integration/test_postgres.py
runs a real cluster."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from tools import postgres


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(postgres, "RUNS", tmp_path)
    return tmp_path


def setting(config: str, name: str) -> str:
    found = re.findall(rf"^{name} = (.+)$", config, re.MULTILINE)
    assert len(found) == 1, name
    return found[0]


def test_the_server_keeps_a_logical_log_and_listens_on_loopback_only(runs: Path) -> None:
    config = postgres.server_config(postgres.Cluster("unit", 25433))
    assert setting(config, "wal_level") == "logical"
    assert int(setting(config, "max_replication_slots")) >= 10
    assert int(setting(config, "max_wal_senders")) >= 10
    assert setting(config, "listen_addresses") == "'127.0.0.1'"
    assert setting(config, "port") == "25433"
    assert setting(config, "unix_socket_directories") == f"'{runs / 'unit'}'"
    assert setting(config, "unix_socket_permissions") == "0700"
    assert setting(config, "password_encryption") == "'scram-sha-256'"


def test_a_quote_in_a_path_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "RUNS", Path("/tmp/o'clock"))
    config = postgres.server_config(postgres.Cluster("unit", 25433))
    assert setting(config, "unix_socket_directories") == "'/tmp/o''clock/unit'"


def test_over_tcp_only_the_two_roles_with_a_password_and_the_superuser_on_the_socket() -> None:
    rules = [line.split() for line in postgres.host_based_access().splitlines()]
    assert rules == [
        ["local", "all", "postgres", "trust"],
        ["host", "pairstream", "pairstream_app,debezium", "127.0.0.1/32", "scram-sha-256"],
    ]


def test_passwords_are_made_once_and_readable_by_their_owner_only(runs: Path) -> None:
    cluster = postgres.Cluster("unit")
    with pytest.raises(postgres.PostgresError, match="start the cluster first"):
        postgres.passwords(cluster)
    postgres.make_passwords(cluster)
    first = postgres.passwords(cluster)
    postgres.make_passwords(cluster)
    assert postgres.passwords(cluster) == first
    assert sorted(first) == ["debezium", "pairstream_app"]
    assert first["debezium"] != first["pairstream_app"] and len(first["debezium"]) >= 24
    assert stat.S_IMODE(cluster.passwords_file.stat().st_mode) == 0o600
    with pytest.raises(postgres.PostgresError, match="no password for role 'postgres'"):
        postgres.password(cluster, "postgres")


def test_a_role_connects_over_tcp_with_its_password(runs: Path) -> None:
    cluster = postgres.Cluster("unit", 25433)
    postgres.make_passwords(cluster)
    assert conninfo_to_dict(postgres.dsn(cluster, "debezium")) == {
        "host": "127.0.0.1",
        "port": "25433",
        "dbname": "pairstream",
        "user": "debezium",
        "password": postgres.password(cluster, "debezium"),
    }
    assert postgres.environment(cluster) == {
        "PAIRSTREAM_POSTGRES_HOST": "127.0.0.1",
        "PAIRSTREAM_POSTGRES_PORT": "25433",
        "PAIRSTREAM_POSTGRES_DATABASE": "pairstream",
        "PAIRSTREAM_POSTGRES_USER": "pairstream_app",
        "PAIRSTREAM_POSTGRES_PASSWORD": postgres.password(cluster, "pairstream_app"),
    }


def test_the_superuser_connects_over_the_unix_socket_without_a_password(runs: Path) -> None:
    cluster = postgres.Cluster("unit", 25433)
    assert conninfo_to_dict(postgres.dsn(cluster, "postgres")) == {
        "host": str(runs / "unit"),
        "port": "25433",
        "dbname": "pairstream",
        "user": "postgres",
    }


def test_a_cluster_keeps_the_port_it_was_started_on(runs: Path) -> None:
    assert postgres.cluster("unit") == postgres.Cluster("unit", 5433)
    data = postgres.Cluster("unit", 25433).data
    data.mkdir(parents=True)
    (data / "pairstream.conf").write_text(postgres.server_config(postgres.Cluster("unit", 25433)))
    assert postgres.cluster("unit").port == 25433
    assert postgres.cluster("unit", 25999).port == 25999


def test_a_socket_path_too_long_for_unix_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "RUNS", Path("/tmp") / ("x" * 100))
    with pytest.raises(postgres.PostgresError, match="unix socket path over 107 bytes"):
        postgres._prepare_home(postgres.Cluster("unit"))
    assert not postgres.RUNS.exists()


def test_the_command_line() -> None:
    args = postgres.parse_args(["start"])
    assert (args.command, args.name, args.port, args.role) == (
        "start",
        "postgres",
        None,
        "pairstream_app",
    )
    args = postgres.parse_args(["env", "--name", "n", "--port", "6000", "--role", "debezium"])
    assert (args.command, args.name, args.port, args.role) == ("env", "n", 6000, "debezium")
    for wrong in (["restart"], ["env", "--role", "admin"], ["start", "--port", "x"]):
        with pytest.raises(SystemExit):
            postgres.parse_args(wrong)
