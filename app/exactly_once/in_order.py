"""Which records of a stream reach a step: each offset of an input partition once,
in order, in the assignment that owns it (the skip filter in front of every agent)."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import AsyncIterator, Sequence
from typing import Any

from faust.types import TP, EventT

from app.exactly_once import internals
from app.exactly_once.application import PairstreamApp
from app.exactly_once.offset_order import OffsetOrder, Verdict
from app.kafka.admin import committed_records_between
from app.settings import settings

log = logging.getLogger(__name__)


async def events_once(app: PairstreamApp, stream: Any) -> AsyncIterator[EventT[Any]]:
    """The stream's events, each offset once and in order per assignment, acked by
    `exactly_once`.

    Skipped, and never acked (an ack would let a commit pass their offset):
      * records of an assignment being revoked or stopped (`PartitionTasks.closing`),
        of a partition with no task (not assigned here), or that arrive while tables
        are being restored, or before the partition has been sought to its committed
        offset: all are delivered again after the seek;
      * records at or before one already processed in this assignment, or below the
        committed offset: faust delivers the last-read record again when its fetcher
        restarts (its check is `offset >= last read`); processed again, their
        outputs would commit twice;
      * a record delivered while an earlier delivered one is still unprocessed, or the
        first after a seek when committed records it leaves out were never delivered
        (`_check_jump`): the partition is sought back to the first unprocessed offset.
    The agent's body must not await before `exactly_once` takes its lock; an agent that
    must await first (delivery) does so through `before_step`, and checks `still_current`
    after it.
    """
    async for event in stream.noack().events():
        if await _admitted(app, event.message, event.message.offset):
            yield event


async def runs_once(
    app: PairstreamApp, stream: Any
) -> AsyncIterator[tuple[EventT[Any], Sequence[Any]]]:
    """For a stage whose records come in runs (app/exactly_once/runs.py): each run's event, and its
    records still to process, by the rules of `events_once` applied to the run's
    first record still to process. Records of the run before the partition's next
    offset were processed already (a run fetched before a seek back) and are left out.
    """
    tasks = app.partition_tasks
    async for event in stream.noack().events():
        message = event.message
        records: Sequence[Any] = message.value
        task = tasks.get(message.tp)
        after = None if task is None else task.offsets.next
        if after is not None and records[0].offset < after:
            records = records[bisect_left(records, after, key=_offset) :]
        first = records[0].offset if records else message.offset
        if await _admitted(app, message, first):
            yield event, records


def _offset(record: Any) -> int:
    offset: int = record.offset
    return offset


async def _admitted(app: PairstreamApp, message: Any, offset: int) -> bool:
    """Whether the message, whose first record to process is at `offset`, is the next
    of its partition to process; if not, it is skipped and forgotten by faust."""
    tasks = app.partition_tasks
    consumer: Any = app.consumer
    tp = message.tp
    task = tasks.get(tp)
    reason: str
    if tasks.closing:
        reason = "closing"
    elif task is None:
        reason = "unassigned"
    elif app.in_recovery:
        reason = "recovering"
        task.offsets.skipped(offset)
    else:
        offsets = task.offsets
        verdict = offsets.verdict(offset)
        if verdict is Verdict.PROCESS and offsets.jumps_from_seek(offset):
            verdict = await _check_jump(tp, offsets, offset)
        if tasks.closing or tasks.get(tp) is not task:
            # Revoked while the broker was asked: a step now would find no task, and
            # the message, never acked, would hold the rebalance up for good.
            reason = "closing"
        elif verdict is Verdict.PROCESS:
            held = consumer.last_read.holds
            if held:
                held.pop(tp, None)  # back in order after a seek back
            return True
        else:
            reason = verdict.value
            if verdict is not Verdict.REDELIVERED:
                offsets.skipped(offset)
            if verdict is Verdict.OUT_OF_ORDER and offsets.next is not None:
                # Again for every such record: aiokafka may hand on records it
                # fetched before the last seek.
                await consumer.seek_back(tp, offsets.next)
    log.warning("skipped %s record %s@%d", reason, tp, offset)
    tasks.stats.count(f"skipped_{reason}")
    internals.forget_unacked(consumer, message)
    return False


async def _check_jump(tp: TP, offsets: OffsetOrder, offset: int) -> Verdict:
    sought = offsets.next
    assert sought is not None  # a jump is measured from the sought offset
    if not await committed_records_between(settings(), tp, sought, offset - 1):
        return Verdict.PROCESS  # markers and aborted records only
    log.error(
        "%s: committed records %d..%d were fetched and never delivered; seeking back",
        tp,
        sought,
        offset - 1,
    )
    return Verdict.OUT_OF_ORDER
