"""A commit holds the steps of every partition of the worker while it takes their
offsets, and lets them go on, held, while the transaction commits (at once when the
worker is behind, else once half the commit interval has passed): it waits for a step
of one of them to be acked, and what held steps send goes into the next transaction.
The real step and consumer, with the sends and faust's own commit replaced."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app.exactly_once import commit as commit_module
from app.exactly_once import consumer as consumer_module
from app.exactly_once import outbox_sends, step
from app.exactly_once.consumer import ExactlyOnceConsumer, Stalled
from app.exactly_once.outbox import SendFailed
from app.exactly_once.partition_tasks import PartitionTask, PartitionTasks
from app.faust_app import app
from app.settings import settings

INGEST, KEYED = TP("events", 0), TP("keyed", 0)


class Steps:
    """Steps of fake events whose sends wait while their partition is held."""

    def __init__(self) -> None:
        self.held: dict[TP, asyncio.Event] = {}
        self.acked: list[tuple[TP, int]] = []
        self.sent: list[tuple[TP, list[bytes | None]]] = []  # the values, per send

    def hold(self, tp: TP) -> None:
        self.held[tp] = asyncio.Event()

    def release(self, tp: TP) -> None:
        self.held.pop(tp).set()

    async def send(self, _: Any, tp: TP, records: list[Any]) -> list[Any]:
        if tp in self.held:
            await self.held[tp].wait()
        self.sent.append((tp, [value for _, _, value, _ in records]))
        return [None] * len(records)  # deliveries, as local state keeps them

    def ack(self, tp: TP, offset: int) -> None:
        self.acked.append((tp, offset))
        app.consumer._acked[tp].append(offset)  # what faust picks partitions to commit by

    async def run(
        self, tp: TP, offset: int, body: Callable[[PartitionTask], None] | None = None
    ) -> None:
        message = SimpleNamespace(tp=tp, offset=offset)
        event: Any = SimpleNamespace(message=message, ack=lambda: self.ack(tp, offset))
        async with step.exactly_once(app, event) as task:
            task.outbox.send("out", None, b"%d" % offset, None)
            if body is not None:
                body(task)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class FaustCommit:
    """faust's commit of offsets, replaced: it stays in flight until `done`, and then
    ends as `outcome` says."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.committing: list[dict[TP, int]] = []
        self.done = asyncio.Event()
        self.fails: Exception | None = None
        self.crashes: list[BaseException] = []
        monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", self.commit)
        monkeypatch.setattr(app.consumer, "assignment", lambda: {INGEST, KEYED})
        monkeypatch.setattr(app, "crash", self.crash)
        monkeypatch.setattr(app, "add_future", asyncio.ensure_future)  # on this test's loop

    async def commit(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        self.committing.append(dict(offsets))
        await self.done.wait()
        if self.fails is not None:
            raise self.fails
        app.consumer._committed_offset.update(offsets)
        return True

    async def crash(self, reason: BaseException) -> None:
        self.crashes.append(reason)


@pytest.fixture
def steps(own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch) -> Steps:
    found = Steps()
    monkeypatch.setattr(outbox_sends, "send_in_transaction", found.send)
    # faust's own bookkeeping of acks and commits, for this test alone
    monkeypatch.setattr(app.consumer, "_acked", defaultdict(list))
    monkeypatch.setattr(app.consumer, "_acked_index", defaultdict(set))
    monkeypatch.setattr(app.consumer, "_committed_offset", defaultdict(lambda: None))
    own_tasks.assigned({INGEST, KEYED})
    for tp in (INGEST, KEYED):
        app.consumer._committed_offset[tp] = 0
        task = own_tasks.get(tp)
        assert task is not None
        task.offsets.sought_to_committed(0)
    return found


def commit_of(tps: list[TP]) -> asyncio.Future[bool]:
    return asyncio.ensure_future(app.consumer._commit_tps(tps, True))


async def test_steps_go_on_held_while_their_transaction_commits(
    steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    faust = FaustCommit(monkeypatch)
    steps.hold(INGEST)
    ingest_step = asyncio.ensure_future(steps.run(INGEST, 0))
    await settle()
    commit = commit_of([INGEST])
    await settle()
    assert faust.committing == []  # an ingest step is between its send and its ack
    steps.release(INGEST)
    await settle()
    assert ingest_step.done() and steps.acked == [(INGEST, 0)]
    assert faust.committing == [{INGEST: 1}]

    # The transaction commits: steps of every partition go on, acked, their records and
    # table writes held; one transaction carries them all, so pairing's too.
    changelog = SimpleNamespace(get_topic_name=lambda: "table-changelog")
    local = own_tasks.local_state.partition(
        SimpleNamespace(name="table", changelog_topic=changelog), 0
    )

    def write(task: PartitionTask) -> None:
        task.writes.stage(local, b"k", b"v")

    await asyncio.wait_for(steps.run(INGEST, 1, write), timeout=5)
    await asyncio.wait_for(steps.run(KEYED, 0), timeout=5)
    assert steps.acked == [(INGEST, 0), (INGEST, 1), (KEYED, 0)]
    assert steps.sent == [(INGEST, [b"0"])]
    faust.done.set()
    assert await asyncio.wait_for(commit, timeout=5)
    # Into the next transaction, which this commit did not take the held offsets for;
    # the held write waits for it in local state (RocksDB has committed writes only).
    assert steps.sent[1:] == [(INGEST, [b"1", b"v"]), (KEYED, [b"0"])]
    assert local.uncommitted == {b"k": b"v"}
    assert app.consumer._committed_offset[INGEST] == 1
    assert app.consumer._new_offset(INGEST) == 2
    assert not faust.crashes


def interval_of_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half of it never passes within a test: steps go on during a commit only because
    the worker is behind."""
    hour = settings().model_copy(update={"commit_interval_seconds": 3600.0})
    monkeypatch.setattr(commit_module, "settings", lambda: hour)


async def test_a_commit_of_a_worker_that_keeps_up_runs_alone(
    steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its round trips would otherwise wait behind every step's turn of the event loop:
    a step that comes meanwhile waits for the commit, and then sends its records into
    the next transaction itself, held by nothing."""
    faust = FaustCommit(monkeypatch)
    interval_of_an_hour(monkeypatch)
    await steps.run(KEYED, 0)
    commit = commit_of([KEYED])
    await settle()
    keyed_step = asyncio.ensure_future(steps.run(KEYED, 1))
    await settle()
    assert faust.committing == [{KEYED: 1}]
    assert steps.acked == [(KEYED, 0)]
    faust.done.set()
    assert await asyncio.wait_for(commit, timeout=5)
    await asyncio.wait_for(keyed_step, timeout=5)
    assert steps.acked == [(KEYED, 0), (KEYED, 1)]
    assert steps.sent == [(KEYED, [b"0"]), (KEYED, [b"1"])]
    task = own_tasks.get(KEYED)
    assert task is not None and task.held == 0 and not task.broken
    assert app.consumer._new_offset(KEYED) == 2


async def test_a_worker_behind_lets_steps_go_on_as_soon_as_the_transaction_commits(
    steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    faust = FaustCommit(monkeypatch)
    interval_of_an_hour(monkeypatch)
    waiting = settings().max_run_records + 1  # more than a run: ingest is behind
    monkeypatch.setattr(app.consumer, "highwater", lambda tp: waiting if tp == INGEST else None)
    await steps.run(KEYED, 0)
    commit = commit_of([KEYED])
    await settle()
    await asyncio.wait_for(steps.run(KEYED, 1), timeout=5)  # held
    assert steps.acked == [(KEYED, 0), (KEYED, 1)]
    assert steps.sent == [(KEYED, [b"0"])]
    faust.done.set()
    assert await asyncio.wait_for(commit, timeout=5)
    assert steps.sent == [(KEYED, [b"0"]), (KEYED, [b"1"])]
    assert app.consumer._new_offset(KEYED) == 2


async def _a_held_step_fails(steps: Steps, faust: FaustCommit) -> None:
    def fail(_: PartitionTask) -> None:
        raise ValueError("a rule failed")

    with pytest.raises(ValueError):
        await steps.run(KEYED, 2, fail)
    faust.done.set()


async def _the_commit_fails(steps: Steps, faust: FaustCommit) -> None:
    faust.fails = RuntimeError("the transaction could not commit")
    faust.done.set()


FAILURES: dict[str, Callable[[Steps, FaustCommit], Awaitable[None]]] = {
    "a held step fails": _a_held_step_fails,
    "the commit fails": _the_commit_fails,
}


@pytest.mark.parametrize("failure", FAILURES)
async def test_what_steps_held_is_never_committed_without_them_all(
    failure: str, steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held records of several steps are mixed in the outbox: if any of them fails, or
    the commit does, none of them may reach a transaction, nor their offsets a commit;
    the worker crashes, and the restart processes them again."""
    faust = FaustCommit(monkeypatch)
    await steps.run(KEYED, 0)
    commit = commit_of([KEYED])
    await settle()
    await steps.run(KEYED, 1)  # held
    await FAILURES[failure](steps, faust)
    await asyncio.wait([commit], timeout=5)  # it ends, with faust's error if that failed
    await settle()
    assert commit.done()
    task = own_tasks.get(KEYED)
    assert task is not None and task.broken
    assert steps.sent == [(KEYED, [b"0"])]
    assert len(faust.crashes) == 1
    assert app.consumer._new_offset(KEYED) is None
    with pytest.raises(SendFailed):
        await steps.run(KEYED, 3)
    assert (KEYED, 3) not in steps.acked


async def test_a_stop_commits_what_a_commit_in_flight_held(
    steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    faust = FaustCommit(monkeypatch)
    new_transactions: list[bool] = []

    async def commit(_: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        new_transactions.append(start_new_transaction)
        return await faust.commit(offsets, start_new_transaction)

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", commit)
    await steps.run(KEYED, 0)
    in_flight = asyncio.ensure_future(app.consumer.commit())
    await settle()
    await steps.run(KEYED, 1)  # held
    stop = asyncio.ensure_future(app.consumer.commit_and_end_transactions())
    await settle()
    faust.done.set()
    await asyncio.wait_for(asyncio.gather(in_flight, stop), timeout=5)
    assert faust.committing == [{KEYED: 1}, {KEYED: 2}]
    assert new_transactions == [True, False]
    assert steps.sent == [(KEYED, [b"0"]), (KEYED, [b"1"])]


async def test_closing_waits_for_the_steps_of_every_partition(
    steps: Steps, own_tasks: PartitionTasks
) -> None:
    steps.hold(KEYED)
    keyed_step = asyncio.ensure_future(steps.run(KEYED, 3))
    await settle()
    closing = asyncio.ensure_future(app.consumer._close_steps())
    await settle()
    assert not closing.done() and own_tasks.closing
    steps.release(KEYED)
    await asyncio.wait_for(asyncio.gather(closing, keyed_step), timeout=5)
    assert steps.acked == [(KEYED, 3)]


async def test_a_step_s_body_runs_only_between_commits(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's hooks read what a body changed (ingest's progress): a body that ran
    while a commit held the lock would have its progress told in that commit's
    transaction, ahead of its events."""
    steps = Steps()
    monkeypatch.setattr(outbox_sends, "send_in_transaction", steps.send)
    own_tasks.assigned({INGEST})
    task = own_tasks.get(INGEST)
    assert task is not None
    ran: list[int] = []

    async def run() -> None:
        message = SimpleNamespace(tp=INGEST, offset=5)
        event: Any = SimpleNamespace(message=message, ack=lambda: steps.acked.append((INGEST, 5)))
        async with step.exactly_once(app, event):
            ran.append(5)

    async with task.lock:  # a commit of the partition is in flight
        started = asyncio.ensure_future(run())
        await settle()
        assert ran == []
    await asyncio.wait_for(started, timeout=5)
    assert ran == [5] and steps.acked == [(INGEST, 5)]


async def test_a_step_cut_off_takes_its_processor_with_it(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a processor made of a step (pairing's indexes and recent states) must not
    # outlive the step's writes, which a cut-off step never sent.
    class Seen(list[int]):
        pass

    steps = Steps()
    monkeypatch.setattr(outbox_sends, "send_in_transaction", steps.send)
    own_tasks.assigned({KEYED})

    def event(offset: int) -> Any:
        message = SimpleNamespace(tp=KEYED, offset=offset)
        return SimpleNamespace(message=message, ack=lambda: steps.acked.append((KEYED, offset)))

    async with step.exactly_once(app, event(1)) as task:
        task.processor(Seen, lambda _: Seen()).append(1)
    assert task.loaded(Seen) == [1]
    with pytest.raises(RuntimeError):
        async with step.exactly_once(app, event(2)) as task:
            task.processor(Seen, lambda _: Seen()).append(2)
            raise RuntimeError("a rule failed")
    assert task.loaded(Seen) is None and steps.acked == [(KEYED, 1)]


async def test_a_step_or_commit_past_the_transaction_timeout_crashes_the_worker(
    steps: Steps, own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    faust = FaustCommit(monkeypatch)
    short = settings().model_copy(update={"transaction_timeout_seconds": 0.2})
    monkeypatch.setattr(consumer_module, "settings", lambda: short)
    watchdog = asyncio.ensure_future(ExactlyOnceConsumer._stall_watchdog(app.consumer))
    running: list[asyncio.Future[Any]] = [watchdog]
    try:
        # Steps and commits that end are no stall, however many.
        for offset in range(3):
            await steps.run(INGEST, offset)
            faust.done.set()
            await commit_of([INGEST])
        faust.done.clear()
        assert own_tasks.stalled(time.monotonic() + 1, 0.5) == []
        # A step whose send never returns, and the commit that waits for it.
        steps.hold(KEYED)
        running.append(asyncio.ensure_future(steps.run(KEYED, 0)))
        await settle()
        running.append(commit_of([KEYED]))
        await asyncio.wait_for(watchdog, timeout=5)
        assert [type(c) for c in faust.crashes] == [Stalled]
        assert f"a step of {KEYED.topic}[0]" in str(faust.crashes[0])
        assert f"a commit of {KEYED.topic}[0]" in str(faust.crashes[0])
        assert own_tasks.stalled(time.monotonic(), 60) == []  # young yet by this limit
    finally:
        for future in running:
            future.cancel()
        await settle()
    task = own_tasks.get(KEYED)
    assert task is not None and task.step_since is None and task.commit_since is None
