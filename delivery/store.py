"""The processed-message store of delivery: a changelog-backed RocksDB table keyed by
message identity (delivery/rules.py), partitioned like the delivery's re-keyed input.

As with the pairing state, a step writes the changelog record into its partition
task's outbox, so it commits with the step's offset, and the local RocksDB once that
has committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from app.exactly_once.local_state import LocalState, StepWrites
from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from delivery.rules import Entry, decode_entry, encode_entry
from tables import TableWriter, bytes_table

conf = settings()

table = bytes_table(
    "deliveries", conf.partitions, [conf.delivery_by_id_topic, conf.delivery_log_topic]
)


class DeliveryStore:
    """The entries of one partition, written inside a step of its task."""

    def __init__(self, task: PartitionTask) -> None:
        self._writer = TableWriter(table, task)
        self.partition = task.tp.partition
        self.outbox = task.outbox

    def get(self, identity: str) -> Entry | None:
        raw = self._writer.get(identity.encode())
        return None if raw is None else decode_entry(raw)

    def put(self, identity: str, entry: Entry) -> None:
        self._writer.put(identity.encode(), encode_entry(entry))

    def delete(self, identity: str) -> None:
        self._writer.delete(identity.encode())


def stored_entries(
    local_state: LocalState, partition: int, writers: Iterable[StepWrites]
) -> Iterator[tuple[str, Entry]]:
    """Every entry of a partition, outside a step (the scan at the end of a catch-up):
    uncommitted ones included, and those still staged by the partition tasks that write
    it (`writers`). Steps held while a transaction commits stay staged until the next
    one begins; a scan without them resumed messages whose outcome a held step had just
    applied, and called the API for them again."""
    local = local_state.partition(table, partition)
    for raw_key, raw_value in local.items(*(writes.staged(local) for writes in writers)):
        yield raw_key.decode(), decode_entry(raw_value)
