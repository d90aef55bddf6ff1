"""The pairing state: one changelog-backed RocksDB table, keyed by pairing key.

Partition p of the table (and of its changelog) holds the keys of partition p
of the keyed topic, plus its event clock (`~clock`: what it knows of each input
partition's progress, and the watermark). A step's writes go to the changelog inside
the event's transaction (the outbox of its partition task), and to the local RocksDB
once that has committed (app/exactly_once/local_state.py), never through faust's own buffered
changelog path.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from pairing.key_state import KeyState, KeyTimes
from pairing.recent import remember
from pairing.records import (
    CLOCK_KEY,
    decode_clock,
    decode_key_times,
    decode_state,
    encode_clock,
    encode_state,
)
from pairing.watermarks import EventClock
from tables import TableWriter, bytes_table

conf = settings()

table = bytes_table("pairing-state", conf.partitions, [conf.keyed_topic])


def stored_state(key: str) -> KeyState | None:
    """A key's committed state as this worker's table holds it (for reading outside a
    step)."""
    raw = table.data.get(key.encode())
    return None if raw is None else decode_state(raw)


RECENT_STATES = 20_000
"""How many key states a keyed partition keeps decoded, as it last read or wrote them.
A partner or a duplicate mostly comes soon after the event before it, and reading and
decoding its state again was 6.7% of a worker's CPU. At a
few hundred bytes a state, tens of MiB for a worker's partitions."""


class PartitionState:
    """The `KeyStore` of one keyed partition, written inside its task's steps. It lives
    as long as its partition task's processor, which goes with any step cut off
    (app/exactly_once/step.py), so the states it keeps are those of the steps that went into
    transactions."""

    __slots__ = ("_recent", "_table")

    def __init__(self, task: PartitionTask) -> None:
        self._table = TableWriter(table, task)
        self._recent: dict[str, KeyState] = {}

    def get(self, key: str) -> KeyState | None:
        state = self._recent.get(key)
        if state is None:
            raw = self._table.get(key.encode())
            if raw is None:
                return None
            state = decode_state(raw)
            self._remember(key, state)
        return state

    def put(self, key: str, state: KeyState) -> None:
        self._table.put(key.encode(), encode_state(state))
        self._remember(key, state)

    def delete(self, key: str) -> None:
        self._table.delete(key.encode())
        self._recent.pop(key, None)

    def _remember(self, key: str, state: KeyState) -> None:
        remember(self._recent, key, state, RECENT_STATES)

    def times(self) -> Iterator[KeyTimes]:
        for raw_key, raw_value in self._table.items():
            if raw_key != CLOCK_KEY:
                yield decode_key_times(raw_key.decode(), raw_value)

    def clock(self) -> EventClock:
        return decode_clock(self._table.get(CLOCK_KEY))

    def set_clock(self, clock: EventClock) -> None:
        self._table.put(CLOCK_KEY, encode_clock(clock))
