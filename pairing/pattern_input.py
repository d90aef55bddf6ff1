"""A record of a pattern file's input topics read as a pattern event, or the reason it
cannot be (dead-lettered and counted by the worker, as any invalid input). Pure.

The record's key and value are bounded as every input's are, and the value is one JSON
object read by the grammar of every input (pairing/grammar.py: size, UTF-8, duplicate
keys, exact and bounded numbers). The key is not read further: events are routed by the
patterns' key fields. Its time
field is a timestamp as events spell theirs; its identity field an id as events give
theirs. Of its other fields it keeps those some pattern reads (`PatternFile.fields`)
that hold text, a number or null: a field of any other kind (true/false, a list, an
object) is kept as missing, which no condition holds on, so it never raises later.
"""

from __future__ import annotations

from collections.abc import Set
from decimal import Decimal

from pairing.events import Rejection, too_far_ahead
from pairing.grammar import Sizes, decode_object, identity, oversize, parse_timestamp
from pairing.pattern_state import PatternEvent
from pairing.patterns import FieldValue, PatternInput


def read_pattern_event(
    key: bytes | None,
    raw: bytes | None,
    topic: str,
    spec: PatternInput,
    fields: Set[str],
    sizes: Sizes,
    clock_guard: tuple[int, int] | None = None,
) -> PatternEvent | Rejection:
    """The event of one record of `topic`; with `spec.topic_field`, that field holds the
    topic's name (whatever the record says it is), so patterns can tell inputs apart.
    `clock_guard`: (the record's timestamp in ms, the most an event may be ahead of it in
    µs), ingest's guard (pairing/events.py), so that no event far in the future moves
    the patterns' watermark."""
    too_large = oversize(key, raw, sizes)
    if too_large is not None:
        return too_large
    doc = decode_object(raw)
    if isinstance(doc, Rejection):
        return doc
    if spec.time not in doc:
        return Rejection(f"missing field {spec.time!r}")
    parsed = parse_timestamp(doc[spec.time])
    if isinstance(parsed, Rejection):
        # The grammar names the field 'timestamp'; this input may call it otherwise.
        return Rejection(parsed.reason.replace("'timestamp'", repr(spec.time), 1))
    if clock_guard is not None:
        ahead = too_far_ahead(parsed[1], str(doc[spec.time]), *clock_guard)
        if ahead is not None:
            return ahead
    if spec.identity not in doc:
        return Rejection(f"missing field {spec.identity!r}")
    event_id = identity(doc[spec.identity], spec.identity)
    if isinstance(event_id, Rejection):
        return event_id
    kept: dict[str, FieldValue] = {}
    for name in fields & doc.keys():
        value = doc[name]
        if value is None or (
            isinstance(value, str | int | Decimal) and not isinstance(value, bool)
        ):
            kept[name] = value
    if spec.topic_field is not None:
        kept[spec.topic_field] = topic
    return PatternEvent(parsed[1], event_id, kept)
