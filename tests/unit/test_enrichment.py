"""Enrichment's rules (pairing/enrichment.py): present, missing, late, changed and
deleted reference rows."""

from __future__ import annotations

import json

from pairing.enrichment import (
    Enricher,
    Waiting,
    decode_waiting,
    encode_waiting,
    enriched_record,
)

SECOND = 1_000_000
ROW = b'{"tariff": "peak"}'
OFF = b'{"tariff": "off-peak"}'


def pair(day: str, second: int) -> tuple[str, bytes, int]:
    key = f"{day}T10:00:{second:02d}Z"
    return key, json.dumps({"timestamp": key, "sum": second}).encode(), second * SECOND


def enricher() -> Enricher:
    return Enricher(bound_us=10 * SECOND, max_wait_s=30)


def test_a_present_row_enriches_at_once() -> None:
    e = enricher()
    assert e.row("2024-02-09", ROW) == []
    out, held = e.pair(*pair("2024-02-09", 1), now=0)
    assert held is None
    assert [(o.key[:10], o.row, o.reason, o.waited) for o in out] == [
        ("2024-02-09", ROW, None, False)
    ]
    record = json.loads(enriched_record(out[0]))
    assert record["enriched"] and record["reference"] == {"tariff": "peak"}


def test_a_late_row_enriches_the_pairs_that_waited() -> None:
    e = enricher()
    out, held = e.pair(*pair("2024-02-09", 1), now=0)
    assert out == [] and held is not None
    released = e.row("2024-02-09", ROW)
    assert [(o.key, o.reason, o.waited) for o in released] == [(held.key, None, True)]
    assert e.release() == []  # not emitted twice


def test_a_missing_row_gives_up_at_the_bound_in_stream_time() -> None:
    e = enricher()
    e.pair(*pair("2024-02-09", 1), now=0)
    e.row("2024-02-10", ROW)
    out, _ = e.pair(*pair("2024-02-10", 11), now=0)  # stream time 11 s: bound not passed
    assert [o.reason for o in out] == [None]
    out, _ = e.pair(*pair("2024-02-10", 12), now=0)  # 12 - 10 > 1: the first gives up
    assert sorted(str(o.reason) for o in out) == ["None", "missing"]


def test_a_quiet_stream_gives_up_after_max_wait() -> None:
    e = enricher()
    e.pair(*pair("2024-02-09", 1), now=100)
    assert e.tick(now=120) == []
    assert [o.reason for o in e.tick(now=131)] == ["missing"]
    assert e.tick(now=200) == []


def test_a_changed_row_applies_to_later_pairs_only() -> None:
    e = enricher()
    e.row("2024-02-09", ROW)
    first, _ = e.pair(*pair("2024-02-09", 1), now=0)
    e.row("2024-02-09", OFF)
    second, _ = e.pair(*pair("2024-02-09", 2), now=0)
    assert (first[0].row, second[0].row) == (ROW, OFF)


def test_a_deleted_row_sends_later_pairs_out_flagged() -> None:
    e = enricher()
    e.pair(*pair("2024-02-09", 1), now=0)
    released = e.row("2024-02-09", None)
    assert [o.reason for o in released] == ["deleted"]
    out, held = e.pair(*pair("2024-02-09", 2), now=0)
    assert held is None and [o.reason for o in out] == ["deleted"]
    assert json.loads(enriched_record(out[0]))["enriched"] is False


def test_waiting_pairs_survive_their_encoding() -> None:
    waiting = Waiting("2024-02-09T10:00:01Z", b'{"sum": 1}', 5, 12.5)
    assert decode_waiting(encode_waiting(waiting)) == waiting
