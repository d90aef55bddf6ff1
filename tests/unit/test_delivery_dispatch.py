"""The delivery dispatcher and HTTP client against the stand-in API on a real socket,
with the delivery log kept in a list (no broker)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.settings import Settings
from delivery.client import ApiClient
from delivery.dispatcher import Dispatcher
from delivery.rules import Entry, LogRecord, Status
from tools.order_api import Behaviour, OrderApi


@pytest.fixture
async def api() -> AsyncIterator[OrderApi]:
    server = await OrderApi(seed=1).start()
    yield server
    await server.stop()


class Run:
    """A dispatcher with its log records collected, running in the background."""

    def __init__(self, api: OrderApi, **settings: Any) -> None:
        lookup = f"{api.url}/orders/status/{{key}}" if api.behaviour.lookup else None
        self.conf = Settings(
            delivery_url=f"{api.url}/orders",
            delivery_status_url=lookup,
            delivery_backoff_seconds=0.01,
            delivery_backoff_max_seconds=0.05,
            delivery_max_in_flight=4,
            **settings,
        )
        self.log: list[tuple[int, LogRecord]] = []
        self.dispatcher = Dispatcher(self.conf, ApiClient(self.conf), self.send_log)
        self.task: asyncio.Task[None] | None = None

    async def send_log(self, partition: int, record: LogRecord) -> None:
        self.log.append((partition, record))

    async def __aenter__(self) -> Run:
        self.task = asyncio.create_task(self.dispatcher.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task

    async def deliver(self, count: int) -> dict[str, LogRecord]:
        """`count` messages of partition 0, committed at once, until each has an outcome."""
        self.dispatcher.open(0, None)
        for n in range(count):
            self.dispatcher.intent(0, f"id:{n}", body(n), f"k{n}", offset=n)
        self.dispatcher.committed(0, count)
        return await self.until(count)

    def outcomes(self) -> dict[str, LogRecord]:
        return {r.identity: r for _, r in self.log if r.kind == "outcome"}

    async def until(self, count: int, timeout: float = 10) -> dict[str, LogRecord]:
        async with asyncio.timeout(timeout):
            while len(self.outcomes()) < count:
                await asyncio.sleep(0.01)  # polling the collected log
        return self.outcomes()


def body(n: int, **extra: Any) -> bytes:
    return json.dumps({"id": n, **extra}).encode()


async def test_nothing_is_called_before_the_intent_commits(api: OrderApi) -> None:
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        dispatcher.intent(0, "id:1", body(1), "k1", offset=10)
        dispatcher.intent(0, "id:2", body(2), "k2", offset=11)
        assert dispatcher.status()["ready"] == 0  # a call starts only from the ready queue
        assert run.log == [] and api.summary()["calls"] == {}
        dispatcher.committed(0, 11)  # offset 10 committed, 11 not yet
        outcomes = await run.until(1)
        assert list(outcomes) == ["id:1"] and outcomes["id:1"].status is Status.DELIVERED
        dispatcher.committed(0, 12)
        await run.until(2)
    kinds = [(r.identity, r.kind) for _, r in run.log]
    assert kinds.index(("id:1", "attempt")) < kinds.index(("id:1", "outcome"))
    assert api.applied_keys == {"k1": 1, "k2": 1}


async def test_nothing_is_called_before_the_log_is_caught_up(api: OrderApi) -> None:
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(3, log_target=5)
        dispatcher.intent(3, "id:1", body(1), "k1", offset=0)
        dispatcher.committed(3, 1)
        assert dispatcher.status()["ready"] == 0
        assert run.log == []
        assert not dispatcher.log_consumed(3, 4)
        assert dispatcher.log_consumed(3, 5)
        stored = [("id:9", Entry(Status.QUEUED, 0, body(9)))]
        dispatcher.resume(3, stored, lambda identity: f"key-{identity}")
        outcomes = await run.until(2)
    assert set(outcomes) == {"id:1", "id:9"}
    assert api.applied_keys["key-id:9"] == 1


async def test_503s_are_retried_and_4xx_dead_lettered(api: OrderApi) -> None:
    api.behaviour = Behaviour(fail_share=0.5)
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        for n in range(20):
            dispatcher.intent(0, f"id:{n}", body(n, reject=n % 10 == 0), f"k{n}", offset=n)
        dispatcher.committed(0, 20)
        outcomes = await run.until(20)
    dead = {i for i, r in outcomes.items() if r.status is Status.DEAD}
    assert dead == {"id:0", "id:10"}
    assert all("HTTP 422" in outcomes[i].reason for i in dead)
    assert len(api.applied) == 18 and max(api.applied.values()) == 1
    failed = [r for _, r in run.log if r.kind == "failed"]
    assert len(failed) == api.calls["failed"] == dispatcher.counts["retried"] > 0
    assert not any(r.maybe_sent for r in failed)  # a 503 is an answer: not uncertain
    assert dispatcher.counts["calls"] == sum(api.calls.values())


async def test_a_dropped_connection_makes_the_next_call_uncertain(api: OrderApi) -> None:
    api.behaviour = Behaviour(crash_share=0.3)
    async with Run(api, delivery_uncertain="resend") as run:
        outcomes = await run.deliver(30)
    crashed = api.calls["crashed"]
    assert crashed > 0
    assert sum(r.uncertain for r in outcomes.values()) == crashed
    assert sum(n - 1 for n in api.applied.values()) == crashed  # resent: each a duplicate


@pytest.mark.parametrize("honour_keys", [False, True])
async def test_uncertain_messages_are_looked_up_not_resent(
    api: OrderApi, honour_keys: bool
) -> None:
    api.behaviour = Behaviour(crash_share=0.3, lookup=True, honour_keys=honour_keys)
    # The API applies a call before it drops the connection: nothing to settle.
    async with Run(api, delivery_uncertain="resend", delivery_settle_seconds=0) as run:
        outcomes = await run.deliver(30)
    assert api.calls["crashed"] > 0 and api.calls["lookups"] == api.calls["crashed"]
    assert max(api.applied.values()) == 1 and len(api.applied) == 30
    found = [r for r in outcomes.values() if r.reason == "found by status lookup"]
    assert len(found) == api.calls["crashed"]


# The API takes 1.5 s over every call, past the client's timeout, and applies it then;
# its status lookup answers 404 meanwhile.
SLOW = Behaviour(lookup=True, slow_share=1.0, slow_seconds=1.5)


async def test_a_lookup_made_while_the_api_still_processes_the_call_duplicates(
    api: OrderApi,
) -> None:
    api.behaviour = SLOW
    async with Run(api, delivery_timeout_seconds=0.2, delivery_settle_seconds=0) as run:
        [outcome] = (await run.deliver(1)).values()
    await api.processed()
    # "Not found" was taken at its word, and the order sent again while the first call
    # was still to be applied: the trap the settle time closes.
    assert outcome.status is Status.DELIVERED
    assert api.applied[body(0).decode()] > 1


async def test_a_lookup_waits_until_the_last_call_has_settled(api: OrderApi) -> None:
    api.behaviour = SLOW
    # Settle 2 s > timeout 0.2 s + the API's 1.5 s.
    async with Run(api, delivery_timeout_seconds=0.2, delivery_settle_seconds=2) as run:
        [outcome] = (await run.deliver(1)).values()
        assert run.dispatcher.counts["settling"] >= 1
    await api.processed()
    assert outcome.reason == "found by status lookup" and outcome.uncertain == 1
    assert api.applied[body(0).decode()] == 1 and api.calls["lookups"] == 1


async def test_uncertain_messages_are_parked_when_so_configured(api: OrderApi) -> None:
    async with Run(api) as run:  # park is the default
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        stored = [
            ("id:1", Entry(Status.CALLING, 0, body(1), attempts=1)),
            ("id:2", Entry(Status.QUEUED, 0, body(2), attempts=1, maybe_sent=True)),
            ("id:3", Entry(Status.QUEUED, 0, body(3), attempts=1)),
            ("id:4", Entry(Status.DELIVERED, 0, None, attempts=1)),
        ]
        dispatcher.resume(0, stored, lambda identity: identity)
        outcomes = await run.until(3)
    assert {i: r.status for i, r in outcomes.items()} == {
        "id:1": Status.PARKED,
        "id:2": Status.PARKED,
        "id:3": Status.DELIVERED,
    }
    assert outcomes["id:1"].uncertain == 1 and outcomes["id:3"].uncertain == 0
    assert api.applied_keys == {"id:3": 1}


async def test_a_message_out_of_time_is_dead_lettered(api: OrderApi) -> None:
    await api.stop()  # nothing listens: every call is refused
    async with Run(api, delivery_deadline_seconds=0.3) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        dispatcher.intent(0, "id:1", body(1), "k1", offset=0)
        dispatcher.committed(0, 1)
        outcomes = await run.until(1)
    assert outcomes["id:1"].status is Status.DEAD
    assert outcomes["id:1"].reason.startswith("deadline")
    failed = [r for _, r in run.log if r.kind == "failed"]
    assert failed and not any(r.maybe_sent for r in failed)  # refused: never sent


async def test_giving_a_partition_up_waits_for_its_calls(api: OrderApi) -> None:
    api.behaviour = Behaviour(delay=0.3)
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        dispatcher.intent(0, "id:1", body(1), "k1", offset=0)
        dispatcher.intent(0, "id:2", body(2), "k2", offset=1)
        dispatcher.committed(0, 1)
        async with asyncio.timeout(5):
            while dispatcher.status()["in_flight"] == 0:
                await asyncio.sleep(0.01)  # until id:1 is in flight
        await dispatcher.close([0], timeout=5)
        assert "id:1" in run.outcomes()  # finished and logged before close returned
        dispatcher.committed(0, 2)  # too late: no longer this worker's
        assert dispatcher.partition(0) is None and dispatcher.status()["ready"] == 0
    assert set(run.outcomes()) == {"id:1"}
    assert api.applied_keys == {"k1": 1}


async def test_intake_waits_while_the_backlog_is_full(api: OrderApi) -> None:
    api.behaviour = Behaviour(delay=0.2)
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, None)
        limit = 4 * run.conf.delivery_max_in_flight
        for n in range(limit):
            assert not dispatcher.full()
            dispatcher.intent(0, f"id:{n}", body(n), f"k{n}", offset=n)
        assert dispatcher.full()
        dispatcher.committed(0, limit)
        async with asyncio.timeout(5):
            await dispatcher.room()
        assert not dispatcher.full() and dispatcher.backlog() < limit
        await run.until(limit)
    assert api.max_concurrent == run.conf.delivery_max_in_flight  # the window, and no more


async def test_a_partition_catching_up_does_not_hold_intake(api: OrderApi) -> None:
    async with Run(api) as run:
        dispatcher = run.dispatcher
        dispatcher.open(0, log_target=10)  # its log must be consumed first
        for n in range(100):
            dispatcher.intent(0, f"id:{n}", body(n), f"k{n}", offset=n)
        dispatcher.committed(0, 100)
        # Else deliver would wait for room instead of consuming the log that frees it.
        assert not dispatcher.full()
        assert dispatcher.status()["ready"] == 0  # held until the catch-up
        assert dispatcher.log_consumed(0, 10)
        assert dispatcher.full()
        dispatcher.resume(0, [], lambda identity: identity)
        await run.until(100)
    assert len(api.applied) == 100


async def test_a_partition_given_up_and_taken_back_calls_each_message_once(
    api: OrderApi,
) -> None:
    api.behaviour = Behaviour(delay=0.3)
    async with Run(api) as run:
        dispatcher = run.dispatcher
        # Partition 1's four calls take every worker; partition 0's two orders wait.
        for partition, count in ((1, 4), (0, 2)):
            dispatcher.open(partition, None)
            for n in range(count):
                name = f"id:{partition}-{n}"
                dispatcher.intent(partition, name, body(n, p=partition), name, offset=n)
            dispatcher.committed(partition, count)
        async with asyncio.timeout(5):
            while dispatcher.status()["in_flight"] < 4:
                await asyncio.sleep(0.01)  # until partition 1's calls are in flight
        await dispatcher.close([0], timeout=5)
        # Taken back at once (a rebalance that keeps it here) and resumed from the store,
        # while its old orders still wait in the ready queue.
        dispatcher.open(0, None)
        stored = [(f"id:0-{n}", Entry(Status.QUEUED, 0, body(n, p=0))) for n in range(2)]
        dispatcher.resume(0, stored, lambda identity: identity)
        await run.until(6)
    assert len(api.applied) == 6 and max(api.applied.values()) == 1, api.summary()
