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
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalOperation
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from mode import Service
from mode.services import WaitResults

from app.exactly_once import commit, eager, internals, predecessor
from app.exactly_once.commit_schedule import CommitSchedule
from app.exactly_once.outbox import transactional_id
from app.exactly_once.partition_tasks import PartitionTasks
from app.exactly_once.runs import in_runs
from app.kafka.admin import committed_records_between, last_committed_records
from app.settings import settings

log = logging.getLogger(__name__)
UNKNOWN = 1 << 62  # offsets left to process, when not known (counts as a backlog)


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
        # The broker answers one connection's requests in turn, so every offset look-up
        # of a rebalance or a restore waited behind a fetch of quiet partitions, held
        # for faust's fixed 1.5 s: about 3 s of each recovery after a kill. And under a
        # trickle, fetches that return at the first byte kept both of the worker's
        # threads busy with one-record fetches and runs (docs/BENCHMARKS.md).
        internals.set_fetch_limits(
            consumer, settings().fetch_min_bytes, settings().fetch_max_wait_seconds
        )
        internals.stable_offset_look_ups(consumer)
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        internals.hand_on_decoded_records(consumer, tasks.in_runs)
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        # Only faust's recovery asks: how far to restore each changelog partition.
        # faust reads aiokafka's cached last stable offset, which is None until the
        # first fetch; it then takes -1 as the end of a changelog and skips recovery,
        # or crashes with ConsistencyError. So ask the broker (with read_committed,
        # ListOffsets answers the last stable offset). And faust restores up to the
        # offset before that end, which on a transactional changelog is a commit
        # marker, never delivered: each restore then waited for two 5 s idle polls and
        # a probe per partition (16-22 s of a 30-44 s recovery). So answer one past
        # the last committed record, where there is one near the end.
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
        self.last_read = internals.install_last_read_offsets(self)

    @property
    def tasks(self) -> PartitionTasks:
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        return tasks

    def _new_consumer_thread(self) -> ExactlyOnceConsumerThread:
        return ExactlyOnceConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        # faust hands the fetch its live set of active partitions, and the fetch waits
        # up to `timeout` for records. A pause meanwhile (the end of a restore pauses
        # every active changelog partition) can empty that set, which aiokafka takes
        # for "every partition": it returned what it had prefetched for partitions
        # faust had not resumed, standby changelogs among them, and faust dropped those
        # records as not active after aiokafka had moved past them. A standby so missed
        # up to a whole fetch of its changelog (docs/exactly-once.md, point 21).
        # faust waits up to 1 s. A partition whose stream buffer filled is left out of
        # the fetch, and aiokafka fetches nothing new for one whose records it holds, so
        # while that buffer drained in milliseconds the wait ran out its second, with
        # both the worker and the broker idle: 0.7-1 s of a 7 s benchmark run, in 3 runs
        # of 4. No longer than a fetch waits at the broker, then ask again.
        timeout = min(timeout, settings().fetch_max_wait_seconds)
        if active_partitions is None:
            fetched = await super()._getmany(None, timeout)
        else:
            requested = set(active_partitions)
            if not requested:
                return {}
            fetched = await super()._getmany(requested, timeout)
        if not fetched or not self.tasks.in_runs:
            return fetched
        return in_runs(fetched, self.tasks.in_runs, settings().max_run_records)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        # faust's fetch loop (`_drain_messages`) hands each record to the conductor as
        # wait_first(callback(message), self.suspend_flow.wait()): four tasks and an
        # asyncio.wait per record, three of them then cancelled. So the hand-over runs
        # here first; one that has to wait (a full queue), or any while the flow is
        # suspended or the consumer stopping, takes faust's way, and the same
        # rebalance rules apply to it.
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
        # Still one turn of the event loop per record, as faust's way took. Handing
        # over a whole fetch at once held the loop for milliseconds, and every commit's
        # round trips waited behind it: handoff commits took 18 ms instead of 11, under
        # the locks of ingest's partitions, and p99 at 1,160 events/s went from 1.1 s
        # to 1.5-2.6 s.
        await asyncio.sleep(0)
        return WaitResults([handover], [started.result], False)

    async def _commit_tps(self, tps: Any, start_new_transaction: bool) -> bool:
        faust_commit = super()._commit_tps

        async def commit_offsets(tps: list[TP]) -> bool:
            committed: bool = await faust_commit(tps, start_new_transaction)
            return committed

        return await commit.commit_partitions(self.app, self, list(tps), commit_offsets)

    @Service.task
    async def _commit_handler(self) -> None:
        # In place of faust's: commits on the clock, and handoff commits in between
        # (app/exactly_once/commit_schedule.py).
        schedule = CommitSchedule(
            time.monotonic(), self.commit_interval, settings().handoff_interval_seconds
        )
        while not self.should_stop:
            now = time.monotonic()
            due = self.tasks.earliest_commit_due()
            if due is not None:
                due += now - time.time()  # wall clock -> monotonic
            at, everything = schedule.next_after(now, due)
            await self.sleep(at - time.monotonic())
            if self.should_stop:
                break
            if everything:
                await self.commit()
            elif not self.tasks.closing and self.tasks.handoff_due(
                self._unprocessed, settings().max_run_records
            ):
                # Not through commit(): a commit() starting meanwhile (faust's after so
                # many acks) would wait for this one and then skip.
                await self.force_commit(set(self.tasks.handoffs))

    @Service.task
    async def _stall_watchdog(self) -> None:
        # A step or a commit that waits for ever holds its partition for ever: seen after
        # a broker's hard bounce, a produce retry waiting for a metadata update that no
        # task ran any more (docs/exactly-once.md, point 25). Whatever the cause, once
        # it has run past the transaction timeout its transaction is aborted, and only a
        # restart processes the partition again.
        limit = settings().transaction_timeout_seconds
        while not self.should_stop:
            await asyncio.sleep(min(5.0, limit / 4))  # stop cancels it
            stalled = self.tasks.stalled(time.monotonic(), limit)
            if stalled:
                error = Stalled(f"{', '.join(stalled)}: not ended after {limit:.0f} s")
                log.error("%s; crashing the worker", error)
                await self.app.crash(error)
                return

    def _unprocessed(self, tp: TP) -> int:
        """Offsets of tp committed (read_committed: up to its last stable offset, as of
        the last fetch) and not yet processed here."""
        task = self.tasks.get(tp)
        if task is None or task.offsets.next is None or tp not in self.assignment():
            return UNKNOWN
        stable: int | None = self.highwater(tp)
        return 0 if stable is None else stable - task.offsets.next

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
            # The second time, faust sometimes still finds offsets to commit for a
            # transaction the first time ended. Raised, this stopped the consumer's
            # stop half-way and the process hung until SIGKILL. No record can have
            # been sent for those offsets (aiokafka refuses a send outside a
            # transaction); left uncommitted, they are read again after a restart.
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
        self.last_read.release(revoked)
        await super().on_partitions_revoked(revoked)

    async def _retire_transaction_producers(self, revoked: set[TP]) -> None:
        # faust stops the producer of a revoked partition only if the partition is not a
        # standby in the next assignment, and reuses a kept producer when the partition
        # comes back. Meanwhile another worker has initialised the same transactional id,
        # which fences the kept producer: its first send after the partition returns fails
        # and the worker crashes (fault matrix, rebalance with standbys). Everything acked
        # is committed by now, so each comes back as a fresh producer that fences the rest.
        for tid in sorted({transactional_id(self.app, tp) for tp in revoked}):
            await self.app.producer.stop_transaction(tid)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        missing = self.tasks.changelogs_missing(self.app.assignor.assigned_actives())
        if missing:
            # Before faust takes the assignment on: no step of it runs. A restart
            # joins again, with the changelogs declared and seen first (app/faust_app.py).
            self.tasks.closing = True
            await self.app.crash(ChangelogsNotAssigned(missing))
            return
        self.tasks.assigned(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

    async def position(self, tp: TP) -> int | None:
        # Only faust's recovery asks, to decide that everything left of a changelog
        # up to its highwater is aborted transactions: it then takes the restore as
        # complete. It decides so when the fetch position has passed the highwater,
        # but records can be fetched and never handed to the recovery (a seek does
        # not reset faust's last-read filter; a batch is dropped when the flow or
        # generation changes). A fault-matrix run lost 16 pairs, by all signs that
        # way: a worker resumed with committed pending events missing from its table
        # after a restore that ended before any record reached it. So answer
        # "not there yet" while committed records after the last applied one exist,
        # and fetch them again.
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
        # At the end of a recovery faust resumes the stream partitions, seeks them to
        # the committed offsets, and then clears the agents' buffers (the flow control
        # resume). Records fetched before the seek come from wherever the fetcher
        # stood; records fetched between the seek and the clearing are thrown away
        # while faust's last-read offset has moved past them, so they are never
        # delivered again. Stream partitions are therefore resumed only when the
        # flow resumes after the seek (resume_flow).
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
                # aiokafka seeks only partitions whose committed offset is above 0; the
                # others stay where records fetched and dropped during the restore left
                # them, past records never delivered. A delivery worker restarted before
                # its first commit of the delivery log so waited for that log for ever.
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
            super().resume_partitions(self._resume_with_flow)
            self._resume_with_flow.clear()

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        # faust's fetcher reports the offsets it did not deliver (transaction markers,
        # and with runs every offset of a run but its last) for its own commit offset;
        # `_new_offset` below does not read them. Kept, each report cost an interval
        # tree insert and merge and a turn of the event loop: 2.5% of a worker's CPU.
        return None

    def _new_offset(self, tp: TP) -> int | None:
        # A commit takes the offset processing has reached in this assignment: every
        # record before it was processed, in order, or never delivered (transaction
        # markers, aborted records; app/exactly_once/offset_order.py). faust works it out from its
        # acked
        # offsets and the gaps its fetcher saw, which went wrong three ways
        # (docs/exactly-once.md, 13, 14 and 19); the last made commits move one offset
        # at a time, and the partition's next owner processed thousands of records again.
        task = self.tasks.get(tp)
        # (Never with steps held: their records are in no transaction yet.)
        reached = task.offsets.next if task is not None and not task.broken else None
        if reached is None:
            return None
        internals.forget_acks_below(self, tp, reached)
        committed = internals.committed_offset(self, tp)
        return reached if reached > (committed or 0) else None
