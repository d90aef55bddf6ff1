"""Whether an input partition has nothing on its way: all of it fetched, processed and
committed (ingest's idle partitions hold no watermark back)."""

from __future__ import annotations

from typing import Any

from faust.types import TP

from app import internals
from app.faust_app import PairstreamApp


async def caught_up(app: PairstreamApp, tp: TP) -> bool:
    """Whether everything in an input partition has been fetched, processed and
    committed: nothing of it is on its way."""
    consumer: Any = app.consumer
    if app.partition_tasks.get(tp) is None:
        return False
    position: int | None = await consumer.position(tp)
    # The rest after the await, so that the answer still holds when the caller goes on
    # (a step may have been acked or a fetch returned meanwhile).
    task = app.partition_tasks.get(tp)
    highwater: int | None = consumer.highwater(tp)
    if task is None or highwater is None or position is None:
        return False
    if task.lock.locked():
        # A step is under way: what its body changed (ingest's progress) belongs to
        # records not yet in any transaction. Told now, outside one, it would reach the
        # keyed partitions ahead of them: with a run's worth of progress, a watermark
        # that passed them by minutes (development runs, under load: 20 late events).
        return False
    offsets = task.offsets
    if offsets.next is None or offsets.unprocessed:
        return False
    committed = internals.committed_offset(consumer, tp) or 0
    return position >= highwater and committed >= offsets.next
