"""Exactly-once steps on top of faust-streaming's transactions.

faust-streaming 0.15 opens one transactional producer per source partition and
commits consumed offsets into it, but (docs/exactly-once.md has the details):
  * a `topic.send` picks the transaction by the *destination* partition, and a
    sink topic the app does not consume is sent outside any transaction;
  * table changelog writes go through a buffer that the commit does not flush;
  * the periodic commit can run between two sends of one event;
  * a rebalance throws away acked-but-uncommitted offsets while the
    transaction holding their outputs stays open.
So every record an event causes (outputs, re-keyed events, changelog writes)
is sent here, into the transaction of the event's *source* partition, and the
event is acked in the same critical section. Commits take the same lock, so a
transaction always holds every record of an event together with its offset,
or none of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalOperation
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT, EventT

from app.progress import Progress, Verdict
from app.settings import settings
from app.stats import stats

log = logging.getLogger(__name__)

# Held by an agent from the first send of an event until its ack, and by every
# commit from choosing offsets until the transaction is committed.
_processing = asyncio.Lock()

# Per input partition assigned here: what has been processed (see app.progress).
_progress: dict[TP, Progress] = {}

# True from the start of a revocation or a stop until the next assignment. A
# record delivered meanwhile belongs to the assignment being given up: it is not
# processed, since its transaction would be aborted (or, on stop, already ended)
# while its RocksDB writes stayed; the next assignment consumes it again from the
# committed offset.
_closing = False

# Set when a step wrote state but was cut off before its records were sent and
# acked: local tables then hold writes that no transaction will commit.
_interrupted_steps = 0


Record = tuple[str, bytes | None, bytes | None, int | None]  # topic, key, value, partition

# Per input topic: the records each of its partitions adds to its transaction just
# before a commit (ingest: the partition's event-time progress). Set at import.
_before_commit: dict[str, Callable[[TP], list[Record]]] = {}


def before_commit(topic: str, records: Callable[[TP], list[Record]]) -> None:
    _before_commit[topic] = records


def local_state_is_committed() -> bool:
    return _interrupted_steps == 0


class ExactlyOnceConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        # faust reads aiokafka's cached last stable offset, which is None until
        # the first fetch; it then takes -1 as the end of a changelog and skips
        # recovery, or crashes with ConsistencyError. Ask the broker instead: with
        # read_committed, ListOffsets answers the last stable offset.
        offsets: Mapping[TP, int] = await self._ensure_consumer().end_offsets(partitions)
        return offsets


class ExactlyOnceConsumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Stream partitions faust asked to resume: held paused until they are sought
        # to the committed offsets, then until the flow resumes (resume_partitions).
        self._resume_after_seek: set[TP] = set()
        self._resume_with_flow: set[TP] = set()

    def _new_consumer_thread(self) -> ExactlyOnceConsumerThread:
        return ExactlyOnceConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _commit_tps(self, tps: Any, start_new_transaction: bool) -> bool:
        async with _processing:
            tps = list(tps)
            before = {tp: self._committed_offset.get(tp) for tp in tps}
            result: bool = await super()._commit_tps(tps, start_new_transaction)
            if result:
                moved = [tp for tp in tps if self._committed_offset.get(tp) != before[tp]]
                stats.committed(moved, time.time())
            return result

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        # Called under `_processing` with the offsets about to be committed. Records
        # added here ride in the same transaction; only for partitions still assigned,
        # as faust discards the commit of the others (records sent for them would keep
        # a transaction open until the broker aborts it).
        assignment = self.assignment()
        for tp in offsets:
            hook = _before_commit.get(tp.topic)
            records = hook(tp) if hook is not None and tp in assignment else []
            if records:
                await _send_in_transaction(self.app, tp, records)
        committed: bool = await super()._commit_offsets(offsets, start_new_transaction)
        return committed

    async def _close_steps(self) -> None:
        global _closing
        _closing = True
        # No step starts from here on, and every step already started holds or
        # awaits `_processing` (a step does not yield between its start and the
        # lock): passing the lock once lets them all finish.
        async with _processing:
            pass

    async def commit_and_end_transactions(self) -> None:
        # On stop faust commits and ends the transactions, then later commits
        # again; a step acked in between would meet a producer with no transaction.
        await self._close_steps()
        try:
            await super().commit_and_end_transactions()
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
        for tp in revoked:
            # A new assignment starts from the committed offset; anything after
            # it that was not committed was aborted, and must be processed again.
            _progress.pop(tp, None)
        self._resume_after_seek -= revoked
        self._resume_with_flow -= revoked
        await super().on_partitions_revoked(revoked)

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
        recovery = cast(Any, self.app.tables).recovery
        applied: int | None = recovery.active_offsets.get(tp)
        highwater: int | None = recovery.active_highwaters.get(tp)
        if position is None or applied is None or highwater is None or position < highwater:
            return position
        if not await _committed_records_between(tp, applied + 1, highwater):
            return position
        log.warning(
            "restore of %s: committed changelog records after %d were fetched but never"
            " applied; fetching them again",
            tp,
            applied,
        )
        await self.seek(tp, applied + 1)
        return applied + 1

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        # faust passes the offset of the record that ends the gap as the gap's last
        # offset. That record is then counted as acked before it is processed, and,
        # acked again, it is a duplicate that cuts the run of offsets a commit may
        # take: each commit passed one transaction marker at most, and on a
        # transactional input the committed offset fell thousands behind.
        await super()._add_gap(tp, offset_from, offset_to - 1)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        # At the end of a recovery faust resumes the stream partitions, seeks them to
        # the committed offsets, and then clears the agents' buffers (the flow control
        # resume). Records fetched before the seek come from wherever the fetcher
        # stood; records fetched between the seek and the clearing are thrown away
        # while faust's last-read offset has moved past them, so they are never
        # delivered again. Stream partitions are therefore resumed only when the
        # flow resumes after the seek (resume_flow).
        tps = set(tps)
        streams = {tp for tp in tps if not self._is_changelog_tp(tp)}
        self._resume_after_seek.update(streams)
        super().resume_partitions(tps - streams)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        assignment = self.assignment()
        for tp in assignment:
            committed = self._committed_offset.get(tp)
            _progress.setdefault(tp, Progress()).sought_to_committed(committed or 0)
        self._resume_with_flow.update(self._resume_after_seek & assignment)
        self._resume_after_seek.clear()
        log.info("stream partitions sought to committed offsets")

    def resume_flow(self) -> None:
        super().resume_flow()
        if self._resume_with_flow:
            super().resume_partitions(self._resume_with_flow)
            self._resume_with_flow.clear()

    def _new_offset(self, tp: TP) -> int | None:
        offset: int | None = super()._new_offset(tp)
        progress = _progress.get(tp)
        limit = progress.next if progress is not None else None
        if offset is not None and (limit is None or offset > limit):
            # Never seen; it would commit records no step of this assignment processed.
            log.error("commit of %s at %d refused: processed only up to %s", tp, offset, limit)
            committed = self._committed_offset.get(tp)
            return limit if limit is not None and limit > (committed or 0) else None
        return offset

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        global _closing
        _closing = False
        await super().on_partitions_assigned(assigned, generation_id)


async def _committed_records_between(tp: TP, first: int, last: int) -> bool:
    """Whether a read_committed consumer finds a record in offsets first..last."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings().bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        partition = TopicPartition(tp.topic, tp.partition)
        consumer.assign([partition])
        consumer.seek(partition, first)
        deadline = time.monotonic() + 30
        while await consumer.position(partition) <= last:
            if time.monotonic() > deadline:
                return True  # unknown: do not let the restore end on a guess
            batch = await consumer.getmany(partition, timeout_ms=500)
            if any(record.offset <= last for record in batch.get(partition, ())):
                return True
        return False
    finally:
        await consumer.stop()


class ExactlyOnceProducer(faust_aiokafka.Producer):
    def _settings_extra(self) -> Mapping[str, Any]:
        # How long a silent (stopped, partitioned) worker's transaction may stay
        # open before the broker aborts it; faust leaves aiokafka's 60 s.
        timeout_ms = int(settings().transaction_timeout_seconds * 1000)
        return {**super()._settings_extra(), "transaction_timeout_ms": timeout_ms}


class ExactlyOnceTransport(faust_aiokafka.Transport):
    Consumer = ExactlyOnceConsumer
    Producer = ExactlyOnceProducer


class DeliveryFailed(RuntimeError):
    pass


class Step:
    """The records one event causes, sent together with its ack, and what the
    event counted as (counted only once it is acked)."""

    __slots__ = ("counts", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.counts: Counter[str] = Counter()

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        self.records.append((topic, key, value, partition))

    def send_all(self, records: list[Record]) -> None:
        self.records.extend(records)

    def count(self, name: str) -> None:
        self.counts[name] += 1


async def events_once(app: AppT, stream: Any) -> AsyncIterator[EventT[Any]]:
    """The stream's events, each offset once and in order per assignment, acked by
    `exactly_once`.

    Skipped, and never acked (an ack would let a commit pass their offset):
      * records of an assignment being revoked or stopped (see `_closing`), or that
        arrive while tables are being restored, or before the partition has been
        sought to its committed offset: all are delivered again after the seek;
      * records at or before one already processed in this assignment, or below the
        committed offset: faust delivers the last-read record again when its fetcher
        restarts (its check is `offset >= last read`); processed again, their
        outputs would commit twice;
      * a record delivered while an earlier delivered one is still unprocessed, or the
        first after a seek when committed records it leaves out were never delivered
        (`_check_jump`): the partition is sought back to the first unprocessed offset.
    The agent's body must not await before `exactly_once` takes its lock.
    """
    consumer = cast(Any, app.consumer)
    async for event in stream.noack().events():
        message = event.message
        tp = message.tp
        progress = _progress.setdefault(tp, Progress())
        reason: str
        if _closing:
            reason = "closing"
        elif app.in_recovery:
            reason = "recovering"
            progress.skipped(message.offset)
        else:
            verdict = progress.verdict(message.offset)
            if verdict is Verdict.PROCESS and progress.jumps_from_seek(message.offset):
                verdict = await _check_jump(tp, progress, message.offset)
            if verdict is Verdict.PROCESS:
                yield event
                continue
            reason = verdict.value
            if verdict is not Verdict.REDELIVERED:
                progress.skipped(message.offset)
            if verdict is Verdict.OUT_OF_ORDER and progress.next is not None:
                # Again for every such record: records fetched before a seek still pass
                # faust's fetcher after it, moving its last-read offset past the sought
                # one, and it drops what it reads below that.
                await consumer.seek(tp, progress.next)
        log.warning("skipped %s record %s@%d", reason, tp, message.offset)
        stats.count(f"skipped_{reason}")
        # Only faust's in-flight set holds it; `wait_empty` waits for that set.
        message.acked = True
        consumer._unacked_messages.discard(message)


async def _check_jump(tp: TP, progress: Progress, offset: int) -> Verdict:
    sought = cast(int, progress.next)
    if not await _committed_records_between(tp, sought, offset - 1):
        return Verdict.PROCESS  # markers and aborted records only
    log.error(
        "%s: committed records %d..%d were fetched and never delivered; seeking back",
        tp,
        sought,
        offset - 1,
    )
    return Verdict.OUT_OF_ORDER


def transactional_id(app: AppT, tp: TP) -> str:
    """faust's id for the producer whose transaction carries tp's offsets."""
    return f"{app.conf.id}-{app.assignor.group_for_topic(tp.topic)}-{tp.partition}"


@asynccontextmanager
async def exactly_once(app: AppT, event: EventT[Any]) -> AsyncIterator[Step]:
    """Collect an event's records; on a clean exit send them into the event's
    transaction and ack the event, with no commit in between."""
    global _interrupted_steps
    step = Step()
    completed = False
    try:
        yield step
        tp = event.message.tp
        async with _processing:
            await _send_in_transaction(app, tp, step.records)
            event.ack()
            _progress[tp].processed(event.message.offset)
        stats.processed(tp, step.counts, time.time())
        completed = True
    finally:
        if not completed:
            _interrupted_steps += 1


async def _send_in_transaction(app: AppT, tp: TP, records: list[Record]) -> None:
    """Send into the open transaction that carries tp's offsets. The caller holds
    `_processing`, so no commit comes in between."""
    tid = transactional_id(app, tp)
    producer = faust_aiokafka.Producer._transaction_producers.get(tid)
    if producer is None:
        # Sending without the transaction would break exactly-once: stop instead.
        raise DeliveryFailed(f"no open transaction {tid} for {tp}")
    async with faust_aiokafka.Producer._trn_locks[tid]:
        for topic, key, value, partition in records:
            delivery = await producer.send(topic, value, key=key, partition=partition)
            delivery.add_done_callback(_crash_on_failure(app))


async def caught_up(app: AppT, tp: TP) -> bool:
    """Whether everything in an input partition has been fetched, processed and
    committed: nothing of it is on its way."""
    consumer = cast(Any, app.consumer)
    progress = _progress.get(tp)
    highwater: int | None = consumer.highwater(tp)
    if progress is None or progress.next is None or progress.unprocessed or highwater is None:
        return False
    committed = consumer._committed_offset.get(tp) or 0
    position: int | None = await consumer.position(tp)
    return position is not None and position >= highwater and committed >= progress.next


def _crash_on_failure(app: Any) -> Any:
    def check(delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is not None:
            # The transaction cannot commit; crash so it aborts and replays.
            app.add_future(app.crash(DeliveryFailed(str(delivery.exception()))))

    return check
