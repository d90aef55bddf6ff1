"""The one Kafka connection, as each client library takes it, and the ACLs a worker needs."""

from __future__ import annotations

import ssl
from pathlib import Path

import faust
import pytest
from pydantic import SecretStr, ValidationError

from app.kafka.access import (
    Operation,
    Pattern,
    Permission,
    ResourceType,
    analytics_permissions,
    worker_permissions,
)
from app.kafka.connection import KafkaConfigError, KafkaConnection
from app.settings import Settings
from tools.broker_security import make_ca, make_certificate

PASSWORD = 'pa"ss\\word'


def sasl_ssl(**changes: object) -> KafkaConnection:
    fields: dict[str, object] = {
        "bootstrap_servers": "b1:9093,b2:9093",
        "security_protocol": "SASL_SSL",
        "username": "pairstream",
        "password": SecretStr(PASSWORD),
        "ca_file": None,
        **changes,
    }
    return KafkaConnection(**fields)  # type: ignore[arg-type]


def test_plaintext_adds_nothing_to_any_client() -> None:
    plain = Settings(broker="kafka://h1:9092;h2:9092").kafka
    assert plain.aiokafka() == {
        "bootstrap_servers": "h1:9092,h2:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert plain.faust_credentials() is None
    assert plain.spark_options() == {
        "kafka.bootstrap.servers": "h1:9092,h2:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_sasl_ssl_reaches_aiokafka_faust_and_spark_alike() -> None:
    connection = sasl_ssl(sasl_mechanism="SCRAM-SHA-256")
    options = connection.aiokafka()
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert options["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "pairstream",
        PASSWORD,
    )
    credentials = connection.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-256"
    assert credentials.ssl_context is context
    spark = connection.spark_options()
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert spark["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert spark["kafka.ssl.endpoint.identification.algorithm"] == "https"
    # JAAS quoting: the password's quote and backslash escaped.
    assert spark["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
        ' username="pairstream" password="pa\\"ss\\\\word";'
    )
    assert (
        "PlainLoginModule"
        in sasl_ssl(sasl_mechanism="PLAIN").spark_options()["kafka.sasl.jaas.config"]
    )


def test_the_password_is_in_no_representation() -> None:
    connection = sasl_ssl()
    assert PASSWORD not in repr(connection) and PASSWORD not in str(connection)
    settings = Settings(kafka_password=PASSWORD)  # type: ignore[arg-type]
    assert PASSWORD not in repr(settings)


def test_hostname_checks_can_be_turned_off_everywhere() -> None:
    connection = sasl_ssl(check_hostname=False)
    assert connection.ssl_context is not None and not connection.ssl_context.check_hostname
    assert connection.spark_options()["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_mutual_tls_loads_the_client_certificate(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    make_certificate(tmp_path, tmp_path, "client")
    connection = KafkaConnection(
        "b:9093",
        security_protocol="SSL",
        ca_file=ca,
        cert_file=tmp_path / "client.crt",
        key_file=tmp_path / "client.key",
    )
    assert connection.ssl_context is not None  # load_cert_chain raised for a bad pair
    spark = connection.spark_options()
    assert spark["kafka.ssl.truststore.type"] == spark["kafka.ssl.keystore.type"] == "PEM"
    assert spark["kafka.ssl.truststore.location"] == str(ca)
    assert "BEGIN CERTIFICATE" in spark["kafka.ssl.keystore.certificate.chain"]
    assert "BEGIN PRIVATE KEY" in spark["kafka.ssl.keystore.key"]
    assert isinstance(connection.faust_credentials(), faust.SSLCredentials)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"username": None}, "needs PAIRSTREAM_KAFKA_USERNAME"),
        ({"password": None}, "needs PAIRSTREAM_KAFKA_USERNAME"),
        ({"cert_file": Path("c.pem")}, "needs both"),
        ({"security_protocol": "PLAINTEXT", "username": None, "ca_file": Path("ca")}, "TLS files"),
    ],
)
def test_settings_that_cannot_work_together_are_refused(
    changes: dict[str, object], words: str
) -> None:
    with pytest.raises(KafkaConfigError, match=words):
        sasl_ssl(**changes)


def test_secrets_are_read_from_files_as_mounted_secrets_are(tmp_path: Path) -> None:
    (tmp_path / "password").write_text("from-a-file\n")
    (tmp_path / "token").write_text("a-token")
    conf = Settings(
        kafka_password="overridden",  # type: ignore[arg-type]
        kafka_password_file=tmp_path / "password",
        web_token_file=tmp_path / "token",
    )
    assert conf.kafka_password is not None and conf.web_token is not None
    assert conf.kafka_password.get_secret_value() == "from-a-file"
    assert conf.web_token.get_secret_value() == "a-token"
    with pytest.raises(ValidationError, match="no-such-file"):
        Settings(kafka_password_file=tmp_path / "no-such-file")


def test_a_worker_needs_its_topics_its_prefix_its_group_and_its_transactional_ids() -> None:
    conf = Settings(app_id="app", events_topic="in", keyed_topic="keyed", pairs_topic="out")
    permissions = set(worker_permissions(conf))
    topic = ResourceType.TOPIC
    assert Permission(topic, "in", Operation.READ) in permissions
    assert Permission(topic, "in", Operation.WRITE) not in permissions
    assert Permission(topic, "out", Operation.WRITE) in permissions
    assert Permission(topic, "out", Operation.READ) not in permissions
    data = (Operation.READ, Operation.WRITE, Operation.CREATE)
    assert {Permission(topic, "keyed", o) for o in data} <= permissions
    assert {Permission(topic, "app-", o, Pattern.PREFIXED) for o in data} <= permissions
    assert Permission(topic, "app-source-progress-changelog", Operation.ALTER) in permissions
    assert Permission(ResourceType.GROUP, "app", Operation.READ) in permissions
    txn = Permission(ResourceType.TRANSACTIONAL_ID, "app-", Operation.WRITE, Pattern.PREFIXED)
    assert txn in permissions
    assert len(permissions) == len(worker_permissions(conf)) == 18
    # The cluster's default replication factor, unless a setting replaces it.
    describe = Permission(ResourceType.CLUSTER, "kafka-cluster", Operation.DESCRIBE_CONFIGS)
    assert describe in permissions
    assert describe not in worker_permissions(conf.model_copy(update={"replication_factor": 3}))
    chain = set(worker_permissions(Settings(app_id="app", chain_enabled=True)))
    assert Permission(topic, "deposits", Operation.READ) in chain - permissions
    assert Permission(topic, "deposits.validated", Operation.WRITE) in chain


def test_the_spark_jobs_only_read() -> None:
    permissions = analytics_permissions(Settings())
    assert {p.operation for p in permissions} == {Operation.READ}
    assert Permission(ResourceType.TOPIC, "pairs", Operation.READ) in permissions


def test_a_prefix_covers_the_topics_that_start_with_it() -> None:
    prefixed = Permission(ResourceType.TOPIC, "app-", Operation.READ, Pattern.PREFIXED)
    literal = Permission(ResourceType.TOPIC, "app-", Operation.READ)
    assert prefixed.covers("app-table-changelog") and not prefixed.covers("ap-x")
    assert literal.covers("app-") and not literal.covers("app-table-changelog")
    assert str(prefixed) == "READ on TOPIC prefix 'app-'"
