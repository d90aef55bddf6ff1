"""The steps that apply handed items (handoff.py): one of the receiving task's own soon
after they were handed, and one inside each commit for what is left; and the fences that
open the hand-off."""

from __future__ import annotations

from faust.types import TP, AppT

from app.exactly_once.handoff import FENCE_KEY
from app.exactly_once.outbox_sends import send_outbox
from app.exactly_once.partition_tasks import PartitionTasks


async def apply_handed(app: AppT, tasks: PartitionTasks, tp: TP) -> None:
    """A step of `tp`'s task that applies what waits for it, as any step: under the task's
    lock, its outbox sent into the open transaction, or held while it commits. Items are
    taken under the lock, so a commit that comes first applies them itself."""
    task = tasks.get(tp)
    handler = tasks.handoff.handlers.get(tp.topic)
    if task is None or handler is None or tasks.closing:
        return  # a revocation's commit applies them, or they go with it
    async with task.lock:
        if task.broken or tasks.closing:
            return
        items = tasks.handoff.take(tp)
        if not items:
            return
        try:
            handler(task, items)
        except BaseException as exc:
            # Their giving steps are acked: committing without them would lose them.
            task.broken = True
            app.add_future(app.crash(exc))  # type: ignore[attr-defined]  # PairstreamApp
            raise
        if task.committing:
            task.held += len(items)  # sent with the held steps' records (commit.py)
            return
        await send_outbox(app, tasks.stats, task, len(items))


async def apply_before_commit(app: AppT, tasks: PartitionTasks, assignment: set[TP]) -> None:
    """What waits, applied into the transaction about to commit; the caller holds every
    task's lock, and the offsets of the steps that handed it are taken."""
    handoff = tasks.handoff
    for tp in handoff.waiting():
        task = tasks.get(tp)
        handler = handoff.handlers.get(tp.topic)
        items = handoff.take(tp)
        if task is None or handler is None or tp not in assignment or not items:
            continue
        handler(task, items)
        await send_outbox(app, tasks.stats, task, len(items))


async def keep_applying(app: AppT, tasks: PartitionTasks) -> None:
    """Apply handed items as they come, until the worker stops."""
    handoff = tasks.handoff
    while True:
        await handoff.due.wait()
        handoff.due.clear()
        for tp in handoff.waiting():
            await apply_handed(app, tasks, tp)


async def write_fences(app: AppT, tasks: PartitionTasks) -> None:
    """A fence record to every receiving partition not open yet, outside any transaction:
    a trigger, not data. Sent again until read."""
    token, closed = tasks.handoff.fence_due()
    for tp in closed:
        await app.producer.send(tp.topic, FENCE_KEY, token, tp.partition, None, None)
