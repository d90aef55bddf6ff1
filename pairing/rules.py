"""The pairing rules, for the events of one partition.

Pure: no Faust, no Kafka. State is read and written through a `KeyStore`
(a Faust table in production, a dict in tests); the in-memory indexes here are
derived from it and can always be rebuilt with `PairingPartition.load`.

Per event, in order:
  duplicate  identity already seen for this key        -> dropped, counted
  conflict   a different event of a type already pending
             or a key already paired                   -> dead letter
  late       t < stream time - expiry, nothing pending  -> unpaired "late"
  expire     stream time advances; pending events with
             stream time - t > expiry                   -> unpaired "expired"
  pair       the partner is pending                     -> pair
  pending    otherwise: wait for the partner
A pending event also expires after `max_wait_s` of wall-clock waiting, so a
quiet partition drains (`expire_waiting`). A key is forgotten once its last
event was settled longer than `dedup_retention_us` of stream time ago.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from pairing.events import Event, EventType, Number, add_exact

UnpairedReason = Literal["expired", "late"]
MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class PairingConfig:
    expiry_us: int = 5 * 60 * MICROS
    max_wait_s: float = 5 * 60.0
    dedup_retention_us: int = 60 * 60 * MICROS


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An event waiting for its partner, with the wall-clock time it started waiting."""

    type: EventType
    value: Number
    identity: str
    waiting_since: float


@dataclass(frozen=True, slots=True)
class KeyState:
    """Everything remembered about one pairing key (one timestamp).

    At most one event is pending: a second one of the other type pairs with it.
    """

    time_us: int
    seen: tuple[str, ...] = ()  # identities of every event taken for this key
    pending: PendingEvent | None = None
    paired: bool = False
    settled_at_us: int | None = None  # stream time when nothing was left pending


# --- outcomes: what processing one event (or the clock) produced -------------


@dataclass(frozen=True, slots=True)
class Paired:
    key: str
    a: PendingEvent
    b: PendingEvent

    @property
    def sum(self) -> Number:
        return add_exact(self.a.value, self.b.value)


@dataclass(frozen=True, slots=True)
class Unpaired:
    key: str
    event: PendingEvent
    reason: UnpairedReason


@dataclass(frozen=True, slots=True)
class Conflict:
    key: str
    event: PendingEvent
    detail: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    key: str
    identity: str


Outcome = Paired | Unpaired | Conflict | Duplicate


class KeyStore(Protocol):
    """Where a partition's key states live."""

    def get(self, key: str) -> KeyState | None: ...
    def put(self, key: str, state: KeyState) -> None: ...
    def delete(self, key: str) -> None: ...
    def items(self) -> Iterable[tuple[str, KeyState]]: ...


@dataclass
class _Indexes:
    """Min-heaps over the store, for O(log n) expiry. Entries may be stale:
    each is checked against the store when it comes to the top."""

    by_event_time: list[tuple[int, str]] = field(default_factory=list)
    by_waiting_since: list[tuple[float, str]] = field(default_factory=list)
    by_settled_at: list[tuple[int, str]] = field(default_factory=list)

    def track(self, key: str, state: KeyState) -> None:
        if state.pending is not None:
            heapq.heappush(self.by_event_time, (state.time_us, key))
            heapq.heappush(self.by_waiting_since, (state.pending.waiting_since, key))
        elif state.settled_at_us is not None:
            heapq.heappush(self.by_settled_at, (state.settled_at_us, key))


@dataclass(frozen=True, slots=True)
class PendingSummary:
    count: int
    oldest_time_us: int | None  # event time of the oldest pending event
    first_waiting_since: float | None  # wall clock: arrival of the longest-waiting one


class PairingPartition:
    """The rule engine for one partition of the keyed event stream."""

    def __init__(
        self, store: KeyStore, config: PairingConfig, stream_time_us: int | None = None
    ) -> None:
        self._store = store
        self._config = config
        self.stream_time_us = stream_time_us
        self._indexes = _Indexes()
        self._pending_count = 0

    @classmethod
    def load(
        cls, store: KeyStore, config: PairingConfig, stream_time_us: int | None
    ) -> PairingPartition:
        """Rebuild the engine over existing state (after a restart or rebalance)."""
        engine = cls(store, config, stream_time_us)
        for key, state in store.items():
            engine._indexes.track(key, state)
            engine._pending_count += state.pending is not None
        return engine

    def pending(self) -> PendingSummary:
        """How many events wait for a partner, and the oldest of them. Drops
        stale index entries it meets on top (amortised O(1))."""
        by_time = self._indexes.by_event_time
        while by_time and not self._is_pending(by_time[0][1]):
            heapq.heappop(by_time)
        by_wait = self._indexes.by_waiting_since
        while by_wait and not self._waits_since(by_wait[0][1], by_wait[0][0]):
            heapq.heappop(by_wait)
        return PendingSummary(
            self._pending_count,
            by_time[0][0] if by_time else None,
            by_wait[0][0] if by_wait else None,
        )

    def _is_pending(self, key: str) -> bool:
        state = self._store.get(key)
        return state is not None and state.pending is not None

    def _waits_since(self, key: str, waiting_since: float) -> bool:
        state = self._store.get(key)
        pending = state.pending if state is not None else None
        return pending is not None and pending.waiting_since == waiting_since

    def process(self, event: Event, now: float) -> list[Outcome]:
        """Apply the rules to one valid event; `now` is the wall clock in seconds."""
        state = self._store.get(event.key)
        arriving = PendingEvent(event.type, event.value, event.identity, now)
        if state is not None:
            if event.identity in state.seen:
                return [Duplicate(event.key, event.identity)]
            if state.paired:
                return [self._conflict(event, arriving, state, "key already paired")]
            if state.pending is not None and state.pending.type == event.type:
                detail = f"another {event.type} is pending"
                return [self._conflict(event, arriving, state, detail)]

        outcomes: list[Outcome] = []
        stream_time = self.stream_time_us
        if stream_time is not None and stream_time - event.time_us > self._config.expiry_us:
            # Late. Nothing can be pending for this key: it would have expired.
            outcomes.append(Unpaired(event.key, arriving, "late"))
            self._remember(event, state, stream_time)
        else:
            if stream_time is None or event.time_us > stream_time:
                self.stream_time_us = event.time_us
                outcomes.extend(self._expire_by_event_time())
                state = self._store.get(event.key)
            paired = self._pair_or_wait(event, arriving, state)
            if paired is not None:
                outcomes.append(paired)
        outcomes.extend(self.expire_waiting(now))
        self._forget_settled()
        return outcomes

    def expire_waiting(self, now: float) -> list[Outcome]:
        """Expire events that waited longer than max_wait of wall-clock time."""
        outcomes: list[Outcome] = []
        heap = self._indexes.by_waiting_since
        deadline = now - self._config.max_wait_s
        while heap and heap[0][0] < deadline:
            waiting_since, key = heapq.heappop(heap)
            state = self._store.get(key)
            pending = state.pending if state is not None else None
            if state is not None and pending is not None and pending.waiting_since == waiting_since:
                outcomes.append(self._expire(key, state, pending))
        return outcomes

    def _pair_or_wait(
        self, event: Event, arriving: PendingEvent, state: KeyState | None
    ) -> Paired | None:
        base = state or KeyState(event.time_us)
        seen = (*base.seen, event.identity)
        partner = base.pending
        if partner is None:
            self._save(event.key, replace(base, seen=seen, pending=arriving, settled_at_us=None))
            self._pending_count += 1
            return None
        self._pending_count -= 1
        self._save(
            event.key,
            replace(base, seen=seen, pending=None, paired=True, settled_at_us=self.stream_time_us),
        )
        a, b = (arriving, partner) if event.type == "A" else (partner, arriving)
        return Paired(event.key, a, b)

    def _expire_by_event_time(self) -> list[Outcome]:
        assert self.stream_time_us is not None
        horizon = self.stream_time_us - self._config.expiry_us
        heap = self._indexes.by_event_time
        outcomes: list[Outcome] = []
        while heap and heap[0][0] < horizon:
            _, key = heapq.heappop(heap)
            state = self._store.get(key)
            if state is not None and state.pending is not None:
                outcomes.append(self._expire(key, state, state.pending))
        return outcomes

    def _expire(self, key: str, state: KeyState, expiring: PendingEvent) -> Unpaired:
        self._save(key, replace(state, pending=None, settled_at_us=self.stream_time_us))
        self._pending_count -= 1
        return Unpaired(key, expiring, "expired")

    def _conflict(
        self, event: Event, arriving: PendingEvent, state: KeyState, detail: str
    ) -> Conflict:
        # Remembered, so a redelivery of the conflicting event is a duplicate.
        self._store.put(event.key, replace(state, seen=(*state.seen, event.identity)))
        return Conflict(event.key, arriving, detail)

    def _remember(self, event: Event, state: KeyState | None, stream_time: int) -> None:
        """Keep a late event's identity so a redelivery of it counts as a duplicate."""
        base = state or KeyState(event.time_us)
        self._save(
            event.key,
            replace(base, seen=(*base.seen, event.identity), settled_at_us=stream_time),
        )

    def _forget_settled(self) -> None:
        if self.stream_time_us is None:
            return
        horizon = self.stream_time_us - self._config.dedup_retention_us
        heap = self._indexes.by_settled_at
        while heap and heap[0][0] < horizon:
            settled_at, key = heapq.heappop(heap)
            state = self._store.get(key)
            if state is not None and state.pending is None and state.settled_at_us == settled_at:
                self._store.delete(key)

    def _save(self, key: str, state: KeyState) -> None:
        self._store.put(key, state)
        self._indexes.track(key, state)
