"""Batches of events: what an agent takes into one step, and what a step sends and acks.
No broker: a stream of fake events over the app's real partition tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from faust.types import TP

from app import exactly_once
from app.faust_app import app
from app.partition_tasks import PartitionTasks

pytestmark = pytest.mark.usefixtures("own_tasks")


@dataclass(eq=False)
class FakeMessage:
    tp: TP
    offset: int
    acked: bool = False


@dataclass(eq=False)
class FakeEvent:
    message: FakeMessage
    acks: int = 0

    def ack(self) -> None:
        self.acks += 1


@dataclass
class FakeChannel:
    queue: asyncio.Queue[FakeEvent] = field(default_factory=asyncio.Queue)


class FakeStream:
    """Events as the consumer delivers them to an agent's channel; `arrive` adds more."""

    def __init__(self) -> None:
        self.channel = FakeChannel()

    def noack(self) -> FakeStream:
        return self

    def arrive(self, tp: TP, *offsets: int) -> list[FakeEvent]:
        events = [FakeEvent(FakeMessage(tp, offset)) for offset in offsets]
        for event in events:
            self.channel.queue.put_nowait(event)
        return events

    async def events(self) -> AsyncIterator[FakeEvent]:
        while True:
            await asyncio.sleep(0)  # as faust's stream iterator does before each event
            yield await self.channel.queue.get()


def assigned(tasks: PartitionTasks, *tps: TP) -> None:
    tasks.assigned(set(tps))
    for tp in tps:
        task = tasks.get(tp)
        assert task is not None
        task.offsets.sought_to_committed(0)


@pytest.fixture
def not_recovering(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(app), "in_recovery", property(lambda _: False))
    monkeypatch.setattr(exactly_once.internals, "forget_unacked", lambda *_: None)


@pytest.mark.usefixtures("not_recovering")
async def test_a_batch_is_what_was_buffered_grouped_by_partition_in_offset_order(
    own_tasks: PartitionTasks,
) -> None:
    a, b = TP("keyed", 0), TP("keyed", 1)
    assigned(own_tasks, a, b)
    stream = FakeStream()
    stream.arrive(a, 0)
    stream.arrive(b, 0, 1)
    stream.arrive(a, 1)
    batches = exactly_once.batches_once(app, stream)
    batch = await anext(batches)
    assert {task.tp: [e.message.offset for e in events] for task, events in batch.items()} == {
        a: [0, 1],
        b: [0, 1],
    }
    stream.arrive(b, 2)
    later = await anext(batches)
    assert [(task.tp, [e.message.offset for e in events]) for task, events in later.items()] == [
        (b, [2])
    ]


@pytest.mark.usefixtures("not_recovering")
async def test_a_batch_stops_at_the_configured_size(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    limited = exactly_once.settings().model_copy(update={"max_batch_events": 2})
    monkeypatch.setattr(exactly_once, "settings", lambda: limited)
    tp = TP("keyed", 0)
    assigned(own_tasks, tp)
    stream = FakeStream()
    stream.arrive(tp, 0, 1, 2)
    batches = exactly_once.batches_once(app, stream)
    assert [len(events) for events in (await anext(batches)).values()] == [2]
    assert [len(events) for events in (await anext(batches)).values()] == [1]


@pytest.mark.usefixtures("not_recovering")
async def test_a_batch_begun_before_a_revocation_is_dropped_unacked(
    own_tasks: PartitionTasks,
) -> None:
    tp = TP("keyed", 0)
    assigned(own_tasks, tp)
    stream = FakeStream()
    dropped = stream.arrive(tp, 0, 1)
    batches = exactly_once.batches_once(app, stream)
    taking = asyncio.ensure_future(anext(batches))
    first_task = own_tasks.get(tp)
    assert first_task is not None
    while first_task.offsets.next == 0:  # until the first event is taken
        await asyncio.sleep(0)
    assert first_task.offsets.next == 1 and stream.channel.queue.qsize() == 1
    assert own_tasks.close() == dropped[:1]  # a revocation begins
    own_tasks.revoked({tp})
    assigned(own_tasks, tp)  # the same partition again: a new task, from offset 0
    stream.channel.queue.get_nowait()  # the old assignment's second record: not delivered
    stream.arrive(tp, 0, 1)  # the next assignment delivers both again
    batch = await taking
    [(task, events)] = batch.items()
    assert task is own_tasks.get(tp)
    assert [e.message.offset for e in events] == [0, 1]
    assert all(e.acks == 0 for e in dropped)
    assert own_tasks.stats.process["skipped_closing"] == 1


async def test_a_step_sends_each_outbox_into_its_partition_s_transaction_then_acks(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = TP("keyed", 0), TP("keyed", 1)
    own_tasks.assigned({a, b})
    task_a, task_b = own_tasks.get(a), own_tasks.get(b)
    assert task_a is not None and task_b is not None
    sent: list[tuple[TP, list[Any], bool]] = []

    async def send(_: Any, tp: TP, records: list[Any]) -> None:
        sent.append((tp, list(records), own_tasks.commit_lock.locked()))

    monkeypatch.setattr(exactly_once, "send_in_transaction", send)
    events_a = [FakeEvent(FakeMessage(a, 0)), FakeEvent(FakeMessage(a, 1))]
    events_b = [FakeEvent(FakeMessage(b, 5))]
    async with exactly_once.exactly_once(app, {task_a: events_a, task_b: events_b}):  # type: ignore[dict-item]
        assert own_tasks.commit_lock.locked()  # no commit while the batch writes state
        task_a.outbox.send("pairs", b"k", b"v", None)
        task_a.outbox.count("pairs")
        task_b.outbox.send("unpaired", b"j", b"w", None)
    assert sent == [
        (a, [("pairs", b"k", b"v", None)], True),
        (b, [("unpaired", b"j", b"w", None)], True),
    ]
    assert [e.acks for e in events_a + events_b] == [1, 1, 1]
    assert own_tasks.stats.partitions[a]["pairs"] == 1
    assert not task_a.outbox.records and not task_b.outbox.records
    assert own_tasks.interrupted_steps == 0


async def test_a_step_cut_off_sends_and_acks_nothing_and_marks_local_state_unclean(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp = TP("keyed", 0)
    own_tasks.assigned({tp})
    task = own_tasks.get(tp)
    assert task is not None
    sends: list[TP] = []

    async def send(_: Any, tp: TP, records: list[Any]) -> None:
        sends.append(tp)

    monkeypatch.setattr(exactly_once, "send_in_transaction", send)
    event = FakeEvent(FakeMessage(tp, 0))
    with pytest.raises(RuntimeError):
        async with exactly_once.exactly_once(app, {task: [event]}):  # type: ignore[dict-item]
            task.outbox.send("pairs", b"k", b"v", None)
            raise RuntimeError("rules failed")
    assert sends == [] and event.acks == 0
    assert not task.outbox.records
    assert not own_tasks.local_state_is_committed()
