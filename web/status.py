"""This worker's status as plain data: what /stats, /metrics and the dashboard show.

Counters are this process's since it started (a restarted worker starts at
zero); offsets, lag and pending state are read live from the consumer and the
rule engines.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from agents.pairing import pending_by_partition
from app.exactly_once import internals
from app.faust_app import app
from app.settings import settings
from pairing.events import format_time
from pairing.key_state import MICROS
from pairing.rules import PendingSummary
from tables.pairing_state import table

conf = settings()

# What an event of each source topic can count as, so zeros show too.
COUNTERS: dict[str, tuple[str, ...]] = {
    conf.events_topic: ("events_in", "valid", "dead_lettered"),
    conf.keyed_topic: ("events_in", "duplicates", "conflicts", "pairs", "expired", "late"),
}
_inputs, _ = conf.pattern_topics()
for _topic in _inputs:
    COUNTERS[_topic] = ("pattern_inputs_in", "pattern_inputs_invalid")
if _inputs:
    COUNTERS[conf.pattern_events_topic] = (
        "pattern_events_in",
        "matches",
        "pattern_late",
        "pattern_duplicates",
        "pattern_partials_dropped",
    )
# Each total sums one counter over the partitions of the topics that count it (the keyed
# topic's events_in repeats the valid events, so it is left out).
TOTALS: dict[str, set[str]] = {}
for _topic, _names in COUNTERS.items():
    for _name in _names:
        TOTALS.setdefault(_name, set()).add(_topic)
TOTALS["events_in"] = {conf.events_topic}
THROUGHPUT_WINDOWS = (1, 10, 60)
# What delivery's steps count, exactly once per record (delivery/agent.py).
DELIVERY_RECORDED = (
    "orders",
    "invalid",
    "accepted",
    "duplicates",
    "delivered",
    "dead",
    "parked",
    "forgotten",
)


def worker_status() -> dict[str, Any]:
    now = time.time()
    stats = app.partition_tasks.stats
    partitions = [*_active_partitions(now), *_standby_partitions()]
    errors = processing_errors()
    status: dict[str, Any] = {
        "worker": {
            "url": str(app.conf.canonical_url),
            "uptime_seconds": round(now - stats.started_at, 3),
            "event_loop": _event_loop(),
            "recovering": bool(app.in_recovery),
            "resident_memory_bytes": _resident_memory(),
            "state_disk_bytes": _disk_usage(Path(app.conf.tabledir)),
            "throughput": {
                topic: {f"{w}s": rate.rate(w, now) for w in THROUGHPUT_WINDOWS}
                for topic, rate in sorted(stats.throughput.items())
            },
            "skipped": dict(stats.process),
            "commit_seconds": stats.commits.status(),
        },
        "totals": {**totals(partitions), "processing_errors": errors["total"]},
        "partitions": partitions,
        "processing_errors": errors,
    }
    if conf.delivery_enabled:
        status["delivery"] = delivery_status()
    return status


def _event_loop() -> str:
    """The running loop's class, as `module.Class`: `uvloop.Loop`, or asyncio's."""
    loop_class = type(asyncio.get_running_loop())
    return f"{loop_class.__module__}.{loop_class.__qualname__}"


def delivery_status() -> dict[str, Any]:
    """The dispatcher's calls and window, and what the delivery steps recorded."""
    from delivery.agent import dispatcher  # loaded with the app when delivery is on

    topics = {conf.delivery_source, conf.delivery_by_id_topic, conf.delivery_log_topic}
    recorded: Counter[str] = Counter()
    for tp, counts in app.partition_tasks.stats.partitions.items():
        if tp.topic in topics:
            recorded.update(counts)
    return {
        **dispatcher.status(),
        "recorded": {name: recorded[name] for name in DELIVERY_RECORDED},
    }


def processing_errors() -> dict[str, Any]:
    """Records of any input partition dead-lettered because their processing raised
    (app/exactly_once/step.py), counted as their steps were acked."""
    found = [
        {"topic": tp.topic, "partition": tp.partition, "count": counts["processing_errors"]}
        for tp, counts in sorted(app.partition_tasks.stats.partitions.items())
        if counts["processing_errors"]
    ]
    return {"total": sum(entry["count"] for entry in found), "partitions": found}


def totals(partitions: list[dict[str, Any]]) -> dict[str, int]:
    """Sums over the active partitions: counters, pending events and lag."""
    active = [p for p in partitions if p["role"] == "active"]
    sums = {
        name: sum(p["counters"][name] for p in active if p["topic"] in topics)
        for name, topics in TOTALS.items()
    }
    sums["pending"] = sum((p.get("pending") or {}).get("count", 0) for p in active)
    sums["lag"] = sum(p["lag"] or 0 for p in active)
    return sums


def _active_partitions(now: float) -> Iterator[dict[str, Any]]:
    consumer = cast(Any, app.consumer)
    stats = app.partition_tasks.stats
    pending = pending_by_partition()
    for tp in sorted(app.assignor.assigned_actives()):
        if tp.topic not in COUNTERS:
            continue  # a table's changelog: shown through its keyed partition
        counts = stats.partitions.get(tp) or Counter()
        committed = internals.committed_offset(consumer, tp)
        end = consumer.highwater(tp)
        last_commit = stats.last_commit_at.get(tp)
        entry: dict[str, Any] = {
            "topic": tp.topic,
            "partition": tp.partition,
            "role": "active",
            "recovering": bool(app.in_recovery),
            "counters": {name: counts.get(name, 0) for name in COUNTERS[tp.topic]},
            "committed_offset": committed,
            "end_offset": end,
            "lag": end - committed if end is not None and committed is not None else None,
            "last_commit_at": _iso(last_commit) if last_commit is not None else None,
        }
        if tp.topic == conf.keyed_topic:
            entry["pending"] = _pending(pending.get(tp.partition), now)
        yield entry


def _pending(loaded: tuple[PendingSummary, int | None] | None, now: float) -> dict[str, Any] | None:
    """None until the partition's rule engine is loaded (by its first event or tick)."""
    if loaded is None:
        return None
    summary, watermark_us = loaded
    oldest_age = None
    if summary.oldest_time_us is not None and watermark_us is not None:
        oldest_age = (watermark_us - summary.oldest_time_us) / MICROS
    return {
        "count": summary.count,
        "oldest_age_seconds": oldest_age,  # in event time, to the watermark: what expiry measures
        "longest_wait_seconds": (
            None if summary.first_waiting_since is None else now - summary.first_waiting_since
        ),
        "watermark": None if watermark_us is None else _iso(watermark_us / MICROS),
    }


def _standby_partitions() -> Iterator[dict[str, Any]]:
    consumer = cast(Any, app.consumer)
    changelog = table.changelog_topic.get_topic_name()
    for tp in sorted(app.assignor.assigned_standbys()):
        if tp.topic != changelog:
            continue
        yield {
            "topic": tp.topic,
            "partition": tp.partition,
            "role": "standby",
            "recovering": bool(app.in_recovery),
            "end_offset": consumer.highwater(tp),
        }


def _iso(seconds: float) -> str:
    return format_time(datetime.fromtimestamp(seconds, UTC))


def _resident_memory() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak, which is what getrusage offers
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _disk_usage(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:  # RocksDB removed it (compaction) meanwhile
            continue
    return total
