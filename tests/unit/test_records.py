import base64
import hashlib
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from pairing.events import Event, parse_event
from pairing.grammar import Sizes
from pairing.key_state import KeyState, Paired, PendingEvent, key_times
from pairing.records import (
    DEAD_LETTER_PREFIX_BYTES,
    Source,
    dead_letter,
    decode_clock,
    decode_key_times,
    decode_keyed_event,
    decode_state,
    decode_watermark,
    dumps,
    encode_clock,
    encode_keyed_event,
    encode_state,
    encode_watermark,
    loads,
    pair_record,
)
from pairing.watermarks import EventClock, WatermarkUpdate

ROOT = Path(__file__).resolve().parents[2]

SOURCE = Source("events", 0, 42, 1_707_508_800_250)


def test_decimals_are_written_as_exact_json_numbers() -> None:
    text = dumps({"sum": Decimal("0.1") + Decimal("0.2"), "big": Decimal("1E+2"), "n": 3})
    assert text == b'{"sum":0.3,"big":1E+2,"n":3}'
    assert json.loads(text, parse_float=Decimal)["sum"] == Decimal("0.3")


def test_integers_beyond_64_bits_and_any_text_are_written_exactly() -> None:
    value = 2**70 + 1
    text = dumps({"n": value, "s": 'é\x01"', "d": Decimal("-0.5")})
    assert json.loads(text, parse_float=Decimal) == {
        "n": value,
        "s": 'é\x01"',
        "d": Decimal("-0.5"),
    }


def test_keyed_event_round_trips() -> None:
    raw = b'{"type":"B","timestamp":"2024-02-09T21:00:00.25+01:00","value":12.50,"id":"b1"}'
    event = parse_event(raw, 4096)
    assert isinstance(event, Event)
    keyed = decode_keyed_event(encode_keyed_event(event, raw, SOURCE, event.time_us + 5))
    assert keyed.event == event
    assert keyed.raw == raw
    assert keyed.source == SOURCE
    assert keyed.progress_us == event.time_us + 5


def test_keyed_event_with_newlines_in_its_fields_and_input_round_trips() -> None:
    raw = b'{"id":"a\\nb",\n "type":"A","timestamp":"2024-02-09 21:00:00","value":1}\n'
    event = parse_event(raw, 4096)
    assert isinstance(event, Event) and event.id == "a\nb"
    keyed = decode_keyed_event(encode_keyed_event(event, raw, SOURCE, event.time_us))
    assert (keyed.event, keyed.raw, keyed.source) == (event, raw, SOURCE)


def keyed_object(event: Event, raw: bytes, value: dict[str, Any], source: list[Any]) -> bytes:
    """A keyed event as versions before the array wrote it: one JSON object."""
    return dumps(
        {
            "type": event.type,
            "key": event.key,
            "time_us": event.time_us,
            **value,
            "id": event.id,
            "identity": event.identity,
            "raw": raw.decode(),
            "source": source,
            "progress": event.time_us + 1,
        }
    )


def test_keyed_event_written_as_one_json_object_still_reads() -> None:
    raw = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":2.50,"id":"a1"}'
    event = parse_event(raw, 4096)
    assert isinstance(event, Event)
    source = [SOURCE.topic, SOURCE.partition, SOURCE.offset, SOURCE.timestamp_ms]
    keyed = decode_keyed_event(keyed_object(event, raw, {"value_text": "2.50"}, source))
    assert (keyed.event, keyed.raw, keyed.source, keyed.progress_us) == (
        event,
        raw,
        SOURCE,
        event.time_us + 1,
    )
    assert keyed.event.value == Decimal("2.50")


def test_keyed_event_written_with_the_value_as_a_number_still_reads_exactly() -> None:
    raw = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":0.10000000000000000001}'
    event = parse_event(raw, 4096)
    assert isinstance(event, Event)
    source = [SOURCE.topic, SOURCE.partition, SOURCE.offset]
    before = keyed_object(event, raw, {"value": event.value}, source)
    keyed = decode_keyed_event(before)
    assert keyed.event == event and keyed.event.value == Decimal("0.10000000000000000001")
    # Written before the input's timestamp was carried: read without one.
    assert keyed.source == Source(SOURCE.topic, SOURCE.partition, SOURCE.offset, None)
    again = encode_keyed_event(event, raw, keyed.source, keyed.progress_us)
    assert decode_keyed_event(again) == keyed


def test_watermark_record_and_clock_round_trip() -> None:
    update = WatermarkUpdate(source=3, sources=8, progress_us=None, idle=True)
    assert decode_watermark(loads(encode_watermark(update))) == update
    clock = EventClock()
    clock.observe(WatermarkUpdate(0, 2, 10, idle=False))
    clock.observe(WatermarkUpdate(1, 2, None, idle=True))
    restored = decode_clock(encode_clock(clock))
    assert (restored.sources, restored.marks, restored.watermark_us) == (2, clock.marks, 10)
    assert decode_clock(None).watermark_us is None


def test_state_round_trips_with_exact_values() -> None:
    state = KeyState(
        time_us=7,
        seen=("a", "fp:1"),
        pending=PendingEvent("A", Decimal("1.10"), "a", 123.5),
        late=(PendingEvent("B", 3, "b", 124.0),),
    )
    assert decode_state(encode_state(state)) == state
    settled = KeyState(time_us=7, seen=("a", "b"), paired=True, closed=True)
    assert decode_state(encode_state(settled)) == settled


def test_key_times_read_from_a_stored_state_are_those_of_the_state() -> None:
    waiting = KeyState(
        time_us=7,
        seen=("a",),
        pending=PendingEvent("A", Decimal("1.10"), "a", 123.5),
        late=(PendingEvent("B", 3, "b", 124.0), PendingEvent("A", 4, "c", 125.25)),
    )
    settled = KeyState(time_us=-9, seen=("a", "b"), paired=True)
    for state in (waiting, settled):
        assert decode_key_times("k", encode_state(state)) == key_times("k", state)
    assert key_times("k", waiting) == ("k", 7, 123.5, [124.0, 125.25])
    assert key_times("k", settled) == ("k", -9, None, [])


def test_state_written_before_orjson_still_reads() -> None:
    # Changelogs and local stores written by the json-module encoder (spaces after
    # nothing, the same fields) must restore as they were.
    written = (
        b'{"t":-1700000000000000,"seen":["a"],"pending":["A","1.10","a",123.5],'
        b'"paired":false,"closed":false,"late":[["B","3","b",1e16]]}'
    )
    assert decode_state(written) == KeyState(
        time_us=-1_700_000_000_000_000,
        seen=("a",),
        pending=PendingEvent("A", Decimal("1.10"), "a", 123.5),
        late=(PendingEvent("B", 3, "b", 1e16),),
    )
    assert decode_key_times("k", written) == ("k", -1_700_000_000_000_000, 123.5, [1e16])


def test_pair_record_has_exact_sum_and_both_identities() -> None:
    paired = Paired(
        "2024-02-09T21:00:00Z",
        PendingEvent("A", Decimal("0.1"), "a1", 0.0),
        PendingEvent("B", Decimal("0.2"), "fp:x", 0.0),
    )
    record = loads(pair_record(paired, "2026-01-01T00:00:00Z"))
    assert record == {
        "timestamp": "2024-02-09T21:00:00Z",
        "a_value": Decimal("0.1"),
        "b_value": Decimal("0.2"),
        "sum": Decimal("0.3"),
        "a_id": "a1",
        "b_id": "fp:x",
        "paired_at": "2026-01-01T00:00:00Z",
    }


SIZES = Sizes(key_bytes=16, value_bytes=1000, record_bytes=20_000)


def letter(raw: bytes | None, key: bytes | None = b"k") -> tuple[bytes | None, dict[str, Any]]:
    dead_key, value = dead_letter("a reason", key, raw, SOURCE, SIZES)
    assert len(value) + len(dead_key or b"") <= SIZES.record_bytes
    return dead_key, loads(value)


def test_dead_letter_keeps_original_bytes_and_source() -> None:
    key, text = letter(b"{oops")
    assert key == b"k" and text["value"] == "{oops" and text["source_offset"] == 42
    _, binary = letter(b"\xff\x00")
    assert base64.b64decode(binary["value_base64"]) == b"\xff\x00"
    assert letter(None, None) == (None, {**text, "value": None})


def test_a_dead_letter_too_large_to_copy_keeps_a_prefix_its_size_and_digest() -> None:
    quotes = b'"' * 15_000  # escaped, twice the bytes: 30,000 > 20,000
    _, cut = letter(quotes)
    assert "value" not in cut and cut["value_prefix"] == '"' * DEAD_LETTER_PREFIX_BYTES
    assert cut["value_bytes"] == 15_000
    assert cut["value_sha256"] == hashlib.sha256(quotes).hexdigest()
    assert (cut["source_topic"], cut["source_partition"], cut["source_offset"]) == ("events", 0, 42)
    # A cut inside a character ends before it; bytes that are not UTF-8 stay base64.
    euros = "€".encode() * 10_000
    _, cut = letter(euros)
    assert cut["value_prefix"] == "€" * (DEAD_LETTER_PREFIX_BYTES // 3)
    _, cut = letter(b"\xff" * 30_000)
    assert base64.b64decode(cut["value_prefix_base64"]) == b"\xff" * DEAD_LETTER_PREFIX_BYTES
    # What fits is copied whole, however close to the limit.
    _, whole = letter(b"x" * 19_000)
    assert whole["value"] == "x" * 19_000


def test_a_key_past_the_limit_is_replaced_by_its_digest() -> None:
    long_key = b"k" * 1_000_000
    digest = hashlib.sha256(long_key).hexdigest()
    key, record = letter(b"{}", long_key)
    assert key == f"sha256:{digest}".encode()
    assert (record["key_bytes"], record["key_sha256"]) == (1_000_000, digest)
    assert letter(b"{}", b"k" * 16)[0] == b"k" * 16
