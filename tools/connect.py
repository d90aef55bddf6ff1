"""Kafka Connect in distributed mode with Debezium's PostgreSQL connector, from jars that
Maven resolves (the broker's Kafka version; docs/cdc.md).

    python -m tools.connect start [--name N] [--rest-port P]   resolve jars once, start a
                                        worker, wait until its REST API is up
    python -m tools.connect stop        SIGTERM, SIGKILL after a grace
    python -m tools.connect status      exit 0 when the worker's REST API answers
    python -m tools.connect register [--postgres NAME] [--postgres-port P] [--connector FILE]
                                        fill the connector file's ${...} from the cluster of
                                        tools/postgres.py, have Connect validate it, PUT it
    python -m tools.connect check       wait until the connector and its task run and stream
                                        from the slot; else the cause in one line, exit 1
    python -m tools.connect restart     restart the connector and its tasks that FAILED
    python -m tools.connect resolve     resolve the jars only

The worker connects to Kafka as every client of the project does (PAIRSTREAM_BROKER and
PAIRSTREAM_KAFKA_*); on a secured broker, as a principal holding `connect_permissions`
(`python -m tools.kafka_acls connect`, docs/deploy.md). Its group is pairstream-<name>,
its config, offset and status topics pairstream-<name>-configs|-offsets|-status. Worker
files, pid and log live in .run/connect/<name>/; jars in .cache/connect/ (the Debezium
plugin in a folder of its own, which Connect loads in its own class loader).

The connector's file, deploy/connect/events-postgres.json, beyond the table, slot and
publication: `offset.mismatch.strategy=trust_offset` fails the task when the slot is
behind its offsets (dropped and made again) instead of streaming from wherever the new
slot is, which would skip changes; `errors.max.retries=10` fails the task after ten
restarts in a row that streamed nothing (Debezium's default retries forever, while Connect
shows the task RUNNING), but a task that cannot connect at start retries without end, so
`check` asks PostgreSQL whether the slot is in use; `topic.creation.default.partitions=8`,
as the JSON input's default: Debezium keys each change by the row's primary key, so a
row's changes stay in order on one partition (a change topic made beforehand keeps its
own count).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from pydantic import SecretStr

from app.kafka.access import Operation, Pattern, Permission, ResourceType
from app.kafka.connection import KafkaConnection
from app.settings import ROOT
from app.settings import settings as app_settings
from tools import jvm, maven, postgres

POM = ROOT / "connect" / "pom.xml"
PLUGIN_POM = ROOT / "connect" / "debezium-postgres" / "pom.xml"
LOG_CONFIG = ROOT / "connect" / "log4j2.properties"
JARS = ROOT / ".cache" / "connect" / "libs"
PLUGINS = ROOT / ".cache" / "connect" / "plugins"
CONNECTOR_FILE = ROOT / "deploy" / "connect" / "events-postgres.json"
RUNS = ROOT / ".run" / "connect"
HEAP = os.environ.get("PAIRSTREAM_CONNECT_HEAP", "512m")
REST_PORT = 8083
STOP_GRACE_SECONDS = 30.0
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
PLACEHOLDER = re.compile(r"\$\{([\w.]+)\}")  # ours; Connect's config providers' have a ':'


@dataclass(frozen=True)
class Worker:
    name: str = "connect"
    rest_port: int = REST_PORT

    @property
    def home(self) -> Path:
        return RUNS / self.name

    @property
    def pid_file(self) -> Path:
        return self.home / "pid"

    @property
    def log_file(self) -> Path:
        return self.home / "connect.log"

    @property
    def properties_file(self) -> Path:
        return self.home / "worker.properties"

    @property
    def secrets_dir(self) -> Path:
        """Connectors' passwords, read by the worker's file config provider: Connect keeps
        a connector's configuration in plain text in its config topic and shows it over
        REST, so a password in it would be visible to anyone who can read either."""
        return self.home / "secrets"

    @property
    def group_id(self) -> str:
        return f"pairstream-{self.name}"

    @property
    def topics(self) -> dict[str, str]:
        """The worker's internal topics, by role."""
        return {role: f"{self.group_id}-{role}" for role in ("configs", "offsets", "status")}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"


@dataclass(frozen=True)
class Connector:
    name: str
    config: dict[str, str]

    @property
    def change_topic(self) -> str:
        """Where Debezium writes the changes of public.events."""
        return f"{self.config['topic.prefix']}.public.events"


@dataclass(frozen=True)
class Database:
    """The PostgreSQL database and the role the connector reads it as."""

    host: str
    port: int
    dbname: str
    user: str
    password: SecretStr = field(repr=False)

    def conninfo(self) -> str:
        return make_conninfo(
            host=self.host,
            port=self.port,
            dbname=self.dbname,
            user=self.user,
            password=self.password.get_secret_value(),
        )


def connect_permissions(
    worker: Worker, topic_prefix: str, connector: str | None = None
) -> list[Permission]:
    """Exactly the ACLs the principal of `worker` needs to run the connector named
    `connector` (default: the repository's, deploy/connect/events-postgres.json) with
    exactly-once source support (KIP-618), writing its change topics under
    `topic_prefix` (the connector's topic.prefix). Kafka's table of them is in its
    docs/connect.html, "ACL requirements"; every producer is idempotent, which needs no
    cluster ACL since Kafka 2.8.

    - READ on the group `worker.group_id`: the workers join it and elect the leader.
    - READ, WRITE, CREATE on each internal topic (configs, offsets, status): the worker
      creates them when missing and reads and writes all three; the tasks write their
      offsets to the offsets topic in their transactions and read them back
      (read_committed). DESCRIBE_CONFIGS on each: at its start the worker checks that
      each is compacted (cleanup.policy=compact); without it Connect skips the check
      (it logs "Unable to use admin client to verify the cleanup policy") and would
      run on a topic that deletes configurations and offsets.
    - WRITE on the transactional id `connect-cluster-<group id>`: the leader writes
      the config topic in transactions under it, which fences a former leader.
    - WRITE on transactional ids prefixed `<group id>-<connector>-`: each task's
      producer is `<group id>-<connector>-<task id>`, and the leader fences the
      producers of a former generation of the tasks under the same ids.
    - WRITE and CREATE on topics prefixed `<topic prefix>.`: Debezium writes
      `<prefix>.<schema>.<table>` (here `<prefix>.public.events`), and Connect creates
      it (topic.creation.default.*) when missing.

    DESCRIBE, which Kafka's table also lists on the transactional ids and the offsets
    topic, is implied by READ and WRITE: the broker allows it to a principal holding
    either."""
    name = load_connector().name if connector is None else connector
    topic, txn = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID
    internal = (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE_CONFIGS)
    return [
        Permission(ResourceType.GROUP, worker.group_id, Operation.READ),
        *(
            Permission(topic, internal_topic, operation)
            for internal_topic in worker.topics.values()
            for operation in internal
        ),
        Permission(txn, f"connect-cluster-{worker.group_id}", Operation.WRITE),
        Permission(txn, f"{worker.group_id}-{name}-", Operation.WRITE, Pattern.PREFIXED),
        *(
            Permission(topic, f"{topic_prefix}.", operation, Pattern.PREFIXED)
            for operation in (Operation.WRITE, Operation.CREATE)
        ),
    ]


class ConnectError(RuntimeError):
    """What Connect answered, or failed to, in one line."""


def resolve_jars() -> Path:
    """The worker's jars into JARS, the plugin's into its own folder; the plugin path."""
    maven.resolve(POM, JARS)
    maven.resolve(PLUGIN_POM, PLUGINS / "debezium-postgres")
    return PLUGINS


def client_properties(connection: KafkaConnection) -> dict[str, str]:
    """The Java client properties of a connection: Spark's Kafka source takes the same
    ones, prefixed with 'kafka.'."""
    return {key.removeprefix("kafka."): value for key, value in connection.spark_options().items()}


def worker_properties(worker: Worker, connection: KafkaConnection, plugin_path: Path) -> str:
    client = client_properties(connection)
    security = {key: value for key, value in client.items() if key != "bootstrap.servers"}
    settings = {
        "bootstrap.servers": client["bootstrap.servers"],
        "group.id": worker.group_id,
        "config.storage.topic": worker.topics["configs"],
        "offset.storage.topic": worker.topics["offsets"],
        "status.storage.topic": worker.topics["status"],
        # -1: the broker's default.replication.factor. Connect creates all three topics
        # compacted, and refuses a config topic that is not.
        "config.storage.replication.factor": "-1",
        "offset.storage.replication.factor": "-1",
        "status.storage.replication.factor": "-1",
        # Source records and their offsets in one Kafka transaction (KIP-618).
        "exactly.once.source.support": "enabled",
        "key.converter": JSON_CONVERTER,
        "value.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "listeners": f"http://127.0.0.1:{worker.rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(worker.rest_port),
        "plugin.path": str(plugin_path),
        # Every plugin here has ServiceLoader manifests: the reflective scan of the
        # default mode took 19 s of a 22 s start.
        "plugin.discovery": "service_load",
        # One worker: the tasks of a worker that was killed go to the next one to join
        # at once, not after the default 5 minutes of waiting for it to come back.
        "scheduled.rebalance.max.delay.ms": "0",
        "config.providers": "file",
        "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
        "config.providers.file.param.allowed.paths": str(worker.secrets_dir),
        # The worker's own clients take the top-level security settings; the producers
        # and consumers of its tasks only the prefixed ones.
        **security,
        **{f"producer.{key}": value for key, value in security.items()},
        **{f"consumer.{key}": value for key, value in security.items()},
    }
    return "".join(f"{key}={_escaped(value)}\n" for key, value in settings.items())


def _escaped(value: str) -> str:
    """A value as java.util.Properties reads it back: ISO 8859-1, so anything else as
    UTF-16 \\u escapes; a PEM key's newlines escaped; a leading space kept."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    out = "".join(c if " " <= c <= "~" else _utf16_escapes(c) for c in out)
    return "\\" + out if out.startswith(" ") else out


def _utf16_escapes(char: str) -> str:
    units = char.encode("utf-16-be")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


def java(main: str, *args: str) -> list[str]:
    return jvm.java(main, JARS, LOG_CONFIG, HEAP, *args)


def alive(worker: Worker) -> int | None:
    return jvm.running_pid(worker.pid_file)


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start(worker: Worker, connection: KafkaConnection, timeout: float = 120.0) -> None:
    if alive(worker):
        wait_ready(worker, timeout)
        return
    if _port_open(worker.rest_port):
        raise SystemExit(
            f"Connect REST port {worker.rest_port} is taken by another process: choose"
            " another with --rest-port"
        )
    plugin_path = resolve_jars()
    worker.secrets_dir.mkdir(parents=True, exist_ok=True)
    worker.secrets_dir.chmod(0o700)
    # Created unreadable to others before the SASL password is written into it.
    worker.properties_file.touch(mode=0o600)
    worker.properties_file.chmod(0o600)
    worker.properties_file.write_text(worker_properties(worker, connection, plugin_path))
    with worker.log_file.open("ab") as log:
        process = subprocess.Popen(
            java("org.apache.kafka.connect.cli.ConnectDistributed", str(worker.properties_file)),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    worker.pid_file.write_text(str(process.pid))
    wait_ready(worker, timeout)
    print(f"connect worker {worker.name} ready at {worker.url}", flush=True)


def wait_ready(worker: Worker, timeout: float) -> None:
    """Until the worker has joined its group and serves requests (GET /health: 200)."""
    deadline = time.monotonic() + timeout
    while not _healthy(worker):
        if alive(worker) is None:
            raise SystemExit(f"connect worker {worker.name} exited:\n{_log_tail(worker)}")
        if time.monotonic() > deadline:
            raise SystemExit(
                f"connect worker {worker.name} not ready after {timeout:.0f}s:\n{_log_tail(worker)}"
            )
        time.sleep(0.5)


def _healthy(worker: Worker) -> bool:
    try:
        request(worker, "GET", "/health")
    except ConnectError:
        return False
    return True


def _log_tail(worker: Worker) -> str:
    try:
        return worker.log_file.read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        return "(no log)"


def stop(worker: Worker, grace: float = STOP_GRACE_SECONDS) -> None:
    pid = alive(worker)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(worker):
            os.kill(pid, signal.SIGKILL)
            while alive(worker):
                time.sleep(0.1)
    worker.pid_file.unlink(missing_ok=True)


def request(worker: Worker, method: str, path: str, body: Any = None) -> Any:
    """One call of the worker's REST API; its JSON answer. ConnectError carries Connect's
    own message on an error status."""
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(
        worker.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            text = answer.read()
    except urllib.error.HTTPError as error:
        raise ConnectError(f"{method} {path}: {error.code} {_message(error.read())}") from None
    except OSError as error:
        raise ConnectError(f"{method} {path}: {error}") from None
    return json.loads(text) if text else None


def _message(text: bytes) -> str:
    try:
        return str(json.loads(text)["message"])
    except (ValueError, KeyError, TypeError):
        return text.decode(errors="replace")


def load_connector(path: Path = CONNECTOR_FILE) -> Connector:
    doc = json.loads(path.read_text())
    return Connector(doc["name"], dict(doc["config"]))


def fill(config: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """The config with each ${name} replaced by values[name]; every one must be known."""
    unknown = sorted(
        {name for value in config.values() for name in PLACEHOLDER.findall(value)} - set(values)
    )
    if unknown:
        raise ConnectError(f"no value for the placeholders {unknown}")
    return {
        key: PLACEHOLDER.sub(lambda found: values[found.group(1)], value)
        for key, value in config.items()
    }


def database_values(worker: Worker, connector: Connector, database: Database) -> dict[str, str]:
    """The placeholders' values: the password as a reference to a file of the worker's
    secrets folder (written here), which the worker reads when it starts the task."""
    secret = worker.secrets_dir / f"{connector.name}.properties"
    worker.secrets_dir.mkdir(parents=True, exist_ok=True)
    secret.touch(mode=0o600)
    secret.chmod(0o600)
    secret.write_text(f"database.password={_escaped(database.password.get_secret_value())}\n")
    return {
        "database.hostname": database.host,
        "database.port": str(database.port),
        "database.dbname": database.dbname,
        "database.user": database.user,
        "database.password": f"${{file:{secret}:database.password}}",
    }


def register(worker: Worker, database: Database, connector: Connector | None = None) -> Connector:
    """Create or update the connector (PUT /connectors/<name>/config) once Connect has
    validated it, Debezium by connecting to the database: a refusal is classified.
    Validated apart because Connect 4.1's PUT answers a refused Debezium 3.6 config with
    a NullPointerException of its own instead of the reasons."""
    connector = connector or load_connector()
    config = fill(connector.config, database_values(worker, connector, database))
    plugin = config["connector.class"]
    answer = request(
        worker,
        "PUT",
        f"/connector-plugins/{plugin}/config/validate",
        {**config, "name": connector.name},
    )
    errors = [
        f"{found['value']['name']}: {error}"
        for found in answer["configs"]
        if found.get("value")
        for error in found["value"]["errors"]
    ]
    if errors:
        raise ConnectError(f"connector {connector.name} refused: {classify(' | '.join(errors))}")
    request(worker, "PUT", f"/connectors/{connector.name}/config", config)
    return connector


def restart(worker: Worker, connector_name: str) -> None:
    """Restart the connector and its tasks that FAILED (after their cause is mended)."""
    request(
        worker, "POST", f"/connectors/{connector_name}/restart?includeTasks=true&onlyFailed=true"
    )


# What a failure's text says, in this order (the first that matches wins): its class, the
# pattern, and the detail (the match, or a template of its groups).
CAUSES: tuple[tuple[str, re.Pattern[str], str | None], ...] = (
    ("authentication failed", re.compile(
        r"password authentication failed for user \"[^\"]*\"|no pg_hba\.conf entry[^\n]*"
        r"|role \"[^\"]*\" does not exist|role \"[^\"]*\" is not permitted to log in"), None),
    ("replication slot missing/dropped", re.compile(
        r"replication slot \"[^\"]*\" does not exist"), None),
    ("replication slot missing/dropped", re.compile(
        r"lsn=LSN\{(?P<lsn>[^}]*)\}[^\n]*no longer available on the server"),
        r"the connector's position, LSN \g<lsn>, is no longer available on the server: the slot"
        r" was dropped (or dropped and made again)"),
    ("publication missing", re.compile(
        r"publication \"(?P<name>[^\"]*)\" does not exist\s*Where: slot \"[^\"]*\"[^\n]*?"
        r"associated LSN (?P<lsn>\S+)"),
        r'publication "\g<name>" did not exist for the change at LSN \g<lsn>: dropped, and one'
        r" made again covers only later changes"),
    ("publication missing", re.compile(
        r"publication \"[^\"]*\" does not exist|Publication autocreation is disabled[^\n]*"),
        None),
    ("cannot connect to PostgreSQL", re.compile(
        r"connection to server at \"(?P<host>[^\"]*)\", port (?P<port>\d+) failed:"
        r" (?P<why>[^\n]*)"),
        r"connection to \g<host>:\g<port> failed: \g<why>"),
    ("cannot connect to PostgreSQL", re.compile(
        r"Connection to \S+ refused|The connection attempt failed|UnknownHostException[^\n]*"
        r"|the database system is (?:starting up|shutting down|in recovery mode)"
        r"|terminating connection due to administrator command"
        r"|An I/O error occurred while sending to the backend"), None),
    ("insufficient privileges", re.compile(
        r"permission denied[^\n]*|must be superuser or[^\n]*|must have REPLICATION[^\n]*"), None),
    ("PostgreSQL not set up for logical replication", re.compile(
        r"logical decoding requires wal_level[^\n]*"), None),
    ("Kafka ACL missing", re.compile(r"Not authorized to [^\n]*"), None),
    ("Kafka ACL missing", re.compile(
        r"(?:Topic|Group|TransactionalId|Cluster)AuthorizationException: [^\n]*"), None),
)  # fmt: skip


def classify(text: str) -> str:
    """A failure's cause in one line: its class and what the text says of it, or else the
    text's deepest cause."""
    for cause, pattern, template in CAUSES:
        found = pattern.search(text)
        if found:
            return f"{cause}: {_one_line(found.expand(template) if template else found.group(0))}"
    causes = re.findall(r"^Caused by: (.*)$", text, re.MULTILINE)
    lines = text.strip().splitlines()
    return _one_line(causes[-1] if causes else lines[0] if lines else "no trace")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


@dataclass(frozen=True)
class State:
    """A connector's state: GET /connectors/<name>/status, and PostgreSQL's view."""

    running: bool
    failure: str | None  # the classified cause, when the connector or a task FAILED
    summary: str


def state(status: Mapping[str, Any]) -> State:
    connector = status["connector"]
    tasks = sorted(status.get("tasks", []), key=lambda task: int(task["id"]))
    summary = ", ".join(
        [f"connector {status['name']} {connector['state']}"]
        + [f"task {task['id']} {task['state']}" for task in tasks]
    )
    failed = [(f"connector {status['name']}", connector)] if connector["state"] == "FAILED" else []
    failed += [(f"task {task['id']}", task) for task in tasks if task["state"] == "FAILED"]
    failure = next(
        (f"{who} FAILED: {classify(what.get('trace', ''))}" for who, what in failed), None
    )
    running = (
        connector["state"] == "RUNNING"
        and bool(tasks)
        and all(task["state"] == "RUNNING" for task in tasks)
    )
    return State(running, failure, summary)


def streaming(database: Database, slot: str, publication: str) -> str | None:
    """None when a replication connection uses the slot, else why not, classified. A task
    that cannot connect when it starts is RUNNING for Connect while Debezium retries."""
    try:
        with psycopg.connect(database.conninfo(), connect_timeout=5) as session:
            active, published = session.execute(
                "SELECT (SELECT active FROM pg_replication_slots WHERE slot_name = %s),"
                " EXISTS (SELECT FROM pg_publication WHERE pubname = %s)",
                [slot, publication],
            ).fetchone() or (None, False)
    except psycopg.Error as error:
        return classify(str(error))
    if not published:
        return f'publication missing: publication "{publication}" does not exist'
    if active is None:
        return f'replication slot missing/dropped: replication slot "{slot}" does not exist'
    return None if active else f'replication slot "{slot}" unused: the task is retrying'


SETTLE_SECONDS = 3.0


def check(
    worker: Worker, connector: Connector, database: Database | None = None, timeout: float = 60.0
) -> State:
    """Wait until the connector and all its tasks are RUNNING (and, given the database,
    the slot in use), or one of them has FAILED; at the deadline, the state then."""
    deadline = time.monotonic() + timeout
    failing: tuple[str, float] | None = None
    while True:
        try:
            now = state(request(worker, "GET", f"/connectors/{connector.name}/status"))
        except ConnectError as error:
            now = State(False, None, str(error))
        if now.failure is None:
            failing = None
        elif failing is None or failing[0] != now.failure:
            failing = (now.failure, time.monotonic())
        elif time.monotonic() - failing[1] >= SETTLE_SECONDS:
            # Right after a config update the status still shows the last run's failure
            # for a moment; a failure that stays is this run's.
            return now
        if now.running and database is not None:
            why_not = streaming(
                database, connector.config["slot.name"], connector.config["publication.name"]
            )
            if why_not is not None:
                now = State(False, f"{now.summary}, but not streaming: {why_not}", now.summary)
        if now.running or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def postgres_database(name: str = postgres.NAME, port: int | None = None) -> Database:
    """The database of a cluster of tools/postgres.py, as the connector's role."""
    found = postgres.settings(postgres.cluster(name, port), postgres.DEBEZIUM)
    return Database(
        found["host"],
        int(found["port"]),
        found["dbname"],
        found["user"],
        SecretStr(found["password"]),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.connect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["start", "stop", "status", "register", "check", "restart", "resolve"],
    )
    parser.add_argument("--name", default="connect", help="folder under .run/connect/")
    parser.add_argument("--rest-port", type=int, default=REST_PORT)
    parser.add_argument("--connector", type=Path, default=CONNECTOR_FILE)
    parser.add_argument("--postgres", default=postgres.NAME, help="the cluster's name")
    parser.add_argument("--postgres-port", type=int, help="default: the cluster's own")
    parser.add_argument("--timeout", type=float, help="start, check: how long to wait")
    args = parser.parse_args(argv)
    worker = Worker(args.name, args.rest_port)
    try:
        if args.command == "start":
            start(worker, app_settings().kafka, args.timeout or 120.0)
        elif args.command == "stop":
            stop(worker)
        elif args.command == "status":
            up = alive(worker) is not None and _healthy(worker)
            print(f"{'running' if up else 'down'}: {worker.url}")
            sys.exit(0 if up else 1)
        elif args.command == "register":
            database = postgres_database(args.postgres, args.postgres_port)
            connector = register(worker, database, load_connector(args.connector))
            print(f"connector {connector.name} registered; changes go to {connector.change_topic}")
        elif args.command == "check":
            database = postgres_database(args.postgres, args.postgres_port)
            now = check(worker, load_connector(args.connector), database, args.timeout or 60.0)
            print(now.failure or now.summary)
            sys.exit(0 if now.running else 1)
        elif args.command == "restart":
            restart(worker, load_connector(args.connector).name)
        elif args.command == "resolve":
            resolve_jars()
    except (ConnectError, postgres.PostgresError) as error:
        raise SystemExit(f"tools.connect: {error}") from None


if __name__ == "__main__":
    main()
