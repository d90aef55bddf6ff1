"""Exactly-once steps: each event processed inside `exactly_once(app, event)`, which
hands it the event's partition task; the task's outbox collects the event's records,
and on a clean exit they are sent and the event acked under the task's lock
(app/consumer.py says why that is needed), so the transaction that commits the
event's offset carries everything it caused. Agents take their events from
`events_once` (app/in_order.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from faust.types import EventT

from app import internals
from app.faust_app import PairstreamApp
from app.outbox import DeliveryFailed
from app.outbox_sends import send_outbox
from app.partition_tasks import PartitionTask

log = logging.getLogger(__name__)


@asynccontextmanager
async def exactly_once(
    app: PairstreamApp, event: EventT[Any], records: int = 1
) -> AsyncIterator[PartitionTask]:
    """The event's partition task, under the task's lock; on a clean exit the outbox is
    sent into the event's transaction and the event acked, with no commit between. An
    event may stand for several `records` (a run, app/runs.py): its offset is that of
    the last.

    The lock is held from the start: a commit (which takes it) must not fall between
    the body and its sends. Its hooks read what the body changed (ingest's progress),
    and would tell the keyed partitions of events that are not in the transaction
    yet: with a run's worth of progress told ahead of its events, pairing's watermark
    passed them and closed their keys before they came (a development run: 415 of
    100,000 events late, 2,808 expired instead of about 2,500).

    While the partition's transaction commits, a step is held: acked, its records and
    table writes left in the outbox after those of the steps held before it, for the
    commit to send into the next transaction (app/outbox_sends.py). A held step does not
    await, so only an error can cut it off; its records are then mixed with the other
    held ones, and the worker crashes with none of them committed."""
    tasks = app.partition_tasks
    message = event.message
    task = tasks.get(message.tp)
    assert task is not None  # events_once yields only events of assigned partitions
    async with task.lock:
        if task.broken:
            raise DeliveryFailed(f"{task.tp}: a step failed while others were held")
        if task.committing:
            try:
                yield task
            except BaseException as exc:
                task.broken = True
                app.add_future(app.crash(exc))
                raise
            event.ack()
            task.offsets.processed(message.offset)
            task.held += records
            return
        sent = False
        task.step_since = time.monotonic()
        try:
            yield task
            await send_outbox(app, tasks.stats, task, records)
            sent = True
            event.ack()
            task.offsets.processed(message.offset)
        finally:
            task.step_since = None
            if not sent:
                # A step cut off: its writes are in no transaction, and the processor's
                # memory of them (pairing's indexes and recent states) must go too.
                task.outbox.clear()
                task.writes.discard()
                task.forget_processor()


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
