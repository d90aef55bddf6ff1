"""A local PostgreSQL 15 cluster of the project's own: the source database of change data
capture (docs/cdc.md).

    python -m tools.postgres start [--name N] [--port P]   initdb on first start, start, wait
                                               until it answers, set up the database
    python -m tools.postgres status            exit 0 when it answers
    python -m tools.postgres stop              fast shutdown (pg_ctl -m fast)
    python -m tools.postgres clean             stop and delete all its data
    python -m tools.postgres env [--role R]    the PAIRSTREAM_POSTGRES_ settings that connect as R

Debian's PostgreSQL 15 (`make postgres` installs it). Data, log, unix socket and the roles'
passwords live in .run/postgres/<name>/ (default .run/postgres/postgres, port 5433). It
listens on 127.0.0.1 only. Over TCP only pairstream_app and debezium connect, to database
pairstream, with scram-sha-256 passwords; the superuser postgres only over the unix socket,
whose directory only the cluster's OS user (and root) can enter. Each start that starts the
server makes sure the database, the table `events`, the two roles and the publication
pairstream_events exist, and that the passwords are those of passwords.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / ".run" / "postgres"
# Where Debian's postgresql-15 package puts the server programs (/usr/bin has only
# wrappers of the client programs).
BIN = Path("/usr/lib/postgresql/15/bin")
# PostgreSQL refuses to run as root: as root, the tool runs it as the package's OS user.
OS_USER = "postgres"
NAME, PORT = "postgres", 5433
HOST = "127.0.0.1"
DATABASE, TABLE, PUBLICATION = "pairstream", "events", "pairstream_events"
SUPERUSER, APP, DEBEZIUM = "postgres", "pairstream_app", "debezium"
ROLES = (APP, DEBEZIUM)  # the roles with a password, that connect over TCP
SLOTS = 20  # replication slots and WAL senders: one per connector, with room for tests
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its NUL

SCHEMA = f"""\
CREATE TABLE IF NOT EXISTS {TABLE} (
  id    text PRIMARY KEY,
  type  text NOT NULL CHECK (type IN ('A','B')),
  ts    timestamptz NOT NULL,
  value numeric NOT NULL
)"""


class PostgresError(RuntimeError):
    """The cluster could not be started, stopped or set up; the message says why."""


@dataclass(frozen=True)
class Cluster:
    name: str = NAME
    port: int = PORT

    @property
    def home(self) -> Path:
        """The log, the unix socket and passwords.json; the data directory inside."""
        return RUNS / self.name

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log_file(self) -> Path:
        return self.home / "postgres.log"

    @property
    def passwords_file(self) -> Path:
        return self.home / "passwords.json"


def cluster(name: str = NAME, port: int | None = None) -> Cluster:
    """The named cluster on `port`, else on the port it was last started on, else on 5433."""
    return Cluster(name, port or configured_port(name) or PORT)


def configured_port(name: str) -> int | None:
    try:
        text = (Cluster(name).data / "pairstream.conf").read_text()
    except FileNotFoundError:
        return None
    found = re.search(r"^port = (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def _quote(value: object) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def server_config(cluster: Cluster) -> str:
    """data/pairstream.conf, which data/postgresql.conf includes."""
    return f"""\
listen_addresses = {_quote(HOST)}
port = {cluster.port}
unix_socket_directories = {_quote(cluster.home)}
unix_socket_permissions = 0700
password_encryption = 'scram-sha-256'
wal_level = logical
max_replication_slots = {SLOTS}
max_wal_senders = {SLOTS}
"""


def host_based_access() -> str:
    """data/pg_hba.conf: the first line that matches a connection decides. A logical
    replication connection (Debezium's) matches its database's lines, not `replication`."""
    return f"""\
local  all         {SUPERUSER}  trust
host   {DATABASE}  {",".join(ROLES)}  {HOST}/32  scram-sha-256
"""


def make_passwords(cluster: Cluster) -> None:
    """The roles' passwords, made once into passwords.json, readable by its owner only."""
    if cluster.passwords_file.exists():
        return
    made = {role: secrets.token_urlsafe(24) for role in ROLES}
    cluster.home.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(cluster.passwords_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(made, file)


def passwords(cluster: Cluster) -> dict[str, str]:
    try:
        found: dict[str, str] = json.loads(cluster.passwords_file.read_text())
    except FileNotFoundError:
        raise PostgresError(f"no {cluster.passwords_file}: start the cluster first") from None
    return found


def password(cluster: Cluster, role: str) -> str:
    known = passwords(cluster)
    if role not in known:
        raise PostgresError(f"no password for role {role!r}: roles with one are {ROLES}")
    return known[role]


def settings(cluster: Cluster, role: str = APP) -> dict[str, str]:
    """libpq's connection keywords: the superuser over the unix socket, a role over TCP."""
    if role == SUPERUSER:
        return {
            "host": str(cluster.home),
            "port": str(cluster.port),
            "dbname": DATABASE,
            "user": SUPERUSER,
        }
    return {
        "host": HOST,
        "port": str(cluster.port),
        "dbname": DATABASE,
        "user": role,
        "password": password(cluster, role),
    }


def dsn(cluster: Cluster, role: str = APP) -> str:
    """A libpq connection string (psycopg.connect, psql) for database pairstream as `role`."""
    return make_conninfo(**settings(cluster, role))


def environment(cluster: Cluster, role: str = APP) -> dict[str, str]:
    names = {"dbname": "DATABASE"}
    return {
        f"PAIRSTREAM_POSTGRES_{names.get(key, key.upper())}": value
        for key, value in settings(cluster, role).items()
    }


def _as_root() -> bool:
    return os.geteuid() == 0


def _run(cluster: Cluster, program: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A PostgreSQL program, as the cluster's OS user; its output is kept for errors."""
    if not (BIN / program).exists():
        raise PostgresError(f"PostgreSQL 15 is not installed ({BIN}): run `make postgres`")
    root = _as_root()
    return subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        cwd=cluster.home,
        stdin=subprocess.DEVNULL,
        user=OS_USER if root else None,
        group=OS_USER if root else None,
        extra_groups=[] if root else None,
    )


def running(cluster: Cluster) -> bool:
    """The server process of this data directory is up (whether it answers yet or not)."""
    return (
        cluster.data.is_dir()
        and _run(cluster, "pg_ctl", "status", "-D", str(cluster.data)).returncode == 0
    )


def answers(cluster: Cluster) -> bool:
    """The server accepts the superuser's connections over its unix socket."""
    try:
        with psycopg.connect(dsn(cluster, SUPERUSER), dbname="postgres", connect_timeout=3) as c:
            c.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((HOST, port)) == 0


def _log_tail(cluster: Cluster) -> str:
    try:
        return cluster.log_file.read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        return "(no log)"


def _prepare_home(cluster: Cluster) -> None:
    """The home directory: the socket's too, so only the cluster's OS user may enter it."""
    socket_file = cluster.home / f".s.PGSQL.{cluster.port}"
    if len(str(socket_file).encode()) > SOCKET_PATH_MAX:
        raise PostgresError(f"unix socket path over {SOCKET_PATH_MAX} bytes: {socket_file}")
    cluster.home.mkdir(parents=True, exist_ok=True)
    cluster.home.chmod(0o700)
    if _as_root():
        try:
            owner = pwd.getpwnam(OS_USER)
        except KeyError:
            raise PostgresError(f"as root, PostgreSQL runs as OS user {OS_USER!r}: none") from None
        os.chown(cluster.home, owner.pw_uid, owner.pw_gid)


def _initdb(cluster: Cluster) -> None:
    options = "-E UTF8 --locale=C --auth-local=trust --auth-host=scram-sha-256 --no-instructions"
    done = _run(cluster, "initdb", "-D", str(cluster.data), "-U", SUPERUSER, *options.split())
    if done.returncode != 0:
        raise PostgresError(f"initdb failed:\n{done.stdout}{done.stderr}")
    with (cluster.data / "postgresql.conf").open("a") as conf:
        conf.write("\ninclude 'pairstream.conf'  # tools/postgres.py writes it at each start\n")


def _write_config(cluster: Cluster) -> None:
    for file, text in (
        ("pairstream.conf", server_config(cluster)),
        ("pg_hba.conf", host_based_access()),
    ):
        (cluster.data / file).write_text(text)
        if _as_root():
            owner = pwd.getpwnam(OS_USER)
            os.chown(cluster.data / file, owner.pw_uid, owner.pw_gid)


def start(cluster: Cluster, timeout: float = 60.0) -> None:
    """Create the cluster if it has no data, start it and set it up; on a cluster that is
    running already, nothing."""
    if running(cluster):
        if configured_port(cluster.name) != cluster.port:
            raise PostgresError(
                f"{cluster.name} runs on port {configured_port(cluster.name)}, not {cluster.port}"
            )
        return
    if _port_open(cluster.port):
        # Something else listens there, and its answers would pass for this cluster's.
        raise PostgresError(f"postgres port taken by another process: {cluster.port}")
    _prepare_home(cluster)
    make_passwords(cluster)
    if not (cluster.data / "PG_VERSION").exists():
        _initdb(cluster)
    _write_config(cluster)
    started = _run(
        cluster,
        "pg_ctl",
        "start",
        "-D",
        str(cluster.data),
        "-l",
        str(cluster.log_file),
        "-w",
        "-t",
        str(max(1, round(timeout))),
    )
    if started.returncode != 0 or not answers(cluster):
        raise PostgresError(
            f"postgres {cluster.name} did not start within {timeout:.0f}s:\n"
            f"{started.stdout}{started.stderr}\nlog {cluster.log_file}:\n{_log_tail(cluster)}"
        )
    setup(cluster)
    print(f"postgres ready at {HOST}:{cluster.port} ({cluster.home})", flush=True)


def setup(cluster: Cluster) -> None:
    """The database, the table, the roles with least privilege, and the publication: what
    is missing is made, what exists is left as it is, so this runs again safely."""
    known = passwords(cluster)
    with psycopg.connect(dsn(cluster, SUPERUSER), dbname="postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        for role in ROLES:
            if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
            # The SCRAM verifier, not the password, goes to the server: a failed statement
            # is logged with its text.
            verifier = admin.pgconn.encrypt_password(
                known[role].encode(), role.encode(), b"scram-sha-256"
            ).decode()
            admin.execute(
                sql.SQL(
                    "ALTER ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE {} PASSWORD {}"
                ).format(
                    sql.Identifier(role),
                    sql.SQL("REPLICATION" if role == DEBEZIUM else "NOREPLICATION"),
                    sql.Literal(verifier),
                )
            )
        # Only the two roles may connect; no one may make temporary tables.
        admin.execute(f"REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC")
        admin.execute(f"GRANT CONNECT ON DATABASE {DATABASE} TO {APP}, {DEBEZIUM}")
    with psycopg.connect(dsn(cluster, SUPERUSER), autocommit=True) as admin:
        admin.execute(SCHEMA)
        admin.execute(f"REVOKE ALL ON {TABLE} FROM PUBLIC")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO {APP}")
        admin.execute(f"GRANT SELECT ON {TABLE} TO {DEBEZIUM}")
        found = admin.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [PUBLICATION])
        if not found.fetchone():
            # Made here, so that the connector needs no right to create it
            # (publication.autocreate.mode=disabled).
            admin.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")


def stop(cluster: Cluster, timeout: float = 60.0) -> None:
    """A fast shutdown: sessions are ended, transactions rolled back, the WAL flushed."""
    if not running(cluster):
        return
    stopped = _run(
        cluster,
        "pg_ctl",
        "stop",
        "-D",
        str(cluster.data),
        "-m",
        "fast",
        "-w",
        "-t",
        str(max(1, round(timeout))),
    )
    if stopped.returncode != 0:
        raise PostgresError(f"postgres {cluster.name} did not stop:\n{stopped.stderr}")


def clean(cluster: Cluster) -> None:
    """Stop the cluster and delete all its data and passwords."""
    stop(cluster)
    shutil.rmtree(cluster.home, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.postgres",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["start", "stop", "status", "clean", "env"])
    parser.add_argument("--name", default=NAME, help="folder under .run/postgres/")
    parser.add_argument("--port", type=int, help="default: the cluster's last, else 5433")
    parser.add_argument(
        "--role",
        default=APP,
        choices=[APP, DEBEZIUM, SUPERUSER],
        help="env: the role to connect as",
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = cluster(args.name, args.port)
    try:
        if args.command == "start":
            start(chosen, args.timeout)
        elif args.command == "stop":
            stop(chosen, args.timeout)
        elif args.command == "clean":
            clean(chosen)
        elif args.command == "env":
            for key, value in environment(chosen, args.role).items():
                print(f"export {key}={shlex.quote(value)}")
        elif args.command == "status":
            up = answers(chosen)
            print(f"{'up' if up else 'down'}: {HOST}:{chosen.port} ({chosen.home})")
            sys.exit(0 if up else 1)
    except PostgresError as error:
        raise SystemExit(f"tools.postgres: {error}") from None


if __name__ == "__main__":
    main()
