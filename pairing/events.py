"""Input events: parsing and validation of the raw bytes producers send.

One parse per event: `parse_event` turns bytes into an `Event` or a `Rejection`
with a readable reason; nothing here raises on bad input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Literal

from pairing.grammar import (
    Number,
    Rejection,
    Sizes,
    add_exact,
    decode_object,
    excerpt,
    format_time,
    identity,
    normalized,
    number,
    oversize,
    parse_timestamp,
)
from pairing.immutable import immutable

EventType = Literal["A", "B"]

EVENT_TYPES: tuple[EventType, ...] = ("A", "B")
# Names other modules take from here, where events are read.
__all__ = ["Number", "Rejection", "add_exact", "format_time", "parse_timestamp"]


@immutable
class Event:
    """A valid input event, normalised."""

    type: EventType
    key: str  # the pairing key: the timestamp as ISO-8601 UTC
    time_us: int  # the same instant in microseconds since the epoch
    value: Number
    id: str | None  # the producer's id, when it gave one
    identity: str  # `id` when present, else a fingerprint of (type, key, value)


def parse_event(raw: bytes | None, max_bytes: int) -> Event | Rejection:
    """Parse and validate one input record's value."""
    doc = decode_object(raw, max_bytes)
    if isinstance(doc, Rejection):
        return doc

    event_type = doc.get("type")
    if event_type not in EVENT_TYPES:
        if "type" not in doc:
            return Rejection("missing field 'type'")
        return Rejection(f"unknown type {excerpt(event_type)}: expected 'A' or 'B'")

    if "timestamp" not in doc:
        return Rejection("missing field 'timestamp'")
    parsed_time = parse_timestamp(doc["timestamp"])
    if isinstance(parsed_time, Rejection):
        return parsed_time
    key, time_us = parsed_time

    if "value" not in doc:
        return Rejection("missing field 'value'")
    value = number(doc["value"], "value")
    if isinstance(value, Rejection):
        return value

    event_id = doc.get("id")
    if event_id is not None:
        event_id = identity(event_id, "id")
        if isinstance(event_id, Rejection):
            return event_id

    known_as = event_id if event_id is not None else fingerprint(event_type, key, value)
    return Event(event_type, key, time_us, value, event_id, known_as)


# How ingest reads an input record's value: `parse_event`, or `pairing.changes.parse_change`.
Parse = Callable[[bytes | None, int], "Event | Rejection"]


def read_event(
    key: bytes | None,
    raw: bytes | None,
    record_time_ms: int,
    sizes: Sizes,
    max_ahead_us: int | None,
    parse: Parse | None = None,
) -> Event | Rejection:
    """An input record as ingest reads it: its key's size, its value (`parse`, by default
    `parse_event`), then the clock guard (docs/event-time.md): an event stamped more than
    `max_ahead_us` after its record's own timestamp is refused, so that it never moves the
    watermark.
    The record's timestamp, not a worker's clock: the same record gets the same answer
    on every worker and every replay."""
    if key is not None and len(key) > sizes.key_bytes:  # a call only when too long
        refused = oversize(key, None, sizes)
        assert refused is not None
        return refused
    event = (parse or parse_event)(raw, sizes.value_bytes)
    if max_ahead_us is None or isinstance(event, Rejection):
        return event
    return too_far_ahead(event.time_us, event.key, record_time_ms, max_ahead_us) or event


def too_far_ahead(
    time_us: int, shown: str, record_time_ms: int, max_ahead_us: int
) -> Rejection | None:
    """The clock guard: a reason when an event time (`shown` as the input wrote it) is
    more than `max_ahead_us` after its record's timestamp."""
    ahead_us = time_us - record_time_ms * 1000
    if ahead_us <= max_ahead_us:
        return None
    return Rejection(
        f"timestamp too far in the future: {shown} is {_seconds(ahead_us)} s after"
        f" its record's timestamp, more than {_seconds(max_ahead_us)} s"
    )


def _seconds(us: int) -> str:
    return f"{us / 1_000_000:,.3f}".rstrip("0").rstrip(".")


def canonical_number(value: Number) -> str:
    """One spelling per numeric value: 1, 1.0 and 1.00 are the same value."""
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    return format(normalized(value), "f")


def fingerprint(event_type: str, key: str, value: Number) -> str:
    text = f"{event_type}|{key}|{canonical_number(value)}"
    return "fp:" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def parse_number(text: str) -> Number:
    """Read back a number written by `str()` on an int or a Decimal."""
    # int() never takes a point or an exponent: trying it first on a decimal raised and
    # caught a ValueError, 2.3 us of the 2.8 a value took.
    if "." not in text and "e" not in text and "E" not in text:
        try:
            return int(text)
        except ValueError:
            pass
    try:
        return Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a number: {text!r}") from exc
