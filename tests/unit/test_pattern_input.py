"""A pattern file's input records read as pattern events (pairing/pattern_input.py):
fuzzed like every input, and what a valid record becomes."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from pairing.events import Rejection
from pairing.grammar import Sizes
from pairing.pattern_input import read_pattern_event
from pairing.pattern_state import PatternEvent
from pairing.patterns import PatternInput
from tests.unit.test_input_fuzz import FUZZ, MAX_BYTES, records, rejected

SIZES = Sizes(value_bytes=MAX_BYTES)
SPEC = PatternInput(("clicks",), time="ts", identity="click", topic_field="stream")
FIELDS = frozenset({"session", "term", "rank", "flag", "ts", "stream"})
RECORD = {
    "ts": ['"2024-02-09 21:00:00"', '"2024-02-09T21:00:30.5+01:00"', "17"],
    "click": ['"c1"', "42", '""', "true"],
    "session": ['"s1"', "7", "null", "1.50"],
    "term": ['"shoes"', "[1]", '{"a":1}'],
    "rank": ["3", "-0.25", "false"],
    "stream": ['"searches"'],
}


@FUZZ
@given(st.none() | st.binary(max_size=SIZES.key_bytes + 2), records(RECORD))
def test_every_record_is_an_event_or_rejected_with_a_reason(
    key: bytes | None, raw: bytes | None
) -> None:
    result = read_pattern_event(key, raw, "clicks", SPEC, FIELDS, SIZES)
    if isinstance(result, Rejection):
        assert rejected(result.reason)
        return
    assert key is None or len(key) <= SIZES.key_bytes  # any other key: read no further
    assert isinstance(result, PatternEvent) and result.identity
    assert result.fields["stream"] == "clicks"  # the topic, whatever the record says
    assert set(result.fields) <= FIELDS
    for value in result.fields.values():
        assert value is None or (type(value) in (str, int, Decimal))


def read(doc: object) -> PatternEvent | Rejection:
    return read_pattern_event(None, json.dumps(doc).encode(), "clicks", SPEC, FIELDS, SIZES)


def test_a_record_keeps_the_fields_patterns_read_of_the_kinds_they_compare() -> None:
    event = read({
        "ts": "2024-02-09T21:00:00.25Z", "click": 9, "session": "s1", "rank": 2.5,
        "term": ["a"], "flag": True, "other": "not read by any pattern",
    })  # fmt: skip
    assert event == PatternEvent(
        1707512400250000,
        "9",
        {
            "session": "s1",
            "rank": Decimal("2.5"),
            "ts": "2024-02-09T21:00:00.25Z",
            "stream": "clicks",
        },
    )


def test_a_record_without_its_time_or_identity_is_refused_naming_the_field() -> None:
    assert read({"click": "c"}) == Rejection("missing field 'ts'")
    assert read({"ts": 5, "click": "c"}) == Rejection("field 'ts' is not a string: 5")
    assert read({"ts": "2024-02-09 21:00:00"}) == Rejection("missing field 'click'")
    refused = read({"ts": "2024-02-09 21:00:00", "click": True})
    assert isinstance(refused, Rejection) and "field 'click' must be a string" in refused.reason
    assert read([1]) == Rejection("not a JSON object but list")


def test_a_record_too_large_is_refused_before_it_is_read() -> None:
    valid = json.dumps({"ts": "2024-02-09 21:00:00", "click": 1}).encode()
    key = b"k" * (SIZES.key_bytes + 1)
    assert read_pattern_event(key, valid, "clicks", SPEC, FIELDS, SIZES) == Rejection(
        f"oversize key: {len(key)} bytes > {SIZES.key_bytes}"
    )
    big = b" " * MAX_BYTES + valid
    assert read_pattern_event(None, big, "clicks", SPEC, FIELDS, SIZES) == Rejection(
        f"oversize record: {len(big)} bytes > {MAX_BYTES}"
    )
    assert isinstance(
        read_pattern_event(b"k" * 1024, valid, "c", SPEC, FIELDS, SIZES), PatternEvent
    )


def test_an_event_far_ahead_of_its_records_timestamp_is_refused_by_the_clock_guard() -> None:
    raw = json.dumps({"ts": "2024-02-09 21:00:00", "click": 1}).encode()
    at_ms = 1707512400000  # 2024-02-09 21:00:00 UTC
    for record_ms, refused in [(at_ms - 60_000, False), (at_ms - 60_001, True)]:
        got = read_pattern_event(b"k", raw, "clicks", SPEC, FIELDS, SIZES, (record_ms, 60_000_000))
        assert isinstance(got, Rejection) == refused
        if refused:
            assert isinstance(got, Rejection)
            assert got.reason.startswith("timestamp too far in the future: 2024-02-09 21:00:00")
