"""The main job, end to end: a local broker, a worker, a generated stream.

    python -m tools.demo [--count 20000] [--rate 4000] [--seed 1] [--delivery] [--chain]
                         [--enrichment] [--secure]

(`python -m tools.demo_cdc`: the same with the events inserted into PostgreSQL.)

Each run uses fresh topics (prefixed with a run id) so runs never mix. With
--delivery, the worker also delivers every pair, as an order, to the stand-in
order API (tools/order_api.py: with a status lookup, failing 5% of calls with 503,
dropping 1% of connections after applying the call), and the demo prints what the
API received. With --chain, accounts and deposits go through the deposit chain and
every balance is checked against the model; with --enrichment, the pairs are joined
with a reference row for their day (docs/chain.md). With --secure, the broker is the
secured one (SASL_SSL, SCRAM-SHA-512, ACLs: tools/broker_security.py): the demo sets up
topics and produces as `admin`, grants the worker's and the Spark jobs' ACLs
(tools/kafka_acls.py), and runs the worker as `worker` and the Spark jobs as
`analytics`, each with exactly those ACLs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import TP

from analytics.jobs import run as run_jobs
from app.kafka.access import analytics_permissions, worker_permissions
from app.kafka.admin import ensure_topics, read_committed, unread_committed
from app.settings import Settings
from pairing.records import dumps
from tools import broker
from tools.deposits import ChainShape, account_records, deposit_records, expected
from tools.generate import StreamShape, generate, produce
from tools.kafka_acls import grant
from tools.order_api import Behaviour, OrderApi
from tools.read_outputs import OutputReader, Outputs

ROOT = Path(__file__).resolve().parent.parent
FAUST = str(Path(sys.executable).with_name("faust"))


def run_settings(run_id: str) -> dict[str, str]:
    return {
        "PAIRSTREAM_APP_ID": f"pairstream-{run_id}",
        "PAIRSTREAM_EVENTS_TOPIC": f"{run_id}.events",
        "PAIRSTREAM_KEYED_TOPIC": f"{run_id}.events-by-timestamp",
        "PAIRSTREAM_PAIRS_TOPIC": f"{run_id}.pairs",
        "PAIRSTREAM_UNPAIRED_TOPIC": f"{run_id}.unpaired",
        "PAIRSTREAM_DEAD_LETTER_TOPIC": f"{run_id}.events.dlq",
        "PAIRSTREAM_MATCH_TOPIC_PREFIX": f"{run_id}.matches.",
        "PAIRSTREAM_DATA_DIR": str(ROOT / ".run" / run_id),
        "PAIRSTREAM_LAKE_DIR": str(ROOT / ".run" / f"{run_id}-lake"),
    }


async def input_committed(conf: Settings) -> bool:
    """True when the worker has committed its position past every committed record of
    the input (a transactional input, Connect's change topic, ends with a marker)."""
    consumer = AIOKafkaConsumer(
        **conf.kafka.aiokafka(), group_id=conf.app_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        # Every partition the input is declared with: the metadata of a just-started
        # broker can leave a just-created topic out, and no partitions would pass as
        # all of them committed.
        partitions = [TopicPartition(conf.events_topic, p) for p in range(conf.events_partitions)]
        committed = {
            TP(tp.topic, tp.partition): await consumer.committed(tp) or 0 for tp in partitions
        }
    finally:
        await consumer.stop()
    return not await unread_committed(conf, committed, timeout=10)


async def settle(conf: Settings, reader: OutputReader, quiet_s: float = 3.0) -> Outputs:
    """Wait until the input is consumed and no output arrived for `quiet_s`."""
    last_total, last_change = -1, time.monotonic()
    while True:
        await reader.read_available()
        if reader.total != last_total:
            last_total, last_change = reader.total, time.monotonic()
        elif time.monotonic() - last_change > quiet_s and await input_committed(conf):
            return reader.outputs


async def run(args: argparse.Namespace, nodes: list[broker.Node]) -> dict[str, str]:
    """The main job up to the Spark jobs; returns the settings the Spark jobs take."""
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    env = run_settings(run_id)
    secured = broker.security(nodes[0].name)
    bootstrap = broker.bootstrap_servers(nodes)
    if args.secure:
        env.update(secured.environment(bootstrap, "admin"))
    api = None
    if args.delivery:
        api = await OrderApi(Behaviour(lookup=True, fail_share=0.05, crash_share=0.01)).start()
        env.update(delivery_settings(run_id, api))
    env.update(chain_settings(run_id, args.chain, args.enrichment))
    os.environ.update(env)
    conf = Settings()
    await ensure_topics(conf)
    worker_env = analytics_env = {}
    if args.secure:
        await grant(conf.kafka, "User:worker", worker_permissions(conf))
        await grant(conf.kafka, "User:analytics", analytics_permissions(conf))
        worker_env = secured.environment(bootstrap, "worker")
        analytics_env = secured.environment(bootstrap, "analytics")
        print("secured: SASL_SSL, SCRAM-SHA-512; the worker as User:worker, Spark as"
              " User:analytics, each with only its ACLs (tools/kafka_acls.py)")  # fmt: skip
    log_path = ROOT / ".run" / f"{run_id}-worker.log"
    print(f"run {run_id}: worker log {log_path}")
    worker = start_worker(log_path, worker_env)
    try:
        await wait_ready(log_path, worker)
        records = generate(StreamShape(count=args.count, seed=args.seed))
        if args.enrichment:
            row = b'{"tariff": "peak", "why": "a demo row for the first day only"}'
            await produce([(FIRST_DAY.encode(), row)], conf.kafka, conf.sources_topic, 0, False)
        await produce(records, conf.kafka, conf.events_topic, args.rate, True)
        print("waiting for the worker to settle ...", flush=True)
        async with OutputReader(conf) as reader:
            outputs = await settle(conf, reader)
        if api is not None:
            await delivered(api, len(outputs.pairs))
        if args.enrichment:
            enriched = await until_count(conf, conf.enriched_topic, len(outputs.pairs))
        if args.chain:
            chain = await run_chain(conf)
    finally:
        stop_worker(worker)
        if api is not None:
            await api.stop()
    report(len(records), outputs)
    if api is not None:
        report_delivery(api, len(outputs.pairs))
    if args.enrichment:
        reasons = Counter(str(json.loads(v)["reason"] or "enriched") for v in enriched)
        print(f"\nEnrichment of the {len(outputs.pairs)} pairs: {dict(reasons)}")
        if len(enriched) != len(outputs.pairs):
            raise SystemExit("enrichment: not every pair came out once")
    if args.chain:
        print(f"\nDeposit chain: {chain}")
    return analytics_env


FIRST_DAY = "2024-02-09"  # the generated stream's first day (tools/generate.py)


def chain_settings(run_id: str, chain: bool, enrichment: bool) -> dict[str, str]:
    env: dict[str, str] = {}
    if chain:
        env.update(
            {
                "PAIRSTREAM_CHAIN_ENABLED": "true",
                "PAIRSTREAM_DEPOSITS_TOPIC": f"{run_id}.deposits",
                "PAIRSTREAM_ACCOUNTS_TOPIC": f"{run_id}.accounts",
                "PAIRSTREAM_VALIDATED_TOPIC": f"{run_id}.deposits.validated",
                "PAIRSTREAM_DEPOSITS_DEAD_LETTER_TOPIC": f"{run_id}.deposits.dlq",
            }
        )
    if enrichment:
        env.update(
            {
                "PAIRSTREAM_ENRICHMENT_ENABLED": "true",
                "PAIRSTREAM_SOURCES_TOPIC": f"{run_id}.sources",
                "PAIRSTREAM_ENRICHED_TOPIC": f"{run_id}.pairs.enriched",
                "PAIRSTREAM_SOURCES_DEAD_LETTER_TOPIC": f"{run_id}.sources.dlq",
            }
        )
    return env


async def topic_values(conf: Settings, topic: str) -> list[bytes]:
    async with read_committed(conf) as consumer:
        partitions = [TopicPartition(topic, p) for p in range(conf.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: list[bytes] = []
        for tp in partitions:
            while await consumer.position(tp) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                values.extend(m.value for m in batch.get(tp, []) if m.value is not None)
        return values


async def until_count(conf: Settings, topic: str, count: int, timeout: float = 300) -> list[bytes]:
    deadline = time.monotonic() + timeout
    while len(values := await topic_values(conf, topic)) < count and time.monotonic() < deadline:
        await asyncio.sleep(1)  # polling the committed topic
    return values


async def run_chain(conf: Settings) -> str:
    """Accounts, then deposits, through the chain; the balances checked against the model."""
    shape = ChainShape(accounts=200, deposits=5000, seed=1)
    accounts, deposits = account_records(shape), deposit_records(shape)
    model = expected(accounts, deposits)
    await produce(accounts, conf.kafka, conf.accounts_topic, 0, False)
    changelog = f"{conf.app_id}-accounts-changelog"
    # Accounts first: validation reads them as a table, in processing order.
    await until_count(conf, changelog, len(accounts))
    await produce(deposits, conf.kafka, conf.deposits_topic, 0, True)
    validated = await until_count(conf, conf.validated_topic, model.validated)
    dead = await until_count(conf, conf.deposits_dead_letter_topic, model.dead_lettered)
    balances = {}
    for value in validated:
        record = json.loads(value)
        balances[record["account"]] = Decimal(record["balance"])
    if balances != model.balances or len(validated) != model.validated:
        raise SystemExit("deposit chain: balances differ from the model")
    return (
        f"{len(validated)} deposits validated over {len(balances)} accounts, {len(dead)}"
        " dead-lettered; every balance equals the sum of the account's valid distinct deposits"
    )


def delivery_settings(run_id: str, api: OrderApi) -> dict[str, str]:
    return {
        "PAIRSTREAM_DELIVERY_ENABLED": "true",
        "PAIRSTREAM_DELIVERY_URL": f"{api.url}/orders",
        "PAIRSTREAM_DELIVERY_STATUS_URL": f"{api.url}/orders/status/{{key}}",
        "PAIRSTREAM_DELIVERY_DEAD_LETTER_TOPIC": f"{run_id}.deliveries.dlq",
        "PAIRSTREAM_DELIVERY_UNCERTAIN_TOPIC": f"{run_id}.deliveries.uncertain",
        "PAIRSTREAM_DELIVERY_BACKOFF_MAX_SECONDS": "2",
    }


async def delivered(api: OrderApi, pairs: int, timeout: float = 300) -> None:
    """Wait until the API has every pair (it may still be retrying a few)."""
    print(f"waiting for the order API to receive {pairs} pairs ...", flush=True)
    deadline = time.monotonic() + timeout
    while len(api.applied) < pairs and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # polling the stand-in API


def report_delivery(api: OrderApi, pairs: int) -> None:
    summary = api.summary()
    print(f"\nDelivery of the {pairs} pairs to the stand-in order API:")
    print(f"  orders applied         {summary['orders']:>7}")
    print(f"  applied more than once {summary['duplicates']:>7}")
    for what, count in sorted(summary["calls"].items()):
        print(f"  calls {what:<16} {count:>7}")
    if summary["orders"] != pairs or summary["duplicates"]:
        raise SystemExit("delivery: the API did not receive every pair exactly once")


def start_worker(log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`faust -A app worker` with this process's environment and `env`, in its own
    session."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [FAUST, "-A", "app", "worker", "-l", "info"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})},
        )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after a grace period, as a supervisor does: faust can
    hang on exit (docs/exactly-once.md), and an unclean stop loses nothing."""
    if worker.poll() is not None:
        return  # exited by itself (a crash): its session is gone with it
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print(f"worker still running {grace:.0f} s after SIGTERM; killed", flush=True)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


async def wait_ready(log_path: Path, worker: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while b"Worker]: Ready" not in log_path.read_bytes():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker did not start; see {log_path}")
        await asyncio.sleep(0.3)


def report(sent: int, outputs: Outputs) -> None:
    print(f"\n{sent} records in. What came out (read_committed):")
    for name, count in sorted(outputs.summary().items()):
        print(f"  {name:<22} {count:>7}")
    print(
        "  (duplicates are dropped without output; events still waiting for a partner stay pending)"
    )
    for label, records in [
        ("pair", outputs.pairs[:3]),
        ("unpaired", outputs.unpaired[:2]),
        ("dead letter", outputs.dead_letters[:2]),
    ]:
        for record in records:
            print(f"  e.g. {label:<12} {dumps(record).decode()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=4_000, help="events per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--delivery", action="store_true", help="also deliver the pairs to a stand-in order API"
    )
    parser.add_argument("--chain", action="store_true", help="also run the deposit chain")
    parser.add_argument("--enrichment", action="store_true", help="also enrich the pairs")
    parser.add_argument(
        "--secure", action="store_true", help="on the secured broker (SASL_SSL, ACLs)"
    )
    args = parser.parse_args(argv)
    if args.secure:
        nodes = broker.cluster(1, broker.SECURE_PORT, "kafka-secure", secure=True)
    else:
        nodes = broker.cluster(1, broker.PORT)
    broker.start(nodes, timeout=120)
    analytics_env = asyncio.run(run(args, nodes))
    print("\nSpark: ingest into Delta, windowed analytics, reconciliation ...", flush=True)
    os.environ.update(analytics_env)
    if not run_jobs("all", Settings(), None):  # Settings() now holds this run's topics
        raise SystemExit("reconciliation found discrepancies (see above)")
    print("\nthe broker keeps running; `make stop` stops it, `make clean` removes all data")


if __name__ == "__main__":
    main()
