"""Exactly-once steps: each event processed inside `exactly_once(app, event)`, which
hands it the event's partition task; the task's outbox collects the event's records,
and on a clean exit they are sent and the event acked under the task's lock
(docs/exactly-once.md says why), so the transaction that commits the
event's offset carries everything it caused. Agents take their events from
`events_once` (app/exactly_once/in_order.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from aiokafka.errors import KafkaError
from faust.exceptions import FaustError
from faust.types import TP, EventT

from app.exactly_once import internals
from app.exactly_once.application import PairstreamApp
from app.exactly_once.outbox import SendFailed
from app.exactly_once.outbox_sends import send_outbox
from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from pairing.records import Source

log = logging.getLogger(__name__)
# What a step may raise that no record caused: the transaction or the transport failed
# (fencing included), or the framework did. The worker stops, whatever the policy.
MUST_STOP = (SendFailed, KafkaError, FaustError)
REASON_CHARS = 500  # an exception's message may quote a whole record


@asynccontextmanager
async def exactly_once(
    app: PairstreamApp, event: EventT[Any], records: int = 1, *, dead_letters: str | None = None
) -> AsyncIterator[PartitionTask]:
    """The event's partition task, under the task's lock; on a clean exit the outbox is
    sent into the event's transaction and the event acked, with no commit between. An
    event may stand for several `records` (a run, app/exactly_once/runs.py): its offset is that of
    the last.

    The lock is held from the start: a commit (which takes it) must not fall between
    the body and its sends. Its hooks read what the body changed (ingest's progress),
    and would tell the keyed partitions of events that are not in the transaction
    yet: with a run's worth of progress told ahead of its events, pairing's watermark
    passed them and closed their keys before they came (a development run: 415 of
    100,000 events late, 2,808 expired instead of about 2,500).

    While the partition's transaction commits, a step is held: acked, its records and
    table writes left in the outbox after those of the steps held before it, for the
    commit to send into the next transaction (app/exactly_once/outbox_sends.py). A held step does
    not
    await, so only an error can cut it off; its records are then mixed with the other
    held ones, and the worker crashes with none of them committed.

    The processing-error boundary: given `dead_letters` (a step of one record), an
    exception of the body that no transaction or transport failure explains ends the
    step as a dead letter (`_dead_lettered`), unless processing_error_policy is "stop".
    A held step's effects are mixed with the held ones before it: it is dead-lettered
    only if it was the first held, or sent and wrote nothing before it raised."""
    tasks = app.partition_tasks
    message = event.message
    task = tasks.get(message.tp)
    assert task is not None  # events_once yields only events of assigned partitions
    async with task.lock:
        if task.broken:
            raise SendFailed(f"{task.tp}: a step failed while others were held")
        if task.committing:
            mark = len(task.outbox.records)
            task.writes.touched = False
            try:
                yield task
            except BaseException as exc:
                if not (
                    _undoable(task, mark) and _dead_lettered(app, task, event, exc, dead_letters)
                ):
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
            try:
                yield task
            except BaseException as exc:
                if not _dead_lettered(app, task, event, exc, dead_letters):
                    raise
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


def _dead_lettered(
    app: PairstreamApp,
    task: PartitionTask,
    event: EventT[Any],
    exc: BaseException,
    topic: str | None,
) -> bool:
    """Whether the step's exception is a processing error to dead-letter (see
    `exactly_once`). If so, the step's effects are gone, and its outbox holds the record
    for `topic` instead, to go into the same transaction as its ack."""
    if topic is None or not _processing_error(exc):
        return False
    message = event.message
    _undo(app, task)  # the caller checked that it can be undone
    where = Source(message.topic, message.partition, message.offset)
    _send_dead_letter(task, topic, message.key, message.value, where, exc)
    return True


def _processing_error(exc: BaseException) -> bool:
    """An error a record caused, to dead-letter under the policy; not one that means
    the worker must stop."""
    return (
        isinstance(exc, Exception)
        and not isinstance(exc, MUST_STOP)
        and settings().processing_error_policy != "stop"
    )


def _undoable(task: PartitionTask, mark: int) -> bool:
    """Whether a step that began with `mark` records in the outbox can be undone: it is
    the only one in the outbox and its table writes, or it sent and wrote nothing."""
    return task.held == 0 or (len(task.outbox.records) == mark and not task.writes.touched)


def _undo(app: PairstreamApp, task: PartitionTask) -> None:
    """Undo an undoable step (`_undoable`): its outbox and table writes go, if it has any,
    and the processor's memory, which may hold what it did, is rebuilt from the table,
    the shared one's too (`PartitionTasks.processor_topics`)."""
    if task.held == 0:
        task.outbox.clear()
        task.writes.discard()
    task.forget_processor()
    tasks = app.partition_tasks
    shared = tasks.processor_topics.get(task.tp.topic)
    owner = None if shared is None else tasks.get(TP(shared, task.tp.partition))
    if owner is not None:
        owner.forget_processor()


def _send_dead_letter(
    task: PartitionTask,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    where: Source,
    exc: BaseException,
) -> None:
    reason = f"processing error: {type(exc).__name__}: {exc}"[:REASON_CHARS]
    task.outbox.dead_letter(topic, reason, key, value, where)
    task.outbox.count("processing_errors")
    log.warning("dead-lettered record %s@%d to %s: %s", task.tp, where.offset, topic, reason)


class RunRecords(list[Any]):
    """The records of a run (app/exactly_once/runs.py) that a step handles. A handler iterates them
    with `each()`, which keeps the position of the record being handled, so that a
    step whose handler raised knows which record to dead-letter. A handler that finds
    the record at fault only after the loop (a write at the step's end) sets `current`
    to it before it raises."""

    current = -1

    def each(self) -> Iterator[Any]:
        for index, record in enumerate(self):
            self.current = index
            yield record
        self.current = -1  # what raises after the last record is no record's doing


async def run_once(
    app: PairstreamApp,
    event: EventT[Any],
    records: Sequence[Any],
    handle: Callable[[PartitionTask, RunRecords], None],
    *,
    dead_letters: str,
) -> None:
    """A run's step with the processing-error boundary. `handle` (no await) processes
    the records; when it raises on one with a processing error, everything the step did
    is undone and the run handled again without that record, which goes to
    `dead_letters` with the exception, in the same transaction. Undoing while the
    partition commits follows `exactly_once`'s rule: only if the step has sent and
    written nothing yet, or it is the first held; else the worker crashes, and the run
    comes again after the restart."""
    async with exactly_once(app, event, len(records)) as task:
        mark = len(task.outbox.records)
        todo = RunRecords(records)
        failed: list[tuple[Any, Exception]] = []
        while True:
            try:
                handle(task, todo)
                break
            except Exception as exc:
                if not (_undoable(task, mark) and _processing_error(exc)) or todo.current < 0:
                    raise
                _undo(app, task)
                failed.append((todo[todo.current], exc))
                todo = RunRecords(r for i, r in enumerate(todo) if i != todo.current)
        topic, partition = task.tp
        for record, error in failed:
            where = Source(topic, partition, record.offset, record.timestamp)
            _send_dead_letter(task, dead_letters, record.key, record.value, where, error)


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
