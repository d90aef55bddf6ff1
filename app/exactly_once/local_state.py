"""Local RocksDB holds committed table writes only.

faust writes a table's RocksDB at once, whatever becomes of the transaction that
carries the changelog record, so after a kill -9 its local tables could hold writes
of aborted transactions and had to be rebuilt from the whole changelog. Here a step's
writes are staged (`StepWrites`); once the step's records are sent into its
transaction they become uncommitted writes of their table partition
(`LocalPartition`); and they reach RocksDB only after the transactions of every
partition task that wrote them have committed: in one write batch per table
partition, with faust's persisted changelog offset (that of the last changelog record
the batch covers). Local RocksDB is then always the changelog up to some offset at
or after the persisted one, and faust's restore reads only what follows it.

Reads in a step see the step's own writes, then the partition's uncommitted ones,
then RocksDB.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from faust.types import TP

from app.exactly_once import internals
from app.exactly_once.outbox import Outbox, SendReceipt, acked_offset, check_size
from pairing.grammar import Sizes

Value = bytes | None  # None: deleted
_ABSENT: Final = object()


class LocalPartition:
    """One partition of a table on this worker: its local RocksDB and the writes over it
    whose transactions have not all committed yet."""

    __slots__ = ("changelog", "last_sent", "partition", "table", "uncommitted")

    def __init__(self, table: Any, partition: int) -> None:
        self.table = table
        self.partition = partition
        self.changelog: str = table.changelog_topic.get_topic_name()
        self.uncommitted: dict[bytes, Value] = {}
        # Per partition task that wrote here: the delivery of the last changelog record
        # it sent. One producer's records reach a partition in order, so that one has
        # its highest offset.
        self.last_sent: dict[TP, SendReceipt] = {}

    def get(self, key: bytes) -> Value:
        found = self.uncommitted.get(key, _ABSENT)
        if found is not _ABSENT:
            return found  # type: ignore[return-value]  # a Value: _ABSENT is not stored
        stored: Value = internals.local_partition(self.table, self.partition).get(key)
        return stored

    def items(self, *staged: Mapping[bytes, Value]) -> Iterator[tuple[bytes, bytes]]:
        """Every entry: RocksDB, under the uncommitted writes, under `staged` writes of
        steps not sent yet (`StepWrites.staged`)."""
        over = dict(self.uncommitted)
        for writes in staged:
            over.update(writes)
        db = internals.local_partition(self.table, self.partition)
        offset_key = self.table.data.offset_key
        for key, value in db.items():
            if key != offset_key and key not in over:
                yield key, value
        for key, maybe in over.items():
            if maybe is not None:
                yield key, maybe

    def write_committed(self) -> None:
        """Write the uncommitted writes to RocksDB: every transaction that carries them
        has committed."""
        batch = internals.local_write_batch()
        for key, value in self.uncommitted.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        offsets = [acked_offset(sent) for sent in self.last_sent.values()]
        known = [offset for offset in offsets if offset is not None]
        if known and len(known) == len(offsets):
            # Otherwise (never seen: a commit waits for every delivery) the persisted
            # offset stays behind, which only makes the next restore read more.
            batch.put(self.table.data.offset_key, str(max(known)).encode())
        internals.local_partition(self.table, self.partition).write(batch)
        self.uncommitted.clear()
        self.last_sent.clear()


class LocalState:
    """This worker's table partitions, with their uncommitted writes. A partition stays
    once created: the processors of partition tasks keep it."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], LocalPartition] = {}

    def partition(self, table: Any, partition: int) -> LocalPartition:
        key = (table.name, partition)
        found = self._partitions.get(key)
        if found is None:
            found = self._partitions[key] = LocalPartition(table, partition)
        return found

    def committed(self, tps: set[TP]) -> None:
        """The transactions of `tps` have committed: write every table partition whose
        writers are all among them."""
        for local in self._partitions.values():
            if local.uncommitted and local.last_sent.keys() <= tps:
                local.write_committed()

    def revoked(self, tps: set[TP]) -> None:
        """Forget writes that partition tasks of `tps` left uncommitted: their
        transactions are aborted (or, committed unseen, restored from the changelog)."""
        for local in self._partitions.values():
            if not local.last_sent.keys().isdisjoint(tps):
                local.uncommitted.clear()
                local.last_sent.clear()


class StepWrites:
    """The table writes of a partition task's current step."""

    __slots__ = ("_last_record", "_staged", "local_state", "sizes", "touched", "tp")

    def __init__(self, tp: TP, local_state: LocalState, sizes: Sizes) -> None:
        self.tp = tp
        self.local_state = local_state
        self.sizes = sizes
        # Per table partition: key -> value, and the index in the outbox of its last
        # changelog record (once `to_changelog` has put them there). Kept apart per
        # partition so that `sent` hands each one's writes over in one update: a loop
        # over (partition, key) pairs was 2.2% of a worker's CPU.
        self._staged: dict[LocalPartition, dict[bytes, Value]] = {}
        self._last_record: dict[LocalPartition, int] = {}
        # Whether a held step wrote: its writes are mixed with the held ones before it
        # (app/exactly_once/step.py resets it when such a step starts).
        self.touched = False

    def get(self, local: LocalPartition, key: bytes) -> Value:
        staged = self._staged.get(local)
        if staged is not None:
            found = staged.get(key, _ABSENT)
            if found is not _ABSENT:
                return found  # type: ignore[return-value]  # a Value: _ABSENT is not stored
        return local.get(key)

    def stage(self, local: LocalPartition, key: bytes, value: Value) -> None:
        check_size(local.changelog, key, value, self.sizes.record_bytes)  # before the step has it
        self.touched = True
        staged = self._staged.get(local)
        if staged is None:
            staged = self._staged[local] = {}
        staged[key] = value

    def to_changelog(self, outbox: Outbox) -> None:
        """Put one changelog record per key written into the outbox, with its last
        value: the keys' earlier values would be overwritten in the same transaction
        (a restore applies the records in order). Pairing writes a key when its first
        event comes and again when its partner does, often in the same run."""
        records = outbox.records
        for local, staged in self._staged.items():
            topic, partition = local.changelog, local.partition
            records.extend([(topic, key, value, partition) for key, value in staged.items()])
            self._last_record[local] = len(records) - 1

    def staged(self, local: LocalPartition) -> Mapping[bytes, Value]:
        """What the current step, or the steps held while the task's transaction
        commits, wrote to `local`: in no transaction yet, and newer than its
        uncommitted writes."""
        return self._staged.get(local, {})

    def sent(self, receipts: Sequence[SendReceipt]) -> None:
        """The step's records are sent into its transaction (`receipts` in outbox order)."""
        for local, staged in self._staged.items():
            local.uncommitted.update(staged)
            local.last_sent[self.tp] = receipts[self._last_record[local]]
        self.discard()

    def discard(self) -> None:
        self._staged.clear()
        self._last_record.clear()
