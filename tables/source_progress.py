"""Each input partition's event-time progress: one changelog-backed RocksDB table,
partitioned like the input topic.

Ingest stamps every event with its partition's progress, so after a restart or a
rebalance the stamps must go on from exactly the progress that was committed: the
table is written inside the event's transaction, like the pairing state.
"""

from __future__ import annotations

from app.exactly_once.input_partitions import PROGRESS_TABLE
from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from tables import TableWriter, bytes_table

conf = settings()

table = bytes_table(PROGRESS_TABLE, conf.events_partitions, [conf.events_topic])


def _key(partition: int) -> bytes:
    return b"~progress/%d" % partition


def stored_progress(task: PartitionTask) -> int | None:
    raw = TableWriter(table, task).get(_key(task.tp.partition))
    return None if raw is None else int(raw)


def store_progress(task: PartitionTask, progress_us: int) -> None:
    """Must be called in a step of the input partition's task."""
    TableWriter(table, task).put(_key(task.tp.partition), str(progress_us).encode())
