"""Run a coroutine's first step in the caller's task; only a coroutine that has to
wait becomes something to schedule.

faust's fetch loop hands every record to the conductor as its own task, raced
against two more (consumer.py, `ExactlyOnceConsumer.wait_first`). Nearly every
hand-over completes without waiting: the agent's queue has room. Run eagerly, such
a hand-over costs no task at all; one that does wait continues, from where it
stopped, in the task the caller makes of `Started.rest`.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Started(Generic[T]):
    """A coroutine after its first step: finished with `result` (`rest` is None), or
    waiting, with `rest` the coroutine that drives it on."""

    result: T | None
    rest: Coroutine[Any, Any, T] | None


def start(coro: Coroutine[Any, Any, T]) -> Started[T]:
    """Run `coro` until it first waits or finishes. Its exception, if it raises
    before waiting, propagates here."""
    try:
        awaiting = coro.send(None)
    except StopIteration as finished:
        return Started(finished.value, None)
    return Started(None, _resumed(coro, awaiting))


async def _resumed(coro: Coroutine[Any, Any, T], awaiting: Any) -> T:
    result: T = await _drive(coro, awaiting)
    return result


@types.coroutine
def _drive(coro: Coroutine[Any, Any, T], awaiting: Any) -> Generator[Any, Any, T]:
    # Hands the task what `coro` is waiting on (a future, or None for a bare yield),
    # then passes back what the task sends or throws: as if the task had run `coro`
    # from its start.
    while True:
        try:
            sent = yield awaiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # cancellation too goes on to `coro`
            try:
                awaiting = coro.throw(exc)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
        else:
            try:
                awaiting = coro.send(sent)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
