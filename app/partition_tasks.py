"""Partition tasks: one per partition assigned to this worker, created on assignment
and dropped on revocation (app/consumer.py keeps the registry up to date).

A task owns where processing of its partition stands (`offsets`), its outbox, the
table writes of its current step (`writes`), and what the agent that consumes it keeps
for the partition (its `processor`: ingest's event-time progress, pairing's rule engine
over its state). The registry holds what the tasks share: the lock between steps and
commits, the closing gate of a rebalance or stop, the table writes not yet committed
(`local_state`), the commit hooks, and the worker's stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from faust.types import TP

from app.local_state import LocalState, StepWrites
from app.outbox import Outbox, Record
from app.progress import Progress
from app.stats import Stats

P = TypeVar("P")


class PartitionTask:
    __slots__ = ("_processor", "offsets", "outbox", "tp", "writes")

    def __init__(self, tp: TP, local_state: LocalState) -> None:
        self.tp = tp
        self.offsets = Progress()
        self.outbox = Outbox()
        self.writes = StepWrites(tp, local_state)
        self._processor: object | None = None

    def processor(self, kind: type[P], create: Callable[[PartitionTask], P]) -> P:
        """The agent's processor of this partition, created on first use."""
        found = self.loaded(kind)
        if found is None:
            found = create(self)
            self._processor = found
        return found

    def loaded(self, kind: type[P]) -> P | None:
        processor = self._processor
        return processor if isinstance(processor, kind) else None


class PartitionTasks:
    def __init__(self) -> None:
        self._by_tp: dict[TP, PartitionTask] = {}
        # Held by a step from its first send until its ack, and by every commit from
        # choosing offsets until the transaction is committed.
        self.commit_lock = asyncio.Lock()
        # True from the start of a revocation or a stop until the next assignment. A
        # record delivered meanwhile belongs to the assignment being given up: it is
        # not processed, since its transaction would be aborted (or, on stop, already
        # ended) while its RocksDB writes stayed; the next assignment consumes it again
        # from the committed offset.
        self.closing = False
        self.local_state = LocalState()
        # Per input topic: the records each of its partitions adds to its transaction
        # just before a commit (ingest: the partition's event-time progress).
        self.commit_hooks: dict[str, Callable[[PartitionTask], list[Record]]] = {}
        # Told after each commit which offsets it committed (delivery waits for them).
        self.commit_listeners: list[Callable[[dict[TP, int]], None]] = []
        # Awaited on revocation, after the last commit and before the tasks go.
        self.revoke_hooks: list[Callable[[set[TP]], Awaitable[None]]] = []
        self.stats = Stats()
        # Set once the tables of the current assignment are restored (faust's rebalance
        # complete); until then a table read outside a step may see old or no state.
        self.restored = asyncio.Event()

    def assigned(self, tps: set[TP]) -> None:
        self.closing = False
        self.restored.clear()
        for tp in tps:
            if tp not in self._by_tp:
                self._by_tp[tp] = PartitionTask(tp, self.local_state)

    def revoked(self, tps: set[TP]) -> None:
        # A new assignment starts from the committed offset; anything after it that
        # was not committed was aborted, and must be processed again.
        self.restored.clear()
        self.local_state.revoked(tps)
        for tp in tps:
            self._by_tp.pop(tp, None)

    def get(self, tp: TP) -> PartitionTask | None:
        return self._by_tp.get(tp)

    def __iter__(self) -> Iterator[PartitionTask]:
        # A copy: callers await between tasks, and a rebalance may come in between.
        return iter(list(self._by_tp.values()))

    def before_commit(self, topic: str, records: Callable[[PartitionTask], list[Record]]) -> None:
        self.commit_hooks[topic] = records
