"""Enrichment of pairs from a reference table, pure.

The reference is a calendar: one row per day (`YYYY-MM-DD`, the key of the compacted
`sources` topic), e.g. the tariff or the trading session that applies that day. A
pair's key is its timestamp, so its day says which row applies; rows are few and
slow to change, which is what a stream-table join is for.

Per partition of the pairs, an `Enricher` keeps the rows and the pairs waiting for
theirs. A pair whose row is known is emitted enriched. One whose row is missing waits
until the row arrives, or until the partition's stream time (the latest pair time it
has seen) passes the pair's time by the bound, or until it has waited `max_wait_s` of
wall-clock time (a quiet stream); then it is emitted unenriched, flagged `missing`. A
changed row applies to pairs after the change. A deleted row (tombstone) makes later
pairs of that day go out at once, unenriched, flagged `deleted`.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field

from pairing.grammar import Rejection, decode_object, parse_day


@dataclass(frozen=True, slots=True)
class Enriched:
    key: str
    pair: bytes
    row: bytes | None
    reason: str | None  # None when enriched; else "missing" or "deleted"
    waited: bool = False  # it was held in the partition's state


@dataclass(frozen=True, slots=True)
class Waiting:
    key: str
    pair: bytes
    time_us: int
    since: float  # wall clock


def row_rejection(key: bytes | None, value: bytes | None) -> str | None:
    """Why a reference row cannot be stored (docs/grammar.md), or None: its key must be a
    calendar day, its value a JSON object or a tombstone."""
    parsed_day = parse_day(key)
    if isinstance(parsed_day, Rejection):
        return f"invalid: key {parsed_day.reason}"
    if value is not None:
        row = decode_object(value)
        if isinstance(row, Rejection):
            return f"invalid: row: {row.reason}"
    return None


def day_of(key: str) -> str:
    return key[:10]


def encode_waiting(waiting: Waiting) -> bytes:
    return json.dumps(
        {
            "key": waiting.key,
            "pair": waiting.pair.decode(),
            "t": waiting.time_us,
            "since": waiting.since,
        }
    ).encode()


def decode_waiting(raw: bytes) -> Waiting:
    data = json.loads(raw)
    return Waiting(data["key"], data["pair"].encode(), data["t"], data["since"])


@dataclass
class Enricher:
    bound_us: int
    max_wait_s: float
    rows: dict[str, bytes | None] = field(default_factory=dict)  # None: deleted
    waiting: dict[str, dict[str, Waiting]] = field(default_factory=dict)  # day -> key -> pair
    stream_time_us: int = 0
    _by_time: list[tuple[int, str, str]] = field(default_factory=list)  # (time, day, key)

    def pair(
        self, key: str, raw: bytes, time_us: int, now: float
    ) -> tuple[list[Enriched], Waiting | None]:
        """What a pair gives now, and the pair itself if it must wait."""
        self.stream_time_us = max(self.stream_time_us, time_us)
        day = day_of(key)
        out: list[Enriched] = []
        if day in self.rows:
            row = self.rows[day]
            out.append(Enriched(key, raw, row, None if row is not None else "deleted"))
            held = None
        else:
            held = Waiting(key, raw, time_us, now)
            self.hold(held)
        out.extend(self.release())
        return out, held

    def hold(self, waiting: Waiting) -> None:
        self.waiting.setdefault(day_of(waiting.key), {})[waiting.key] = waiting
        heapq.heappush(self._by_time, (waiting.time_us, day_of(waiting.key), waiting.key))

    def row(self, day: str, row: bytes | None) -> list[Enriched]:
        """A reference row set (or deleted): the pairs that waited for it go out."""
        self.rows[day] = row
        reason = None if row is not None else "deleted"
        waited = self.waiting.pop(day, {}).values()
        return [Enriched(w.key, w.pair, row, reason, waited=True) for w in waited]

    def release(self) -> list[Enriched]:
        """Pairs that waited past the bound in stream time (O(log n) each)."""
        out: list[Enriched] = []
        horizon = self.stream_time_us - self.bound_us
        while self._by_time and self._by_time[0][0] < horizon:
            _, day, key = heapq.heappop(self._by_time)
            waiting = self.waiting.get(day, {}).pop(key, None)
            if waiting is not None:  # else already emitted
                out.append(Enriched(key, waiting.pair, None, "missing", waited=True))
        return out

    def tick(self, now: float) -> list[Enriched]:
        """Pairs that waited `max_wait_s` of wall-clock time (a quiet stream)."""
        out: list[Enriched] = []
        for day, pairs in list(self.waiting.items()):
            for key, waiting in list(pairs.items()):
                if now - waiting.since >= self.max_wait_s:
                    del pairs[key]
                    out.append(Enriched(key, waiting.pair, None, "missing", waited=True))
            if not pairs:
                del self.waiting[day]
        return out


def enriched_record(enriched: Enriched) -> bytes:
    """The pair and its row spliced in as they came: both are JSON objects already (the
    pair written by pairing, the row checked by `row_rejection`), and a round trip
    through json would turn their decimals into floats."""
    reference = b"null" if enriched.row is None else enriched.row
    reason = b"null" if enriched.reason is None else json.dumps(enriched.reason).encode()
    enriched_flag = b"true" if enriched.reason is None else b"false"
    return b"".join(
        (
            b'{"pair":',
            enriched.pair,
            b',"reference":',
            reference,
            b',"enriched":',
            enriched_flag,
            b',"reason":',
            reason,
            b"}",
        )
    )
