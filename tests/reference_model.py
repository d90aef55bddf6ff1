"""A small, deliberately naive model of the pairing rules over an input topic with
several partitions.

It takes what each input partition holds, in order, and computes the one outcome
the rules allow, key by key: no watermark records, no interleaving, no heaps, no
store. The engine and the real pipeline are checked against what it predicts.

Its only notion of time: each event's *stamp* (the largest valid event time of its
input partition up to and including it) and, at the end, the *final watermark*:
the least final progress over the partitions that have any valid event, or the
largest once every partition is idle.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from pairing.events import Event, Parse, Rejection, add_exact, parse_event, read_event
from pairing.grammar import Sizes

FIVE_MINUTES_US = 5 * 60 * 1_000_000
HOUR_US = 60 * 60 * 1_000_000


class AmbiguousStream(ValueError):
    """The rules leave the outcome to the order in which partitions are read: for
    one key, partitions whose first event of a type differ (or two events with one
    identity and different contents on different partitions). docs/event-time.md."""


@dataclass
class Expected:
    pairs: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    unpaired: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    conflicts: Counter[str] = field(default_factory=Counter)
    invalid: Counter[bytes | None] = field(default_factory=Counter)  # the records themselves
    duplicates: int = 0
    pending: set[str] = field(default_factory=set)
    held_late: set[str] = field(default_factory=set)  # late, waiting for their key to close
    watermark_us: int | None = None


@dataclass(frozen=True)
class Reading:
    """How ingest reads every record (`pairing.events.read_event`): its sizes, and the
    clock guard against one record timestamp taken for every record (the tests' records
    are produced after `record_time_ms`, and any they stamp ahead are years ahead)."""

    sizes: Sizes = field(default_factory=Sizes)
    max_ahead_us: int | None = None
    record_time_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    parse: Parse = parse_event  # or pairing.changes.parse_change

    def read(self, raw: bytes | None) -> Event | Rejection:
        return read_event(None, raw, self.record_time_ms, self.sizes, self.max_ahead_us, self.parse)


@dataclass(frozen=True)
class _Stamped:
    source: int
    event: Event
    stamp_us: int


def expected_outputs(
    sources: list[list[bytes | None]],
    expiry_us: int = FIVE_MINUTES_US,
    retention_us: int = HOUR_US,
    reading: Reading | None = None,
    drained: bool = False,
    all_idle: bool = False,
) -> Expected:
    """What the pipeline must output for an input topic whose partitions hold
    `sources`. `all_idle`: every partition has been declared idle since its last
    record (the watermark is then the largest progress, not the least); `drained`:
    every key has been closed (a quiet stream after max wait)."""
    read = (reading or Reading()).read
    out = Expected()
    by_key: dict[str, list[_Stamped]] = {}
    finals: list[int] = []
    for source, records in enumerate(sources):
        progress: int | None = None
        for raw in records:
            parsed = read(raw)
            if isinstance(parsed, Rejection):
                out.invalid[raw] += 1
                continue
            progress = parsed.time_us if progress is None else max(progress, parsed.time_us)
            by_key.setdefault(parsed.key, []).append(_Stamped(source, parsed, progress))
        if progress is not None:
            finals.append(progress)
    if finals:
        out.watermark_us = max(finals) if all_idle else min(finals)
    for key, stamped in by_key.items():
        time_us = stamped[0].event.time_us
        closed = drained or (
            out.watermark_us is not None and out.watermark_us - time_us > expiry_us
        )
        _decide(key, stamped, closed, expiry_us, retention_us, out)
    return out


def _decide(
    key: str,
    stamped: list[_Stamped],
    closed: bool,
    expiry_us: int,
    retention_us: int,
    out: Expected,
) -> None:
    on_time = [s for s in stamped if s.stamp_us - s.event.time_us <= expiry_us]
    late = [
        s for s in stamped if expiry_us < s.stamp_us - s.event.time_us <= expiry_us + retention_us
    ]
    for s in stamped:
        if s.stamp_us - s.event.time_us > expiry_us + retention_us:
            out.unpaired[(key, s.event.type, s.event.identity, "late")] += 1

    taken = _distinct(on_time)
    out.duplicates += len(on_time) - len(taken)
    # An on-time event whose identity was taken with other contents is a duplicate,
    # whatever its type: only copies of the taken events can be first.
    kept = {s.event.identity: (s.event.type, s.event.value) for s in taken}
    copies = [s for s in on_time if kept[s.event.identity] == (s.event.type, s.event.value)]
    firsts: dict[str, Event] = {}
    for kind in ("A", "B"):
        # Whichever partition is read first gives the first event of a type: the
        # outcome is one only if each partition's first is the same event.
        by_partition = {}
        for s in copies:
            if s.event.type == kind:
                by_partition.setdefault(s.source, s.event)
        if len({e.identity for e in by_partition.values()}) > 1:
            raise AmbiguousStream(f"{key}: different {kind} events first on different partitions")
        if by_partition:
            first = firsts[kind] = next(iter(by_partition.values()))
            for s in taken:
                if s.event.type == kind and s.event.identity != first.identity:
                    out.conflicts[s.event.identity] += 1
    if "A" in firsts and "B" in firsts:
        a, b = firsts["A"], firsts["B"]
        out.pairs[(key, a.identity, b.identity, str(add_exact(a.value, b.value)))] += 1
    elif firsts:
        (single,) = firsts.values()
        if closed:
            out.unpaired[(key, single.type, single.identity, "expired")] += 1
        else:
            out.pending.add(single.identity)

    seen = {s.event.identity for s in taken}
    held = _distinct(late)
    out.duplicates += len(late) - len(held)
    for s in held:
        if s.event.identity in seen:
            out.duplicates += closed
        elif closed:
            out.unpaired[(key, s.event.type, s.event.identity, "late")] += 1
        else:
            out.held_late.add(s.event.identity)


def _distinct(stamped: list[_Stamped]) -> list[_Stamped]:
    """First of each identity, in partition order; copies on different partitions
    must be the same event."""
    first: dict[str, _Stamped] = {}
    for s in sorted(stamped, key=lambda s: s.source):
        taken = first.setdefault(s.event.identity, s)
        if taken.source != s.source and (taken.event.type, taken.event.value) != (
            s.event.type,
            s.event.value,
        ):
            raise AmbiguousStream(f"{s.event.identity}: different events on different partitions")
    return list(first.values())
