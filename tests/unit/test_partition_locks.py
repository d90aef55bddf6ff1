"""A commit holds the locks of the partitions it commits: it waits for a step of one of
them to be acked, and steps of the other partitions go on meanwhile (ingest's handoff
commits do not hold pairing up). The real step and consumer, with the sends and
faust's own commit replaced."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app import step
from app.faust_app import app
from app.partition_tasks import PartitionTasks

INGEST, KEYED = TP("events", 0), TP("keyed", 0)


class Steps:
    """Steps of fake events whose sends wait while their partition is held."""

    def __init__(self) -> None:
        self.held: dict[TP, asyncio.Event] = {}
        self.acked: list[tuple[TP, int]] = []

    def hold(self, tp: TP) -> None:
        self.held[tp] = asyncio.Event()

    def release(self, tp: TP) -> None:
        self.held.pop(tp).set()

    async def send(self, _: Any, tp: TP, records: list[Any]) -> list[Any]:
        if tp in self.held:
            await self.held[tp].wait()
        return []

    async def run(self, tp: TP, offset: int) -> None:
        message = SimpleNamespace(tp=tp, offset=offset)
        event: Any = SimpleNamespace(message=message, ack=lambda: self.acked.append((tp, offset)))
        async with step.exactly_once(app, event) as task:
            task.outbox.send("out", None, b"x", None)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_commit_waits_for_its_partitions_steps_only(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = Steps()
    committing: list[list[TP]] = []
    commit_done = asyncio.Event()

    async def faust_commit(_: Any, tps: Any, start_new_transaction: bool) -> bool:
        committing.append(sorted(tps))
        await commit_done.wait()
        return False

    monkeypatch.setattr(step, "send_in_transaction", steps.send)
    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_tps", faust_commit)
    own_tasks.assigned({INGEST, KEYED})

    steps.hold(INGEST)
    ingest_step = asyncio.ensure_future(steps.run(INGEST, 1))
    await settle()
    commit = asyncio.ensure_future(app.consumer._commit_tps([INGEST], True))
    await settle()
    assert committing == []  # an ingest step is between its send and its ack
    steps.release(INGEST)
    await settle()
    assert ingest_step.done() and steps.acked == [(INGEST, 1)]
    assert committing == [[INGEST]]

    # The ingest commit is in flight: a pairing step goes on, an ingest step waits.
    await asyncio.wait_for(steps.run(KEYED, 7), timeout=5)
    later_ingest_step = asyncio.ensure_future(steps.run(INGEST, 2))
    await settle()
    assert steps.acked == [(INGEST, 1), (KEYED, 7)]
    commit_done.set()
    await asyncio.wait_for(asyncio.gather(commit, later_ingest_step), timeout=5)
    assert steps.acked[-1] == (INGEST, 2)


async def test_closing_waits_for_the_steps_of_every_partition(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = Steps()
    monkeypatch.setattr(step, "send_in_transaction", steps.send)
    own_tasks.assigned({INGEST, KEYED})
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
    monkeypatch.setattr(step, "send_in_transaction", steps.send)
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


async def test_a_commit_clears_the_commit_wishes_of_the_partitions_it_committed(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def faust_commit(_: Any, tps: Any, start_new_transaction: bool) -> bool:
        return True

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_tps", faust_commit)
    own_tasks.assigned({INGEST, KEYED})
    ingest, keyed = own_tasks.get(INGEST), own_tasks.get(KEYED)
    assert ingest is not None and keyed is not None
    assert own_tasks.earliest_commit_due() is None
    keyed.due_by(10.0)
    keyed.due_by(12.0)  # a later wish does not postpone an earlier one
    ingest.due_by(11.0)
    assert own_tasks.earliest_commit_due() == 10.0
    await app.consumer._commit_tps([KEYED], True)
    assert keyed.commit_due is None
    assert own_tasks.earliest_commit_due() == 11.0


async def test_a_step_cut_off_takes_its_processor_with_it(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a processor made of a step (pairing's indexes and recent states) must not
    # outlive the step's writes, which a cut-off step never sent.
    class Seen(list[int]):
        pass

    steps = Steps()
    monkeypatch.setattr(step, "send_in_transaction", steps.send)
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
