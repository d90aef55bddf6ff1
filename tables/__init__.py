"""State declarations: changelog-backed RocksDB tables of raw bytes, which our own
codecs write and read, and whose changelog records go into the event's transaction.
Steps write them through `TableWriter` only."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from app.exactly_once.partition_tasks import PartitionTask
from app.faust_app import app
from app.settings import settings


def bytes_table(name: str, partitions: int, partitioned_like: Iterable[str]) -> Any:
    """A table whose partition p only the steps of partition p of the topics
    `partitioned_like` read and write."""
    table = app.Table(
        name,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        options={
            "driver": "rocksdict",
            "write_buffer_size": settings().rocksdb_write_buffer_bytes,
        },
    )
    app.partition_tasks.state_in(partitioned_like, table.changelog_topic.get_topic_name())
    return table


class TableWriter:
    """One partition of a bytes table, written inside a step of that partition's task:
    to the changelog through the step's outbox as the step ends, and to the local
    RocksDB once the step's transaction has committed (app/exactly_once/local_state.py). Reads see
    the step's own
    writes and the partition's uncommitted ones."""

    __slots__ = ("_local", "_writes")

    def __init__(self, table: Any, task: PartitionTask) -> None:
        self._writes = task.writes
        self._local = task.writes.local_state.partition(table, task.tp.partition)

    @property
    def partition(self) -> int:
        return self._local.partition

    def get(self, key: bytes) -> bytes | None:
        return self._writes.get(self._local, key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """The partition's entries, uncommitted and staged writes included."""
        return self._local.items(self._writes.staged(self._local))

    def put(self, key: bytes, value: bytes) -> None:
        self._writes.stage(self._local, key, value)

    def delete(self, key: bytes) -> None:
        self._writes.stage(self._local, key, None)
