"""faust's Prometheus sensor on the worker: its per-record hooks are silent, the rest
still count."""

from __future__ import annotations

from typing import Any

import pytest
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from faust.types import TP
from prometheus_client import CollectorRegistry

from app.metrics import BatchPathMonitor


def record_path(monitor: PrometheusMonitor, tp: TP) -> None:
    """What faust's consumer and stream report for one record and one table write."""
    message: Any = type("M", (), {"tp": tp, "offset": 7, "time_in": None})()
    event: Any = type("E", (), {"message": message})()
    owner = type("Owner", (), {})()
    stream: Any = type("S", (), {"shortlabel": "s", "task_owner": owner})()
    table: Any = type("T", (), {"name": "t"})()
    monitor.on_message_in(tp, 7, message)
    state = monitor.on_stream_event_in(tp, 7, stream, event)
    monitor.on_stream_event_out(tp, 7, stream, event, state)
    monitor.on_message_out(tp, 7, message)
    monitor.on_table_set(table, b"k", b"v")


@pytest.mark.parametrize(
    ("monitor_class", "counted"), [(PrometheusMonitor, 1), (BatchPathMonitor, 0)]
)
def test_records_are_not_counted_by_faust_s_sensor(
    monitor_class: type[PrometheusMonitor], counted: int
) -> None:
    registry = CollectorRegistry()
    monitor = monitor_class(metrics=FaustMetrics.create(registry, "faust"))
    tp = TP("events", 0)
    record_path(monitor, tp)
    assert registry.get_sample_value("faust_messages_received_total") == counted
    assert tp in monitor.stream_inbound_time  # faust's livelock check still sees the stream


def test_commits_are_still_counted() -> None:
    registry = CollectorRegistry()
    monitor = BatchPathMonitor(metrics=FaustMetrics.create(registry, "faust"))
    monitor.on_tp_commit({TP("events", 0): 12})
    assert (
        registry.get_sample_value(
            "faust_topic_partition_offset_commited",  # faust's spelling
            {"topic": "events", "partition": "0"},
        )
        == 12
    )
