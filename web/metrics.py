"""GET /metrics: our metrics (prefixed `pairstream_`), and with
PAIRSTREAM_FAUST_SENSOR faust-streaming's Prometheus sensor too (prefixed `faust_`),
in one registry.

Ours are read from `worker_status()` at scrape time, so the event path only
bumps plain counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from faust.sensors.prometheus import setup_prometheus_sensors
from faust.types import AppT
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from web.status import worker_status

# Our counter name -> (metric family, help, extra labels).
COUNTERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "events_in": ("pairstream_events_in", "Input records processed (ticks excluded)", {}),
    "valid": ("pairstream_valid_events", "Events that passed validation", {}),
    "dead_lettered": ("pairstream_dead_lettered_events", "Invalid events sent to the DLQ", {}),
    "duplicates": ("pairstream_duplicate_events", "Events already seen, dropped", {}),
    "conflicts": ("pairstream_conflicting_events", "Events that conflict with a key's state", {}),
    "pairs": ("pairstream_pairs", "Pairs published", {}),
    "expired": ("pairstream_unpaired_events", "Events published unpaired", {"reason": "expired"}),
    "late": ("pairstream_unpaired_events", "Events published unpaired", {"reason": "late"}),
    "pattern_inputs_in": ("pairstream_pattern_inputs", "Pattern input records processed", {}),
    "pattern_inputs_invalid": (
        "pairstream_pattern_inputs_invalid",
        "Pattern input records sent to the DLQ",
        {},
    ),
    "pattern_events_in": ("pairstream_pattern_events", "Events the patterns processed", {}),
    "matches": ("pairstream_matches", "Matches published", {}),
    "pattern_late": ("pairstream_pattern_refused", "Events patterns refused", {"reason": "late"}),
    "pattern_duplicates": (
        "pairstream_pattern_refused",
        "Events patterns refused",
        {"reason": "duplicate"},
    ),
    "pattern_partials_dropped": (
        "pairstream_pattern_partials_dropped",
        "Partial matches the cap per key dropped",
        {},
    ),
}
PARTITION_GAUGES: dict[str, tuple[str, str]] = {
    "committed_offset": ("pairstream_committed_offset", "Offset committed for the group"),
    "end_offset": ("pairstream_end_offset", "Last stable offset of the partition"),
    "lag": ("pairstream_consumer_lag_records", "End offset minus committed offset"),
}
PENDING_GAUGES: dict[str, tuple[str, str]] = {
    "count": ("pairstream_pending_events", "Events waiting for a partner"),
    "oldest_age_seconds": (
        "pairstream_oldest_pending_age_seconds",
        "Stream time minus the event time of the oldest event waiting (pending, or late and held)",
    ),
}


class WorkerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        status = worker_status()
        yield from _partition_metrics(status["partitions"])
        worker = status["worker"]
        for name, help_text in [
            ("uptime_seconds", "Seconds since this worker process started"),
            ("resident_memory_bytes", "Resident memory of this worker process"),
            ("state_disk_bytes", "Size of the local RocksDB state on disk"),
        ]:
            yield GaugeMetricFamily(f"pairstream_{name}", help_text, value=worker[name])
        throughput = GaugeMetricFamily(
            "pairstream_throughput_events_per_second",
            "Events processed per second over a window",
            labels=["topic", "window"],
        )
        for topic, rates in worker["throughput"].items():
            for window, rate in rates.items():
                throughput.add_metric([topic, window], rate)
        yield throughput
        yield _counters(
            "pairstream_skipped_records",
            "Records not processed, to be consumed again (see docs/exactly-once.md)",
            "reason",
            {name.removeprefix("skipped_"): n for name, n in worker["skipped"].items()},
        )
        errors = CounterMetricFamily(
            "pairstream_processing_errors",
            "Records whose processing raised, dead-lettered (processing_error_policy)",
            labels=["topic", "partition"],
        )
        for entry in status["processing_errors"]["partitions"]:
            errors.add_metric([entry["topic"], str(entry["partition"])], entry["count"])
        yield errors
        yield _histogram(
            "pairstream_commit_seconds",
            "Duration of this worker's commits (one transaction for all its partitions)",
            worker["commit_seconds"],
        )
        if "delivery" in status:
            yield from _delivery_metrics(status["delivery"])


def _partition_metrics(partitions: list[dict[str, Any]]) -> Iterator[Metric]:
    families: dict[str, Any] = {}

    def family(
        kind: type[CounterMetricFamily | GaugeMetricFamily],
        name: str,
        help_text: str,
        labels: list[str],
    ) -> Any:
        if name not in families:
            families[name] = kind(name, help_text, labels=labels)
        return families[name]

    for entry in (p for p in partitions if p["role"] == "active"):
        where = [entry["topic"], str(entry["partition"])]
        for counter, count in entry["counters"].items():
            name, help_text, extra = COUNTERS[counter]
            labels = ["topic", "partition", *extra]
            family(CounterMetricFamily, name, help_text, labels).add_metric(
                [*where, *extra.values()], count
            )
        for field, (name, help_text) in PARTITION_GAUGES.items():
            if entry[field] is not None:
                gauge = family(GaugeMetricFamily, name, help_text, ["topic", "partition"])
                gauge.add_metric(where, entry[field])
        recovering = family(
            GaugeMetricFamily,
            "pairstream_partition_recovering",
            "1 while the partition's tables are being restored",
            ["topic", "partition"],
        )
        recovering.add_metric(where, int(entry["recovering"]))
        for field, (name, help_text) in PENDING_GAUGES.items():
            value = (entry.get("pending") or {}).get(field)
            if value is not None:
                family(GaugeMetricFamily, name, help_text, ["partition"]).add_metric(
                    [str(entry["partition"])], value
                )
    yield from families.values()


def _counters(name: str, help_text: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=[label])
    for value, count in sorted(counts.items()):
        family.add_metric([value], count)
    return family


def _delivery_metrics(delivery: dict[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "pairstream_delivery_in_flight", "HTTP calls in flight", value=delivery["in_flight"]
    )
    yield GaugeMetricFamily(
        "pairstream_delivery_waiting",
        "Messages not yet final and not in flight: awaiting their commit, a slot or a retry",
        value=delivery["waiting"],
    )
    yield _counters(
        "pairstream_delivery_calls",
        "What the dispatcher did: calls, retried, uncertain, lookups, resumed, outcomes",
        "event",
        delivery["counts"],
    )
    yield _counters(
        "pairstream_delivery_messages",
        "Messages as the delivery steps recorded them (once per record)",
        "outcome",
        delivery["recorded"],
    )
    yield _histogram(
        "pairstream_delivery_call_seconds", "Duration of HTTP calls to the API", delivery["latency"]
    )


def _histogram(name: str, help_text: str, durations: dict[str, Any]) -> HistogramMetricFamily:
    """A Prometheus histogram of `Durations.status()`."""
    buckets = [(str(bound), count) for bound, count in durations["buckets"].items()]
    return HistogramMetricFamily(
        name,
        help_text,
        buckets=[*buckets, ("+Inf", durations["count"])],
        sum_value=durations["sum"],
    )


def setup_metrics(app: AppT, faust_sensor: bool) -> None:
    registry = CollectorRegistry()
    registry.register(WorkerCollector())
    if faust_sensor:  # its page serves the whole registry
        setup_prometheus_sensors(app, pattern="/metrics", registry=registry, name_prefix="faust")
        return

    @app.page("/metrics")
    async def metrics(self: View, request: Request) -> Response:
        return self.bytes(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
