"""faust's aiokafka transport with the exactly-once consumer (consumer.py), a producer
whose transactions commit offsets as a member of the consumer group, and one transaction
for all of a worker's partitions, whose commit follows commit.py (docs/exactly-once.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast
from weakref import WeakSet

from aiokafka import AIOKafkaProducer
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app.exactly_once import commit, internals
from app.exactly_once.consumer import ExactlyOnceConsumer
from app.exactly_once.outbox import PARTITION_TRANSACTIONAL_ID
from app.exactly_once.partition_tasks import PartitionTasks
from app.settings import settings

log = logging.getLogger(__name__)
# A transaction's commit right after the one before it is answered CONCURRENT_TRANSACTIONS
# until the broker has written that one's markers (a few ms here), and aiokafka retries the
# offsets and the end after this backoff: at its 100 ms, one commit in ten took over 100 ms
# (10,000 events/s, a commit every 0.05 s: p90 113 ms); at 20 ms, p90 39 ms.
RETRY_BACKOFF_MS = 20
# The first AddPartitionsToTxn of the transaction after a commit meets the same answer;
# commits come back to back, and at aiokafka's 20 ms that retry was most of the time
# between two (docs/exactly-once.md). The offsets' commit meets COORDINATOR_LOAD_IN_PROGRESS
# then (2% of commits at 10,000 events/s), and the same short retry took its p99 from 21 ms
# to 7 ms.
CONCURRENT_TRANSACTIONS_RETRY_SECONDS = 0.005


class ExactlyOnceProducer(faust_aiokafka.Producer):
    def _new_producer(self, transactional_id: str | None = None) -> AIOKafkaProducer:
        # Every producer faust makes: the plain one and the transactional ones.
        producer: AIOKafkaProducer = super()._new_producer(transactional_id)
        internals.retry_concurrent_transactions_after(CONCURRENT_TRANSACTIONS_RETRY_SECONDS)
        internals.track_known_topics(producer)
        if transactional_id is not None:
            consumer = self.app.consumer
            internals.commit_offsets_as_member(
                producer,
                lambda: internals.group_member(consumer),
                CONCURRENT_TRANSACTIONS_RETRY_SECONDS,
            )
        return producer

    def _settings_extra(self) -> Mapping[str, Any]:
        # How long a silent (stopped, partitioned) worker's transaction may stay
        # open before the broker aborts it; faust leaves aiokafka's 60 s.
        timeout_ms = int(settings().transaction_timeout_seconds * 1000)
        return {
            **super()._settings_extra(),
            "transaction_timeout_ms": timeout_ms,
            "retry_backoff_ms": RETRY_BACKOFF_MS,
        }


class ConcurrentTransactionManager(TransactionManager):
    """One transactional producer per active input partition, as faust has it (its id:
    outbox.partition_transactional_id), so that a worker taking a partition over
    aborts at once the open transaction of the partition's previous owner, if that one
    died or hangs. The worker's steps and commits use one of them only, the first of its
    assignment (`PartitionTasks.transactional_id`): a commit is one transaction for all
    the worker's partitions, whatever their number. Offsets go in as a member of the
    group (app/kafka/txn_offset_commit.py), which fences a worker that lost its
    partitions."""

    transactional_id_format = PARTITION_TRANSACTIONAL_ID

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watched_tasks: WeakSet[asyncio.Task[Any]] = WeakSet()

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        return await commit.end_transactions(
            self.app, self.producer, offsets, start_new_transaction
        )

    async def _start_transactions(self, tids: Iterable[str]) -> None:
        # faust starts one transactional producer after the other. After a kill each
        # InitProducerId first has the coordinator abort the dead producer's open
        # transaction (about 0.12 s): 13 in turn took 1.5 s of the recovery. The
        # producers share nothing, and begin_transaction handles its own errors.
        started = sorted(tids)
        await asyncio.gather(*(self.producer.maybe_begin_transaction(tid) for tid in started))
        for tid in started:
            self._crash_when_producer_tasks_fail(tid)
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        tasks.transactional_id = started[0] if started else None

    async def _stop_transactions(self, tids: Iterable[str]) -> None:
        stopped = set(tids)
        tasks: PartitionTasks = cast(Any, self.app).partition_tasks
        if tasks.transactional_id in stopped:
            tasks.transactional_id = None
        await super()._stop_transactions(stopped)

    def _crash_when_producer_tasks_fail(self, tid: str) -> None:
        # A producer's sender or metadata routine that dies leaves its transaction's commit waiting
        # for ever: crash instead, and the restart aborts it (docs/faust-gaps.md, 24 and 25).
        found = internals.transaction_producer(tid)
        if found is None:
            return
        for task in (internals.sender_task(found[0]), internals.metadata_task(found[0])):
            if task is not None and task not in self._watched_tasks:
                self._watched_tasks.add(task)
                task.add_done_callback(self._producer_task_ended)

    def _producer_task_ended(self, task: asyncio.Task[Any]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("a producer's task %s ended: %r; crashing the worker", task, error)
            app: Any = self.app
            app.add_future(app.crash(error))


class ExactlyOnceTransport(faust_aiokafka.Transport):
    TransactionManager = ConcurrentTransactionManager
    Consumer = ExactlyOnceConsumer
    Producer = ExactlyOnceProducer
