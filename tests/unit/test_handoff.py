"""The hand-off between a step of one stage and a partition task of the next on the same
worker (app/exactly_once/handoff.py): when it is open, and that what is handed is applied
once, into the transaction that commits the giving step's offset."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app.exactly_once import handed_steps, outbox_sends
from app.exactly_once.handoff import FENCE_KEY, Handoff
from app.exactly_once.partition_tasks import PartitionTask, PartitionTasks
from app.faust_app import app

pytestmark = pytest.mark.usefixtures("own_tasks")

GIVER, RECEIVER, OTHER_RECEIVER = TP("giving", 0), TP("receiving", 0), TP("receiving", 1)


def applied_into_outbox(task: PartitionTask, items: list[Any]) -> None:
    for item in items:
        task.outbox.send("out", None, item, None)


def receiving(tasks: PartitionTasks, *tps: TP) -> Handoff:
    tasks.handoff.receives("receiving", applied_into_outbox)
    tasks.assigned({GIVER, *tps})
    return tasks.handoff


def fence_of(handoff: Handoff) -> bytes:
    token, _ = handoff.fence_due()
    return token


def test_a_receiving_partition_opens_on_this_assignment_s_fence_only(
    own_tasks: PartitionTasks,
) -> None:
    handoff = receiving(own_tasks, RECEIVER, OTHER_RECEIVER)
    token, closed = handoff.fence_due()
    assert closed == [RECEIVER, OTHER_RECEIVER]  # a partition not receiving gets none
    assert not handoff.all_open()
    handoff.fenced(RECEIVER, b"an earlier assignment's")
    assert not handoff.is_open(RECEIVER)
    handoff.fenced(RECEIVER, token)
    assert handoff.is_open(RECEIVER)
    assert handoff.fence_due() == (token, [OTHER_RECEIVER])
    assert not handoff.all_open()
    handoff.fenced(OTHER_RECEIVER, token)
    assert handoff.all_open()
    own_tasks.assigned({GIVER, RECEIVER})  # a new assignment closes them again
    assert not handoff.is_open(RECEIVER)
    handoff.fenced(RECEIVER, token)
    assert not handoff.is_open(RECEIVER)


def test_with_no_receiving_partition_here_the_handoff_is_open(
    own_tasks: PartitionTasks,
) -> None:
    handoff = receiving(own_tasks)
    assert handoff.all_open()
    assert handoff.fence_due()[1] == []


def test_every_receiving_partition_open_is_told_once(own_tasks: PartitionTasks) -> None:
    opened: list[bool] = []
    own_tasks.handoff.when_open(lambda: opened.append(True))
    handoff = receiving(own_tasks, RECEIVER, OTHER_RECEIVER)
    token = fence_of(handoff)
    handoff.fenced(RECEIVER, token)
    assert opened == []
    handoff.fenced(OTHER_RECEIVER, token)
    handoff.fenced(OTHER_RECEIVER, token)  # a fence sent again, read again
    assert opened == [True]


def test_an_idle_claim_read_after_its_source_handed_more_is_stale(
    own_tasks: PartitionTasks,
) -> None:
    handoff = receiving(own_tasks, RECEIVER, OTHER_RECEIVER)
    source = 3
    handoff.handed_by(source)
    handoff.claimed_idle(source)  # read before the source hands more: it holds
    assert not handoff.stale_claim(RECEIVER, source)
    handoff.claimed_idle(source)
    handoff.handed_by(source)  # the source woke up before the claim was read
    assert handoff.stale_claim(RECEIVER, source)
    assert handoff.stale_claim(OTHER_RECEIVER, source)  # its first claim: stale now too
    assert handoff.stale_claim(OTHER_RECEIVER, source)
    # A claim this worker did not send (an earlier owner's, before the fence): it holds.
    assert not handoff.stale_claim(RECEIVER, 5)
    own_tasks.assigned({GIVER, RECEIVER})  # claims in flight belong to their assignment
    assert not handoff.stale_claim(RECEIVER, source)


def test_a_lost_claim_only_makes_a_later_one_stale(own_tasks: PartitionTasks) -> None:
    handoff = receiving(own_tasks, RECEIVER)
    handoff.claimed_idle(0)  # never arrives
    handoff.handed_by(0)
    handoff.claimed_idle(0)
    # The second claim is read against the first one's count: stale, though it holds.
    assert handoff.stale_claim(RECEIVER, 0)
    assert not handoff.stale_claim(RECEIVER, 0)  # no claim left in flight


async def test_fences_go_to_the_closed_partitions_outside_any_transaction(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    handoff = receiving(own_tasks, RECEIVER, OTHER_RECEIVER)
    handoff.fenced(RECEIVER, fence_of(handoff))
    sent: list[tuple[Any, ...]] = []

    async def send(*args: Any) -> None:
        sent.append(args)

    monkeypatch.setattr(app.producer, "send", send)
    await handed_steps.write_fences(app, own_tasks)
    assert sent == [("receiving", FENCE_KEY, fence_of(handoff), 1, None, None)]


def sends_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[TP, list[Any]]]:
    sent: list[tuple[TP, list[Any]]] = []

    async def send(_: Any, tp: TP, records: list[Any]) -> list[Any]:
        sent.append((tp, list(records)))
        return []

    monkeypatch.setattr(outbox_sends, "send_in_transaction", send)
    return sent


async def test_items_are_applied_in_order_by_a_step_of_the_receiving_task(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sends_recorded(monkeypatch)
    handoff = receiving(own_tasks, RECEIVER)
    handoff.hand(RECEIVER, b"1")
    handoff.hand(RECEIVER, b"2")
    await handed_steps.apply_handed(app, own_tasks, RECEIVER)
    assert sent == [(RECEIVER, [("out", None, b"1", None), ("out", None, b"2", None)])]
    task = own_tasks.get(RECEIVER)
    assert task is not None and task.sent  # its writes commit with the transaction
    await handed_steps.apply_handed(app, own_tasks, RECEIVER)
    assert len(sent) == 1  # applied once


async def test_a_commit_applies_what_still_waits_before_its_transaction_ends(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sends_recorded(monkeypatch)
    order: list[str] = []

    async def commit(_: Any, offsets: dict[TP, int], start_new_transaction: bool = True) -> bool:
        order.append(f"commit after {len(sent)} sends")
        return True

    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", commit)
    monkeypatch.setattr(app.consumer, "assignment", lambda: {GIVER, RECEIVER})
    handoff = receiving(own_tasks, RECEIVER)
    handoff.hand(RECEIVER, b"handed")
    assert await app.consumer._commit_offsets({GIVER: 5})
    assert sent == [(RECEIVER, [("out", None, b"handed", None)])]
    assert order == ["commit after 1 sends"]
    assert handoff.waiting() == []


async def test_while_the_receiver_commits_what_it_applies_is_held_for_the_next_transaction(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sends_recorded(monkeypatch)
    handoff = receiving(own_tasks, RECEIVER)
    task = own_tasks.get(RECEIVER)
    assert task is not None
    await task.lock.acquire()
    task.committing = True  # a commit let steps go
    task.lock.release()
    handoff.hand(RECEIVER, b"held")
    await handed_steps.apply_handed(app, own_tasks, RECEIVER)
    assert sent == []
    assert task.held == 1  # the commit sends it (commit.send_held)
    assert task.outbox.records == [("out", None, b"held", None)]


async def test_a_revocation_drops_what_waits_and_no_step_applies_it(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sends_recorded(monkeypatch)
    handoff = receiving(own_tasks, RECEIVER)
    handoff.hand(RECEIVER, b"uncommitted")
    own_tasks.revoked({RECEIVER})
    assert handoff.waiting() == []
    await handed_steps.apply_handed(app, own_tasks, RECEIVER)
    assert sent == []


async def test_a_handler_that_raises_crashes_the_worker(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    sends_recorded(monkeypatch)
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    def broken(task: PartitionTask, items: list[Any]) -> None:
        raise ValueError("a bug in the rules")

    monkeypatch.setattr(app, "crash", crash)
    monkeypatch.setattr(app, "add_future", asyncio.ensure_future)  # on this test's loop
    own_tasks.handoff.receives("receiving", broken)
    own_tasks.assigned({GIVER, RECEIVER})
    own_tasks.handoff.hand(RECEIVER, b"x")
    with pytest.raises(ValueError):
        await handed_steps.apply_handed(app, own_tasks, RECEIVER)
    await asyncio.sleep(0)
    assert [str(exc) for exc in crashes] == ["a bug in the rules"]
    task = own_tasks.get(RECEIVER)
    assert task is not None and task.broken  # nothing more of it commits


def test_the_giving_partitions_stay_paused_until_the_handoff_is_open(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    resumed: list[set[TP]] = []
    monkeypatch.setattr(faust_aiokafka.Consumer, "resume_flow", lambda self: None)
    monkeypatch.setattr(
        faust_aiokafka.Consumer, "resume_partitions", lambda self, tps: resumed.append(set(tps))
    )
    consumer: Any = app.consumer
    own_tasks.handoff.gives("giving")
    own_tasks.handoff.when_open(consumer._resume_handing)  # the app's consumer does so
    handoff = receiving(own_tasks, RECEIVER)
    monkeypatch.setattr(consumer, "_resume_with_flow", {GIVER, RECEIVER})
    consumer.resume_flow()  # after the seek to the committed offsets
    assert resumed == [{RECEIVER}]  # the receiving partition reads on, to its fence
    handoff.fenced(RECEIVER, fence_of(handoff))
    assert resumed == [{RECEIVER}, {GIVER}]
