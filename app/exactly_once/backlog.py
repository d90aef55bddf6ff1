"""What of the input is on its way: whether an input partition has nothing on its way,
all of it fetched, processed and committed (ingest's idle partitions hold no watermark
back), and how many records of the worker's partitions wait (a commit lets steps go
on at once when the worker is behind, app/exactly_once/commit.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiokafka.errors import KafkaError
from faust.exceptions import ConsumerNotStarted
from faust.types import TP

from app.exactly_once import internals
from app.kafka.admin import end_offsets
from app.settings import settings

if TYPE_CHECKING:  # the app's module imports the commit's, which imports this one
    from app.exactly_once.application import PairstreamApp
    from app.exactly_once.partition_tasks import PartitionTasks

log = logging.getLogger(__name__)


async def caught_up(app: PairstreamApp, tp: TP, ask_broker: bool = False) -> bool:
    """Whether everything in an input partition has been fetched, processed and
    committed: nothing of it is on its way.

    Where it ends is the last fetch's answer, or with `ask_broker` the broker's. A
    worker that stood still (a long pause, a frozen VM, a zombie brought back) runs
    its overdue timers before its first fetch, and the last fetch's end is then as old
    as the stall: what landed meanwhile would not count."""
    consumer: Any = app.consumer
    if app.partition_tasks.get(tp) is None:
        return False
    position: int | None = await consumer.position(tp)
    fresh_end = None
    if ask_broker:
        try:
            fresh_end = (await end_offsets(settings(), [tp])).get(tp)
        except (KafkaError, OSError) as exc:
            log.warning("%s: the broker did not say where it ends (%r): not caught up", tp, exc)
            return False
        if fresh_end is None:
            return False
    # The rest after the awaits, so that the answer still holds when the caller goes on
    # (a step may have been acked or a fetch returned meanwhile).
    task = app.partition_tasks.get(tp)
    highwater = fetched_end(consumer, tp) if fresh_end is None else fresh_end
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


def fetched_end(consumer: Any, tp: TP) -> int | None:
    """Where `tp` ends by the consumer's last fetch (for read_committed, the last stable
    offset); None before a fetch or the consumer thread's start, or when that thread no
    longer has it assigned: aiokafka asserts that it has, and a rebalance changes that on
    its own thread."""
    try:
        end: int | None = consumer.highwater(tp)
    except (AssertionError, ConsumerNotStarted):
        return None
    return end


def records_waiting(consumer: Any, tasks: PartitionTasks) -> int:
    """Records of the worker's stream partitions that the consumer's last fetches found
    and the steps have not processed yet. Not the tables' changelogs: no step processes
    them, and a restore leaves their ends far ahead of where their tasks stand."""
    return tasks.waiting(
        lambda tp: None if internals.is_changelog(consumer, tp) else fetched_end(consumer, tp)
    )
