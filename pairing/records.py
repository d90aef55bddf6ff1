"""Wire formats: the keyed (repartitioned) event, watermark records, the stored
key state and event clock, and the output records on `pairs`, `unpaired` and the
dead-letter topic (the patterns' own: pairing/pattern_records.py).

Numbers travel as JSON numbers spelled exactly as their int or Decimal value,
so a sum of decimals is never rounded through a float.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from pairing.events import Event, parse_number
from pairing.grammar import Sizes
from pairing.immutable import immutable
from pairing.key_state import KeyState, KeyTimes, Paired, PendingEvent, Unpaired
from pairing.watermarks import EventClock, SourceMark, WatermarkUpdate


@immutable
class Source:
    """Where an input record came from, and its Kafka timestamp (when its producer
    sent it, or the broker appended it): None when it had none, or was handed over
    before the timestamp was carried."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None


def dumps(record: Mapping[str, Any] | list[Any]) -> bytes:
    """Compact JSON in which a Decimal is written as the exact JSON number it is."""
    try:
        return orjson.dumps(record, default=_exact_decimal)
    except orjson.JSONEncodeError:
        # An int beyond 64 bits, which orjson does not write: rare, so the slow way.
        return _encode(record).encode()


def _exact_decimal(value: Any) -> orjson.Fragment:
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))  # finite by validation; "1E+2" is valid JSON
    raise TypeError(f"cannot encode {type(value).__name__}")


def _encode(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(k)}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


_JSON = json.JSONDecoder(parse_float=Decimal)  # one, not one per record as json.loads builds


def loads(data: bytes) -> Any:
    return _JSON.decode(data.decode())


# --- the keyed event on the repartition topic ---------------------------------


def encode_keyed_event(event: Event, raw: bytes, source: Source, progress_us: int) -> bytes:
    """The event's fields as a JSON array, a newline, then the input's bytes as they
    came (orjson escapes every newline inside a string, so the first one ends the
    fields). Against the JSON object that held the input as an escaped string: 215
    bytes for 311 on the benchmark's events, encoded in half the time and decoded in
    two thirds (timeit). The value travels as text, so that orjson reads it back
    exactly (it reads a JSON number with a fraction as a float)."""
    fields = orjson.dumps(
        [
            event.type,
            event.key,
            event.time_us,
            str(event.value),
            event.id,
            event.identity,
            source.topic,
            source.partition,
            source.offset,
            source.timestamp_ms,
            progress_us,
        ]
    )
    return fields + b"\n" + raw


@immutable
class KeyedEvent:
    event: Event
    raw: bytes  # the input record's value
    source: Source
    progress_us: int  # its input partition's progress, including it


def decode_keyed_event(data: bytes) -> KeyedEvent:
    if data[:1] != b"[":
        return _decode_keyed_object(data)
    fields, _, raw = data.partition(b"\n")
    (
        event_type,
        key,
        time_us,
        value,
        event_id,
        identity,
        topic,
        partition,
        offset,
        timestamp_ms,
        progress_us,
    ) = orjson.loads(fields)
    event = Event(event_type, key, time_us, parse_number(value), event_id, identity)
    return KeyedEvent(event, raw, Source(topic, partition, offset, timestamp_ms), progress_us)


def _decode_keyed_object(data: bytes) -> KeyedEvent:
    """A keyed event written as one JSON object: by versions before the array and raw
    bytes, and, earlier still, with the value as a JSON number (read exactly)."""
    doc = orjson.loads(data)
    text = doc.get("value_text")
    if text is None:
        doc = loads(data)
        value = doc["value"]
    else:
        value = parse_number(text)
    event = Event(doc["type"], doc["key"], doc["time_us"], value, doc["id"], doc["identity"])
    return KeyedEvent(event, doc["raw"].encode(), Source(*doc["source"]), doc["progress"])


# --- watermarks on the repartition topic ----------------------------------------

WATERMARK_KEY = b"~watermark"
HANDED = b"~handed:"
"""Before the key of a keyed event or watermark record whose effect is already in its
keyed partition's state: handed to the partition on ingest's worker and paired in ingest's
transaction (app/exactly_once/handoff.py), written for the record, and skipped by pairing."""
HANDED_WATERMARK_KEY = HANDED + WATERMARK_KEY


def encode_watermark(update: WatermarkUpdate) -> bytes:
    return dumps(
        {
            "watermark": {
                "source": update.source,
                "sources": update.sources,
                "progress": update.progress_us,
                "idle": update.idle,
            }
        }
    )


def decode_watermark(doc: Mapping[str, Any]) -> WatermarkUpdate:
    mark = doc["watermark"]
    return WatermarkUpdate(mark["source"], mark["sources"], mark["progress"], mark["idle"])


CLOCK_KEY = b"~clock"  # where a keyed partition keeps its clock; "~": never a timestamp


def encode_clock(clock: EventClock) -> bytes:
    marks = {str(s): [m.progress_us, m.idle] for s, m in sorted(clock.marks.items())}
    return dumps({"watermark": clock.watermark_us, "sources": clock.sources, "marks": marks})


def decode_clock(data: bytes | None) -> EventClock:
    if data is None:
        return EventClock()
    doc = json.loads(data)
    marks = {int(s): SourceMark(progress, idle) for s, (progress, idle) in doc["marks"].items()}
    return EventClock(doc["sources"], marks, doc["watermark"])


TICK = b'{"tick":true}'
"""A wall-clock tick on the repartition topic: lets a quiet partition expire
events that waited longer than max_wait, inside the partition's transaction."""


# --- key state in the table ---------------------------------------------------


# orjson: a restart decodes every stored key to rebuild the rule engine's indexes, and
# json.loads was most of that. A state holds no Decimal (values are kept as text).
def encode_state(state: KeyState) -> bytes:
    pending = state.pending
    return orjson.dumps(
        {
            "t": state.time_us,
            "seen": state.seen,
            "pending": None if pending is None else _encode_pending(pending),
            "paired": state.paired,
            "closed": state.closed,
            "late": [_encode_pending(late) for late in state.late],
        }
    )


def decode_state(data: bytes) -> KeyState:
    doc = orjson.loads(data)
    pending = doc["pending"]
    return KeyState(
        time_us=doc["t"],
        seen=tuple(doc["seen"]),
        pending=None if pending is None else _decode_pending(pending),
        paired=doc["paired"],
        closed=doc["closed"],
        late=tuple(_decode_pending(late) for late in doc["late"]),
    )


def decode_key_times(key: str, data: bytes) -> KeyTimes:
    """`key_times` of a stored state, without building the state."""
    doc = orjson.loads(data)
    pending = doc["pending"]
    return (
        key,
        doc["t"],
        None if pending is None else pending[3],
        [late[3] for late in doc["late"]],
    )


def _encode_pending(event: PendingEvent) -> list[Any]:
    return [event.type, str(event.value), event.identity, event.waiting_since]


def _decode_pending(doc: list[Any]) -> PendingEvent:
    return PendingEvent(doc[0], parse_number(doc[1]), doc[2], doc[3])


# --- output records -----------------------------------------------------------


def pair_record(paired: Paired, paired_at: str) -> bytes:
    return dumps(
        {
            "timestamp": paired.key,
            "a_value": paired.a.value,
            "b_value": paired.b.value,
            "sum": paired.sum,
            "a_id": paired.a.identity,
            "b_id": paired.b.identity,
            "paired_at": paired_at,
        }
    )


def unpaired_record(unpaired: Unpaired) -> bytes:
    event = unpaired.event
    return dumps(
        {
            "timestamp": unpaired.key,
            "type": event.type,
            "value": event.value,
            "id": event.identity,
            "reason": unpaired.reason,
        }
    )


# What a dead letter keeps of an input too large to copy whole: its first bytes.
DEAD_LETTER_PREFIX_BYTES = 4096


def dead_letter(
    reason: str,
    key: bytes | None,
    raw: bytes | None,
    source: Source,
    sizes: Sizes,
    identity: str | None = None,
) -> tuple[bytes | None, bytes]:
    """The key and value of a dead letter: the original bytes (base64 where not UTF-8),
    where they came from, and why. Always small enough to send (docs/grammar.md,
    "Sizes"): a key longer than `sizes.key_bytes` is replaced by its digest, and a value
    whose copy would not fit in `sizes.record_bytes` by a cut: its first
    DEAD_LETTER_PREFIX_BYTES, its size and digest; the whole stays in the input topic at
    the source offset."""
    record: dict[str, Any] = {
        "reason": reason,
        "source_topic": source.topic,
        "source_partition": source.partition,
        "source_offset": source.offset,
        "id": identity,
    }
    if key is not None and len(key) > sizes.key_bytes:
        record["key_bytes"] = len(key)
        record["key_sha256"] = hashlib.sha256(key).hexdigest()
        key = b"sha256:" + record["key_sha256"].encode()
    if raw is None:
        record["value"] = None
        return key, dumps(record)
    whole = dumps({**record, **_copy("value", raw)})
    if len(whole) + len(key or b"") <= sizes.record_bytes:
        return key, whole
    record["value_bytes"] = len(raw)
    record["value_sha256"] = hashlib.sha256(raw).hexdigest()
    prefix = _whole_characters(raw[:DEAD_LETTER_PREFIX_BYTES])
    return key, dumps({**record, **_copy("value_prefix", prefix)})


def _whole_characters(prefix: bytes) -> bytes:
    """A prefix of UTF-8 text without the start of a character the cut fell in (a
    character has at most 4 bytes); other bytes as they are."""
    for end in range(len(prefix), max(len(prefix) - 4, 0), -1):
        try:
            prefix[:end].decode()
        except UnicodeDecodeError:
            continue
        return prefix[:end]
    return prefix


def _copy(field: str, raw: bytes) -> dict[str, str]:
    """Bytes as text where they are UTF-8, else in base64 under `<field>_base64`."""
    try:
        return {field: raw.decode()}
    except UnicodeDecodeError:
        return {f"{field}_base64": base64.b64encode(raw).decode()}
