"""Every declared pattern over one partition of a keyed stream: the pattern engines
(pairing/pattern_engine.py) driven by the partition's event time. Pure: no Faust, no
Kafka; the state of each (pattern, key) lives in a `PatternStore` the caller backs with
a changelog-backed table.

Event time is pairing's (pairing/watermarks.py): each input partition's progress, the
partition's watermark their minimum. A pattern's watermark lags it by `lateness_us` (and
1 µs: a source may still send events at its progress), as pairing closes a key only
`expiry` after the watermark passes it: an event that arrives no more than that behind
its source's progress is matched as if it had come in order, and one further behind is
refused as `late`.

Work per event and per watermark is proportional to the keys it concerns, not to all
keys held: each live key is filed under the least watermark at which its engine has
anything to do (`PatternEngine.wake_at`), and an advance visits only the keys due.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Protocol

from pairing.immutable import immutable
from pairing.pattern_engine import PatternEngine
from pairing.pattern_state import Match, PatternEvent, PatternState, Refused, key_text
from pairing.watermarks import EventClock, WatermarkUpdate


class PatternStore(Protocol):
    """The state of each (pattern, key) of one partition, by the pattern's name."""

    def get(self, pattern: str, key: str) -> PatternState | None: ...

    def put(self, pattern: str, state: PatternState) -> None: ...

    def delete(self, pattern: str, key: str) -> None: ...

    def states(self) -> Iterable[tuple[str, PatternState]]:
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

    __slots__ = ("_due", "_engines", "_keyed_by", "_wake", "clock", "lateness_us", "store")

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
        self._engines = {engine.pattern.name: engine for engine in engines}
        self._keyed_by: dict[str, list[PatternEngine]] = {}
        for engine in engines:
            self._keyed_by.setdefault(engine.pattern.key, []).append(engine)
        self.store = store
        self.clock = clock
        self.lateness_us = lateness_us
        # (pattern, key) -> the watermark its engine next has work at; the heap holds
        # the same as (watermark, pattern, key), with entries a later filing replaced.
        self._due: dict[tuple[str, str], int] = {}
        self._wake: list[tuple[int, str, str]] = []
        for name, state in store.states():
            if name in self._engines:  # a pattern no longer declared: its state stays unread
                self._file(name, state)
        heapq.heapify(self._wake)

    @property
    def watermark(self) -> int | None:
        """The patterns' watermark: every event at or before it is decided. A source at
        progress p may still send events at p - lateness (behind by no more than the
        lateness), so it is below that."""
        watermark = self.clock.watermark_us
        return None if watermark is None else watermark - self.lateness_us - 1

    def live_keys(self) -> int:
        """(pattern, key) states held: each has an event buffered or a partial match."""
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
            for engine in engines:
                name = engine.pattern.name
                if late:
                    # The key's own state may be behind (not due since): the partition's
                    # watermark decides, so that lateness does not depend on other events.
                    refused.append((name, Refused(event, "late")))
                    continue
                state = store.get(name, key) or engine.start(key, watermark)
                added = engine.add(state, event)
                if isinstance(added, Refused):
                    refused.append((name, added))
                    continue
                store.put(name, added)
                # Buffering an event moves the key's wake to it at the latest (wake_at).
                at = due.get((name, key))
                if at is None or event.time < at:
                    due[(name, key)] = event.time
                    heapq.heappush(self._wake, (event.time, name, key))
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
        wake = self._wake
        while wake and wake[0][0] <= watermark:
            at, name, key = heapq.heappop(wake)
            if self._due.get((name, key)) != at:
                continue  # filed again since, at another watermark
            del self._due[(name, key)]
            engine = self._engines[name]
            state = self.store.get(name, key)
            assert state is not None  # a filed key is stored
            advanced = engine.advance(state, watermark)
            matches.extend(advanced.matches)
            dropped += advanced.dropped
            if engine.idle(advanced.state):
                self.store.delete(name, key)
            else:
                self.store.put(name, advanced.state)
                self._file(name, advanced.state, push=True)
        if not matches and not dropped:
            return NOTHING
        matches.sort(key=lambda m: (m.completed_at, m.pattern, m.key))
        return Decided(tuple(matches), dropped)

    def _file(self, name: str, state: PatternState, push: bool = False) -> None:
        at = self._engines[name].wake_at(state)
        assert at is not None  # a stored state has an event buffered or a partial
        if self._due.get((name, state.key)) == at:
            return
        self._due[(name, state.key)] = at
        entry = (at, name, state.key)
        if push:
            heapq.heappush(self._wake, entry)
        else:
            self._wake.append(entry)
