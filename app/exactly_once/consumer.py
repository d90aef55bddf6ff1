"""faust's aiokafka consumer, made to keep exactly-once (docs/exactly-once.md): records
reach the agents in offset order, once, from the committed offset; commits follow
commit.py and take the offset processing has reached; a rebalance or a stop commits what
was acked before the partitions go. It keeps the registry of partition tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
from contextlib import suppress
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalOperation
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from mode import Service
from mode.services import WaitResults

from app.exactly_once import commit, eager, internals, predecessor
from app.exactly_once.outbox import partition_transactional_id
from app.exactly_once.partition_tasks import PartitionTasks
from app.exactly_once.runs import in_runs
from app.kafka.admin import committed_records_between, last_committed_records
from app.settings import Settings, settings

log = logging.getLogger(__name__)
# How often faust's livelock detector looks at every partition: it does so every 2.5 commit
# intervals (7 s at its default interval, 0.125 s at ours), for stalls it reports after
# minutes (stream_processing_timeout, broker_commit_livelock_soft_timeout: 5 min).
LIVELOCK_CHECK_SECONDS = 7.0
# No record for this long and the worker is quiet: its fetches wait longer (_note_fetched).
QUIET_AFTER_SECONDS = 1.0
# How often the commit loop, waiting for an ack, looks whether the consumer stops.
ACK_WAIT_SECONDS = 1.0


class ChangelogsNotAssigned(RuntimeError):
    def __init__(self, missing: list[TP]) -> None:
        super().__init__(
            "assigned input partitions without the changelog partitions of their state:"
            f" {', '.join(f'{tp.topic}[{tp.partition}]' for tp in missing)}. The group"
            " leader's metadata lacked them (a changelog just created, or deleted?), or"
            " the tables and their input topics differ in partitions. Stopping rather"
            " than run on tables that were never restored."
        )
        self.missing = missing


class Stalled(RuntimeError):
    """A step or a commit that has not ended within the transaction timeout."""


class ExactlyOnceConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def on_start(self) -> None:
        # Before the join, which a predecessor killed without leaving would hold up
        # until its session timed out (app/exactly_once/predecessor.py).
        await predecessor.remove(settings())
        await super().on_start()

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        conf = settings()
        member_id = internals.group_member_id(internals.client_consumer(self))
        if member_id is not None and conf.group_instance_id is None:
            predecessor.remember(predecessor.member_file(conf), conf.app_id, member_id)
        await super().on_partitions_assigned(assigned, generation_id)

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # The broker answers a connection's requests in turn: faust's fixed 1.5 s fetch wait held
        # every offset look-up of a recovery behind a fetch of quiet partitions.
        internals.set_fetch_limits(
            consumer, settings().fetch_min_bytes, settings().fetch_max_wait_seconds
        )
        internals.stable_offset_look_ups(consumer)
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        internals.hand_on_decoded_records(consumer, tasks.in_runs)
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        # Only faust's recovery asks, how far to restore: the broker's last stable offset, and one
        # past the last committed record rather than a commit marker never delivered
        # (docs/faust-gaps.md, 8).
        client = internals.client_consumer(self)
        ends: Mapping[TP, int] = await client.end_offsets(partitions)
        last = await last_committed_records(settings(), ends)
        return {tp: last[tp] + 1 if tp in last else end for tp, end in ends.items()}


class ExactlyOnceConsumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Stream partitions faust asked to resume: held paused until they are sought
        # to the committed offsets, then until the flow resumes (resume_partitions).
        self._resume_after_seek: set[TP] = set()
        self._resume_with_flow: set[TP] = set()
        # Then partitions of stages that hand over, until the hand-off is open (handoff.py).
        self._resume_when_open: set[TP] = set()
        self.tasks.handoff.when_open(self._resume_handing)
        self.last_read = internals.install_last_read_offsets(self)
        self._livelock_checked_at = time.monotonic()
        # Set by an ack, cleared by the commit that takes it: no ack, no commit to make.
        self._acked_since_commit = asyncio.Event()
        # When a fetch last returned records, and whether fetches wait as a quiet worker's.
        self._records_at = time.monotonic()
        self._quiet = False
        internals.lazy_commit_tables()

    @property
    def tasks(self) -> PartitionTasks:
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        return tasks

    def _new_consumer_thread(self) -> ExactlyOnceConsumerThread:
        return ExactlyOnceConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        # A copy of the active set: emptied by a pause mid-fetch, aiokafka read it as "all" and
        # standbys lost records (docs/faust-gaps.md, 21). Waits no longer than a broker fetch.
        conf = settings()
        wait = conf.quiet_fetch_max_wait_seconds if self._quiet else conf.fetch_max_wait_seconds
        timeout = min(timeout, wait)
        if active_partitions is None:
            fetched = await super()._getmany(None, timeout)
        else:
            requested = set(active_partitions)
            if not requested:
                return {}
            fetched = await super()._getmany(requested, timeout)
        self._note_fetched(bool(fetched), conf)
        if not fetched or not self.tasks.in_runs:
            return fetched
        return in_runs(fetched, self.tasks.in_runs, settings().max_run_records)

    def _note_fetched(self, records: bool, conf: Settings) -> None:
        # A second without records and fetches wait longer at the broker: a quiet worker's
        # fetch loop turned 100 times a second. A fetch waiting there still answers at
        # the first record of any partition it asks for, so only a partition resumed
        # meanwhile waits (up to the quiet wait).
        now = time.monotonic()
        if records:
            self._records_at = now
            if self._quiet:
                self._quiet = False
                self._set_fetch_wait(conf.fetch_max_wait_seconds)
        elif not self._quiet and now - self._records_at >= QUIET_AFTER_SECONDS:
            self._quiet = True
            self._set_fetch_wait(conf.quiet_fetch_max_wait_seconds)

    def _set_fetch_wait(self, seconds: float) -> None:
        internals.set_fetch_wait(internals.client_consumer(self._thread), seconds)

    def ack(self, message: Any) -> bool:
        acked: bool = super().ack(message)
        if acked and not self._acked_since_commit.is_set():
            self._acked_since_commit.set()
        return acked

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        # faust hands each record over with four tasks and an asyncio.wait; eager.py runs the
        # hand-over at once and falls back to faust's way when it has to wait.
        if not (
            timeout is None
            and len(coros) == 2
            and all(isinstance(coro, Coroutine) for coro in coros)
            and internals.flow_running(self)
        ):
            return await super().wait_first(*coros, timeout=timeout)
        handover, flow_suspended = coros
        started = eager.start(handover)
        if started.rest is not None:
            return await super().wait_first(started.rest, flow_suspended)
        flow_suspended.close()
        # One turn of the loop per record, as faust's way took: handing over a whole fetch at once
        # held the loop, and every commit's round trips with it.
        await asyncio.sleep(0)
        return WaitResults([handover], [started.result], False)

    async def verify_all_partitions_active(self) -> None:
        # A look at each partition, a turn of the loop each: 0.9 ms of the event loop.
        now = time.monotonic()
        if now - self._livelock_checked_at >= LIVELOCK_CHECK_SECONDS:
            self._livelock_checked_at = now
            await super().verify_all_partitions_active()

    async def _commit_tps(self, tps: Any, start_new_transaction: bool) -> bool:
        if not tps:  # nothing acked since the last commit
            return False
        faust_commit = super()._commit_tps

        async def commit_offsets(tps: list[TP]) -> bool:
            committed: bool = await faust_commit(tps, start_new_transaction)
            return committed

        return await commit.commit_partitions(self.app, self, list(tps), commit_offsets)

    @Service.task
    async def _commit_handler(self) -> None:
        # In place of faust's, which commits on a clock: a commit as soon as something is
        # acked, the one before has ended and the commit interval has passed since that one
        # began. What a step makes waits half an interval and a commit on average (one
        # transaction, however many partitions); a commit that takes longer than the
        # interval delays the next, and more records go into each. With nothing acked
        # there is nothing to commit: a quiet worker does not turn this loop.
        acked = self._acked_since_commit
        while not self.should_stop:
            if not acked.is_set():
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(acked.wait(), ACK_WAIT_SECONDS)
                continue  # and look at should_stop again
            acked.clear()  # before the commit: what it does not take sets it again
            began = time.monotonic()
            await self.commit()
            if internals.pending_acks(self):
                # Acked but not taken (a commit in flight took its acks before them, or a
                # gap below them): the next turn tries again, as a quiet input may ack
                # nothing more to wake it.
                acked.set()
            await self.sleep(max(0.0, began + self.commit_interval - time.monotonic()))

    @Service.task
    async def _stall_watchdog(self) -> None:
        # A step or commit past the transaction timeout has had its transaction aborted, and holds
        # its partition for ever: crash, and restart (docs/faust-gaps.md, 25).
        limit = settings().transaction_timeout_seconds
        while not self.should_stop:
            await asyncio.sleep(min(5.0, limit / 4))  # stop cancels it
            stalled = self.tasks.stalled(time.monotonic(), limit)
            if stalled:
                error = Stalled(f"{', '.join(stalled)}: not ended after {limit:.0f} s")
                log.error("%s; crashing the worker", error)
                await self.app.crash(error)
                return

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        await commit.before_transactions_commit(
            self.app, self.tasks, self.assignment(), offsets, start_new_transaction
        )
        committed: bool = await super()._commit_offsets(offsets, start_new_transaction)
        return committed

    async def _close_steps(self) -> None:
        self.tasks.closing = True
        await self.tasks.steps_done()

    async def commit_and_end_transactions(self) -> None:
        # On stop faust commits and ends the transactions, then later commits
        # again; a step acked in between would meet a producer with no transaction.
        await self._close_steps()
        for hook in self.tasks.revoke_hooks:
            await hook(set(self.assignment()))  # delivery: let calls in flight be logged
        try:
            # Not faust's commit(), which skips when a commit is in flight: what that
            # one's steps held would then wait in an open transaction for the broker to
            # abort it, and be processed again after the restart.
            await self.force_commit(start_new_transaction=False)
        except IllegalOperation as exc:
            # faust's second commit on stop can find offsets of a transaction already
            # ended. No record was sent for them; left uncommitted, they are read again
            # (docs/faust-gaps.md, 12).
            log.warning("on stop, offsets left uncommitted: %s", exc)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        await self._close_steps()
        # Commit what was acked before faust forgets it; otherwise those events
        # are processed again while their outputs are still in an open transaction.
        # On stop faust has already committed and ended the transactions itself.
        if self.in_transaction and revoked and not self.should_stop:
            await self.force_commit(revoked)
            await self._retire_transaction_producers(revoked)
        for hook in self.tasks.revoke_hooks:
            await hook(revoked)
        self.tasks.revoked(revoked)
        self._resume_after_seek -= revoked
        self._resume_with_flow -= revoked
        self._resume_when_open -= revoked
        self.last_read.release(revoked)
        await super().on_partitions_revoked(revoked)

    async def _retire_transaction_producers(self, revoked: set[TP]) -> None:
        # A producer kept for a partition that comes back was fenced meanwhile by its other owner:
        # everything acked is committed, so start afresh (docs/faust-gaps.md, 15).
        transactions: Any = self.transactions  # ConcurrentTransactionManager
        await transactions._stop_transactions(
            sorted({partition_transactional_id(self.app, tp) for tp in revoked})
        )

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        missing = self.tasks.changelogs_missing(self.app.assignor.assigned_actives())
        if missing:
            # Before faust takes the assignment on: no step of it runs. A restart
            # joins again, with the changelogs declared and seen first (application.py).
            self.tasks.closing = True
            await self.app.crash(ChangelogsNotAssigned(missing))
            return
        self.tasks.assigned(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

    async def position(self, tp: TP) -> int | None:
        # Only faust's recovery asks, to take a restore as complete: not while committed records
        # after the last one applied exist; fetch those again (docs/faust-gaps.md, 27).
        position: int | None = await super().position(tp)
        applied, highwater = internals.restore_offsets(cast(Any, self.app.tables).recovery, tp)
        if position is None or applied is None or highwater is None or position < highwater:
            return position
        if not await committed_records_between(settings(), tp, applied + 1, highwater):
            return position
        log.warning(
            "restore of %s: committed changelog records after %d were fetched but never"
            " applied; fetching them again",
            tp,
            applied,
        )
        await self.seek(tp, applied + 1)
        return applied + 1

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        # Stream partitions resume only when the flow resumes after the seek to the committed
        # offsets: records fetched in between were dropped for good (docs/faust-gaps.md, 14).
        tps = set(tps)
        streams = {tp for tp in tps if not internals.is_changelog(self, tp)}
        self._resume_after_seek.update(streams)
        super().resume_partitions(tps - streams)

    async def seek_back(self, tp: TP, offset: int) -> None:
        """Fetch a stream partition again from `offset`, which records fetched before
        cannot move faust's last-read offset past (internals.LastReadOffsets)."""
        await self.seek(tp, offset)
        self.last_read.hold(tp, offset)

    async def perform_seek(self) -> None:
        self.last_read.release(self.assignment())
        await super().perform_seek()
        assignment = self.assignment()
        for tp in assignment:
            committed = internals.committed_offset(self, tp)
            if not committed and not internals.is_changelog(self, tp):
                # aiokafka seeks only partitions committed above 0 (docs/faust-gaps.md, 18).
                await self.seek(tp, 0)
            task = self.tasks.get(tp)
            if task is not None:
                task.offsets.sought_to_committed(committed or 0)
        self._resume_with_flow.update(self._resume_after_seek & assignment)
        self._resume_after_seek.clear()
        log.info("stream partitions sought to committed offsets")

    def resume_flow(self) -> None:
        super().resume_flow()
        if self._resume_with_flow:
            resuming = self._resume_with_flow
            handoff = self.tasks.handoff
            if not handoff.all_open():
                # Their records would be handed to keyed partitions that have not read what
                # came before: held, without holding up the records those must read.
                held = {tp for tp in resuming if tp.topic in handoff.giving}
                self._resume_when_open |= held
                resuming -= held
            super().resume_partitions(resuming)
            self._resume_with_flow = set()

    def _resume_handing(self) -> None:
        if self._resume_when_open:
            super().resume_partitions(self._resume_when_open)
            self._resume_when_open = set()

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        # `_new_offset` does not read faust's gaps; keeping them cost an interval tree per run.
        return None

    def _new_offset(self, tp: TP) -> int | None:
        # Where processing has reached in offset order (offset_order.py); faust's acks and gaps
        # went wrong three ways (docs/faust-gaps.md, 13, 14 and 19).
        task = self.tasks.get(tp)
        # (Never with steps held: their records are in no transaction yet.)
        reached = task.offsets.next if task is not None and not task.broken else None
        if reached is None:
            return None
        internals.forget_acks_below(self, tp, reached)
        committed = internals.committed_offset(self, tp)
        return reached if reached > (committed or 0) else None
