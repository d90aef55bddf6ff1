"""What the pattern engine keeps per key and what it decides: pure values (no Faust, no
Kafka), and their bytes for a changelog-backed table. pairing/pattern_engine.py makes
them; docs/patterns.md says what they mean.

The state of one key is plain data: ints, strings and field values in tuples, so it
can be written to the changelog and read back after a restart into engines that carry
on exactly where the old ones stopped. Every pattern keyed by one field sees the same
events of a key, so they share one state per key (`KeyState`): its buffered events
once, and each pattern's partial matches.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import field
from decimal import Decimal
from typing import Any, Literal

import orjson

from pairing.events import canonical_number
from pairing.immutable import immutable
from pairing.patterns import FieldValue

Position = tuple[int, str]
"""Where an event stands among its key's events: (event time in microseconds, identity).
A key's events are taken in this order, so no answer depends on arrival order."""

FORMAT = 3  # of the encoded state: a later change of layout can still read this one


@immutable
class PatternEvent:
    """An event as patterns see it: when, which, and its fields. `encoded`: its JSON as
    `event_doc` writes it, when it came so (routed to its key's partition): an event
    buffered by ten patterns is then encoded into their states without being encoded
    again. Not part of what the event is (equality)."""

    time: int  # event time, microseconds since the epoch
    identity: str
    fields: Mapping[str, FieldValue]
    encoded: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def position(self) -> Position:
        return (self.time, self.identity)


@immutable
class Partial:
    """One partial match: an assignment of events to the pattern's first steps.

    `taken` has one tuple of positions per step up to the step of the last event taken
    (steps that took none, optional or absent, hold an empty tuple). `blocked`: the
    first absent step after that one which an event since the last taken satisfied,
    so the match may no longer pass it (None: none). `bound`: the fields later
    conditions read of earlier steps' first events, (step, field, value), kept here
    because those events leave the buffer once processed.
    """

    taken: tuple[tuple[Position, ...], ...]
    blocked: int | None
    bound: tuple[tuple[int, str, FieldValue], ...]

    @property
    def first(self) -> Position:
        return self.taken[0][0]  # the first step always takes an event

    @property
    def last(self) -> Position:
        return self.taken[-1][-1]  # the tuple of the step of the last event taken


@immutable
class PatternState:
    """Everything remembered for one key of one pattern: what an engine reads and
    returns (a `KeyState` holds it for every pattern of the key's field)."""

    key: str
    watermark: int | None  # the last watermark advanced to: an event at or before it is late
    last: Position | None  # the key's last processed event (strict contiguity is after it)
    buffer: tuple[PatternEvent, ...]  # events not yet processed, in position order
    partials: tuple[Partial, ...]  # in order of `taken`
    dropped: int = 0  # partial matches the cap on partials has dropped, in all


@immutable
class KeyState:
    """Everything remembered for one key of one key field: the events buffered, shared
    by every pattern keyed by that field (each sees all of them), and each pattern's
    partial matches. A pattern with no partial match has no entry."""

    field: str
    key: str
    watermark: int | None  # the last watermark the key was advanced to
    last: Position | None  # the key's last processed event
    buffer: tuple[PatternEvent, ...]  # in position order
    partials: Mapping[str, tuple[Partial, ...]]  # by pattern name, in order of `taken`
    dropped: Mapping[str, int]  # by pattern name: partial matches the cap dropped, in all

    def of(self, pattern: str) -> PatternState:
        """The state of one of its patterns, as the engine reads it."""
        return PatternState(
            self.key,
            self.watermark,
            self.last,
            self.buffer,
            self.partials.get(pattern, ()),
            self.dropped.get(pattern, 0),
        )


@immutable
class Match:
    """A complete match: per step of the pattern, the identities of the events it took
    (an absent step: none)."""

    pattern: str
    key: str
    events: tuple[tuple[str, ...], ...]
    first_time: int
    last_time: int
    completed_at: int  # event time it was decided at: its last event's, or its deadline


@immutable
class Refused:
    """An event `add` did not buffer: at or before the watermark the key was advanced
    to ("late": what it could change is decided already), or the same position as one
    buffered ("duplicate")."""

    event: PatternEvent
    reason: Literal["late", "duplicate"]


@immutable
class Advanced:
    state: PatternState
    matches: tuple[Match, ...]  # in the order decided
    dropped: int  # partial matches the cap dropped in this advance


def buffered(
    buffer: tuple[PatternEvent, ...], event: PatternEvent
) -> tuple[PatternEvent, ...] | None:
    """`buffer` (in position order) with `event` in its place; None if an event of its
    position is there already (a duplicate)."""
    at = bisect_left(buffer, event.position, key=_event_position)
    if at < len(buffer) and buffer[at].position == event.position:
        return None
    return (*buffer[:at], event, *buffer[at:])


def due_count(buffer: tuple[PatternEvent, ...], watermark: int) -> int:
    """How many of `buffer`'s first events are at or before `watermark`."""
    due = 0
    while due < len(buffer) and buffer[due].time <= watermark:
        due += 1
    return due


def _event_position(event: PatternEvent) -> Position:
    return event.position


def key_text(value: FieldValue) -> str | None:
    """The key of an event whose key field holds `value`: keys are text, as Kafka's are,
    so the number 1 (or 1.0) and the string "1" are one key. None: no key."""
    if value is None:
        return None
    return value if isinstance(value, str) else canonical_number(value)


# --- bytes -------------------------------------------------------------------
# A key's state is a JSON array, [FORMAT, field, key, watermark, last, buffer,
# {pattern: partials}, {pattern: dropped}], written and read by orjson. orjson has no
# Decimal and reads an integer beyond 64 bits as a float, so those field values are
# tagged objects ({"d": "1.50"}, {"i": "1180591620717411303424"}). Formats 1 and 2 held
# one state per pattern and key: they are refused with the reason, not read.


def encode(state: KeyState) -> bytes:
    return orjson.dumps(
        [
            FORMAT,
            state.field,
            state.key,
            state.watermark,
            state.last,
            [event_doc(e) for e in state.buffer],
            {
                name: [
                    [p.taken, p.blocked, [[step, field, _value(v)] for step, field, v in p.bound]]
                    for p in partials
                ]
                for name, partials in state.partials.items()
            },
            state.dropped,
        ]
    )


def decode(raw: bytes) -> KeyState:
    """What `encode` wrote; ValueError for anything else, and for a state of an
    earlier format (one per pattern and key), saying so."""
    try:
        doc = orjson.loads(raw)
        if isinstance(doc, dict) or (isinstance(doc, list) and doc[:1] == [2]):
            raise ValueError(
                "a pattern state of format 1 or 2 (one per pattern and key), which this"
                " version does not read: docs/patterns.md, Bounded state"
            )
        if not isinstance(doc, list) or doc[:1] != [FORMAT]:
            raise ValueError(f"not a pattern state of format {FORMAT}: {raw[:40]!r}")
        _, field, key, watermark, last, buffer, partials, dropped = doc
        return KeyState(
            field,
            key,
            watermark,
            None if last is None else _position(last),
            tuple(event_from_doc(e) for e in buffer),
            {
                name: tuple(
                    Partial(
                        tuple(tuple(_position(p) for p in step) for step in taken),
                        blocked,
                        tuple((step, read, _read(v)) for step, read, v in bound),
                    )
                    for taken, blocked, bound in held
                )
                for name, held in partials.items()
            },
            dropped,
        )
    except (KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"not an encoded pattern state: {exc}") from exc


def event_doc(event: PatternEvent) -> list[Any] | orjson.Fragment:
    """An event as JSON holds it (in a state, or routed to its key's partition), for
    orjson to write."""
    if event.encoded is not None:
        return orjson.Fragment(event.encoded)
    return [event.time, event.identity, {name: _value(v) for name, v in event.fields.items()}]


def event_from_doc(doc: Any, encoded: bytes | None = None) -> PatternEvent:
    """What `event_doc` made (read from `encoded`, if given); TypeError or ValueError
    for anything else."""
    time, identity, fields = doc
    if not isinstance(time, int) or not isinstance(identity, str):
        raise TypeError(f"not an event: {doc!r}")
    return PatternEvent(time, identity, {n: _read(v) for n, v in fields.items()}, encoded)


_INT64 = range(-(2**63), 2**63)


def _value(value: FieldValue) -> Any:
    if isinstance(value, Decimal):
        return {"d": str(value)}
    if isinstance(value, int) and value not in _INT64:
        return {"i": str(value)}
    return value


def _read(value: Any) -> FieldValue:
    if isinstance(value, dict):
        if "d" in value:
            return Decimal(value["d"])
        return int(value["i"])
    if value is None or (isinstance(value, str | int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"not a field value: {value!r}")


def _position(doc: Any) -> Position:
    time, identity = doc
    if not isinstance(time, int) or not isinstance(identity, str):
        raise TypeError(f"not a position: {doc!r}")
    return (time, identity)
