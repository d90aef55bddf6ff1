"""The processed-message store of delivery: a changelog-backed RocksDB table keyed by
message identity (pairing/delivery.py), partitioned like the delivery's re-keyed input.

As with the pairing state, a step writes the local RocksDB at once and the changelog
record into its partition task's outbox, so both commit with the step's offset.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.outbox import Outbox
from app.settings import settings
from pairing.delivery import Entry, decode_entry, encode_entry
from pairing.routing import partition_for
from tables import TableWriter, bytes_table

conf = settings()

table = bytes_table("deliveries", conf.partitions)


class DeliveryStore:
    """The entries of one partition, written inside a step of that partition."""

    def __init__(self, partition: int, outbox: Outbox) -> None:
        self._writer = TableWriter(table, partition, outbox)
        self.partition = partition
        self.outbox = outbox

    def get(self, identity: str) -> Entry | None:
        raw = self._writer.get(identity.encode())
        return None if raw is None else decode_entry(raw)

    def put(self, identity: str, entry: Entry) -> None:
        self._writer.put(identity.encode(), encode_entry(entry))

    def delete(self, identity: str) -> None:
        self._writer.delete(identity.encode())


def stored_entries(partition: int) -> Iterator[tuple[str, Entry]]:
    """Every entry of a partition this worker holds (outside a step: the scan at the end
    of a catch-up)."""
    for raw_key, raw_value in table.data.items():
        identity = raw_key.decode()
        if partition_for(identity, conf.partitions) == partition:
            yield identity, decode_entry(raw_value)
