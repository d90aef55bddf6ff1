"""A small, deliberately naive model of the pairing rules.

No heaps, no indexes, no store protocol: every step scans all keys. The engine
and the real pipeline are checked against what this model predicts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pairing.events import Event, Rejection, add_exact, parse_event
from pairing.routing import partition_for

FIVE_MINUTES_US = 5 * 60 * 1_000_000
HOUR_US = 60 * 60 * 1_000_000


@dataclass
class _Key:
    time_us: int
    seen: set[str] = field(default_factory=set)
    pending: Event | None = None
    paired: bool = False
    settled_at: int | None = None


@dataclass
class Expected:
    pairs: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    unpaired: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    conflicts: Counter[str] = field(default_factory=Counter)
    invalid: list[int] = field(default_factory=list)  # input positions
    duplicates: int = 0
    pending: set[str] = field(default_factory=set)


class ModelPartition:
    def __init__(self, expiry_us: int, retention_us: int) -> None:
        self.expiry_us = expiry_us
        self.retention_us = retention_us
        self.stream_time: int | None = None
        self.keys: dict[str, _Key] = {}

    def feed(self, e: Event, out: Expected) -> None:
        k = self.keys.get(e.key)
        if k is not None and e.identity in k.seen:
            out.duplicates += 1
            return
        if k is not None and (k.paired or (k.pending is not None and k.pending.type == e.type)):
            out.conflicts[e.identity] += 1
            k.seen.add(e.identity)
            return
        if self.stream_time is not None and self.stream_time - e.time_us > self.expiry_us:
            out.unpaired[(e.key, e.type, e.identity, "late")] += 1
            k = self.keys.setdefault(e.key, _Key(e.time_us))
            k.seen.add(e.identity)
            k.settled_at = self.stream_time
        else:
            if self.stream_time is None or e.time_us > self.stream_time:
                self.stream_time = e.time_us
                for key, other in self.keys.items():
                    p = other.pending
                    if p is not None and self.stream_time - p.time_us > self.expiry_us:
                        out.unpaired[(key, p.type, p.identity, "expired")] += 1
                        other.pending = None
                        other.settled_at = self.stream_time
            k = self.keys.setdefault(e.key, _Key(e.time_us))
            k.seen.add(e.identity)
            if k.pending is None:
                k.pending = e
                k.settled_at = None
            else:
                a, b = (e, k.pending) if e.type == "A" else (k.pending, e)
                out.pairs[(e.key, a.identity, b.identity, str(add_exact(a.value, b.value)))] += 1
                k.pending = None
                k.paired = True
                k.settled_at = self.stream_time
        assert self.stream_time is not None
        for key in [
            key
            for key, other in self.keys.items()
            if other.pending is None
            and other.settled_at is not None
            and other.settled_at < self.stream_time - self.retention_us
        ]:
            del self.keys[key]


def expected_outputs(
    records: list[bytes | None],
    partitions: int,
    expiry_us: int = FIVE_MINUTES_US,
    retention_us: int = HOUR_US,
    max_bytes: int = 65536,
) -> Expected:
    """What the pipeline must output for records produced in this order to a
    single-partition input topic."""
    out = Expected()
    model = [ModelPartition(expiry_us, retention_us) for _ in range(partitions)]
    for position, raw in enumerate(records):
        parsed = parse_event(raw, max_bytes)
        if isinstance(parsed, Rejection):
            out.invalid.append(position)
            continue
        model[partition_for(parsed.key, partitions)].feed(parsed, out)
    for part in model:
        out.pending.update(k.pending.identity for k in part.keys.values() if k.pending)
    return out
