"""Private members of faust's tables, their recovery and RocksDB store."""

from __future__ import annotations

from typing import Any

import rocksdict
from faust.tables import TableManager

__all__ = [
    "local_partition",
    "local_write_batch",
    "take_tables_on",
]


async def take_tables_on(manager: TableManager) -> None:
    """What faust's table manager does first when it starts (`_update_channels`): the
    tables' changelogs added to the subscription, each table started, the changelog
    partitions paused until recovery."""
    await manager._update_channels()


def local_partition(table: Any, partition: int) -> Any:
    """The rocksdict database of one partition of a table's local store, opened on
    first use (faust routes its own reads and writes by the current event)."""
    return table.data._db_for_partition(partition)


def local_write_batch() -> Any:
    """A write batch for `local_partition`'s databases, which faust opens in raw mode."""
    return rocksdict.WriteBatch(raw_mode=True)
