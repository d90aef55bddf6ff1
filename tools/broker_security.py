"""What makes the local broker a secured one (`python -m tools.broker start --secure`):
a CA and a broker certificate made on the spot (PEM, by openssl), SCRAM-SHA-512 users
created when the node is formatted, a SASL_SSL listener and the standard authorizer.

Users: `admin` (a super user: the tools, topic set-up, ACL grants), `worker` (the
pairstream workers) and `analytics` (the Spark jobs), each with a random password in
`<run>/security/<user>.password`; `add_user` adds one to a running broker (a test's
Kafka Connect user, say) in the same way. The broker's certificate names 127.0.0.1 only, so a
client that connects to `localhost` sees a hostname mismatch.

A test broker, not a template for production: its controller listener is plaintext on
loopback, and that listener's anonymous principal is a super user (KRaft's broker and
controller talk over it).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from app.kafka.access import KafkaAccessError, check_connection
from app.kafka.connection import KafkaConnection

MECHANISM = "SCRAM-SHA-512"
MECHANISM_CODE = 2  # Kafka's ScramMechanism: SCRAM-SHA-512
ITERATIONS = 4096  # the least Kafka takes for SCRAM-SHA-512
USERS = ("admin", "worker", "analytics")
SUPER_USER = "admin"
DAYS = 365


def make_ca(folder: Path, name: str = "pairstream local CA") -> Path:
    """A self-signed CA (ca.pem, ca.key) in `folder`; returns the certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    certificate = folder / "ca.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(DAYS),
        "-subj", f"/CN={name}", "-keyout", str(folder / "ca.key"), "-out", str(certificate),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return certificate


def make_certificate(folder: Path, ca_folder: Path, name: str, ip: str = "127.0.0.1") -> Path:
    """`<name>.pem`: an unencrypted PKCS#8 key and a certificate for `ip` signed by the
    CA in `ca_folder`, in one file (Kafka's PEM key store); also `<name>.key`, `.crt`."""
    key, request, cert = (folder / f"{name}.{kind}" for kind in ("key", "csr", "crt"))
    extensions = folder / f"{name}.ext"
    extensions.write_text(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={ip}",
        "-keyout", str(key), "-out", str(request),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca_folder / "ca.pem"),
        "-CAkey", str(ca_folder / "ca.key"), "-CAcreateserial", "-days", str(DAYS),
        "-out", str(cert), "-extfile", str(extensions),
    )  # fmt: skip
    bundle = folder / f"{name}.pem"
    bundle.write_text(key.read_text() + cert.read_text())
    bundle.chmod(0o600)
    return bundle


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class BrokerSecurity:
    """The TLS material and users of one local cluster, kept in `<run>/security`."""

    home: Path

    @property
    def ca_file(self) -> Path:
        return self.home / "ca.pem"

    @property
    def key_store(self) -> Path:
        return self.home / "broker.pem"

    def password_file(self, user: str) -> Path:
        return self.home / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def prepare(self) -> None:
        """Make what is missing: the CA, the broker's certificate, the passwords."""
        if not self.key_store.exists():
            make_ca(self.home)
            make_certificate(self.home, self.home, "broker")
        for user in USERS:
            path = self.password_file(user)
            if not path.exists():
                path.write_text(secrets.token_hex(16) + "\n")
                path.chmod(0o600)

    def format_arguments(self) -> list[str]:
        """kafka-storage format's arguments that create the users."""
        return [
            argument
            for user in USERS
            for argument in (
                "--add-scram",
                f"{MECHANISM}=[name={user},password={self.password(user)}]",
            )
        ]

    def listener_properties(self) -> str:
        """server.properties lines of the SASL_SSL listener, TLS and the authorizer."""
        return f"""\
sasl.enabled.mechanisms={MECHANISM}
sasl.mechanism.inter.broker.protocol={MECHANISM}
listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required \
username="{SUPER_USER}" password="{self.password(SUPER_USER)}";
ssl.keystore.type=PEM
ssl.keystore.location={self.key_store}
ssl.truststore.type=PEM
ssl.truststore.location={self.ca_file}
ssl.client.auth=requested
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{SUPER_USER};User:ANONYMOUS
allow.everyone.if.no.acl.found=false
"""

    def connection(self, bootstrap_servers: str, user: str = SUPER_USER) -> KafkaConnection:
        from pydantic import SecretStr

        return KafkaConnection(
            bootstrap_servers,
            security_protocol="SASL_SSL",
            sasl_mechanism=MECHANISM,
            username=user,
            password=SecretStr(self.password(user)),
            ca_file=self.ca_file,
        )

    async def add_user(self, bootstrap_servers: str, user: str) -> KafkaConnection:
        """Create `user` (SCRAM-SHA-512, a random password in its file) on the running
        broker, as the super user; its connection, once the broker takes it."""
        path = self.password_file(user)
        if not path.exists():
            path.write_text(secrets.token_hex(16) + "\n")
            path.chmod(0o600)
        salt = secrets.token_bytes(32)
        salted = hashlib.pbkdf2_hmac("sha512", self.password(user).encode(), salt, ITERATIONS)
        upsert: list[tuple[Any, ...]] = [(user, MECHANISM_CODE, ITERATIONS, salt, salted, {})]
        await _alter_scram(self.connection(bootstrap_servers), [], upsert)
        connection = self.connection(bootstrap_servers, user)
        deadline = time.monotonic() + 30
        while True:  # until the credential has reached the broker from the controller
            try:
                await check_connection(connection, timeout=10)
                return connection
            except KafkaAccessError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def remove_user(self, bootstrap_servers: str, user: str) -> None:
        """Delete the credential `add_user` made, and its password file."""
        await _alter_scram(self.connection(bootstrap_servers), [(user, MECHANISM_CODE, {})], [])
        self.password_file(user).unlink(missing_ok=True)

    def environment(self, bootstrap_servers: str, user: str) -> dict[str, str]:
        """PAIRSTREAM_ settings that connect a worker, a Spark job or a tool as `user`."""
        return {
            "PAIRSTREAM_BROKER": f"kafka://{bootstrap_servers.replace(',', ';')}",
            "PAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PAIRSTREAM_KAFKA_SASL_MECHANISM": MECHANISM,
            "PAIRSTREAM_KAFKA_USERNAME": user,
            "PAIRSTREAM_KAFKA_PASSWORD_FILE": str(self.password_file(user)),
            "PAIRSTREAM_KAFKA_CA_FILE": str(self.ca_file),
        }


# AlterUserScramCredentials (KIP-554), which aiokafka does not have: version 0, the only one.


class _AlterUserScramCredentialsResponse(Response):  # type: ignore[misc]
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("user", CompactString("utf-8")),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterUserScramCredentialsRequest(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterUserScramCredentialsResponse
    SCHEMA = Schema(
        (
            "deletions",
            CompactArray(
                ("name", CompactString("utf-8")), ("mechanism", Int8), ("tags", TaggedFields)
            ),
        ),
        (
            "upsertions",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("mechanism", Int8),
                ("iterations", Int32),
                ("salt", CompactBytes),
                ("salted_password", CompactBytes),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterUserScramCredentials(Request[_AlterUserScramCredentialsRequest]):  # type: ignore[misc]
    API_KEY = 51

    def __init__(self, deletions: list[tuple[Any, ...]], upsertions: list[tuple[Any, ...]]):
        self._deletions = deletions
        self._upsertions = upsertions

    def build(
        self, request_struct_class: type[_AlterUserScramCredentialsRequest]
    ) -> _AlterUserScramCredentialsRequest:
        return request_struct_class(self._deletions, self._upsertions, {})


async def _alter_scram(
    admin: KafkaConnection, deletions: list[tuple[Any, ...]], upsertions: list[tuple[Any, ...]]
) -> None:
    client = AIOKafkaClient(**admin.aiokafka())
    await client.bootstrap()
    try:
        request = _AlterUserScramCredentials(deletions, upsertions)
        response: Any = await client.send(client.get_random_node(), request)
        for user, error_code, message, _ in response.results:
            if error_code:
                raise for_code(error_code)(f"SCRAM credential of {user!r}: {message}")
    finally:
        await client.close()
