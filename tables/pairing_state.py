"""The pairing state: one changelog-backed RocksDB table, keyed by pairing key.

Partition p of the table (and of its changelog) holds the keys of partition p
of the keyed topic, plus its event clock (`~clock`: what it knows of each input
partition's progress, and the watermark). Writes go to the local
RocksDB at once and to the changelog inside the event's transaction (the
outbox of its partition task), never through faust's own buffered changelog path.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.outbox import Outbox
from app.settings import settings
from pairing.records import CLOCK_KEY, decode_clock, decode_state, encode_clock, encode_state
from pairing.routing import partition_for
from pairing.rules import KeyState
from pairing.watermarks import EventClock
from tables import bytes_table

conf = settings()

table = bytes_table("pairing-state", conf.partitions)


def stored_state(key: str) -> KeyState | None:
    """A key's state as this worker's table holds it (for reading outside a step)."""
    raw = table.data.get(key.encode())
    return None if raw is None else decode_state(raw)


class PartitionState:
    """The `KeyStore` of one partition, over the table; its changelog writes go to
    the partition task's outbox. Must be used while processing an event of that
    partition (faust routes by current event)."""

    def __init__(self, partition: int, outbox: Outbox) -> None:
        self.partition = partition
        self.outbox = outbox
        self._changelog = table.changelog_topic.get_topic_name()

    def get(self, key: str) -> KeyState | None:
        return stored_state(key)

    def put(self, key: str, state: KeyState) -> None:
        self._write(key.encode(), encode_state(state))

    def delete(self, key: str) -> None:
        encoded = key.encode()
        del table.data[encoded]
        self.outbox.send(self._changelog, encoded, None, self.partition)

    def items(self) -> Iterator[tuple[str, KeyState]]:
        for raw_key, raw_value in table.data.items():
            if raw_key == CLOCK_KEY:
                continue
            key = raw_key.decode()
            if partition_for(key, conf.partitions) == self.partition:
                yield key, decode_state(raw_value)

    def clock(self) -> EventClock:
        return decode_clock(table.data.get(CLOCK_KEY))

    def set_clock(self, clock: EventClock) -> None:
        self._write(CLOCK_KEY, encode_clock(clock))

    def _write(self, key: bytes, value: bytes) -> None:
        table.data[key] = value
        self.outbox.send(self._changelog, key, value, self.partition)
