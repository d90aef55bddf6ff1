"""Exactly-once steps: each record of an input partition processed once, in order,
with everything it causes sent into the transaction that commits its offset.

An agent iterates `events_once(app, stream)` and processes each event inside
`exactly_once(app, event)`, which hands it the event's partition task; the task's
outbox collects the event's records, and on a clean exit they are sent and the
event acked under the commit lock (app/consumer.py says why that is needed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from faust.types import TP, EventT

from app import internals
from app.faust_app import PairstreamApp
from app.kafka_admin import committed_records_between
from app.outbox import send_in_transaction
from app.partition_tasks import PartitionTask
from app.progress import Progress, Verdict
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
    tasks = app.partition_tasks
    consumer: Any = app.consumer
    held = consumer.last_read.holds
    async for event in stream.noack().events():
        message = event.message
        tp = message.tp
        task = tasks.get(tp)
        reason: str
        if tasks.closing:
            reason = "closing"
        elif task is None:
            reason = "unassigned"
        elif app.in_recovery:
            reason = "recovering"
            task.offsets.skipped(message.offset)
        else:
            offsets = task.offsets
            verdict = offsets.verdict(message.offset)
            if verdict is Verdict.PROCESS and offsets.jumps_from_seek(message.offset):
                verdict = await _check_jump(tp, offsets, message.offset)
            if verdict is Verdict.PROCESS:
                if held:
                    held.pop(tp, None)  # back in order after a seek back
                yield event
                continue
            reason = verdict.value
            if verdict is not Verdict.REDELIVERED:
                offsets.skipped(message.offset)
            if verdict is Verdict.OUT_OF_ORDER and offsets.next is not None:
                # Again for every such record: aiokafka may hand on records it
                # fetched before the last seek.
                await consumer.seek_back(tp, offsets.next)
        log.warning("skipped %s record %s@%d", reason, tp, message.offset)
        tasks.stats.count(f"skipped_{reason}")
        internals.forget_unacked(consumer, message)


async def before_step(app: PairstreamApp, waiting: Awaitable[object]) -> None:
    """Await `waiting` between receiving an event and its step, but no longer than the
    flow runs: a rebalance or a stop stops the flow and then waits for every event
    received to be acked (faust's wait_empty), so an agent holding one must go on."""
    consumer: Any = app.consumer
    flow_stopped = asyncio.ensure_future(consumer.suspend_flow.wait())
    done = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait([done, flow_stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in (done, flow_stopped):
            if not future.done():
                future.cancel()


def still_current(
    app: PairstreamApp, event: EventT[Any], task: PartitionTask, ready: bool = True
) -> bool:
    """After an agent awaited between receiving `event` and its step: whether the event
    still belongs to this assignment and the agent is `ready` for it. If not, it is
    skipped, never acked, and consumed again: by the next assignment, or (same
    assignment) after a seek back to it."""
    tasks = app.partition_tasks
    message = event.message
    if not tasks.closing and tasks.get(message.tp) is task and ready:
        return True
    log.warning("skipped record %s@%d: its assignment is ending", message.tp, message.offset)
    tasks.stats.count("skipped_closing")
    task.offsets.skipped(message.offset)
    internals.forget_unacked(app.consumer, message)
    return False


async def _check_jump(tp: TP, offsets: Progress, offset: int) -> Verdict:
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


@asynccontextmanager
async def exactly_once(app: PairstreamApp, event: EventT[Any]) -> AsyncIterator[PartitionTask]:
    """The event's partition task, its outbox empty; on a clean exit the outbox is
    sent into the event's transaction and the event acked, with no commit between."""
    tasks = app.partition_tasks
    tp = event.message.tp
    task = tasks.get(tp)
    assert task is not None  # events_once yields only events of assigned partitions
    outbox = task.outbox  # empty: every step clears it on the way out
    try:
        yield task
        async with tasks.commit_lock:
            task.writes.sent(await send_in_transaction(app, tp, outbox.records))
            event.ack()
            task.offsets.processed(event.message.offset)
        tasks.stats.processed(tp, outbox.counts, time.time())
    finally:
        outbox.clear()
        task.writes.discard()  # a step cut off: its writes are not in any transaction


async def caught_up(app: PairstreamApp, tp: TP) -> bool:
    """Whether everything in an input partition has been fetched, processed and
    committed: nothing of it is on its way."""
    consumer: Any = app.consumer
    task = app.partition_tasks.get(tp)
    highwater: int | None = consumer.highwater(tp)
    if task is None or highwater is None:
        return False
    offsets = task.offsets
    if offsets.next is None or offsets.unprocessed:
        return False
    committed = internals.committed_offset(consumer, tp) or 0
    position: int | None = await consumer.position(tp)
    return position is not None and position >= highwater and committed >= offsets.next
