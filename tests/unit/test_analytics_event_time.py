"""Reconciliation's watermark of a keyed partition: its watermark records folded in
offset order, each keyed partition on its own."""

from __future__ import annotations

from analytics.event_time import fold_watermarks
from pairing.records import encode_watermark
from pairing.watermarks import WatermarkUpdate


def mark(source: int, progress_us: int, idle: bool) -> bytes:
    return encode_watermark(WatermarkUpdate(source, 2, progress_us, idle))


def test_records_fold_in_offset_order_per_keyed_partition() -> None:
    # In offset order source 0 is active again before source 1 is heard from: the
    # watermark is 10. Read backwards, source 0 would be idle and it would be 50.
    partition_0 = [
        (0, 0, mark(0, 10, True)),
        (0, 1, mark(0, 10, False)),
        (0, 2, mark(1, 50, False)),
    ]
    partition_1 = [(1, 0, mark(0, 70, False))]  # source 1 not heard from: no watermark
    records = [*reversed(partition_0), *partition_1]
    assert fold_watermarks(records) == {0: 10, 1: None}
