"""The patterns' wire formats: a pattern event routed to its key's partition, and a
match on its pattern's topic. Numbers travel exactly, as in pairing/records.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson

from pairing.grammar import format_time
from pairing.immutable import immutable
from pairing.pattern_state import Match, PatternEvent, event_doc, event_from_doc
from pairing.patterns import Pattern
from pairing.records import Source, dumps


@immutable
class RoutedPatternEvent:
    event: PatternEvent
    key_field: str  # the key it was routed by: only the patterns keyed by it take it
    source: Source
    progress_us: int  # its source's progress, including it


def encode_pattern_event(routed: RoutedPatternEvent) -> bytes:
    """A JSON array (a watermark record is an object) of where it came from, a newline,
    then the event as its state keeps it (orjson escapes every newline inside a string,
    so the first one ends the array): the partition that takes it keeps those bytes
    (`PatternEvent.encoded`). orjson reads its numbers back exactly
    (pairing/pattern_state.py)."""
    source = routed.source
    header = orjson.dumps(
        [
            routed.key_field,
            routed.progress_us,
            source.topic,
            source.partition,
            source.offset,
            source.timestamp_ms,
        ]
    )
    return header + b"\n" + orjson.dumps(event_doc(routed.event))


def decode_pattern_event(data: bytes) -> RoutedPatternEvent:
    header, _, event = data.partition(b"\n")
    key_field, progress_us, topic, partition, offset, timestamp_ms = orjson.loads(header)
    return RoutedPatternEvent(
        event_from_doc(orjson.loads(event), event),
        key_field,
        Source(topic, partition, offset, timestamp_ms),
        progress_us,
    )


def match_record(match: Match, pattern: Pattern) -> bytes:
    """A match on its pattern's topic: the identities each step took, by the step's name
    (an absent step, or an optional one that took none: an empty list), and its times."""
    steps = {
        step.name: list(taken) for step, taken in zip(pattern.steps, match.events, strict=True)
    }
    return dumps(
        {
            "pattern": match.pattern,
            "key": match.key,
            "steps": steps,
            "first_time": event_time(match.first_time),
            "last_time": event_time(match.last_time),
            "decided_at": event_time(match.completed_at),
        }
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def event_time(time_us: int) -> str | int:
    """An event time as the grammar writes one, or its microseconds where no calendar
    date holds it (a window's end past year 9999)."""
    try:
        return format_time(_EPOCH + timedelta(microseconds=time_us))
    except OverflowError:
        return time_us
