"""Every declared pattern over one partition of a keyed stream: the pattern engines
(pairing/pattern_engine.py) driven by the partition's event time. Pure: no Faust, no
Kafka; the state of each key lives in a `PatternStore` the caller backs with a
changelog-backed table, one state per key of a key field for all the patterns keyed by
that field (`KeyState`: each sees every event of the key, so the events are buffered
once, and the key is read, advanced and written once for all of them).

Event time is pairing's (pairing/watermarks.py): each input partition's progress, the
partition's watermark their minimum. A pattern's watermark lags it by `lateness_us` (and
1 µs: a source may still send events at its progress), as pairing closes a key only
`expiry` after the watermark passes it: an event that arrives no more than that behind
its source's progress is matched as if it had come in order, and one further behind is
refused as `late`.

Work per event and per watermark is proportional to the keys it concerns, not to all
keys held: each live key is filed under the least watermark at which one of its engines
has anything to do (its first buffered event, or the end of a partial's window), and an
advance visits only the keys due.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Protocol

from pairing.immutable import immutable
from pairing.pattern_engine import PatternEngine
from pairing.pattern_state import (
    KeyState,
    Match,
    Partial,
    PatternEvent,
    Refused,
    buffered,
    due_count,
    key_text,
)
from pairing.watermarks import EventClock, WatermarkUpdate


class PatternStore(Protocol):
    """The state of each key of one partition, by its key field."""

    def get(self, field: str, key: str) -> KeyState | None: ...

    def put(self, state: KeyState) -> None: ...

    def delete(self, field: str, key: str) -> None: ...

    def states(self) -> Iterable[KeyState]:
        """Everything stored: read once, when the partition is loaded."""
        ...


@immutable
class Decided:
    """What an advance decided: the matches, ordered by when they completed (then by
    pattern and key), and the partial matches the cap on partials dropped."""

    matches: tuple[Match, ...]
    dropped: int


NOTHING = Decided((), 0)


class PatternPartition:
    """The declared patterns over the events of one keyed partition."""

    __slots__ = ("_due", "_keyed_by", "_wake", "clock", "lateness_us", "store")

    def __init__(
        self,
        engines: Sequence[PatternEngine],
        store: PatternStore,
        clock: EventClock,
        lateness_us: int,
    ) -> None:
        names = [engine.pattern.name for engine in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"patterns of one partition need distinct names: {names}")
        if lateness_us < 0:
            raise ValueError(f"lateness must be 0 or more, not {lateness_us} µs")
        self._keyed_by: dict[str, list[PatternEngine]] = {}
        for engine in engines:
            self._keyed_by.setdefault(engine.pattern.key, []).append(engine)
        self.store = store
        self.clock = clock
        self.lateness_us = lateness_us
        # (field, key) -> the watermark its engines next have work at; the heap holds
        # the same as (watermark, field, key), with entries a later filing replaced.
        self._due: dict[tuple[str, str], int] = {}
        self._wake: list[tuple[int, str, str]] = []
        for state in store.states():
            # A field no pattern keys by any more: left unread. A key with only the
            # partials of patterns no longer declared: deleted.
            if state.field in self._keyed_by and not self._file(state):
                store.delete(state.field, state.key)
        heapq.heapify(self._wake)

    @property
    def watermark(self) -> int | None:
        """The patterns' watermark: every event at or before it is decided. A source at
        progress p may still send events at p - lateness (behind by no more than the
        lateness), so it is below that."""
        watermark = self.clock.watermark_us
        return None if watermark is None else watermark - self.lateness_us - 1

    def live_keys(self) -> int:
        """(key field, key) states held: each has an event buffered or a partial match."""
        return len(self._due)

    def add(
        self, event: PatternEvent, stamp_us: int | None = None, key_field: str | None = None
    ) -> list[tuple[str, Refused]]:
        """Buffer `event` for every pattern that keys it; the patterns that refused it
        and why (late, or a duplicate). `stamp_us`: its source's progress including it;
        `key_field`: only the patterns keyed by that field (the key it was routed by).

        Late is decided as pairing decides it (docs/event-time.md): at or before the
        patterns' watermark, or more than the lateness behind its own source's progress.
        The watermark never passes a source's progress, so an event late by the first is
        late by the second, which depends on its source's events alone: whether an event
        is late does not depend on how far the other sources had got when it came."""
        refused: list[tuple[str, Refused]] = []
        watermark = self.watermark
        limit = watermark
        if stamp_us is not None:
            by_stamp = stamp_us - self.lateness_us - 1  # late: behind it by more
            limit = by_stamp if limit is None else max(limit, by_stamp)
        fields = self._keyed_by if key_field is None else (key_field,)
        late = limit is not None and event.time <= limit
        store, due = self.store, self._due
        for field in fields:
            engines = self._keyed_by.get(field)
            key = None if engines is None else key_text(event.fields.get(field))
            if engines is None or key is None:
                continue
            # The key's own state may be behind (not due since): the partition's
            # watermark decides lateness, so that it does not depend on other events.
            state = None if late else store.get(field, key)
            buffer = None if late else buffered(() if state is None else state.buffer, event)
            if buffer is None:
                why = Refused(event, "late" if late else "duplicate")
                refused.extend((engine.pattern.name, why) for engine in engines)
                continue
            if state is None:
                store.put(KeyState(field, key, watermark, None, buffer, {}, {}))
            else:
                store.put(
                    KeyState(
                        field,
                        key,
                        state.watermark,
                        state.last,
                        buffer,
                        state.partials,
                        state.dropped,
                    )
                )
            # Buffering an event moves the key's wake to it at the latest.
            at = due.get((field, key))
            if at is None or event.time < at:
                due[(field, key)] = event.time
                heapq.heappush(self._wake, (event.time, field, key))
        return refused

    def observe(self, update: WatermarkUpdate) -> Decided:
        """A source's progress: advance the patterns if the watermark moved."""
        if not self.clock.observe(update):
            return NOTHING
        watermark = self.watermark
        assert watermark is not None  # it advanced
        return self._advance(watermark)

    def _advance(self, watermark: int) -> Decided:
        matches: list[Match] = []
        dropped = 0
        wake, store = self._wake, self.store
        while wake and wake[0][0] <= watermark:
            at, field, key = heapq.heappop(wake)
            if self._due.get((field, key)) != at:
                continue  # filed again since, at another watermark
            del self._due[(field, key)]
            state = store.get(field, key)
            assert state is not None  # a filed key is stored
            buffer = state.buffer
            due = due_count(buffer, watermark)
            events = buffer[:due]
            partials: dict[str, tuple[Partial, ...]] = {}
            dropped_by = state.dropped
            for engine in self._keyed_by[field]:
                name = engine.pattern.name
                held = state.partials.get(name, ())
                if not held and not events:
                    continue
                kept, found, lost = engine.decide(held, events, state.last, key, watermark)
                matches.extend(found)
                if kept:
                    partials[name] = kept
                if lost:
                    dropped += lost
                    dropped_by = {**dropped_by, name: dropped_by.get(name, 0) + lost}
            rest = buffer[due:]
            if not rest and not partials:
                store.delete(field, key)
                continue
            last = events[-1].position if events else state.last
            advanced = KeyState(field, key, watermark, last, rest, partials, dropped_by)
            store.put(advanced)
            self._file(advanced, push=True)
        if not matches and not dropped:
            return NOTHING
        matches.sort(key=lambda m: (m.completed_at, m.pattern, m.key))
        return Decided(tuple(matches), dropped)

    def _file(self, state: KeyState, push: bool = False) -> bool:
        """File a stored key under the least watermark its engines next have work at;
        False if they have none."""
        times = [state.buffer[0].time] if state.buffer else []
        for engine in self._keyed_by[state.field]:
            deadline = engine.deadline(state.partials.get(engine.pattern.name, ()))
            if deadline is not None:
                times.append(deadline)
        if not times:
            return False
        at = min(times)
        if self._due.get((state.field, state.key)) == at:
            return True
        self._due[(state.field, state.key)] = at
        entry = (at, state.field, state.key)
        if push:
            heapq.heappush(self._wake, entry)
        else:
            self._wake.append(entry)
        return True
