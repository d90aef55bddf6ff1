"""app/exactly_once/eager.py: a coroutine's first step in the caller's task, the rest as a task."""

from __future__ import annotations

import asyncio

import pytest

from app.exactly_once import eager


async def test_a_coroutine_that_never_waits_finishes_in_the_caller_s_task() -> None:
    caller = asyncio.current_task()
    ran_in: list[asyncio.Task[object] | None] = []

    async def hand_over() -> int:
        ran_in.append(asyncio.current_task())
        return 7

    started = eager.start(hand_over())
    assert (started.result, started.rest) == (7, None)
    assert ran_in == [caller]


async def test_a_coroutine_that_waits_goes_on_where_it_stopped() -> None:
    steps: list[str] = []
    release = asyncio.Event()

    async def hand_over() -> str:
        steps.append("before")
        await release.wait()
        steps.append("after")
        await asyncio.sleep(0)  # a bare yield too
        return "done"

    started = eager.start(hand_over())
    assert started.rest is not None and steps == ["before"]
    rest = asyncio.ensure_future(started.rest)
    await asyncio.sleep(0.01)
    assert not rest.done()
    release.set()
    assert await rest == "done"
    assert steps == ["before", "after"]


async def test_an_exception_comes_out_where_it_is_raised() -> None:
    async def fails_at_once() -> None:
        raise ValueError("at once")

    with pytest.raises(ValueError, match="at once"):
        eager.start(fails_at_once())

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("later")

    started = eager.start(fails_later())
    assert started.rest is not None
    with pytest.raises(ValueError, match="later"):
        await started.rest


async def test_cancelling_the_rest_cancels_the_coroutine_where_it_waits() -> None:
    cleaned: list[str] = []

    async def hand_over() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("finally")

    started = eager.start(hand_over())
    assert started.rest is not None
    rest = asyncio.ensure_future(started.rest)
    await asyncio.sleep(0)
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rest
    assert cleaned == ["finally"]
