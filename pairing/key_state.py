"""What the pairing rules keep per key, and what they decide: pure values (no Faust,
no Kafka); pairing/rules.py applies the rules, pairing/records.py encodes these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from pairing.events import EventType, Number, add_exact
from pairing.immutable import immutable

UnpairedReason = Literal["expired", "late"]
MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class PairingConfig:
    expiry_us: int = 5 * 60 * MICROS
    max_wait_s: float = 5 * 60.0
    dedup_retention_us: int = 60 * 60 * MICROS


@immutable
class PendingEvent:
    """An event waiting for its partner (or a late one waiting for its key to
    close), with the wall-clock time it started waiting."""

    type: EventType
    value: Number
    identity: str
    waiting_since: float


@immutable
class KeyState:
    """Everything remembered about one pairing key (one timestamp).

    At most one event is pending: a second one of the other type pairs with it.
    The rules build each new state with all its fields, in this order:
    `dataclasses.replace` took 20 us an event, a fifth of the rules' floor.
    """

    time_us: int
    seen: tuple[str, ...] = ()  # identities taken for this key: on time, or late and settled
    pending: PendingEvent | None = None
    paired: bool = False
    closed: bool = False  # closed early, by max wait
    late: tuple[PendingEvent, ...] = ()  # late events held until the key's window closes


# --- outcomes: what processing one event (or the clock) produced -------------


@immutable
class Paired:
    key: str
    a: PendingEvent
    b: PendingEvent

    @property
    def sum(self) -> Number:
        return add_exact(self.a.value, self.b.value)


@immutable
class Unpaired:
    key: str
    event: PendingEvent
    reason: UnpairedReason


@immutable
class Conflict:
    key: str
    event: PendingEvent
    detail: str


@immutable
class Duplicate:
    key: str
    identity: str


Outcome = Paired | Unpaired | Conflict | Duplicate


KeyTimes = tuple[str, int, float | None, list[float]]
"""What the indexes need of one stored key: the key, its time, when its pending event
started waiting (None: nothing pending), and when each of its held late events did. A
rebuild reads these, not whole states: building a million `KeyState`s was three
quarters of a restart's rebuild."""


def key_times(key: str, state: KeyState) -> KeyTimes:
    pending = state.pending
    return (
        key,
        state.time_us,
        None if pending is None else pending.waiting_since,
        [late.waiting_since for late in state.late],
    )


class KeyStore(Protocol):
    """Where a partition's key states live."""

    def get(self, key: str) -> KeyState | None: ...
    def put(self, key: str, state: KeyState) -> None: ...
    def delete(self, key: str) -> None:
        """Only of a stored key."""
        ...

    def times(self) -> Iterable[KeyTimes]:
        """`key_times` of every stored key, in any order."""
        ...
