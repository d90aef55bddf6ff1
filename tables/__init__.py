"""State declarations: changelog-backed RocksDB tables of raw bytes, which our own
codecs write and read, and whose changelog records go into the event's transaction."""

from __future__ import annotations

from typing import Any

from app.faust_app import app
from app.outbox import Outbox


def bytes_table(name: str, partitions: int) -> Any:
    return app.Table(
        name,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        options={"driver": "rocksdict"},
    )


class TableWriter:
    """One partition of a bytes table, written inside a step of that partition: to the
    local RocksDB at once, and to the changelog through the step's outbox (so both
    commit with the step's offset). Reads go to the step's partition."""

    __slots__ = ("_changelog", "_table", "outbox", "partition")

    def __init__(self, table: Any, partition: int, outbox: Outbox) -> None:
        self._table = table
        self._changelog = table.changelog_topic.get_topic_name()
        self.partition = partition
        self.outbox = outbox

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._table.data.get(key)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self._table.data[key] = value
        self.outbox.send(self._changelog, key, value, self.partition)

    def delete(self, key: bytes) -> None:
        del self._table.data[key]
        self.outbox.send(self._changelog, key, None, self.partition)
