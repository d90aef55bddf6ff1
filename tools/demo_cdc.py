"""The main job with the events in a database (docs/cdc.md), end to end:

    python -m tools.demo_cdc [--count 20000] [--rate 2000] [--seed 1]

A local broker, a PostgreSQL cluster of the run's own (tools/postgres.py), a Kafka
Connect worker with Debezium's connector (tools/connect.py), a pairstream worker reading
the change topic. The generator's events are inserted as rows, in transactions of mixed
sizes, some rolled back (tools/cdc.py); then the Spark jobs reconcile the pairs with the
change topic and the Delta replica with the table, each printing "reconciliation: OK".
The run's cluster is removed at the end; its topics stay, under the run id.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from analytics.jobs import run as run_jobs
from app.kafka.admin import ensure_topics
from app.settings import Settings
from pairing.changes import parse_change
from pairing.events import Event
from tools import broker, connect, postgres
from tools.cdc import insert, rows_of
from tools.demo import (
    ROOT,
    report,
    run_settings,
    settle,
    start_worker,
    stop_worker,
    topic_values,
    wait_ready,
)
from tools.generate import StreamShape, generate
from tools.ports import free_port
from tools.read_outputs import OutputReader


async def changes_in(conf: Settings, ids: set[str], timeout: float = 300) -> None:
    """Until the change topic holds a change of every row of `ids` (the connector's lag)."""
    deadline = time.monotonic() + timeout
    while True:
        values = await topic_values(conf, conf.events_topic)
        found = {e.identity for v in values if isinstance(e := parse_change(v, 1 << 20), Event)}
        if ids <= found:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids - found):,} committed rows not in the change topic")
        await asyncio.sleep(2)  # polling the change topic


def connector_for(run_id: str) -> connect.Connector:
    """The repo's connector, under the run's name, topic prefix and replication slot."""
    loaded = connect.load_connector()
    slot = f"slot_{run_id.replace('-', '_')}"
    return connect.Connector(
        f"events-{run_id}", {**loaded.config, "topic.prefix": run_id, "slot.name": slot}
    )


async def run(
    args: argparse.Namespace, nodes: list[broker.Node], cluster: postgres.Cluster
) -> None:
    """Up to the Spark jobs, which take the settings this leaves in the environment."""
    run_id = cluster.name
    worker = connect.Worker(f"{run_id}-connect", free_port())  # its group apart from the app id
    connector = connector_for(run_id)
    env = {
        **run_settings(run_id),
        "PAIRSTREAM_BROKER": f"kafka://{broker.bootstrap_servers(nodes)}",
        "PAIRSTREAM_EVENTS_FORMAT": "debezium",
        "PAIRSTREAM_EVENTS_TOPIC": connector.change_topic,
    }
    postgres.start(cluster)
    env.update(postgres.environment(cluster, postgres.APP))
    os.environ.update(env)
    conf = Settings()
    await ensure_topics(conf)  # the change topic too, with its partitions
    connect.start(worker, conf.kafka)
    try:
        connect.register(worker, connect.postgres_database(cluster.name, cluster.port), connector)
        state = connect.check(worker, connector)
        if not state.running:
            raise SystemExit(f"the connector does not run: {state.summary}")
        print(f"run {run_id}: PostgreSQL on port {cluster.port}, change topic {conf.events_topic}")
        log_path = ROOT / ".run" / f"{run_id}-worker.log"
        print(f"worker log {log_path}")
        pairing = start_worker(log_path)
        try:
            await wait_ready(log_path, pairing)
            rows = rows_of(generate(StreamShape(count=args.count, seed=args.seed, conflicts=0)))
            done = await asyncio.to_thread(insert, conf, rows, args.seed, args.rate)
            print(
                f"{len(done.committed):,} rows committed, {len(done.rolled_back):,} rolled back,"
                f" in {done.transactions:,} transactions; waiting for the worker to settle ...",
                flush=True,
            )
            await changes_in(conf, {row.id for row in done.committed})
            async with OutputReader(conf) as reader:
                outputs = await settle(conf, reader)
        finally:
            stop_worker(pairing)
        report(len(done.committed), outputs)
    finally:
        connect.stop(worker)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.demo_cdc", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2_000, help="rows inserted a second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    nodes = broker.cluster(1, broker.PORT)
    broker.start(nodes, timeout=120)
    cluster = postgres.Cluster(f"demo-cdc-{time.strftime('%Y%m%d-%H%M%S')}", free_port())
    try:
        asyncio.run(run(args, nodes, cluster))
        print("\nSpark: ingest into Delta, windows, reconciliation, the replica ...", flush=True)
        if not run_jobs("all", Settings(), None):  # Settings() now holds this run's
            raise SystemExit("reconciliation found discrepancies (see above)")
    finally:
        postgres.clean(cluster)
    print("\nthe broker keeps running; `make stop` stops it, `make clean` removes all data")


if __name__ == "__main__":
    main()
