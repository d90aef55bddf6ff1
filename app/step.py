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
from app.outbox import send_in_transaction
from app.partition_tasks import PartitionTask

log = logging.getLogger(__name__)


@asynccontextmanager
async def exactly_once(
    app: PairstreamApp, event: EventT[Any], records: int = 1
) -> AsyncIterator[PartitionTask]:
    """The event's partition task, its outbox empty, under the task's lock; on a clean
    exit the outbox is sent into the event's transaction and the event acked, with no
    commit between. An event may stand for several `records` (a run, app/runs.py):
    its offset is that of the last.

    The lock is held from the start: a commit (which takes it) must not fall between
    the body and its sends. Its hooks read what the body changed (ingest's progress),
    and would tell the keyed partitions of events that are not in the transaction
    yet: with a run's worth of progress told ahead of its events, pairing's watermark
    passed them and closed their keys before they came (a development run: 415 of
    100,000 events late, 2,808 expired instead of about 2,500)."""
    tasks = app.partition_tasks
    tp = event.message.tp
    task = tasks.get(tp)
    assert task is not None  # events_once yields only events of assigned partitions
    outbox = task.outbox  # empty: every step clears it on the way out
    async with task.lock:
        sent = False
        try:
            yield task
            task.writes.sent(await send_in_transaction(app, tp, outbox.records))
            sent = True
            event.ack()
            task.offsets.processed(event.message.offset)
            tasks.stats.processed(tp, outbox.counts, time.time(), records)
        finally:
            outbox.clear()
            if not sent:
                # A step cut off: its writes are in no transaction, and the processor's
                # memory of them (pairing's indexes and recent states) must go too.
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
