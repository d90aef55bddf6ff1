"""The commit of the worker's transaction, in order. faust drives it (its periodic
commit, a rebalance, a stop); the overrides in consumer.py and
transport.py call the steps here. docs/exactly-once.md says why each step is needed.

1. Take the partitions: each one's commit lock, then its step lock, so no step is
   half-way (`commit_partitions`, PartitionTasks.committing).
2. Take each partition's offset: where processing has reached in offset order
   (ExactlyOnceConsumer._new_offset, faust's call).
3. Add the records each stage sends just before a commit (ingest's event-time
   progress) to the partition's transaction, and apply what was handed to the next
   stage's partitions and waits (handoff.py) (`before_transactions_commit`).
4. Let steps go on, held: what they make waits in their outbox for the next
   transaction (same function). At once when the worker is behind; otherwise only if
   the transaction has not ended within half the commit interval, since a commit whose
   round trips wait behind steps takes several times as long (`let_steps_go_now`).
5. Commit the worker's transaction, which carries every partition's: its records
   delivered, then offsets, then the end, under the transaction timeout; a fenced or hung
   commit crashes the worker. The next one begins with the partitions this one wrote
   (`end_transactions`).
6. Stop the held steps taking more, then, for the partitions whose offset moved or
   that sent records into the transaction: apply their table writes to RocksDB, count
   them, tell the commit listeners (`commit_partitions`).
7. Send what held steps made into the transactions that have begun (`send_held`).
If what held steps made cannot reach a transaction, the worker crashes: a restart
processes those records again from the committed offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka.errors import ProducerFenced
from aiokafka.structs import TopicPartition
from faust.types import TP, AppT

from app.exactly_once import internals
from app.exactly_once.backlog import records_waiting
from app.exactly_once.handed_steps import apply_before_commit
from app.exactly_once.outbox import send_in_transaction, worker_transactional_id
from app.exactly_once.outbox_sends import send_outbox
from app.exactly_once.partition_tasks import PartitionTask, PartitionTasks
from app.kafka.txn_offset_commit import NOT_A_CURRENT_MEMBER
from app.settings import settings

log = logging.getLogger(__name__)


async def commit_partitions(
    app: AppT,
    consumer: Any,
    tps: list[TP],
    commit: Callable[[list[TP]], Awaitable[bool]],
) -> bool:
    """Steps 1, 6 and 7 around faust's `commit` of `tps` (steps 2-5), and of every other
    partition of the worker: their records are in the same transaction, and a step of one
    left out could add records to it that the offsets it commits do not cover."""
    tasks: PartitionTasks = consumer.tasks
    tps = sorted({*tps, *(task.tp for task in tasks)})
    began = time.monotonic()
    async with tasks.committing(tps) as committing:
        before = {tp: internals.committed_offset(consumer, tp) for tp in tps}
        try:
            result = await commit(tps)
        except Exception as exc:
            await _crash_if_held(app, committing, exc)
            raise
        finally:
            tasks.stay_stopped()
        held = [task for task in committing if task.committing]
        await tasks.stop_steps(held)
        if result:
            moved = [
                task.tp
                for task in committing
                if task.sent or internals.committed_offset(consumer, task.tp) != before[task.tp]
            ]
            for task in committing:
                task.sent = False
            # Before the held writes are sent: they are in no committed transaction.
            tasks.local_state.committed(set(moved))
            tasks.stats.committed(moved, time.time())
            if moved and tasks.commit_listeners:
                offsets = {tp: internals.committed_offset(consumer, tp) or 0 for tp in moved}
                for listener in tasks.commit_listeners:
                    listener(offsets)
        try:
            for task in held:
                await send_held(app, tasks, task)
        except Exception as exc:
            await _crash_if_held(app, committing, exc)
            raise
        if result:
            tasks.stats.commits.observe(time.monotonic() - began)
        return result


async def before_transactions_commit(
    app: AppT, tasks: PartitionTasks, assignment: set[TP], offsets: Mapping[TP, int], new: bool
) -> None:
    """Steps 3 and 4, under the partitions' locks with their offsets taken. Records only
    for partitions still assigned: faust discards the commit of the others, and records
    sent for them would keep a transaction open until the broker aborts it."""
    for tp in offsets:
        hook = tasks.commit_hooks.get(tp.topic)
        task = tasks.get(tp)
        if hook is None or task is None or tp not in assignment:
            continue
        records = hook(task)
        if records:
            await send_in_transaction(app, tp, records)
    # After the hooks: they hand over too (ingest's progress).
    await apply_before_commit(app, tasks, assignment)
    if not new:  # no transaction would take what steps held
        return
    if let_steps_go_now(app, tasks):
        tasks.let_steps_go()
    else:
        tasks.let_steps_go_after(settings().commit_interval_seconds / 2)


def let_steps_go_now(app: AppT, tasks: PartitionTasks) -> bool:
    """Whether steps go on as soon as the transaction commits: when more records wait
    than a run takes, the worker is behind, and throughput counts. Else a commit runs
    alone for up to half the commit interval: at 10,000 events/s one took 4-5 ms so
    (p50), against 17-19 ms with the steps beside it (docs/exactly-once.md)."""
    return records_waiting(app.consumer, tasks) > settings().max_run_records


async def end_transactions(
    app: AppT, producer: Any, offsets: Mapping[TP, int], start_new_transaction: bool
) -> bool:
    """Step 5: False (and the worker crashing) when this worker is fenced (its producer
    by a newer one of the same id, or its offsets by the group: it is no longer a
    member of the current generation) or the commit outlived the transaction timeout.
    faust's commit answered True when fenced, and our local state then applied the
    aborted transaction's writes."""
    tid = worker_transactional_id(app)
    # aiokafka takes only its own TopicPartition; faust's TP is an equal tuple, and is what
    # the partitions a commit adds of its own (commit_partitions) are named by.
    by_partition = {
        TopicPartition(tp.topic, tp.partition): offset for tp, offset in offsets.items()
    }
    # Past the transaction timeout the broker has aborted it: the commit never ends.
    watchdog = asyncio.timeout(settings().transaction_timeout_seconds)
    try:
        async with watchdog:
            # Its records before its offsets: the produce requests of the two overlapping
            # took 1-3% of commits from 4-6 ms to 25-40 ms (a broker's retry, internals).
            found = internals.transaction_producer(tid)
            if found is not None:
                await internals.deliver_gathered_batches(found[0])
                written = internals.transaction_partitions(found[0])
            await producer.commit_transactions(
                {tid: by_partition}, app.conf.id, start_new_transaction=start_new_transaction
            )
            if found is not None and start_new_transaction:
                # The next transaction will most likely write where this one did.
                internals.add_to_transaction(found[0], written)
    except (ProducerFenced, *NOT_A_CURRENT_MEMBER) as exc:
        log.warning("commit failed, this worker is fenced: %r", exc)
        await app.crash(exc)
        return False
    except TimeoutError as exc:
        if not watchdog.expired():
            raise
        log.error("commit not ended after the transaction timeout: crashing the worker")
        await app.crash(exc)
        return False
    return True


async def send_held(app: AppT, tasks: PartitionTasks, task: PartitionTask) -> None:
    """Step 7: the next transaction has begun, and the caller holds the task's lock."""
    if task.held and not task.broken:
        await send_outbox(app, tasks.stats, task, 0)


async def _crash_if_held(app: AppT, tasks: list[PartitionTask], exc: Exception) -> None:
    # What held steps made cannot be sent (the tasks become `broken` as the commit ends).
    if any(task.held for task in tasks):
        await app.crash(exc)
