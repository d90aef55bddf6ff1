"""The worker's web endpoints, against real workers that processed a known stream."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from pairing.events import Event, parse_event
from pairing.routing import partition_for
from tests.integration.harness import ROOT, Pipeline, Worker, expected_total, wait_for_outputs
from tests.reference_model import Expected
from tools.generate import Record, StreamShape, generate
from tools.read_outputs import OutputReader

pytestmark = pytest.mark.broker

EVENTS = 1_000
TOKEN = "web-t0ken-4711"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}
WRONG_TOKEN = {"Authorization": "Bearer web-t0ken-4712"}


@dataclass
class Processed:
    """Workers that processed EVENTS known records and are idle now."""

    pipeline: Pipeline
    workers: list[Worker]
    records: list[Record]
    expected: Expected

    def url(self, worker: int, path: str) -> str:
        return f"http://127.0.0.1:{self.workers[worker].web_port}{path}"

    def pending_keys(self) -> dict[str, str]:
        """Pairing key of each event the model says is pending, by identity."""
        conf = self.pipeline.conf
        events = [parse_event(value, conf.max_event_bytes) for _, value in self.records]
        keys = {e.identity: e.key for e in events if isinstance(e, Event)}
        return {identity: keys[identity] for identity in self.expected.pending}


async def processed(broker: str, tmp: Path, workers: int, seed: int, **overrides: str) -> Processed:
    pipeline = await Pipeline(broker, tmp, PAIRSTREAM_WEB_TOKEN=TOKEN, **overrides).create_topics()
    records = generate(StreamShape(count=EVENTS, seed=seed))
    started = [pipeline.worker(i).start() for i in range(workers)]
    for worker in started:
        await worker.wait_ready()
    await pipeline.produce(records)
    expected = await pipeline.expected()
    async with OutputReader(pipeline.conf) as reader:
        await wait_for_outputs(reader, expected_total(expected), timeout=180)
        assert reader.total == expected_total(expected)
    return Processed(pipeline, started, records, expected)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def one_worker(
    broker: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Processed]:
    # faust's debug pages on, /metrics and the dashboard page open.
    run = await processed(
        broker,
        tmp_path_factory.mktemp("web"),
        workers=1,
        seed=31,
        PAIRSTREAM_DEBUG="true",
        PAIRSTREAM_WEB_OPEN_METRICS="true",
    )
    yield run
    for worker in run.workers:
        worker.kill()


async def get(url: str, headers: dict[str, str] = AUTHORIZED) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        body = await response.text()
        is_json = response.content_type == "application/json"
        return response.status, response.content_type, json.loads(body) if is_json else body


async def assert_refused(url: str) -> None:
    """401 without the token and with a wrong one, as JSON, asking for a bearer token."""
    for headers in ({}, WRONG_TOKEN):
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers=headers) as response,
        ):
            assert response.status == 401, (url, headers)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert set(await response.json()) == {"error"}


def model_totals(expected: Expected) -> dict[str, int]:
    reasons = [reason for (_, _, _, reason), n in expected.unpaired.items() for _ in range(n)]
    return {
        "events_in": EVENTS,
        "valid": EVENTS - expected.invalid.total(),
        "dead_lettered": expected.invalid.total(),
        "duplicates": expected.duplicates,
        "conflicts": sum(expected.conflicts.values()),
        "pairs": sum(expected.pairs.values()),
        "expired": reasons.count("expired"),
        "late": reasons.count("late"),
        "pending": len(expected.pending),
    }


@pytest.mark.asyncio(loop_scope="module")
async def test_stats_add_up_to_what_was_produced(one_worker: Processed) -> None:
    status, _, stats = await get(one_worker.url(0, "/stats"))
    assert status == 200
    want = model_totals(one_worker.expected)
    assert {name: stats["totals"][name] for name in want} == want
    assert want["pairs"] and want["expired"] and want["late"] and want["duplicates"]
    conf = one_worker.pipeline.conf
    partitions = {(p["topic"], p["partition"]): p for p in stats["partitions"]}
    assert set(partitions) == {(conf.events_topic, p) for p in range(conf.events_partitions)} | {
        (conf.keyed_topic, p) for p in range(conf.partitions)
    }
    events = [p for p in stats["partitions"] if p["topic"] == conf.events_topic]
    assert sum(p["end_offset"] for p in events) == EVENTS
    for p in events:
        # The input topic is not transactional: everything consumed is committed, no lag.
        assert p["end_offset"] > 0 and p["committed_offset"] == p["end_offset"], p
    keyed = [p for p in stats["partitions"] if p["topic"] == conf.keyed_topic]
    assert sum(p["counters"]["events_in"] for p in keyed) == want["valid"]
    for p in stats["partitions"]:
        assert (p["role"], p["recovering"]) == ("active", False)
        assert p["last_commit_at"] is not None
        assert p["lag"] == p["end_offset"] - p["committed_offset"]
    for p in keyed:
        # Transaction markers take offsets too, and a commit stops at the last record
        # processed: an idle keyed partition shows the marker after it as lag.
        assert p["lag"] >= 0 and p["counters"]["events_in"] <= p["end_offset"]
        pending_keys = one_worker.pending_keys().values()
        here = sum(partition_for(k, conf.partitions) == p["partition"] for k in pending_keys)
        assert p["pending"]["count"] == here
        assert p["pending"]["watermark"] is not None
        if here:
            assert 0 <= p["pending"]["oldest_age_seconds"] <= conf.expiry_seconds
    worker = stats["worker"]
    assert worker["uptime_seconds"] > 0 and worker["resident_memory_bytes"] > 0
    assert worker["event_loop"] == "uvloop.Loop"  # the default, chosen by the app
    assert worker["state_disk_bytes"] > 0
    assert set(worker["throughput"]) == {conf.events_topic, conf.keyed_topic}
    commits = worker["commit_seconds"]
    # Every partition's last commit counted; a cumulative histogram.
    assert commits["count"] > 0 and commits["sum"] > 0
    counts = list(commits["buckets"].values())
    assert counts == sorted(counts) and counts[-1] <= commits["count"]


@pytest.mark.asyncio(loop_scope="module")
async def test_prometheus_metrics_parse_and_match_the_stats(one_worker: Processed) -> None:
    status, content_type, text = await get(one_worker.url(0, "/metrics"))
    assert status == 200 and content_type == "text/plain"
    # Summed over partitions: (sample name, reason label or "") -> value
    samples: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("reason", ""))] += sample.value
    want = model_totals(one_worker.expected)
    assert samples[("pairstream_pairs_total", "")] == want["pairs"]
    assert samples[("pairstream_duplicate_events_total", "")] == want["duplicates"]
    assert samples[("pairstream_dead_lettered_events_total", "")] == want["dead_lettered"]
    assert samples[("pairstream_unpaired_events_total", "expired")] == want["expired"]
    assert samples[("pairstream_unpaired_events_total", "late")] == want["late"]
    assert samples[("pairstream_pending_events", "")] == want["pending"]
    assert samples[("pairstream_commit_seconds_count", "")] > 0
    # faust's own sensor only with PAIRSTREAM_FAUST_SENSOR (tests/unit/test_app_config.py)
    assert not any(name.startswith("faust_") for name, _ in samples)


@pytest.mark.asyncio(loop_scope="module")
async def test_pending_answers_the_event_and_errors_are_json(one_worker: Processed) -> None:
    identity, key = sorted(one_worker.pending_keys().items())[0]
    status, _, body = await get(one_worker.url(0, f"/pending/{key}"))
    assert status == 200, body
    assert (body["key"], body["identity"]) == (key, identity)
    status, _, body = await get(one_worker.url(0, "/pending/not-a-time"))
    assert status == 400 and "malformed timestamp" in body["error"]
    status, _, body = await get(one_worker.url(0, "/pending/1999-01-01T00:00:00Z"))
    assert status == 404 and body["key"] == "1999-01-01T00:00:00Z"


@pytest.mark.asyncio(loop_scope="module")
async def test_with_a_token_data_and_faust_s_debug_pages_need_it(one_worker: Processed) -> None:
    _, key = sorted(one_worker.pending_keys().items())[0]
    # faust's own pages, served with PAIRSTREAM_DEBUG: raw tables, topology, sensors.
    faust_pages = ["/table/", "/router/", "/graph/", "/assignment/"]
    for path in ["/stats", "/stats/cluster", f"/pending/{key}", *faust_pages]:
        await assert_refused(one_worker.url(0, path))
        status, _, body = await get(one_worker.url(0, path))
        if path == "/graph/" and status == 500:  # reached: faust's view wants pydot
            assert "pydot" in body
        else:
            assert status == 200, (path, body)
    # /health always; /metrics and the dashboard page with PAIRSTREAM_WEB_OPEN_METRICS.
    for path in ["/health", "/metrics", "/"]:
        status, _, body = await get(one_worker.url(0, path), headers={})
        assert status == 200, (path, body)


@pytest.mark.asyncio(loop_scope="module")
async def test_dashboard_shows_live_values_in_headless_chromium(one_worker: Processed) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium package is needed: make setup installs it"
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    # Without the token the page asks for it.
    url = one_worker.url(0, "/")
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert '<form id="login">' in dom.stdout and "/stats answered 401" in dom.stdout, dom.stdout
    url = one_worker.url(0, f"/#token={TOKEN}")  # sent as the header on its fetches
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    want = model_totals(one_worker.expected)
    for name in ("pairs", "expired", "late", "duplicates", "dead_lettered", "pending"):
        assert f'id="{name}">{want[name]}<' in dom.stdout, (name, dom.stdout[-2000:])
    assert "data-updated" in dom.stdout  # the refresh ran and found no error
    shot = ROOT / ".run" / "dashboard.png"
    shot.parent.mkdir(exist_ok=True)
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,800", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.asyncio(loop_scope="module")
async def test_two_workers_route_pending_and_sum_cluster_stats_with_the_token(
    broker: str, tmp_path: Path
) -> None:
    run = await processed(broker, tmp_path, workers=2, seed=32)  # faust's debug pages off
    try:
        conf = run.pipeline.conf
        owners: dict[int, int] = {}  # keyed partition -> worker index
        for index in range(2):
            _, _, stats = await get(run.url(index, "/stats"))
            for p in stats["partitions"]:
                if p["topic"] == conf.keyed_topic and p["role"] == "active":
                    owners[p["partition"]] = index
        assert len(owners) == conf.partitions and set(owners.values()) == {0, 1}
        pending = run.pending_keys()
        identity, key = next(
            (i, k)
            for i, k in sorted(pending.items())
            if owners[partition_for(k, conf.partitions)] == 1
        )
        status, _, body = await get(run.url(0, f"/pending/{key}"))  # asked of the other worker
        assert status == 200, body
        assert body["identity"] == identity
        assert body["worker"] == f"http://127.0.0.1:{run.workers[1].web_port}"
        status, _, cluster = await get(run.url(0, "/stats/cluster"))
        assert status == 200 and cluster["complete"], cluster
        want = model_totals(run.expected)
        assert {name: cluster["totals"][name] for name in want} == want
        # Without PAIRSTREAM_WEB_OPEN_METRICS, /metrics and the dashboard page need it too.
        for path in [f"/pending/{key}", "/stats/cluster", "/metrics", "/", "/table/"]:
            await assert_refused(run.url(0, path))
        status, _, _ = await get(run.url(0, "/metrics"))
        assert status == 200
        status, _, _ = await get(run.url(0, "/table/"))
        assert status == 404  # faust's raw table pages are off unless debug is on
        status, _, _ = await get(run.url(1, "/health"), headers={})
        assert status == 200
    finally:
        for worker in run.workers:
            worker.kill()
