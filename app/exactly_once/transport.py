"""faust's aiokafka transport with the exactly-once consumer (consumer.py), a producer
that commits an assignment's transactions together, and one transaction per input
partition whose commit follows commit.py (docs/exactly-once.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from weakref import WeakSet

from aiokafka import AIOKafkaProducer
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app.exactly_once import commit, internals
from app.exactly_once.consumer import ExactlyOnceConsumer
from app.settings import settings

log = logging.getLogger(__name__)


class ExactlyOnceProducer(faust_aiokafka.Producer):
    def _new_producer(self, transactional_id: str | None = None) -> AIOKafkaProducer:
        # Every producer faust makes: the plain one and one per transaction.
        producer: AIOKafkaProducer = super()._new_producer(transactional_id)
        internals.track_known_topics(producer)
        return producer

    async def commit_transactions(
        self,
        tid_to_offset_map: Mapping[str, Mapping[TP, int]],
        group_id: str,
        start_new_transaction: bool = True,
    ) -> None:
        # The partitions' transactions are independent: commit them together rather than one
        # after the other under their locks; all are tried before the first error is raised.
        commit = super().commit_transactions
        results = await asyncio.gather(
            *(
                commit({tid: offsets}, group_id, start_new_transaction=start_new_transaction)
                for tid, offsets in tid_to_offset_map.items()
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _settings_extra(self) -> Mapping[str, Any]:
        # How long a silent (stopped, partitioned) worker's transaction may stay
        # open before the broker aborts it; faust leaves aiokafka's 60 s.
        timeout_ms = int(settings().transaction_timeout_seconds * 1000)
        return {**super()._settings_extra(), "transaction_timeout_ms": timeout_ms}


class ConcurrentTransactionManager(TransactionManager):
    # One transaction per input partition, not per partition number of a topic group, so that
    # a stage commits on its own (handoff commits). Must match outbox.transactional_id.
    transactional_id_format = "{group_id}-{tpg.topic}-{tpg.partition}"

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
        started = list(tids)
        await asyncio.gather(*(self.producer.maybe_begin_transaction(tid) for tid in started))
        for tid in started:
            self._crash_when_producer_tasks_fail(tid)

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
