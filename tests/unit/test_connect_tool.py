"""The Kafka Connect tool's pure parts: the worker's properties, the connector file and its
placeholders, the one-line causes of real Debezium 3.6 failures, and the worker's ACLs."""

from __future__ import annotations

import re
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.kafka.access import Operation, Pattern, Permission, ResourceType
from app.kafka.connection import KafkaConnection
from tools import connect, kafka_acls

PLUGINS = Path("/plugins")

# Task traces as Connect 4.1.2 showed them (GET /connectors/<name>/status), frames cut.
PUBLICATION_DROPPED = """\
org.apache.kafka.connect.errors.ConnectException: An exception occurred in the change event \
producer. This connector will be stopped.
\tat io.debezium.pipeline.ErrorHandler.setProducerThrowable(ErrorHandler.java:67)
\tat io.debezium.connector.postgresql.PostgresStreamingChangeEventSource.execute(\
PostgresStreamingChangeEventSource.java:215)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: org.apache.kafka.connect.errors.ConnectException: Publication autocreation is \
disabled, please create one and restart the connector.
\tat io.debezium.connector.postgresql.connection.PostgresReplicationConnection.initPublication(\
PostgresReplicationConnection.java:242)
\t... 10 more
"""
PUBLICATION_MADE_AGAIN = """\
org.apache.kafka.connect.errors.ConnectException: An exception occurred in the change event \
producer. This connector will be stopped.
\tat io.debezium.pipeline.ErrorHandler.setProducerThrowable(ErrorHandler.java:67)
Caused by: org.postgresql.util.PSQLException: ERROR: publication "pairstream_events" does not exist
  Where: slot "pairstream_events", output plugin "pgoutput", in the change callback, associated \
LSN 0/193D958
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2904)
"""
SLOT_DROPPED = """\
io.debezium.DebeziumException: The connector is trying to read change stream starting at \
PostgresOffsetContext [sourceInfoSchema=Schema{io.debezium.connector.postgresql.Source:STRUCT}, \
sourceInfo=source_info[server='probe2'db='pairstream', lsn=LSN{0/193D5E0}, txId=739, \
timestamp=2026-12-05T06:43:36.317348Z, snapshot=FALSE, schema=, table=], \
lastSnapshotRecord=true, lastCompletelyProcessedLsn=null, lastCommitLsn=null], but this is no \
longer available on the server. Reconfigure the connector to use a snapshot mode when needed.
\tat io.debezium.connector.common.BaseSourceTask.validateSchemaHistory(BaseSourceTask.java:164)
\tat io.debezium.connector.postgresql.PostgresConnectorTask.start(PostgresConnectorTask.java:181)
"""
# A task whose principal lost WRITE on the change topics (exactly-once source support).
NOT_AUTHORIZED = """\
org.apache.kafka.connect.errors.ConnectException: Failed to flush offsets and/or records for \
task events-29f9fe21-0
\tat org.apache.kafka.connect.runtime.ExactlyOnceWorkerSourceTask.maybeWrapProducerSendException(\
ExactlyOnceWorkerSourceTask.java:355)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access \
topics: [acl29f9fe21.public.events]
"""
# The same, its task started afresh: it looks the change topic up before it writes.
NOT_AUTHORIZED_TO_DESCRIBE = """\
org.apache.kafka.connect.errors.ConnectException: Not authorized to describe topic(s) \
'exp9592c954.public.events' on the brokers 127.0.0.1:9394
\tat org.apache.kafka.connect.util.TopicAdmin.describeTopics(TopicAdmin.java:502)
Caused by: org.apache.kafka.common.errors.TopicAuthorizationException: Topic authorization failed.
"""
# Errors of PUT /connector-plugins/<class>/config/validate, as register joins them.
VALIDATION_PASSWORD = (
    "database.hostname: Error while validating connector config: FATAL: password"
    ' authentication failed for user "debezium"'
)
VALIDATION_REFUSED = (
    "database.hostname: Error while validating connector config: Connection to"
    " 127.0.0.1:5438 refused. Check that the hostname and port are correct and that the"
    " postmaster is accepting TCP/IP connections."
)
# psycopg's errors, as check's own look at the slot meets them.
PSYCOPG_REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 5438 failed: Connection'
    " refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
PSYCOPG_PASSWORD = (
    'connection failed: connection to server at "127.0.0.1", port 5439 failed: FATAL:  password'
    ' authentication failed for user "debezium"'
)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (
            PUBLICATION_DROPPED,
            "publication missing: Publication autocreation is disabled, please create one and"
            " restart the connector.",
        ),
        (
            PUBLICATION_MADE_AGAIN,
            'publication missing: publication "pairstream_events" did not exist for the change'
            " at LSN 0/193D958: dropped, and one made again covers only later changes",
        ),
        (
            SLOT_DROPPED,
            "replication slot missing/dropped: the connector's position, LSN 0/193D5E0, is no"
            " longer available on the server: the slot was dropped (or dropped and made again)",
        ),
        (
            'ERROR: replication slot "pairstream_events" does not exist',
            'replication slot missing/dropped: replication slot "pairstream_events" does not exist',
        ),
        (
            VALIDATION_PASSWORD,
            'authentication failed: password authentication failed for user "debezium"',
        ),
        (VALIDATION_REFUSED, "cannot connect to PostgreSQL: Connection to 127.0.0.1:5438 refused"),
        (
            PSYCOPG_REFUSED,
            "cannot connect to PostgreSQL: connection to 127.0.0.1:5438 failed: Connection refused",
        ),
        (
            PSYCOPG_PASSWORD,
            'authentication failed: password authentication failed for user "debezium"',
        ),
        (
            NOT_AUTHORIZED,
            "Kafka ACL missing: Not authorized to access topics: [acl29f9fe21.public.events]",
        ),
        (
            NOT_AUTHORIZED_TO_DESCRIBE,
            "Kafka ACL missing: Not authorized to describe topic(s) 'exp9592c954.public.events'"
            " on the brokers 127.0.0.1:9394",
        ),
        (
            "org.apache.kafka.common.errors.TransactionalIdAuthorizationException: Transactional"
            " Id authorization failed.",
            "Kafka ACL missing: TransactionalIdAuthorizationException: Transactional Id"
            " authorization failed.",
        ),
        (
            "org.apache.kafka.connect.errors.ConnectException: boom\n\tat a.b(C.java:1)\n"
            "Caused by: java.lang.IllegalStateException: the deepest cause\n\tat d.e(F.java:2)",
            "java.lang.IllegalStateException: the deepest cause",
        ),
    ],
)
def test_a_failure_is_classified_in_one_line(text: str, cause: str) -> None:
    assert connect.classify(text) == cause


def _status(connector: str, *tasks: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": "events-postgres",
        "connector": {"state": connector, "worker_id": "127.0.0.1:8083"},
        "tasks": [
            {"id": i, "state": task_state, **({"trace": trace} if trace else {})}
            for i, (task_state, trace) in enumerate(tasks)
        ],
        "type": "source",
    }


def test_state_is_running_only_with_every_task_running() -> None:
    assert connect.state(_status("RUNNING", ("RUNNING", ""))) == connect.State(
        True, None, "connector events-postgres RUNNING, task 0 RUNNING"
    )
    assert not connect.state(_status("RUNNING")).running  # no task yet
    assert not connect.state(_status("UNASSIGNED", ("RUNNING", ""))).running


def test_a_failed_task_is_reported_with_its_cause() -> None:
    found = connect.state(_status("RUNNING", ("FAILED", SLOT_DROPPED)))
    assert not found.running
    assert found.failure is not None
    assert found.failure.startswith("task 0 FAILED: replication slot missing/dropped: ")


def test_check_waits_out_a_failure_left_from_before_a_config_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter(
        [_status("UNASSIGNED", ("FAILED", SLOT_DROPPED)), _status("RUNNING", ("RUNNING", ""))]
    )
    monkeypatch.setattr(connect, "request", lambda *_: next(answers))
    found = connect.check(connect.Worker(), connect.load_connector(), timeout=10)
    assert found.running


def test_check_reports_a_failure_that_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "SETTLE_SECONDS", 0.4)
    monkeypatch.setattr(
        connect, "request", lambda *_: _status("RUNNING", ("FAILED", PUBLICATION_DROPPED))
    )
    found = connect.check(connect.Worker(), connect.load_connector(), timeout=10)
    assert found.failure == (
        "task 0 FAILED: publication missing: Publication autocreation is disabled, please create"
        " one and restart the connector."
    )


def _unescaped(value: str) -> str:
    """java.util.Properties' reading of a value (the escapes _escaped makes)."""
    return (
        re.sub(
            r"\\(u[0-9a-f]{4}|.)",
            lambda m: (
                {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1))
                if len(m.group(1)) == 1
                else chr(int(m.group(1)[1:], 16))
            ),
            value,
        )
        .encode("utf-16", "surrogatepass")
        .decode("utf-16")
    )


def _properties(text: str) -> dict[str, str]:
    lines = text.splitlines()
    found = dict(line.split("=", 1) for line in lines)
    assert len(found) == len(lines)
    return {key: _unescaped(value) for key, value in found.items()}


def test_worker_properties_on_a_plaintext_broker() -> None:
    worker = connect.Worker("unit", 18083)
    found = _properties(
        connect.worker_properties(worker, KafkaConnection("127.0.0.1:9092,127.0.0.1:9094"), PLUGINS)
    )
    assert found["bootstrap.servers"] == "127.0.0.1:9092,127.0.0.1:9094"
    assert found["group.id"] == "pairstream-unit"
    assert [found[f"{role}.storage.topic"] for role in ("config", "offset", "status")] == [
        "pairstream-unit-configs",
        "pairstream-unit-offsets",
        "pairstream-unit-status",
    ]
    assert {
        found[f"{role}.storage.replication.factor"] for role in ("config", "offset", "status")
    } == {"-1"}
    assert found["exactly.once.source.support"] == "enabled"
    assert found["listeners"] == "http://127.0.0.1:18083"
    assert found["plugin.path"] == "/plugins"
    assert (
        found["key.converter.schemas.enable"] == found["value.converter.schemas.enable"] == "false"
    )
    assert found["config.providers.file.param.allowed.paths"] == str(worker.secrets_dir)
    assert found["security.protocol"] == found["producer.security.protocol"] == "PLAINTEXT"


def test_worker_properties_on_a_secured_broker(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    connection = KafkaConnection(
        "127.0.0.1:9094",
        security_protocol="SASL_SSL",
        username="connect",
        password=SecretStr(' pä"ss\\wörd😀'),
        ca_file=tmp_path / "ca.pem",
        cert_file=cert,
        key_file=key,
    )
    found = _properties(connect.worker_properties(connect.Worker(), connection, PLUGINS))
    # The worker's own clients, and its tasks' producers and consumers, all connect so.
    for prefix in ("", "producer.", "consumer."):
        assert found[f"{prefix}security.protocol"] == "SASL_SSL"
        assert found[f"{prefix}sasl.mechanism"] == "SCRAM-SHA-512"
        assert found[f"{prefix}sasl.jaas.config"] == (
            "org.apache.kafka.common.security.scram.ScramLoginModule required"
            ' username="connect" password=" pä\\"ss\\\\wörd😀";'
        )
        assert found[f"{prefix}ssl.truststore.location"] == str(tmp_path / "ca.pem")
        assert found[f"{prefix}ssl.keystore.key"] == key.read_text()
        assert found[f"{prefix}ssl.keystore.certificate.chain"] == cert.read_text()


def test_properties_escapes_as_java_reads_them() -> None:
    assert connect._escaped(" a\\b\nc\rdé😀") == "\\ a\\\\b\\nc\\rd\\u00e9\\ud83d\\ude00"


def test_the_connector_file_says_what_docs_cdc_promises() -> None:
    connector = connect.load_connector()
    assert connector.name == "events-postgres"
    assert connector.change_topic == "pairstream.public.events"
    config = connector.config
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert config["table.include.list"] == "public.events"
    assert config["plugin.name"] == "pgoutput"
    assert config["publication.name"] == config["slot.name"] == "pairstream_events"
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["decimal.handling.mode"] == "string"
    assert config["tombstones.on.delete"] == "false"
    assert config["snapshot.mode"] == "initial"
    assert config["exactly.once.support"] == "required"
    assert (
        config["key.converter.schemas.enable"]
        == config["value.converter.schemas.enable"]
        == "false"
    )


def test_register_fills_every_placeholder_and_keeps_the_password_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connect, "RUNS", tmp_path)
    worker = connect.Worker("unit")
    connector = connect.load_connector()
    database = connect.Database("127.0.0.1", 5433, "pairstream", "debezium", SecretStr("s3cret=1"))
    config = connect.fill(connector.config, connect.database_values(worker, connector, database))
    secret = worker.secrets_dir / "events-postgres.properties"
    assert config["database.hostname"] == "127.0.0.1"
    assert config["database.port"] == "5433"
    assert config["database.dbname"] == "pairstream"
    assert config["database.user"] == "debezium"
    # Connect's file config provider reads it when the task starts; the config topic and
    # the REST API see only the reference.
    assert config["database.password"] == f"${{file:{secret}:database.password}}"
    assert "s3cret" not in str(config)
    assert secret.read_text() == "database.password=s3cret=1\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not any(connect.PLACEHOLDER.search(value) for value in config.values())


def test_fill_refuses_a_placeholder_without_a_value() -> None:
    with pytest.raises(connect.ConnectError, match=r"\['database.port'\]"):
        connect.fill(
            {"a": "${database.hostname}", "b": "${database.port}"}, {"database.hostname": "h"}
        )
    # A reference to one of Connect's config providers is not ours to fill.
    assert connect.fill({"a": "${file:/x:y}"}, {}) == {"a": "${file:/x:y}"}


def test_start_refuses_a_taken_rest_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "RUNS", tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(SystemExit, match=f"REST port {port} is taken by another process"):
            connect.start(connect.Worker("unit", port), KafkaConnection("127.0.0.1:1"), timeout=1)
    assert not (tmp_path / "unit").exists()


def _allowed(permissions: list[Permission], kind: ResourceType, name: str) -> set[Operation]:
    return {p.operation for p in permissions if p.resource is kind and p.covers(name)}


def test_connect_permissions_cover_its_topics_group_and_transactional_ids() -> None:
    worker = connect.Worker("connect")
    permissions = connect.connect_permissions(worker, "pairstream")
    topic, txn = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
    assert len(permissions) == len(set(permissions)) == 17  # what docs/deploy.md lists
    assert _allowed(permissions, ResourceType.GROUP, "pairstream-connect") == {Operation.READ}
    internal = {Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE_CONFIGS}
    for name in ("pairstream-connect-configs", "pairstream-connect-offsets",
                 "pairstream-connect-status"):  # fmt: skip
        assert _allowed(permissions, topic, name) == internal, name
    # The change topic of the repository's connector, and any other table's under the prefix.
    change = connect.load_connector().change_topic
    assert change == "pairstream.public.events"
    assert _allowed(permissions, topic, change) == {Operation.WRITE, Operation.CREATE}
    assert _allowed(permissions, topic, "pairstream.public.other") == {
        Operation.WRITE,
        Operation.CREATE,
    }
    # Not the pairstream workers' topics, nor another Connect worker's.
    for name in ("pairstream-pairing-state-changelog", "events", "pairstream-other-offsets"):
        assert _allowed(permissions, topic, name) == set(), name
    # The leader's transactional id, and the task's: <group id>-<connector>-<task id>.
    assert _allowed(permissions, txn, "connect-cluster-pairstream-connect") == {Operation.WRITE}
    assert _allowed(permissions, txn, "pairstream-connect-events-postgres-0") == {Operation.WRITE}
    assert _allowed(permissions, txn, "pairstream-connect-other-connector-0") == set()
    assert _allowed(permissions, txn, "pairstream-") == set()
    assert not [p for p in permissions if p.resource is ResourceType.CLUSTER]
    prefixed = {(p.resource, p.name) for p in permissions if p.pattern is Pattern.PREFIXED}
    assert prefixed == {(topic, "pairstream."), (txn, "pairstream-connect-events-postgres-")}


def test_connect_permissions_follow_the_worker_and_the_connector() -> None:
    permissions = connect.connect_permissions(connect.Worker("cdc"), "shop", "orders")
    topic, txn = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
    assert _allowed(permissions, ResourceType.GROUP, "pairstream-cdc") == {Operation.READ}
    assert Operation.WRITE in _allowed(permissions, topic, "pairstream-cdc-offsets")
    assert _allowed(permissions, topic, "shop.public.events") == {Operation.WRITE, Operation.CREATE}
    assert _allowed(permissions, topic, "pairstream.public.events") == set()
    assert _allowed(permissions, txn, "connect-cluster-pairstream-cdc") == {Operation.WRITE}
    assert _allowed(permissions, txn, "pairstream-cdc-orders-0") == {Operation.WRITE}


def test_kafka_acls_lists_connects_without_granting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_acls, "grant", None)  # --list grants nothing
    kafka_acls.main(["connect", "User:connect", "--connect-name", "cdc", "--topic-prefix", "shop",
                     "--list"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    expected = connect.connect_permissions(connect.Worker("cdc"), "shop", "events-postgres")
    assert lines == [f"User:connect: {permission}" for permission in expected]
    assert "User:connect: WRITE on TOPIC prefix 'shop.'" in lines
