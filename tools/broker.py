"""A local Apache Kafka broker (KRaft) from jars that Maven resolves.

    python -m tools.broker start [--nodes 3] [--name cluster] [--port 9292] [--dedicated-controller]
                                               resolve jars once, format, start, wait until healthy
    python -m tools.broker start --secure      the same with SASL_SSL, SCRAM users and ACLs
                                               (tools/broker_security.py), as .run/kafka-secure
                                               on port 9094 unless --name and --port say else
    python -m tools.broker env --name N --user U   the PAIRSTREAM_ settings that connect as U
    python -m tools.broker status              exit 0 when every node answers
    python -m tools.broker stop [--kill]       SIGTERM (or SIGKILL) every node
    python -m tools.broker clean               stop and delete all broker data

Node i listens on 127.0.0.1:(port + 2(i-1)), its controller on the next port. Each
node is broker and controller, unless the cluster has a dedicated controller: then
nodes 1..n are brokers only and node n+1 is the only controller (the metadata
quorum), so brokers can be killed without touching the quorum.
Data, logs and pid files live in .run/<name>/ (default .run/kafka, git-ignored);
a single broker and a cluster can run side by side under different names.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from app.kafka.connection import KafkaConnection
from tools import jvm, maven
from tools.broker_security import BrokerSecurity

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "kafka" / "pom.xml"
LOG_CONFIG = ROOT / "kafka" / "log4j2.properties"
JARS = ROOT / ".cache" / "kafka" / "libs"
RUNS = ROOT / ".run"
HEAP = os.environ.get("PAIRSTREAM_BROKER_HEAP", "512m")
PORT, SECURE_PORT = 9092, 9094  # each node takes its port and the next one


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int
    name: str = "kafka"
    roles: str = "broker,controller"
    secure: bool = False

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles

    @property
    def listening_port(self) -> int:
        return self.port if self.is_broker else self.controller_port

    @property
    def home(self) -> Path:
        return RUNS / self.name / f"node-{self.node_id}"

    @property
    def pid_file(self) -> Path:
        return self.home / "pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"


def cluster(
    nodes: int,
    port: int,
    name: str = "kafka",
    dedicated_controller: bool = False,
    secure: bool = False,
) -> list[Node]:
    if not dedicated_controller:
        return [Node(i, port + 2 * (i - 1), name, secure=secure) for i in range(1, nodes + 1)]
    brokers = [Node(i, port + 2 * (i - 1), name, "broker", secure) for i in range(1, nodes + 1)]
    return [*brokers, Node(nodes + 1, port + 2 * nodes, name, "controller", secure)]


def bootstrap_servers(nodes: list[Node]) -> str:
    return ",".join(f"127.0.0.1:{n.port}" for n in nodes if n.is_broker)


def security(name: str) -> BrokerSecurity:
    return BrokerSecurity(RUNS / name / "security")


def admin_connection(nodes: list[Node]) -> KafkaConnection:
    """How the tools connect to these nodes: as the super user, if they are secured."""
    bootstrap = bootstrap_servers(nodes)
    if nodes and nodes[0].secure:
        return security(nodes[0].name).connection(bootstrap)
    return KafkaConnection(bootstrap)


def resolve_jars() -> None:
    maven.resolve(POM, JARS)


def properties(node: Node, nodes: list[Node]) -> str:
    voters = ",".join(
        f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes if n.is_controller
    )
    replicas = sum(n.is_broker for n in nodes)
    min_isr = min(2, replicas)
    client = "SASL_SSL" if node.secure else "PLAINTEXT"
    listeners = [
        *([f"{client}://127.0.0.1:{node.port}"] if node.is_broker else []),
        *([f"CONTROLLER://127.0.0.1:{node.controller_port}"] if node.is_controller else []),
    ]
    broker_lines = f"advertised.listeners={client}://127.0.0.1:{node.port}\n" * node.is_broker
    security_lines = security(node.name).listener_properties() if node.secure else ""
    return f"""\
process.roles={node.roles}
node.id={node.node_id}
controller.quorum.voters={voters}
listeners={",".join(listeners)}
{broker_lines}controller.listener.names=CONTROLLER
inter.broker.listener.name={client}
listener.security.protocol.map={client}:{client},CONTROLLER:PLAINTEXT
{security_lines}log.dirs={node.home / "data"}
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=8
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=8
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
"""


def java(main: str, *args: str) -> list[str]:
    return jvm.java(main, JARS, LOG_CONFIG, HEAP, *args)


def alive(node: Node) -> int | None:
    return jvm.running_pid(node.pid_file)


def start(nodes: list[Node], timeout: float, cluster: list[Node] | None = None) -> None:
    """Start the nodes that are not running; `cluster` is the whole cluster when
    only some of its nodes are (re)started."""
    taken = [n.listening_port for n in nodes if not alive(n) and _port_open(n.listening_port)]
    if taken:
        # Something else listens there, and its health would pass for these nodes'.
        raise SystemExit(f"broker ports taken by another process: {taken}")
    resolve_jars()
    run = RUNS / nodes[0].name
    cluster_id_file = run / "cluster-id"
    run.mkdir(parents=True, exist_ok=True)
    if not cluster_id_file.exists():
        cluster_id_file.write_text(_cluster_id())
    cluster_id = cluster_id_file.read_text().strip()
    secured = security(nodes[0].name)
    if nodes[0].secure:
        secured.prepare()
    for node in nodes:
        if alive(node):
            continue
        node.home.mkdir(parents=True, exist_ok=True)
        config = node.home / "server.properties"
        config.write_text(properties(node, cluster or nodes))
        if not (node.home / "data" / "meta.properties").exists():
            subprocess.run(
                # "--cluster-id=" form: a random id may start with "-".
                java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                     "-c", str(config), *(secured.format_arguments() if node.secure else [])),
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        with node.log_file.open("ab") as log:
            process = subprocess.Popen(
                java("kafka.Kafka", str(config)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        node.pid_file.write_text(str(process.pid))
    wait_healthy(nodes, timeout)
    print(f"broker ready at {bootstrap_servers(nodes)}", flush=True)


def _cluster_id() -> str:
    # A Kafka cluster id is a 16-byte UUID in URL-safe base64 without padding.
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def wait_healthy(nodes: list[Node], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        dead = [n for n in nodes if alive(n) is None]
        if dead:
            tail = dead[0].log_file.read_text(errors="replace")[-3000:]
            raise SystemExit(f"broker node {dead[0].node_id} exited:\n{tail}")
        if asyncio.run(_cluster_answers(nodes)):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"broker not healthy after {timeout:.0f}s; see {nodes[0].home.parent}")
        time.sleep(0.5)


async def _cluster_answers(nodes: list[Node]) -> bool:
    """True when each of these brokers has registered with the controller (a node
    restarted alone is checked against the cluster it joins)."""
    if not all(_port_open(n.listening_port) for n in nodes):
        return False
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**admin_connection(nodes).aiokafka(), request_timeout_ms=3000)
    try:
        await admin.start()
        description = await admin.describe_cluster()
        registered = {broker["node_id"] for broker in description["brokers"]}
        return {n.node_id for n in nodes if n.is_broker} <= registered
    except Exception:
        return False
    finally:
        await admin.close()


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def stop(nodes: list[Node], hard: bool, timeout: float = 30.0) -> None:
    for node in nodes:
        pid = alive(node)
        if pid is None:
            continue
        os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(node):
            os.kill(pid, signal.SIGKILL)
        node.pid_file.unlink(missing_ok=True)


def all_nodes(name: str) -> list[Node]:
    """Every node that has a home under .run/<name>, whatever the cluster size."""
    found = []
    for home in sorted((RUNS / name).glob("node-*")):
        config = home / "server.properties"
        if config.exists():
            lines = dict(
                line.split("=", 1) for line in config.read_text().splitlines() if "=" in line
            )
            roles = lines["process.roles"]
            # The first listener: the clients' on a broker, CONTROLLER (port + 1) otherwise.
            port = int(lines["listeners"].split(",")[0].rsplit(":", 1)[1])
            port -= "broker" not in roles
            secure = "SASL_SSL" in lines["listener.security.protocol.map"]
            found.append(Node(int(home.name.split("-")[1]), port, name, roles, secure))
    return found


def clean(name: str) -> None:
    """Stop every node of the named cluster and delete all its data."""
    stop(all_nodes(name), hard=True)
    shutil.rmtree(RUNS / name, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["start", "stop", "status", "clean", "resolve", "env"])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--name", help="folder under .run/ for this cluster")
    parser.add_argument("--port", type=int)
    parser.add_argument("--secure", action="store_true", help="SASL_SSL, SCRAM users, ACLs")
    parser.add_argument("--user", default="worker", help="env: the user to connect as")
    parser.add_argument("--kill", action="store_true", help="stop with SIGKILL")
    parser.add_argument(
        "--dedicated-controller",
        action="store_true",
        help="brokers only on the --nodes, plus one node that is the controller",
    )
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    name = args.name or ("kafka-secure" if args.secure else "kafka")
    default_port = SECURE_PORT if args.secure else PORT
    port = args.port or int(os.environ.get("PAIRSTREAM_BROKER_PORT", default_port))
    nodes = cluster(args.nodes, port, name, args.dedicated_controller, args.secure)
    if args.command == "resolve":
        resolve_jars()
    elif args.command == "start":
        start(nodes, args.timeout)
    elif args.command == "stop":
        stop(all_nodes(name), args.kill)
    elif args.command == "env":
        running = all_nodes(name)
        for key, value in security(name).environment(bootstrap_servers(running), args.user).items():
            print(f"export {key}={value}")
    elif args.command == "status":
        running = all_nodes(name)
        healthy = bool(running) and asyncio.run(_cluster_answers(running))
        print(f"{'healthy' if healthy else 'down'}: {bootstrap_servers(running) or 'no nodes'}")
        sys.exit(0 if healthy else 1)
    elif args.command == "clean":
        clean(name)


if __name__ == "__main__":
    main()
