"""Partition tasks: one per partition assigned to this worker, created on assignment
and dropped on revocation (consumer.py keeps the registry up to date).

A task owns where processing of its partition stands (`offsets`), its outbox, the
table writes of its current step (`writes`), the locks between its steps and the commits of its
transaction, and what the agent that consumes it keeps for the partition (its
`processor`: ingest's event-time progress, pairing's rule engine over its state).

Steps go on while their partition's transaction commits (`committing`): they are acked,
and their records and table writes wait in the outbox for the next transaction, which
the commit sends them into once it has begun (app/exactly_once/step.py). The
registry holds what the tasks share: the closing gate of a rebalance or stop, the table
writes not yet committed (`local_state`), the commit hooks, and the worker's stats.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from faust.types import TP

from app.exactly_once.handoff import Handoff
from app.exactly_once.local_state import LocalState, StepWrites
from app.exactly_once.offset_order import OffsetOrder
from app.exactly_once.outbox import Outbox, Record
from app.exactly_once.stats import Stats
from pairing.grammar import Sizes

DEFAULT_SIZES = Sizes()

if TYPE_CHECKING:
    from app.exactly_once.stage import Stage

P = TypeVar("P")


class PartitionTask:
    __slots__ = (
        "_processor",
        "broken",
        "commit_lock",
        "commit_since",
        "committing",
        "held",
        "lock",
        "offsets",
        "outbox",
        "sent",
        "step_since",
        "tp",
        "writes",
    )

    def __init__(self, tp: TP, local_state: LocalState, sizes: Sizes = DEFAULT_SIZES) -> None:
        self.tp = tp
        self.offsets = OffsetOrder()
        self.outbox = Outbox(sizes)
        self.writes = StepWrites(tp, local_state, sizes)
        # Held by a step from its start until its ack, and by a commit of this
        # partition while it takes its offset and its before-commit records, and again
        # while it sends the held records.
        self.lock = asyncio.Lock()
        # Held by a commit of this partition from start to end: one at a time.
        self.commit_lock = asyncio.Lock()
        # The transaction is committing with the offset taken: steps are held.
        self.committing = False
        # Records processed by held steps (a run counts its records); 0 outside a
        # commit, unless it failed (`broken`).
        self.held = 0
        # What steps held cannot reach a transaction (a held step or the commit failed;
        # their records are mixed): nothing more of the partition may be committed, and
        # the worker crashes.
        self.broken = False
        # Records sent into the open transaction since the partition's last commit: its
        # table writes commit with it even if its offset did not move (a hand-off).
        self.sent = False
        self._processor: object | None = None
        # Monotonic clock since the step that holds the lock began, and since a commit of
        # the partition began: None when none runs (the stall watchdog reads them).
        self.step_since: float | None = None
        self.commit_since: float | None = None

    def processor(self, kind: type[P], create: Callable[[PartitionTask], P]) -> P:
        """The agent's processor of this partition, created on first use."""
        found = self.loaded(kind)
        if found is None:
            found = create(self)
            self._processor = found
        return found

    def forget_processor(self) -> None:
        """After a step cut off: its writes are in no transaction, so what the processor
        made of them goes too; the next step builds it again from the table."""
        self._processor = None

    def loaded(self, kind: type[P]) -> P | None:
        processor = self._processor
        return processor if isinstance(processor, kind) else None


class PartitionTasks:
    def __init__(self, sizes: Sizes = DEFAULT_SIZES) -> None:
        self._by_tp: dict[TP, PartitionTask] = {}
        self.sizes = sizes
        # From the start of a revocation or a stop until the next assignment: records delivered
        # meanwhile are not processed (their transaction ends); the next owner reads them again.
        self.closing = False
        self.local_state = LocalState()
        # Per input topic: the records each of its partitions adds to its transaction
        # just before a commit (ingest: the partition's event-time progress).
        self.commit_hooks: dict[str, Callable[[PartitionTask], list[Record]]] = {}
        # Input topic -> the topic whose partition task keeps the processor its steps
        # use (enrichment's rows: the pairs'), forgotten with theirs (app/exactly_once/step.py).
        self.processor_topics: dict[str, str] = {}
        # Input topics whose records reach their agent in runs (app/exactly_once/runs.py).
        self.in_runs: dict[str, int | None] = {}  # topic -> its stage's run_records
        # The id of the producer whose transaction carries every partition's offsets and
        # records (transport.ConcurrentTransactionManager); None between assignments.
        self.transactional_id: str | None = None
        # Told after each commit which offsets it committed (delivery waits for them).
        self.commit_listeners: list[Callable[[dict[TP, int]], None]] = []
        # Awaited on revocation, after the last commit and before the tasks go.
        self.revoke_hooks: list[Callable[[set[TP]], Awaitable[None]]] = []
        # Input topic -> the changelogs of the tables its steps read and write: partition
        # p of each must be restored here before a step of partition p runs.
        self.changelogs: dict[str, set[str]] = {}
        self.stats = Stats()
        # What steps hand to the partition tasks of the next stage here (handoff.py).
        self.handoff = Handoff()
        # Set once the tables of the current assignment are restored (faust's rebalance
        # complete); until then a table read outside a step may see old or no state.
        self.restored = asyncio.Event()
        # A commit's `let_steps_go`, due once the commit has run that long (`let_steps_go_after`).
        self._letting_go: asyncio.TimerHandle | None = None

    def state_in(self, topics: Iterable[str], changelog: str) -> None:
        """The steps of `topics` keep state in the table of `changelog`, partitioned
        like them."""
        for topic in topics:
            self.changelogs.setdefault(topic, set()).add(changelog)

    def changelogs_missing(self, actives: set[TP]) -> list[TP]:
        """The changelog partitions `actives` lacks that its input partitions need.
        faust assigns them together, unless the group leader's metadata lacked the
        changelog then: the partitions' steps would run on empty tables, never
        restored, and their outputs would be wrong with nothing to say so."""
        missing = {
            TP(changelog, tp.partition)
            for tp in actives
            for changelog in self.changelogs.get(tp.topic, ())
        }
        return sorted(missing - actives)

    def assigned(self, tps: set[TP]) -> None:
        self.closing = False
        self.restored.clear()
        for tp in tps:
            if tp not in self._by_tp:
                self._by_tp[tp] = PartitionTask(tp, self.local_state, self.sizes)
        self.handoff.assigned(self._by_tp)

    def revoked(self, tps: set[TP]) -> None:
        # A new assignment starts from the committed offset; anything after it that
        # was not committed was aborted, and must be processed again.
        self.restored.clear()
        self.local_state.revoked(tps)
        self.handoff.revoked(tps)
        for tp in tps:
            self._by_tp.pop(tp, None)

    def get(self, tp: TP) -> PartitionTask | None:
        return self._by_tp.get(tp)

    def __iter__(self) -> Iterator[PartitionTask]:
        # A copy: callers await between tasks, and a rebalance may come in between.
        return iter(list(self._by_tp.values()))

    @asynccontextmanager
    async def committing(self, tps: Iterable[TP]) -> AsyncIterator[list[PartitionTask]]:
        """Hold the tasks of `tps` for a commit of them: their commit locks throughout,
        and their step locks except between `let_steps_go` and `stop_steps`. Each kind
        is taken in the same order, and a step holds one step lock only, so two commits
        cannot deadlock."""
        tasks = [task for tp in sorted(set(tps)) if (task := self._by_tp.get(tp)) is not None]
        started = time.monotonic()
        for task in tasks:
            task.commit_since = started
        async with AsyncExitStack() as held:
            held.callback(self._commit_ended, tasks)
            for task in tasks:
                await held.enter_async_context(task.commit_lock)
            for task in tasks:
                await task.lock.acquire()
                held.callback(self._release_steps, task)
            yield tasks

    @staticmethod
    def _commit_ended(tasks: list[PartitionTask]) -> None:
        for task in tasks:
            task.commit_since = None

    def stalled(self, now: float, limit: float) -> list[str]:
        """The steps and commits that have run for more than `limit` seconds (monotonic
        clock `now`). Nothing of their partitions has committed meanwhile, and their
        open transactions are past the broker's timeout: they can only be aborted."""
        found = []
        for task in self._by_tp.values():
            for what, since in (("step", task.step_since), ("commit", task.commit_since)):
                if since is not None and now - since > limit:
                    found.append(f"a {what} of {task.tp.topic}[{task.tp.partition}]")
        return found

    @staticmethod
    def _release_steps(task: PartitionTask) -> None:
        if task.held:  # not sent: the commit failed or was cancelled
            task.broken = True
        if task.committing:  # let go and not taken back: a step may hold the lock now
            task.committing = False
        else:
            task.lock.release()

    def let_steps_go(self) -> None:
        """The worker's transaction is about to commit, with the offsets and before-commit
        records of the partitions it holds (their commit locks) taken: their steps may go
        on, held."""
        for task in self._by_tp.values():
            if task.commit_lock.locked() and not task.committing:
                task.committing = True
                task.lock.release()

    def let_steps_go_after(self, seconds: float) -> None:
        """`let_steps_go` once `seconds` have passed, unless the commit has ended by then
        (`stay_stopped`): a commit that ends within them keeps the event loop to its round
        trips, which otherwise wait behind every step's turn."""
        self._letting_go = asyncio.get_running_loop().call_later(seconds, self.let_steps_go)

    def stay_stopped(self) -> None:
        """The commit's transaction has ended: its steps are let go no more."""
        if self._letting_go is not None:
            self._letting_go.cancel()
            self._letting_go = None

    def waiting(self, end_of: Callable[[TP], int | None]) -> int:
        """Records of the assigned partitions not processed yet, up to where each ends by
        `end_of` (the consumer's last fetch)."""
        waiting = 0
        for task in self._by_tp.values():
            end, reached = end_of(task.tp), task.offsets.next
            if end is not None and reached is not None and end > reached:
                waiting += end - reached
        return waiting

    async def stop_steps(self, tasks: Iterable[PartitionTask]) -> None:
        """Take back the step locks `let_steps_go` released (in the same order)."""
        for task in tasks:
            if task.committing:
                await task.lock.acquire()
                task.committing = False

    async def steps_done(self) -> None:
        """Once `closing` is set no step starts, and every step already started holds
        or awaits its task's lock (a step does not yield between its start and the
        lock): passing each lock once lets them all finish."""
        for task in self:
            async with task.lock:
                pass

    def plug_in(self, stage: Stage) -> None:
        if stage.in_runs:
            self.in_runs[stage.topic] = stage.run_records
        if stage.before_commit is not None:
            self.commit_hooks[stage.topic] = stage.before_commit
        if stage.processor_of is not None:
            self.processor_topics[stage.topic] = stage.processor_of
        if stage.on_commit is not None:
            self.commit_listeners.append(stage.on_commit)
        if stage.on_revoke is not None:
            self.revoke_hooks.append(stage.on_revoke)
        if stage.receive_handed is not None:
            self.handoff.receives(stage.topic, stage.receive_handed)
        if stage.hands_over:
            self.handoff.gives(stage.topic)
