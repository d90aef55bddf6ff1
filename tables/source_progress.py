"""Each input partition's event-time progress: one changelog-backed RocksDB table,
partitioned like the input topic.

Ingest stamps every event with its partition's progress, so after a restart or a
rebalance the stamps must go on from exactly the progress that was committed: the
table is written inside the event's transaction (through its partition task's
outbox), like the pairing state.
"""

from __future__ import annotations

from app.outbox import Outbox
from app.settings import settings
from tables import bytes_table

conf = settings()

table = bytes_table("source-progress", conf.events_partitions)


def _key(partition: int) -> bytes:
    # One key per partition, so it can be read outside an event of that partition
    # (faust then looks in every local partition).
    return b"~progress/%d" % partition


def stored_progress(partition: int) -> int | None:
    raw = table.data.get(_key(partition))
    return None if raw is None else int(raw)


def store_progress(partition: int, progress_us: int, outbox: Outbox) -> None:
    """Must be called while processing an event of that input partition."""
    key, value = _key(partition), str(progress_us).encode()
    table.data[key] = value
    outbox.send(table.changelog_topic.get_topic_name(), key, value, partition)
