"""The fault matrix: six ways to break a worker or a broker mid-stream.

Quick mode (default, CI): 20,000 records per scenario. Long mode
(PAIRSTREAM_FAULT_MODE=long): 100,000. PAIRSTREAM_FAULT_EVENTS sets another count.
The seed comes from PAIRSTREAM_FAULT_SEED or at random, and is printed. Each report
is appended to .run/fault-matrix.jsonl.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from app.kafka.admin import admin_client
from tests.conftest import broker_nodes
from tests.integration.faults import (
    kill_broker,
    kill_worker,
    pause_worker,
    scale_in,
    scale_out,
    start_broker,
)
from tests.integration.harness import ROOT, Pipeline, secured_pipeline
from tests.integration.scenarios import Fault, Report, run_scenario
from tools import broker as local_broker
from tools.generate import StreamShape, generate

pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.matrix]

LONG = os.environ.get("PAIRSTREAM_FAULT_MODE", "quick") == "long"
EVENTS = int(os.environ.get("PAIRSTREAM_FAULT_EVENTS", 100_000 if LONG else 20_000))
RATE = 1_000.0 if LONG else 800.0  # events per second: faults strike while events flow
SEED = int(os.environ.get("PAIRSTREAM_FAULT_SEED", random.randrange(1 << 30)))
CLUSTER_PORT = int(os.environ.get("PAIRSTREAM_TEST_CLUSTER_PORT", "9292"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[local_broker.Node]]:
    """Three KRaft brokers (replication factor 3, min.insync.replicas 2) and a
    dedicated controller. With combined broker+controller nodes, a voter killed
    with SIGKILL and restarted made the other two crash (docs/fault-matrix.md)."""
    local_broker.clean("cluster")  # a fresh cluster: no state from earlier sessions
    nodes = local_broker.cluster(3, CLUSTER_PORT, name="cluster", dedicated_controller=True)
    local_broker.start(nodes, timeout=180)
    yield nodes
    local_broker.stop(nodes, hard=False)


async def check(
    name: str, pipeline: Pipeline, faults: list[Fault], rate: float = RATE, **kwargs: object
) -> Report:
    print(f"\n[{name}] seed {SEED}, {EVENTS} records")
    records = generate(StreamShape(count=EVENTS, seed=SEED))
    report = await run_scenario(pipeline, records, faults, seed=SEED, rate=rate, **kwargs)  # type: ignore[arg-type]
    log = ROOT / ".run" / "fault-matrix.jsonl"
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as out:
        out.write(json.dumps({"scenario": name, "long": LONG, **asdict(report)}) + "\n")
    assert report.problems == {}, f"[{name}] seed {SEED}: {report.problems}"
    return report


async def test_worker_hard_kill(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    await check(
        "worker hard kill", pipeline, [kill_worker(0.2), kill_worker(0.45), kill_worker(0.7)]
    )


async def test_worker_hard_kill_secured(
    secure_broker: list[local_broker.Node], tmp_path: Path
) -> None:
    """The same, on SASL_SSL with SCRAM-SHA-512, the worker holding only its ACLs."""
    pipeline = await secured_pipeline(secure_broker, tmp_path)
    await check(
        "worker hard kill, secured",
        pipeline,
        [kill_worker(0.2), kill_worker(0.45), kill_worker(0.7)],
    )


async def test_rebalance_with_standbys(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(broker, tmp_path, PAIRSTREAM_STANDBY_REPLICAS="1").create_topics()
    faults = [scale_out(0.15, 2), kill_worker(0.4, index=1), scale_in(0.65, [1, 2])]
    await check("rebalance 1-3-1, kill one of three", pipeline, faults)


async def test_lost_local_state(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    faults = [kill_worker(0.3, lose_local_state=True), kill_worker(0.6, lose_local_state=True)]
    await check("lost local state", pipeline, faults)


async def test_broker_hard_bounce(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    fault = kill_broker(0.35, broker_nodes(), restart=True)
    await check("broker hard bounce", pipeline, [fault])


async def test_cluster_loses_a_broker(cluster: list[local_broker.Node], tmp_path: Path) -> None:
    """No replication setting: every topic the pipeline and its workers create takes the
    cluster's default.replication.factor (3), and a broker lost mid-stream loses nothing."""
    bootstrap = local_broker.bootstrap_servers(cluster)
    pipeline = await Pipeline(bootstrap, tmp_path, PAIRSTREAM_PARTITIONS="8").create_topics()
    assert pipeline.conf.replication_factor is None
    victim = [cluster[1]]
    faults = [kill_broker(0.3, victim, restart=False), start_broker(0.65, victim, cluster)]
    # At the quick rate the stream ended before the broker was back (seen once): the
    # broker must come back while records flow.
    await check("3-broker cluster, one killed", pipeline, faults, rate=min(RATE, 400.0))
    async with admin_client(pipeline.conf) as admin:
        names = [t for t in await admin.list_topics() if t.startswith(pipeline.conf.app_id)]
        described = await admin.describe_topics(names)
    replicas = {t["topic"]: {len(p["replicas"]) for p in t["partitions"]} for t in described}
    changelogs = [name for name in replicas if name.endswith("-changelog")]
    assert len(changelogs) >= 2, replicas  # the pairing state's and the input progress'
    assert all(counts == {3} for counts in replicas.values()), replicas


async def test_paused_worker_is_fenced(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(
        broker, tmp_path, PAIRSTREAM_TRANSACTION_TIMEOUT_SECONDS="10"
    ).create_topics()
    # Longer than both the transaction timeout and the session timeout.
    faults = [pause_worker(0.3, index=0, seconds=15)]
    await check("SIGSTOP past the transaction timeout", pipeline, faults, workers=2)
