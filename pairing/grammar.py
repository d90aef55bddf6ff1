"""The one input grammar (docs/grammar.md): JSON documents, numbers, timestamps, days
and identities, as every service reads them from its inputs. Pure; nothing here
raises on bad input: each reader returns the value or a `Rejection` with a reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import (
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
    Underflow,
)
from typing import Any

Number = int | Decimal

# The bound on every number: at most MAX_DIGITS significant digits, and the exponent of
# its leading digit within ±MAX_EXPONENT. A JSON number like 1e999999999 is valid JSON
# but would cost gigabytes to print, and overflow any decimal context.
MAX_DIGITS = 100
MAX_EXPONENT = 300
OUT_OF_RANGE = (
    f"number out of range: more than {MAX_DIGITS} digits or a magnitude beyond 1e±{MAX_EXPONENT}"
)
MAX_IDENTITY_LENGTH = 256

# A bounded number spans at most MAX_DIGITS + 2 * MAX_EXPONENT digit positions, so a sum
# of up to 10**MAX_DIGITS of them fits this precision; a result that would not is an
# error (a trap), never a silent rounding.
EXACT = Context(
    prec=2 * (MAX_DIGITS + 2 * MAX_EXPONENT),
    traps=[Inexact, Rounded, Overflow, Underflow, InvalidOperation, DivisionByZero],
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input could not be read."""

    reason: str


# --- sizes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How large records may be (docs/grammar.md, "Sizes"): an input record's key and
    value, refused past these before anything else is read; and any record a worker
    writes (outputs, re-keyed records, changelogs), key and value together, which must
    stay under its producer's request limit and the topics' max.message.bytes."""

    key_bytes: int = 1024  # an identity's 256 characters, 4 bytes each at most in UTF-8
    value_bytes: int = 65536  # an event is a few hundred bytes; a copy escaped fits a record
    record_bytes: int = 960_000  # faust's producer request limit is 1,000,000: room to frame


def oversize(key: bytes | None, value: bytes | None, sizes: Sizes) -> Rejection | None:
    """Why an input record is too large to read, or None."""
    if key is not None and len(key) > sizes.key_bytes:
        return Rejection(f"oversize key: {len(key)} bytes > {sizes.key_bytes}")
    if value is not None and len(value) > sizes.value_bytes:
        return Rejection(f"oversize record: {len(value)} bytes > {sizes.value_bytes}")
    return None


def oversize_invalid(key: bytes | None, value: bytes | None, sizes: Sizes) -> str | None:
    """`oversize`'s reason as the chain, enrichment and delivery spell their reasons."""
    refused = oversize(key, value, sizes)
    return None if refused is None else f"invalid: {refused.reason}"


# --- JSON documents ---------------------------------------------------------------


class _Refused(ValueError):
    """Raised by the decoder's hooks: the document is JSON, but not in the grammar."""


def _json_int(text: str) -> int:
    # Checked before int(): Python refuses over 4,300 digits with a ValueError of its own.
    if len(text) - text.startswith("-") > MAX_DIGITS:
        raise _Refused(OUT_OF_RANGE)
    return int(text)


def _json_decimal(text: str) -> Decimal:
    value = Decimal(text)  # exact: no context
    if not in_bounds(value, len(text)):
        raise _Refused(OUT_OF_RANGE)
    return value


def _json_constant(name: str) -> None:
    raise _Refused(f"{name} is not a finite number")


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {excerpt(key)} in an object")
            seen.add(key)
    return document


# One decoder, not one per record (json.loads builds one whenever it is given options).
_DECODER = json.JSONDecoder(
    parse_float=_json_decimal,
    parse_int=_json_int,
    parse_constant=_json_constant,
    object_pairs_hook=_json_object,
)


def decode_json(raw: bytes | None) -> Any:
    """The JSON document in `raw` (UTF-8), or a `Rejection`."""
    if raw is None:
        return Rejection("empty record (null value)")
    if len(raw) == 0:
        return Rejection("empty record")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection("malformed JSON: not UTF-8")
    if "\x00" in text[:2]:
        # UTF-16 (or UTF-32) of ASCII text is valid UTF-8 with a NUL in every other
        # place; JSON allows no NUL outside a string, and a document starts with ASCII.
        return Rejection("malformed JSON: not UTF-8 (UTF-16 or UTF-32?)")
    try:
        return _DECODER.decode(text)
    except _Refused as exc:
        return Rejection(str(exc))
    except RecursionError:
        return Rejection("malformed JSON: nested too deeply")
    except ValueError as exc:
        return Rejection(f"malformed JSON: {exc}")


def decode_object(raw: bytes | None, max_bytes: int | None = None) -> dict[str, Any] | Rejection:
    """A JSON object, or why `raw` is not one (too long, with `max_bytes`, unread)."""
    if max_bytes is not None and raw is not None and len(raw) > max_bytes:
        return Rejection(f"oversize record: {len(raw)} bytes > {max_bytes}")
    document = decode_json(raw)
    if isinstance(document, Rejection | dict):
        return document
    return Rejection(f"not a JSON object but {type(document).__name__}")


# --- numbers ----------------------------------------------------------------------


def in_bounds(value: Decimal, spelled_in: int) -> bool:
    """Finite, at most MAX_DIGITS digits and a magnitude within 1e±MAX_EXPONENT. A number
    spelled in `spelled_in` characters has no more digits than that: most are far shorter
    than MAX_DIGITS, and counting digits (`as_tuple`) costs more than the rest."""
    if not value.is_finite() or abs(value.adjusted()) > MAX_EXPONENT:
        return False
    return spelled_in <= MAX_DIGITS or len(value.as_tuple().digits) <= MAX_DIGITS


# A JSON number's grammar, ASCII digits only: no sign but a leading minus, no spaces,
# underscores, leading zeros, bare points, NaN or Infinity spellings.
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?", re.ASCII)


def number(value: Any, field: str, text_too: bool = False) -> Number | Rejection:
    """A JSON field as a number: a JSON number (already bounded by `decode_json`) or, with
    `text_too`, a string spelled as one."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        return Rejection(f"field {field!r} is not a number: {excerpt(value)}")
    if not isinstance(value, str):
        return value
    if not text_too:
        return Rejection(f"field {field!r} is not a number: {excerpt(value)}")
    if _NUMBER_TEXT.fullmatch(value) is None:
        return Rejection(f"field {field!r} is not a decimal number: {excerpt(value)}")
    parsed = Decimal(value)
    return (
        parsed if in_bounds(parsed, len(value)) else Rejection(f"field {field!r}: {OUT_OF_RANGE}")
    )


def add_exact(a: Number, b: Number) -> Number:
    """Integers give an integer; decimals give the exact decimal (or raise, never round)."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return EXACT.add(Decimal(a), Decimal(b))


def normalized(value: Decimal) -> Decimal:
    """`value` without trailing zeros, exactly (the default context rounds to 28 digits)."""
    return value.normalize(EXACT)


def fixed_point(value: Number, integer_digits: int, places: int) -> Decimal | None:
    """`value` with exactly `places` digits after the point, if that holds it exactly and
    it has at most `integer_digits` before; else None, never a rounded value (Spark's
    widest decimal, `decimal(38,18)`, holds 20 and 18: docs/grammar.md)."""
    exact = Decimal(value)
    if exact and exact.adjusted() >= integer_digits:
        return None
    try:
        return exact.quantize(Decimal(1).scaleb(-places), context=EXACT)
    except (Inexact, Rounded):
        return None


# --- identities -------------------------------------------------------------------


def identity(value: Any, field: str) -> str | Rejection:
    """An id: a non-empty string or an integer, at most MAX_IDENTITY_LENGTH characters,
    encodable as UTF-8 (JSON's escapes can spell a lone surrogate, which cannot be a key)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return Rejection(f"field {field!r} must be a string or an integer: {excerpt(value)}")
    text = str(value)
    if not text or len(text) > MAX_IDENTITY_LENGTH:
        return Rejection(f"field {field!r} must have 1 to {MAX_IDENTITY_LENGTH} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return Rejection(f"field {field!r} is not valid Unicode (a lone surrogate)")
    return text


def identity_bytes(raw: bytes | None, field: str) -> str | Rejection:
    """An id given as a record key: UTF-8 bytes."""
    if raw is None:
        return Rejection(f"{field} missing")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejection(f"{field} is not UTF-8")
    return identity(text, field)


def excerpt(value: Any) -> str:
    """A value as a reason quotes it: its repr, cut to 40 characters (inputs may be long)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


# --- days -------------------------------------------------------------------------

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


def parse_day(raw: bytes | None) -> str | Rejection:
    """A calendar day, `YYYY-MM-DD` (ASCII digits), that exists."""
    text = raw.decode("utf-8", errors="replace") if raw is not None else ""
    if _DAY.fullmatch(text) is None:
        return Rejection("must be a day, YYYY-MM-DD")
    try:
        date.fromisoformat(text)
    except ValueError:
        return Rejection(f"is not a calendar day: {text}")
    return text


# --- timestamps -------------------------------------------------------------------

# The seed's "YYYY-MM-DD HH:MM:SS" and ISO-8601 with T, fractions, Z or an offset.
# A time part is required: a bare date is not an event time. ASCII digits only.
# `\Z`, not `$`: `$` also matches before a final newline.
_TIMESTAMP = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?\Z",
    re.ASCII,
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def parse_timestamp(text: object) -> tuple[str, int] | Rejection:
    """Return (ISO-8601 UTC key, microseconds since epoch); naive means UTC."""
    if not isinstance(text, str):
        return Rejection(f"field 'timestamp' is not a string: {excerpt(text)}")
    if _plain_utc(text):
        # Most inputs: "YYYY-MM-DD HH:MM:SS" (or with T), naive. Read without the pattern,
        # the parts and the time zone of the general way (1.13 against 0.66 us, timeit),
        # with the same results: tests/unit/test_events.py.
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return _parse_timestamp(text)  # to say why, as the general way says it
        time_us = (moment - _NAIVE_EPOCH) // _MICROSECOND
        return f"{text[:10]}T{text[11:]}Z", time_us
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
        return Rejection(f"unparseable timestamp {excerpt(text)}")
    date_part, clock, fraction, zone = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    utc = zone == "Z" or zone is None or zone == "+00:00"
    if utc:
        zone = "+00:00"
    try:
        moment = datetime.fromisoformat(f"{date_part}T{clock}.{micros}{zone}").astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        return Rejection(f"unparseable timestamp {text!r}: {exc}")
    delta = moment - _EPOCH
    time_us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if utc:
        # What format_time writes, from the parts already checked (most inputs are UTC;
        # strftime was 2% of a worker's CPU).
        whole = f"{date_part}T{clock}"
        return (f"{whole}Z" if micros == "000000" else f"{whole}.{micros}Z"), time_us
    return format_time(moment), time_us


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with a Z, fractions only when there are some; the year in four
    digits (strftime's %Y writes year 1 as "1")."""
    m = moment.astimezone(UTC)
    whole = f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
    return f"{whole}.{m.microsecond:06d}Z" if m.microsecond else f"{whole}Z"
