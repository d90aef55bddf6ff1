"""Each input partition's event-time progress: one changelog-backed RocksDB table,
partitioned like the input topic.

Ingest stamps every event with its partition's progress, so after a restart or a
rebalance the stamps must go on from exactly the progress that was committed: the
table is written inside the event's transaction, like the pairing state
(agents/event_time.py reads and writes it).
"""

from __future__ import annotations

from app.exactly_once.input_partitions import PROGRESS_TABLE
from app.settings import settings
from tables import bytes_table

conf = settings()

table = bytes_table(PROGRESS_TABLE, conf.events_partitions, [conf.events_topic])
