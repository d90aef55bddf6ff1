"""The worker's HTTP endpoints, on faust's web server: /stats, /stats/cluster,
/pending/{timestamp}, /metrics, the dashboard at /, and the probes (web/probes.py). With
a web token, all but the probes need it (web/auth.py); a worker asking another sends it.

Every error is JSON {"error": message, ...} with its status code.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
from faust.web import Request, Response, View
from yarl import URL

from app.faust_app import app
from app.settings import settings
from pairing.events import Rejection, parse_timestamp
from pairing.routing import partition_for
from tables.pairing_state import stored_state, table
from web import probes
from web.auth import bearer
from web.metrics import setup_metrics
from web.status import worker_status

conf = settings()
PEER_HEADERS = bearer(conf.web_token)  # other workers ask for the same token
DASHBOARD = (Path(__file__).parent / "dashboard.html").read_text()
FORWARDED = "X-Pairstream-Forwarded"  # a forwarded request is never forwarded again
PEER_TIMEOUT = aiohttp.ClientTimeout(total=5)

setup_metrics(app, conf.faust_sensor)
probes.install(app, conf)


@app.page("/")
async def dashboard(self: View, request: Request) -> Response:
    return self.html(DASHBOARD)


@app.page("/stats")
async def stats(self: View, request: Request) -> Response:
    return self.json(worker_status())


@app.page("/stats/cluster")
async def cluster_stats(self: View, request: Request) -> Response:
    """Every worker of the group asked for its /stats. During a rebalance a
    partition can be reported by no worker, or by two: then `complete` is false
    and `missing` / `reported_twice` say which."""
    urls = sorted(_distribution()) or [str(app.conf.canonical_url)]
    answers = await asyncio.gather(*(_worker_status_at(url) for url in urls))
    workers, partitions = [], []
    for url, (status, error) in zip(urls, answers, strict=True):
        workers.append({"url": url, "ok": error is None, "error": error})
        for entry in status["partitions"] if status else ():
            if entry["role"] == "active":
                partitions.append({**entry, "worker": url})
    reported = Counter((p["topic"], p["partition"]) for p in partitions)
    missing = sorted(_source_partitions() - set(reported))
    twice = sorted(tp for tp, times in reported.items() if times > 1)
    totals: Counter[str] = Counter()
    for status, _ in answers:
        totals.update(status["totals"] if status else {})
    return self.json(
        {
            "complete": all(w["ok"] for w in workers) and not missing and not twice,
            "workers": workers,
            "missing": missing,
            "reported_twice": twice,
            "totals": totals,
            "partitions": partitions,
        }
    )


@app.page("/pending/{timestamp}")
async def pending(self: View, request: Request, timestamp: str) -> Response:
    """The pending event of a pairing key, from whichever worker owns the key."""
    parsed = parse_timestamp(timestamp)
    if isinstance(parsed, Rejection):
        return self.error(400, f"malformed timestamp: {parsed.reason}", timestamp=timestamp)
    key, _ = parsed
    partition = partition_for(key, conf.partitions)

    def answer() -> Response:
        state = stored_state(key)
        if state is None or state.pending is None:
            return self.error(404, "no event is pending for this key", key=key)
        event = state.pending
        return self.json(
            {
                "key": key,
                "type": event.type,
                "value": str(event.value),  # a string: JSON numbers would round decimals
                "identity": event.identity,
                "waiting_since": event.waiting_since,
                "partition": partition,
                "worker": str(app.conf.canonical_url),
            }
        )

    changelog = table.changelog_topic.get_topic_name()
    return await from_owner(self, request, changelog, partition, f"pending/{key}", answer)


async def from_owner(
    view: View,
    request: Request,
    changelog: str,
    partition: int,
    path: str,
    answer: Callable[[], Response],
) -> Response:
    """`answer()` from the worker that owns `partition` of the table whose changelog is
    `changelog`: here, or forwarded there (once)."""
    owner = _owner(partition, changelog)
    if owner is None:
        return view.error(503, f"no worker owns partition {partition} now (rebalancing)")
    if not _is_me(owner):
        if request.headers.get(FORWARDED):
            return view.error(503, f"ownership of partition {partition} is moving")
        return await _forward(view, URL(owner) / path)
    if app.in_recovery:
        return view.error(503, "tables are being restored", partition=partition)
    return answer()


def _distribution() -> dict[str, dict[str, list[int]]]:
    """Worker URL -> the table partitions it owns, as of the last rebalance."""
    distribution: dict[str, dict[str, list[int]]] = cast(Any, app.assignor).changelog_distribution
    return distribution


def _owner(partition: int, changelog: str) -> str | None:
    for url, topics in _distribution().items():
        if partition in topics.get(changelog, ()):
            return url
    return None


def _is_me(url: str) -> bool:
    mine, other = URL(str(app.conf.canonical_url)), URL(url)
    return (mine.host, mine.port) == (other.host, other.port)


def _source_partitions() -> set[tuple[str, int]]:
    consumer = cast(Any, app.consumer)
    # The count this worker has seen: faust's is kept up to date on the group leader only.
    events = max(consumer.topic_partitions(conf.events_topic) or 0, app.input_size.count)
    return {(conf.keyed_topic, p) for p in range(conf.partitions)} | {
        (conf.events_topic, p) for p in range(events)
    }


async def _worker_status_at(url: str) -> tuple[dict[str, Any] | None, str | None]:
    if _is_me(url):
        return worker_status(), None
    try:
        async with app.http_client.get(
            URL(url) / "stats", headers=PEER_HEADERS, timeout=PEER_TIMEOUT
        ) as response:
            response.raise_for_status()
            return await response.json(), None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


async def _forward(view: View, url: URL) -> Response:
    try:
        async with app.http_client.get(
            url, headers={FORWARDED: "1", **PEER_HEADERS}, timeout=PEER_TIMEOUT
        ) as response:
            body = await response.read()
            return view.bytes(body, content_type=response.content_type, status=response.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return view.error(502, f"the owning worker did not answer: {type(exc).__name__}")
