"""What the pattern engine keeps per key and what it decides: pure values (no Faust, no
Kafka), and their bytes for a changelog-backed table. pairing/pattern_engine.py makes
them; docs/patterns.md says what they mean.

The state of one (pattern, key) is plain data: ints, strings and field values in
tuples, so it can be written to the changelog and read back after a restart into an
engine that carries on exactly where the old one stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from pairing.events import canonical_number
from pairing.immutable import immutable
from pairing.patterns import FieldValue

Position = tuple[int, str]
"""Where an event stands among its key's events: (event time in microseconds, identity).
A key's events are taken in this order, so no answer depends on arrival order."""

FORMAT = 1  # of the encoded state: a later change of layout can still read this one


@immutable
class PatternEvent:
    """An event as patterns see it: when, which, and its fields."""

    time: int  # event time, microseconds since the epoch
    identity: str
    fields: Mapping[str, FieldValue]

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
    """Everything remembered for one key of one pattern."""

    key: str
    watermark: int | None  # the last watermark advanced to: an event at or before it is late
    last: Position | None  # the key's last processed event (strict contiguity is after it)
    buffer: tuple[PatternEvent, ...]  # events not yet processed, in position order
    partials: tuple[Partial, ...]  # in order of `taken`
    dropped: int = 0  # partial matches the cap on partials has dropped, in all


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


def key_text(value: FieldValue) -> str | None:
    """The key of an event whose key field holds `value`: keys are text, as Kafka's are,
    so the number 1 (or 1.0) and the string "1" are one key. None: no key."""
    if value is None:
        return None
    return value if isinstance(value, str) else canonical_number(value)


# --- bytes -------------------------------------------------------------------


def encode(state: PatternState) -> bytes:
    doc = {
        "format": FORMAT,
        "key": state.key,
        "watermark": state.watermark,
        "last": state.last,
        "buffer": [event_doc(e) for e in state.buffer],
        "partials": [
            [p.taken, p.blocked, [[step, name, _value(v)] for step, name, v in p.bound]]
            for p in state.partials
        ],
        "dropped": state.dropped,
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def decode(raw: bytes) -> PatternState:
    """What `encode` wrote; ValueError for anything else."""
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise ValueError(f"pattern state of format {doc.get('format')!r}, not {FORMAT}")
        return PatternState(
            doc["key"],
            doc["watermark"],
            None if doc["last"] is None else _position(doc["last"]),
            tuple(event_from_doc(e) for e in doc["buffer"]),
            tuple(
                Partial(
                    tuple(tuple(_position(p) for p in step) for step in taken),
                    blocked,
                    tuple((step, name, _read(v)) for step, name, v in bound),
                )
                for taken, blocked, bound in doc["partials"]
            ),
            doc["dropped"],
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an encoded pattern state: {exc}") from exc


def event_doc(event: PatternEvent) -> list[Any]:
    """An event as JSON holds it (in a state, or routed to its key's partition)."""
    return [event.time, event.identity, {name: _value(v) for name, v in event.fields.items()}]


def event_from_doc(doc: Any) -> PatternEvent:
    """What `event_doc` made; TypeError or ValueError for anything else."""
    time, identity, fields = doc
    if not isinstance(time, int) or not isinstance(identity, str):
        raise TypeError(f"not an event: {doc!r}")
    return PatternEvent(time, identity, {n: _read(v) for n, v in fields.items()})


def _value(value: FieldValue) -> Any:
    # JSON has one kind of number; a Decimal is tagged so it reads back a Decimal.
    return {"d": str(value)} if isinstance(value, Decimal) else value


def _read(value: Any) -> FieldValue:
    if isinstance(value, dict):
        return Decimal(value["d"])
    if value is None or (isinstance(value, str | int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"not a field value: {value!r}")


def _position(doc: Any) -> Position:
    time, identity = doc
    if not isinstance(time, int) or not isinstance(identity, str):
        raise TypeError(f"not a position: {doc!r}")
    return (time, identity)
