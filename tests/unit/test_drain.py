"""The consumer's fetch loop (ExactlyOnceConsumer._drain_messages): each fetched record
handed to the conductor directly, in order, as faust's loop would hand it on. No broker:
the app's real consumer with a fake fetch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from faust.types import TP

from app import internals
from app.faust_app import app


@dataclass(eq=False)
class FakeMessage:
    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


class FakeFetcher:
    """Stops the loop once its fetches are used up."""

    def __init__(self, fetches: list[list[FakeMessage]]) -> None:
        self.fetches = fetches
        self.should_stop = False

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, FakeMessage]]:
        fetch = self.fetches.pop(0)
        self.should_stop = not self.fetches
        for message in fetch:
            yield message.tp, message


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Any:
    consumer: Any = app.consumer
    offsets: dict[TP, int | None] = {}
    monkeypatch.setattr(internals, "read_offsets", lambda _: _Offsets(offsets))
    monkeypatch.setattr(app.topics, "acks_enabled_for", lambda topic: True)
    gaps: list[tuple[TP, int, int]] = []

    async def add_gap(tp: TP, first: int, last: int) -> None:
        gaps.append((tp, first, last))

    monkeypatch.setattr(consumer, "_add_gap", add_gap)
    consumer.test_gaps = gaps
    consumer.test_offsets = offsets
    monkeypatch.setattr(consumer, "suspend_flow", asyncio.Event())  # of this test's loop
    return consumer


class _Offsets(dict):  # type: ignore[type-arg]
    """faust's read offsets: None for a partition not read yet."""

    def __init__(self, backing: dict[TP, int | None]) -> None:
        super().__init__()
        self.backing = backing

    def __getitem__(self, tp: TP) -> int | None:
        return self.backing.get(tp)

    def __setitem__(self, tp: TP, offset: int | None) -> None:
        self.backing[tp] = offset


async def drain(
    consumer: Any, monkeypatch: pytest.MonkeyPatch, fetches: list[list[FakeMessage]], deliver: Any
) -> None:
    fetcher = FakeFetcher(fetches)
    monkeypatch.setattr(consumer, "getmany", fetcher.getmany)
    monkeypatch.setattr(consumer, "callback", deliver)
    await asyncio.wait_for(consumer._drain_messages(fetcher), timeout=5)


async def test_records_go_to_the_conductor_in_order_without_a_task_each(
    consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    delivered: list[tuple[int, int]] = []
    tasks_seen: set[asyncio.Task[Any] | None] = set()

    async def deliver(message: FakeMessage) -> None:
        delivered.append((message.partition, message.offset))
        tasks_seen.add(asyncio.current_task())

    fetch = [FakeMessage("events", p, o) for o in range(3) for p in (0, 1)]
    await drain(consumer, monkeypatch, [fetch], deliver)
    assert delivered == [(p, o) for o in range(3) for p in (0, 1)]
    assert len(tasks_seen) == 1  # faust's loop ran each delivery in a task of its own
    assert consumer.test_offsets == {TP("events", 0): 2, TP("events", 1): 2}


async def test_records_below_the_last_read_are_dropped_and_jumps_are_gaps(
    consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    delivered: list[int] = []

    async def deliver(message: FakeMessage) -> None:
        delivered.append(message.offset)

    fetches = [
        [FakeMessage("keyed", 0, o) for o in (10, 11)],
        [FakeMessage("keyed", 0, o) for o in (10, 11, 14)],  # fetched again, then a jump
    ]
    await drain(consumer, monkeypatch, fetches, deliver)
    # 11 again: faust hands on the last record read a second time (exactly_once skips it)
    assert delivered == [10, 11, 11, 14]
    assert consumer.test_gaps == [(TP("keyed", 0), 12, 14)]


async def test_while_the_flow_is_suspended_a_delivery_waits_as_faust_s_does(
    consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # faust's wait (Service.wait_first) ends a delivery early once the flow is
    # suspended; only its arguments are checked here (it runs on the worker's loop).
    waited: list[Any] = []

    async def wait_first(*coros: Any) -> None:
        waited.extend(coros)
        for coro in coros:
            coro.close()

    async def deliver(message: FakeMessage) -> None:
        raise AssertionError("delivered directly while the flow is suspended")

    monkeypatch.setattr(consumer, "wait_first", wait_first)
    consumer.suspend_flow.set()  # a rebalance is under way
    await drain(consumer, monkeypatch, [[FakeMessage("events", 0, 5)]], deliver)
    [delivery, suspension] = waited
    assert delivery.__name__ == "deliver" and suspension.__qualname__ == "Event.wait"
    assert consumer.test_offsets == {TP("events", 0): 5}
