"""Input events: parsing and validation of the raw bytes producers send.

One parse per event: `parse_event` turns bytes into an `Event` or a `Rejection`
with a readable reason; nothing here raises on bad input.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import Literal

from pairing.immutable import immutable

EventType = Literal["A", "B"]
Number = int | Decimal

EVENT_TYPES: tuple[EventType, ...] = ("A", "B")
MAX_ID_LENGTH = 256
# Bounds that keep every sum exact under _EXACT (and formatting cheap): a JSON
# number like 1e999999999 is valid but would otherwise cost gigabytes to print.
MAX_DIGITS = 100
MAX_EXPONENT = 300
_EXACT = Context(prec=2 * (MAX_DIGITS + 2 * MAX_EXPONENT), traps=[Inexact, InvalidOperation])

# The seed's "YYYY-MM-DD HH:MM:SS" and ISO-8601 with T, fractions, Z or an offset.
# A time part is required: a bare date is not an event time.
_TIMESTAMP = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?$"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


@immutable
class Event:
    """A valid input event, normalised."""

    type: EventType
    key: str  # the pairing key: the timestamp as ISO-8601 UTC
    time_us: int  # the same instant in microseconds since the epoch
    value: Number
    id: str | None  # the producer's id, when it gave one
    identity: str  # `id` when present, else a fingerprint of (type, key, value)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input could not become an event."""

    reason: str


class _BadConstant(ValueError):
    pass


def _reject_constant(name: str) -> None:
    raise _BadConstant(f"value {name} is not a finite number")


# One decoder, not one per record (json.loads builds one whenever it is given options).
_INPUT_JSON = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)


def parse_event(raw: bytes | None, max_bytes: int) -> Event | Rejection:
    """Parse and validate one input record's value."""
    if raw is None:
        return Rejection("empty record (null value)")
    if len(raw) == 0:
        return Rejection("empty record")
    if len(raw) > max_bytes:
        return Rejection(f"oversize record: {len(raw)} bytes > {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection("malformed JSON: not UTF-8")
    try:
        doc = _INPUT_JSON.decode(text)
    except _BadConstant as exc:
        return Rejection(str(exc))
    except (ValueError, RecursionError) as exc:
        return Rejection(f"malformed JSON: {exc}")
    if not isinstance(doc, dict):
        return Rejection(f"not a JSON object but {type(doc).__name__}")

    event_type = doc.get("type")
    if event_type not in EVENT_TYPES:
        if "type" not in doc:
            return Rejection("missing field 'type'")
        return Rejection(f"unknown type {event_type!r}: expected 'A' or 'B'")

    if "timestamp" not in doc:
        return Rejection("missing field 'timestamp'")
    parsed_time = parse_timestamp(doc["timestamp"])
    if isinstance(parsed_time, Rejection):
        return parsed_time
    key, time_us = parsed_time

    if "value" not in doc:
        return Rejection("missing field 'value'")
    value = doc["value"]
    # bool is an int subclass in Python but not a number in JSON.
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return Rejection(f"field 'value' is not a number: {value!r}")
    if isinstance(value, Decimal) and not value.is_finite():
        return Rejection(f"field 'value' is not finite: {value}")
    if not _in_range(value, len(raw)):
        return Rejection(
            f"field 'value' is out of range: more than {MAX_DIGITS} digits"
            f" or a magnitude beyond 1e{MAX_EXPONENT}"
        )

    event_id = doc.get("id")
    if event_id is not None:
        if isinstance(event_id, bool) or not isinstance(event_id, (str, int)):
            return Rejection(f"field 'id' must be a string or an integer: {event_id!r}")
        event_id = str(event_id)
        if not event_id or len(event_id) > MAX_ID_LENGTH:
            return Rejection(f"field 'id' must have 1 to {MAX_ID_LENGTH} characters")

    identity = event_id if event_id is not None else fingerprint(event_type, key, value)
    return Event(event_type, key, time_us, value, event_id, identity)


_INT_LIMIT: int = 10**MAX_DIGITS  # the least integer of more than MAX_DIGITS digits


def _in_range(value: Number, record_bytes: int) -> bool:
    """At most MAX_DIGITS digits and a magnitude within 1e±MAX_EXPONENT. A record of
    `record_bytes` cannot spell a number of more digits: counting them (`as_tuple`) was
    half of this check's 1.65 us, and most records are far shorter than MAX_DIGITS."""
    if isinstance(value, int):
        return -_INT_LIMIT < value < _INT_LIMIT
    if abs(value.adjusted()) > MAX_EXPONENT:
        return False
    return record_bytes <= MAX_DIGITS or len(value.as_tuple().digits) <= MAX_DIGITS


def parse_timestamp(text: object) -> tuple[str, int] | Rejection:
    """Return (ISO-8601 UTC key, microseconds since epoch); naive means UTC."""
    if not isinstance(text, str):
        return Rejection(f"field 'timestamp' is not a string: {text!r}")
    if _plain_utc(text):
        # Most inputs: "YYYY-MM-DD HH:MM:SS" (or with T), naive. Read without the pattern,
        # the parts and the time zone of the general way (1.13 against 0.66 us, timeit),
        # with the same results: tests/unit/test_events.py.
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return _parse_timestamp(text)  # to say why, as the general way says it
        time_us = (moment - _NAIVE_EPOCH) // _MICROSECOND
        if text[0] != "0":
            return f"{text[:10]}T{text[11:]}Z", time_us
        return format_time(moment.replace(tzinfo=UTC)), time_us
    return _parse_timestamp(text)


def _plain_utc(text: str) -> bool:
    """Shaped as "YYYY-MM-DD HH:MM:SS" or with a T: `fromisoformat` checks the digits
    (ASCII only) and the ranges; it takes any separator between date and time, and
    other forms too, hence this."""
    return (
        len(text) == 19
        and text[10] in "T "
        and text[4] == "-"
        and text[7] == "-"
        and text[13] == ":"
        and text[16] == ":"
    )


def _parse_timestamp(text: str) -> tuple[str, int] | Rejection:
    """Any form `_TIMESTAMP` takes."""
    match = _TIMESTAMP.match(text)
    if match is None:
        return Rejection(f"unparseable timestamp {text!r}")
    date, clock, fraction, zone = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    utc = zone == "Z" or zone is None or zone == "+00:00"
    if utc:
        zone = "+00:00"
    try:
        moment = datetime.fromisoformat(f"{date}T{clock}.{micros}{zone}").astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        return Rejection(f"unparseable timestamp {text!r}: {exc}")
    delta = moment - _EPOCH
    time_us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if utc and date[0] != "0":
        # What format_time writes, from the parts already checked (most inputs are UTC;
        # strftime was 2% of a worker's CPU). Years before 1000: strftime writes no
        # leading zero.
        return (f"{date}T{clock}Z" if micros == "000000" else f"{date}T{clock}.{micros}Z"), time_us
    return format_time(moment), time_us


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with a Z, fractions only when there are some."""
    spec = "%Y-%m-%dT%H:%M:%S.%fZ" if moment.microsecond else "%Y-%m-%dT%H:%M:%SZ"
    return moment.astimezone(UTC).strftime(spec)


def canonical_number(value: Number) -> str:
    """One spelling per numeric value: 1, 1.0 and 1.00 are the same value."""
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


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


def add_exact(a: Number, b: Number) -> Number:
    """Integers give an integer; decimals give the exact decimal."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return _EXACT.add(Decimal(a), Decimal(b))
