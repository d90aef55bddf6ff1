"""Change records of Debezium's PostgreSQL connector for the events table, read as
events (docs/cdc.md): with PAIRSTREAM_EVENTS_FORMAT=debezium the input topic is the
connector's change topic.

The table's contract: `events(id text primary key, type, ts timestamptz, value numeric)`.
A committed insert (`op` "c") and a row of the initial snapshot (`op` "r") are an event
whose identity is the row's primary key: a change the connector emits again (after a
crash, or in a new snapshot) is a duplicate, never a second event. An event is a fact:
an update or a delete of its row is refused with a reason that names the row, and so
dead-lettered and counted like any invalid input; the event as inserted stands.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Literal

from pairing.events import EVENT_TYPES, Event, Parse, Rejection, canonical_number, parse_event
from pairing.grammar import Number, decode_object, excerpt, identity, number, parse_timestamp

NEW_ROW = frozenset({"c", "r"})  # an insert; a row read by a snapshot
CHANGED_ROW = {"u": "update", "d": "delete", "t": "truncate"}


def parse_change(raw: bytes | None, max_bytes: int) -> Event | Rejection:
    """Parse one change record's value (JSON, schemas off) into the event its row is."""
    doc = decode_object(raw, max_bytes)
    if isinstance(doc, Rejection):
        return doc
    op = doc.get("op")
    kind = op if isinstance(op, str) else None  # a list or an object is no op (nor hashable)
    if kind in NEW_ROW:
        row = doc.get("after")
        if not isinstance(row, dict):
            return Rejection(f"change {op!r} without its row: 'after' is {excerpt(row)}")
        return event_of_row(row)
    if kind in CHANGED_ROW:
        row = doc.get("before") or doc.get("after")
        row_id = row.get("id") if isinstance(row, dict) else None
        named = f"of events row {excerpt(row_id)}" if row_id is not None else "of the events table"
        return Rejection(
            f"{CHANGED_ROW[kind]} {named}: an event is immutable, the row as inserted stands"
        )
    if "op" not in doc:
        return Rejection("missing field 'op': not a Debezium change record")
    return Rejection(f"unknown op {excerpt(op)}: expected 'c', 'r', 'u', 'd' or 't'")


def event_of_row(row: dict[str, Any]) -> Event | Rejection:
    """An events row as an event; `value` as Debezium's string of a NUMERIC (exact)."""
    event_type = row.get("type")
    if event_type not in EVENT_TYPES:
        return Rejection(f"column 'type' is {excerpt(event_type)}: expected 'A' or 'B'")
    parsed_time = parse_timestamp(row.get("ts"))
    if isinstance(parsed_time, Rejection):
        return Rejection(f"column 'ts': {parsed_time.reason}")
    key, time_us = parsed_time
    text = row.get("value")
    if not isinstance(text, str):
        # A double (decimal.handling.mode=double) may be a NUMERIC rounded: never taken.
        return Rejection(
            f"column 'value' is {excerpt(text)}: expected NUMERIC as a string"
            " (decimal.handling.mode=string)"
        )
    value = number(text, "value", text_too=True)
    if isinstance(value, Rejection):
        return value
    row_id = identity(row.get("id"), "id")
    if isinstance(row_id, Rejection):
        return row_id
    return Event(event_type, key, time_us, value, row_id, row_id)


def parser_for(events_format: Literal["json", "debezium"]) -> Parse:
    return parse_change if events_format == "debezium" else parse_event


def row_digest(row_id: str, event_type: str, ts: str, value: Number | str) -> int:
    """A row's content as 64 bits, the same however it was read: `ts` in any form the
    grammar reads (taken to its UTC key), `value` with any trailing zeros."""
    parsed = parse_timestamp(ts)
    key = ts if isinstance(parsed, Rejection) else parsed[0]
    number_text = canonical_number(Decimal(value) if isinstance(value, str) else value)
    text = f"{row_id}\x1f{event_type}\x1f{key}\x1f{number_text}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def checksum(digests: Iterable[int]) -> int:
    """Rows' digests summed modulo 2**64: the same in any order."""
    return sum(digests) % (1 << 64)
