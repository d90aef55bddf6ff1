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
        # faust commits an assignment's transactions one after the other, three round
        # trips each (offsets, offset commit, end), while the partitions' locks hold
        # their steps. They are independent (each commits only its own partition's records
        # and offsets), so commit them together; all are tried before an error is
        # raised, as faust's loop would have raised the first one.
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
    # faust's id names the partition's topic group, so the same partition number of
    # every input topic with that partition count (ingest's events and pairing's keyed
    # events) shared one transaction: a commit of one stage's partitions committed the
    # other's records too, without their offsets. One transaction per input partition
    # lets a stage commit on its own (handoff commits); it must match
    # app.outbox.transactional_id.
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
        # A producer's sender routine ends on an error it does not expect (a broker
        # answered TxnOffsetCommit with UNKNOWN_SERVER_ERROR after a hard bounce, its
        # group coordinator out of sync): aiokafka then fails the producer's batches,
        # but a commit waiting on the transaction waited for ever, and the worker hung
        # with its partitions. So can its metadata synchronizer: a produce retry then
        # waits for a metadata update nothing runs (a worker stalled 11 minutes after a
        # hard bounce, with 26 producer senders and 25 synchronizers; docs/
        # exactly-once.md, point 25). Crashed, it is restarted and its transactions abort.
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
