"""The pairing rules, for the events of one keyed partition.

Pure: no Faust, no Kafka. State is read and written through a `KeyStore`
(a Faust table in production, a dict in tests); the in-memory indexes here are
derived from it and can always be rebuilt with `PairingPartition.load`.

Event time is the watermark of `pairing.watermarks`: the least progress over the
input partitions. Every event comes stamped with its own input partition's
progress (including it); how far it is *behind* is that stamp, or the watermark
if larger, minus its time. docs/event-time.md has worked examples.

Per event, in order:
  past retention  behind > expiry + dedup retention     -> unpaired "late", not remembered
  duplicate       identity already taken for this key   -> dropped, counted
  late            behind > expiry, or its key was closed -> unpaired "late" once the key's
                                                           window is closed (see below)
  conflict        a different event of a type already
                  pending, or a key already paired       -> dead letter
  pair            the partner is pending                 -> pair
  pending         otherwise: wait for the partner
A key's window closes when the watermark passes its time by more than the expiry:
its pending event is "expired", and late events held for it are settled (a late
copy of an event taken on time is a duplicate). Every event that is on time comes
before that point, so what closes is final. A key is forgotten once the watermark
passes its time by more than expiry + dedup retention.

Wall clock: once the watermark has not advanced for `max_wait_s`, a key whose
pending (or held late) event has waited that long too is closed early
(`expire_waiting`), so a quiet stream drains; a key so closed takes any later
event as late.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pairing.events import Event
from pairing.key_state import (
    Conflict,
    Duplicate,
    KeyState,
    KeyStore,
    Outcome,
    Paired,
    PairingConfig,
    PendingEvent,
    Unpaired,
)
from pairing.watermarks import EventClock, WatermarkUpdate


@dataclass
class _Indexes:
    """Min-heaps over the store, and which keys are open. Heap entries may be stale;
    `waiting` says which are not, without reading the store."""

    open_by_time: list[tuple[int, str]] = field(default_factory=list)  # pending or held late
    by_waiting_since: list[tuple[float, str]] = field(default_factory=list)
    all_by_time: list[tuple[int, str]] = field(default_factory=list)  # to forget
    # Each open key (pending or held late): when each event holding it open arrived.
    waiting: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def track(self, key: str, state: KeyState) -> None:
        if state.pending is not None:
            heapq.heappush(self.open_by_time, (state.time_us, key))
            heapq.heappush(self.by_waiting_since, (state.pending.waiting_since, key))
        for late in state.late:
            heapq.heappush(self.open_by_time, (state.time_us, key))
            heapq.heappush(self.by_waiting_since, (late.waiting_since, key))

    def note(self, key: str, state: KeyState) -> None:
        """`key`'s state as stored now."""
        since = _waits(state)
        if since:
            self.waiting[key] = since
        else:
            self.waiting.pop(key, None)

    def is_open(self, key: str) -> bool:
        return key in self.waiting

    def holds_since(self, key: str, waiting_since: float) -> bool:
        return waiting_since in self.waiting.get(key, ())

    def drop_closed_tops(self, most: int | None = None) -> None:
        """Drop up to `most` (None: all) stale entries from the top of each open heap,
        down to the first entry still open. Called with a bound as a
        key leaves the open set, which makes one entry of each stale: the heaps then hold
        about as many entries as keys open (amortised O(1)), and `pending` (a scrape of
        /stats) has nothing to clear. Left for the scrape, 165,000 entries of pairs made
        at 11,000 events/s held a worker's event loop for 1.4 s."""
        by_time = self.open_by_time
        left = most
        while by_time and by_time[0][1] not in self.waiting and left != 0:
            heapq.heappop(by_time)
            left = None if left is None else left - 1
        by_wait = self.by_waiting_since
        left = most
        while by_wait and not self.holds_since(by_wait[0][1], by_wait[0][0]) and left != 0:
            heapq.heappop(by_wait)
            left = None if left is None else left - 1


def _waits(state: KeyState) -> tuple[float, ...]:
    """When each event holding the key open arrived: its pending one and its late ones."""
    late = tuple(event.waiting_since for event in state.late)
    return late if state.pending is None else (state.pending.waiting_since, *late)


@dataclass(frozen=True, slots=True)
class PendingSummary:
    count: int
    oldest_time_us: int | None  # event time of the oldest pending event
    first_waiting_since: float | None  # wall clock: arrival of the longest-waiting one


class PairingPartition:
    """The rule engine for one partition of the keyed event stream."""

    def __init__(
        self,
        store: KeyStore,
        config: PairingConfig,
        clock: EventClock | None = None,
        now: float = 0.0,
    ) -> None:
        self._store = store
        self._config = config
        self.clock = clock if clock is not None else EventClock()
        # Wall clock of the last watermark advance. A (re)loaded engine starts the
        # count afresh: time spent down or restoring is not the watermark standing still.
        self._advanced_at = now
        self._indexes = _Indexes()
        self._pending_count = 0

    @classmethod
    def load(
        cls, store: KeyStore, config: PairingConfig, clock: EventClock, now: float
    ) -> PairingPartition:
        """Rebuild the engine over existing state (after a restart or rebalance): the
        same heaps as `_Indexes.track` builds one key at a time, heapified at once."""
        engine = cls(store, config, clock, now)
        indexes = engine._indexes
        all_by_time = indexes.all_by_time
        open_by_time = indexes.open_by_time
        by_waiting_since = indexes.by_waiting_since
        waiting = indexes.waiting
        pending_count = 0
        for key, time_us, pending_since, late_since in store.times():
            entry = (time_us, key)
            all_by_time.append(entry)
            waits = tuple(late_since) if pending_since is None else (pending_since, *late_since)
            if waits:
                waiting[key] = waits
            if pending_since is not None:
                pending_count += 1
                open_by_time.append(entry)
                by_waiting_since.append((pending_since, key))
            for since in late_since:
                open_by_time.append(entry)
                by_waiting_since.append((since, key))
        heapq.heapify(all_by_time)
        heapq.heapify(open_by_time)
        heapq.heapify(by_waiting_since)
        engine._pending_count = pending_count
        return engine

    @property
    def watermark_us(self) -> int | None:
        return self.clock.watermark_us

    def pending(self) -> PendingSummary:
        """How many events wait for a partner; the event time of the oldest event held
        open (pending, or late and held until its window closes) and the arrival of
        the one held longest."""
        self._indexes.drop_closed_tops()
        by_time = self._indexes.open_by_time
        by_wait = self._indexes.by_waiting_since
        return PendingSummary(
            self._pending_count,
            by_time[0][0] if by_time else None,
            by_wait[0][0] if by_wait else None,
        )

    def process(self, event: Event, progress_us: int, now: float) -> list[Outcome]:
        """Apply the rules to one valid event. `progress_us`: its input partition's
        progress including it; `now`: when its record was written, in seconds (the
        clock of max wait)."""
        arriving = PendingEvent(event.type, event.value, event.identity, now)
        watermark = self.clock.watermark_us
        horizon = progress_us if watermark is None else max(progress_us, watermark)
        behind = horizon - event.time_us
        config = self._config
        if behind > config.expiry_us + config.dedup_retention_us:
            # Its key may be forgotten already, and whether it is depends on timing:
            # never compared with what was taken, never remembered.
            return [Unpaired(event.key, arriving, "late")]
        state = self._store.get(event.key)
        if state is not None and event.identity in state.seen:
            return [Duplicate(event.key, event.identity)]
        if behind > config.expiry_us or (state is not None and state.closed):
            return self._late(event, arriving, state)
        if state is not None:
            if state.paired:
                return [self._conflict(event, arriving, state, "key already paired")]
            if state.pending is not None and state.pending.type == event.type:
                detail = f"another {event.type} is pending"
                return [self._conflict(event, arriving, state, detail)]
        paired = self._pair_or_wait(event, arriving, state)
        return [] if paired is None else [paired]

    def observe(self, update: WatermarkUpdate, now: float) -> list[Outcome]:
        """A watermark record: close the windows the watermark passes, forget keys
        past retention."""
        if not self.clock.observe(update):
            return []
        self._advanced_at = now
        watermark = self.clock.watermark_us
        assert watermark is not None  # it advanced
        outcomes: list[Outcome] = []
        heap = self._indexes.open_by_time
        while heap and watermark - heap[0][0] > self._config.expiry_us:
            _, key = heapq.heappop(heap)
            if self._indexes.is_open(key):
                outcomes.extend(self._close(key, self._open_state(key), early=False))
        self._forget(watermark)
        # Only max wait pops the waits otherwise, and only while the watermark stands still.
        self._indexes.drop_closed_tops()
        return outcomes

    def expire_waiting(self, now: float) -> list[Outcome]:
        """Close early the keys whose event waited longer than max_wait of wall-clock
        time, if the watermark has not advanced for as long."""
        max_wait = self._config.max_wait_s
        if now - self._advanced_at <= max_wait:
            return []
        outcomes: list[Outcome] = []
        heap = self._indexes.by_waiting_since
        while heap and heap[0][0] < now - max_wait:
            waiting_since, key = heapq.heappop(heap)
            if self._indexes.holds_since(key, waiting_since):
                outcomes.extend(self._close(key, self._open_state(key), early=True))
        return outcomes

    def _open_state(self, key: str) -> KeyState:
        state = self._store.get(key)
        assert state is not None  # an open key is stored
        return state

    def _late(self, event: Event, arriving: PendingEvent, state: KeyState | None) -> list[Outcome]:
        if state is not None and any(late.identity == event.identity for late in state.late):
            return [Duplicate(event.key, event.identity)]
        base = state or KeyState(event.time_us)
        watermark = self.clock.watermark_us
        if base.closed or (
            watermark is not None and watermark - event.time_us > self._config.expiry_us
        ):
            # Its window is closed: what was taken on time is final.
            self._save(
                event.key,
                KeyState(
                    base.time_us,
                    (*base.seen, event.identity),
                    base.pending,
                    base.paired,
                    base.closed,
                    base.late,
                ),
                state is None,
            )
            return [Unpaired(event.key, arriving, "late")]
        # Held until the window closes: an on-time copy may still be on its way
        # from another input partition, and would make this one a duplicate.
        self._save(
            event.key,
            KeyState(
                base.time_us,
                base.seen,
                base.pending,
                base.paired,
                base.closed,
                (*base.late, arriving),
            ),
            state is None,
        )
        return []

    def _close(self, key: str, state: KeyState, *, early: bool) -> list[Outcome]:
        outcomes: list[Outcome] = []
        if state.pending is not None:
            outcomes.append(Unpaired(key, state.pending, "expired"))
            self._pending_count -= 1
        seen = state.seen
        for late in state.late:
            if late.identity in seen:
                outcomes.append(Duplicate(key, late.identity))
            else:
                outcomes.append(Unpaired(key, late, "late"))
                seen = (*seen, late.identity)
        closed = KeyState(state.time_us, seen, None, state.paired, state.closed or early, ())
        self._put(key, closed)
        return outcomes

    def _pair_or_wait(
        self, event: Event, arriving: PendingEvent, state: KeyState | None
    ) -> Paired | None:
        base = state or KeyState(event.time_us)
        seen = (*base.seen, event.identity)
        partner = base.pending
        if partner is None:
            self._save(
                event.key,
                KeyState(base.time_us, seen, arriving, base.paired, base.closed, base.late),
                state is None,
            )
            self._pending_count += 1
            return None
        self._pending_count -= 1
        self._put(event.key, KeyState(base.time_us, seen, None, True, base.closed, base.late))
        self._indexes.drop_closed_tops(2)
        a, b = (arriving, partner) if event.type == "A" else (partner, arriving)
        return Paired(event.key, a, b)

    def _conflict(
        self, event: Event, arriving: PendingEvent, state: KeyState, detail: str
    ) -> Conflict:
        # Remembered, so a redelivery of the conflicting event is a duplicate.
        self._put(
            event.key,
            KeyState(
                state.time_us,
                (*state.seen, event.identity),
                state.pending,
                state.paired,
                state.closed,
                state.late,
            ),
        )
        return Conflict(event.key, arriving, detail)

    def _forget(self, watermark: int) -> None:
        horizon = watermark - self._config.expiry_us - self._config.dedup_retention_us
        heap = self._indexes.all_by_time
        while heap and heap[0][0] < horizon:
            # Each stored key is here once: pushed when first saved, and never saved
            # again once forgotten (an event past this horizon is late and not kept).
            # Reading it first was a RocksDB read and a decode per key.
            _, key = heapq.heappop(heap)
            self._store.delete(key)
            self._indexes.waiting.pop(key, None)

    def _put(self, key: str, state: KeyState) -> None:
        self._store.put(key, state)
        self._indexes.note(key, state)

    def _save(self, key: str, state: KeyState, new: bool) -> None:
        self._put(key, state)
        self._indexes.track(key, state)
        if new:
            heapq.heappush(self._indexes.all_by_time, (state.time_us, key))
