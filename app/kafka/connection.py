"""How every Kafka client of the project connects: one value built from the settings,
turned into what each client library takes (faust, aiokafka, Spark's Kafka source).
docs/deploy.md says how to point it at a managed Kafka."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

if TYPE_CHECKING:
    from app.settings import Settings

TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


class KafkaConfigError(ValueError):
    """Connection settings that cannot work together."""


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: SecretStr | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.uses_sasl and (not self.username or self.password is None):
            raise KafkaConfigError(
                f"security protocol {self.security_protocol} needs PAIRSTREAM_KAFKA_USERNAME"
                " and PAIRSTREAM_KAFKA_PASSWORD (or PAIRSTREAM_KAFKA_PASSWORD_FILE)"
            )
        if (self.cert_file is None) != (self.key_file is None):
            raise KafkaConfigError(
                "a client certificate needs both PAIRSTREAM_KAFKA_CERT_FILE and"
                " PAIRSTREAM_KAFKA_KEY_FILE"
            )
        tls_files = (self.ca_file, self.cert_file)
        if not self.uses_tls and any(tls_files):
            raise KafkaConfigError(
                f"TLS files are set but the security protocol is {self.security_protocol}:"
                " set PAIRSTREAM_KAFKA_SECURITY_PROTOCOL to SSL or SASL_SSL"
            )

    @classmethod
    def from_settings(cls, conf: Settings) -> KafkaConnection:
        return cls(
            bootstrap_servers=conf.bootstrap_servers,
            security_protocol=conf.kafka_security_protocol,
            sasl_mechanism=conf.kafka_sasl_mechanism,
            username=conf.kafka_username,
            password=conf.kafka_password,
            ca_file=conf.kafka_ca_file,
            cert_file=conf.kafka_cert_file,
            key_file=conf.kafka_key_file,
            check_hostname=conf.kafka_check_hostname,
        )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in TLS_PROTOCOLS

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in SASL_PROTOCOLS

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        context.check_hostname = self.check_hostname
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def aiokafka(self) -> dict[str, Any]:
        """Keyword arguments of aiokafka's producer, consumer, admin client and client."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.username
            options["sasl_plain_password"] = self._password
        return options

    def faust_credentials(self) -> Any:
        """faust's `broker_credentials` (None: plaintext)."""
        import faust

        if self.uses_sasl:
            return faust.SASLCredentials(
                username=self.username,
                password=self._password,
                ssl_context=self.ssl_context,
                mechanism=self.sasl_mechanism,
            )
        if self.uses_tls:
            return faust.SSLCredentials(self.ssl_context)
        return None

    def spark_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source (`kafka.`-prefixed consumer settings)."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "kafka.security.protocol": self.security_protocol,
        }
        if self.uses_tls:
            options["kafka.ssl.endpoint.identification.algorithm"] = (
                "https" if self.check_hostname else ""
            )
            if self.ca_file is not None:
                options["kafka.ssl.truststore.type"] = "PEM"
                options["kafka.ssl.truststore.location"] = str(self.ca_file)
            if self.cert_file is not None and self.key_file is not None:
                options["kafka.ssl.keystore.type"] = "PEM"
                options["kafka.ssl.keystore.certificate.chain"] = self.cert_file.read_text()
                options["kafka.ssl.keystore.key"] = self.key_file.read_text()
        if self.uses_sasl:
            options["kafka.sasl.mechanism"] = self.sasl_mechanism
            options["kafka.sasl.jaas.config"] = self._jaas_config()
        return options

    def _jaas_config(self) -> str:
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if self.sasl_mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        return (
            f'{module} required username="{_jaas_quoted(self.username or "")}"'
            f' password="{_jaas_quoted(self._password or "")}";'
        )

    @property
    def _password(self) -> str | None:
        return self.password.get_secret_value() if self.password is not None else None


def _jaas_quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
