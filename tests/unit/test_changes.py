"""Debezium's change records of the events table read as events (pairing/changes.py)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairing.changes import parse_change, parser_for
from pairing.events import Event, Rejection, parse_event
from pairing.records import Source, decode_keyed_event, encode_keyed_event
from tests.unit.test_input_fuzz import near_valid, records, rejected

MAX_BYTES = 65_536
SOURCE = {
    "version": "3.6.1.Final",
    "connector": "postgresql",
    "name": "pairstream",
    "ts_ms": 1707512415000,
    "snapshot": "false",
    "db": "pairstream",
    "schema": "public",
    "table": "events",
    "txId": 771,
    "lsn": 24023128,
}
ROW = {"id": "order-17", "type": "A", "ts": "2024-02-09T21:00:15Z", "value": "12.30"}


def change(op: str, before: Any = None, after: Any = None) -> bytes:
    record = {"before": before, "after": after, "source": SOURCE, "op": op, "ts_ms": 1}
    return json.dumps(record).encode()


def test_an_insert_is_the_event_of_its_row_known_by_its_primary_key() -> None:
    event = parse_change(change("c", after=ROW), MAX_BYTES)
    assert event == Event("A", "2024-02-09T21:00:15Z", 1707512415000000, Decimal("12.30"),
                          "order-17", "order-17")  # fmt: skip


def test_a_snapshot_row_is_the_same_event_as_its_insert() -> None:
    """Read again by a new snapshot, or emitted again after a crash: a duplicate."""
    assert parse_change(change("r", after=ROW), MAX_BYTES) == parse_change(
        change("c", after=ROW), MAX_BYTES
    )


def test_numeric_values_stay_exact_and_time_zones_become_utc() -> None:
    row = {
        **ROW,
        "value": "-" + "9" * 30 + ".000000000000000001",
        "ts": "2024-02-09T22:00:15.5+01:00",
    }
    event = parse_change(change("c", after=row), MAX_BYTES)
    assert isinstance(event, Event)
    assert event.value == Decimal("-" + "9" * 30 + ".000000000000000001")
    assert event.key == "2024-02-09T21:00:15.500000Z"


def test_updates_and_deletes_are_refused_naming_the_row() -> None:
    updated = parse_change(change("u", before=ROW, after={**ROW, "value": "1"}), MAX_BYTES)
    assert updated == Rejection(
        "update of events row 'order-17': an event is immutable, the row as inserted stands"
    )
    # With REPLICA IDENTITY DEFAULT a delete's before holds the key only.
    deleted = parse_change(change("d", before={"id": "order-17"}), MAX_BYTES)
    assert isinstance(deleted, Rejection) and deleted.reason.startswith("delete of events row")
    truncated = parse_change(change("t"), MAX_BYTES)
    assert isinstance(truncated, Rejection)
    assert truncated.reason.startswith("truncate of the events table")


def test_a_malformed_change_is_refused_with_its_reason() -> None:
    cases = {
        b'{"after": {}}': "missing field 'op': not a Debezium change record",
        change("x", after=ROW): "unknown op 'x': expected 'c', 'r', 'u', 'd' or 't'",
        b'{"op": ["c"]}': "unknown op ['c']: expected 'c', 'r', 'u', 'd' or 't'",
        b'{"op": {"c": 1}}': "unknown op {'c': 1}: expected 'c', 'r', 'u', 'd' or 't'",
        change("c"): "change 'c' without its row: 'after' is None",
        change("c", after={**ROW, "type": "C"}): "column 'type' is 'C': expected 'A' or 'B'",
        change("c", after={**ROW, "ts": "now"}): "column 'ts': unparseable timestamp 'now'",
        change("c", after={**ROW, "value": "x"}): "field 'value' is not a decimal number: 'x'",
        change("c", after={**ROW, "id": ""}): "field 'id' must have 1 to 256 characters",
    }  # fmt: skip
    for raw, reason in cases.items():
        assert parse_change(raw, MAX_BYTES) == Rejection(reason), raw


def test_a_json_float_value_is_refused_not_rounded() -> None:
    """decimal.handling.mode=double would send floats: refused, as the contract says."""
    parsed = parse_change(change("c", after={**ROW, "value": 0.1}), MAX_BYTES)
    assert parsed == Rejection(
        "column 'value' is Decimal('0.1'): expected NUMERIC as a string"
        " (decimal.handling.mode=string)"
    )


def test_the_setting_chooses_the_reader() -> None:
    assert parser_for("debezium") is parse_change
    assert parser_for("json") is parse_event


ROW_FIELDS = {
    "id": ['"order-1"', "7", '""'],
    "type": ['"A"', '"B"'],
    "ts": ['"2024-02-09T21:00:15Z"', '"2024-02-09T21:00:15.123456+02:00"'],
    "value": ['"12.30"', '"1e30"', "12.3", '"' + "9" * 200 + '"'],
}


@st.composite
def changes(draw: Any) -> bytes | None:
    """Change records near the valid ones: any op, any row, or anything at all."""
    if draw(st.booleans()):
        return draw(records(ROW_FIELDS))
    op = draw(st.sampled_from(['"c"', '"r"', '"u"', '"d"', '"t"', '"x"', "1", "null"]))
    row = draw(near_valid(ROW_FIELDS) | st.just(b"null"))
    field = draw(st.sampled_from(["after", "before"]))
    return b'{"op":%s,"%s":%s}' % (op.encode(), field.encode(), row)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes())
def test_every_change_is_an_event_or_refused_with_a_reason(raw: bytes | None) -> None:
    result = parse_change(raw, MAX_BYTES)
    if isinstance(result, Rejection):
        assert rejected(result.reason)
        return
    assert result.id is not None and result.identity == result.id
    keyed = encode_keyed_event(result, raw or b"", Source("changes", 0, 0), result.time_us)
    assert decode_keyed_event(keyed).event == result
