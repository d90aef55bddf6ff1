from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from app.exactly_once.partition_tasks import PartitionTasks
from app.faust_app import app


@pytest.fixture
def own_tasks(monkeypatch: pytest.MonkeyPatch) -> PartitionTasks:
    """A registry of partition tasks for this test alone."""
    tasks = PartitionTasks()
    monkeypatch.setattr(app, "partition_tasks", tasks)
    return tasks


async def _delivered() -> None:
    return None


class FakeTransactionalProducer:
    """What faust needs of an aiokafka producer to begin and stop a transaction."""

    def __init__(self) -> None:
        self.began = 0
        self.stopped = False
        # aiokafka's sender and client: their routines' tasks, from the start
        self._sender = SimpleNamespace(sender_task=None)
        self.client = SimpleNamespace(_sync_task=None)
        # what a commit touches of its accumulator and transaction manager (internals)
        self._message_accumulator = SimpleNamespace(flush_for_commit=_delivered)
        self._txn_manager = SimpleNamespace(
            txn_partitions=set(), partitions_to_add=set, maybe_add_partition_to_txn=set().add
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._sender.sender_task = loop.create_future()
        self.client._sync_task = loop.create_future()

    async def begin_transaction(self) -> None:
        self.began += 1

    async def stop(self) -> None:
        self.stopped = True


class Transactions:
    """Transactions begun through faust's own producer, on fake aiokafka producers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.began: list[str] = []
        self._next: FakeTransactionalProducer | None = None
        producer: Any = app.producer
        monkeypatch.setattr(producer, "_new_producer", lambda **_: self._next)
        monkeypatch.setattr(producer, "_ensure_producer", lambda: None)

    async def begin(self, tid: str) -> FakeTransactionalProducer:
        fake = self._next = FakeTransactionalProducer()
        await app.producer.begin_transaction(tid)
        self.began.append(tid)
        return fake

    def close(self) -> None:
        for tid in self.began:
            faust_aiokafka.Producer._transaction_producers.pop(tid, None)
            faust_aiokafka.Producer._trn_locks.pop(tid, None)


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Transactions]:
    opened = Transactions(monkeypatch)
    yield opened
    opened.close()
