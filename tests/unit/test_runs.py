"""Runs (app/exactly_once/runs.py): what one fetch returned of a partition reaches the agent as one
message, through faust's own conversion, and the agent gets each offset once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from app.exactly_once import in_order
from app.exactly_once.in_order import runs_once
from app.exactly_once.partition_tasks import PartitionTasks
from app.exactly_once.runs import Run, in_runs
from app.faust_app import app

EVENTS, OTHER = TP("events", 0), TP("other", 0)


def records(tp: TP, offsets: range) -> list[Any]:
    """As the record batch decodes them: no topic or partition."""
    return [SimpleNamespace(offset=o, timestamp=1000 + o) for o in offsets]


def test_a_fetch_is_cut_into_runs_of_the_topics_taken_in_runs_only() -> None:
    fetched = {EVENTS: records(EVENTS, range(10, 15)), OTHER: records(OTHER, range(3))}
    result = in_runs(fetched, {"events": None}, max_records=2)
    runs = result[EVENTS]
    assert [[r.offset for r in run.value] for run in runs] == [[10, 11], [12, 13], [14]]
    assert [(run.value[0].offset, run.offset, run.timestamp) for run in runs] == [
        (10, 11, 1011),
        (12, 13, 1013),
        (14, 14, 1014),
    ]
    assert result[OTHER] is fetched[OTHER]


def test_a_topic_whose_stage_sets_a_run_size_is_cut_by_it() -> None:
    fetched = {EVENTS: records(EVENTS, range(5)), OTHER: records(OTHER, range(5))}
    result = in_runs(fetched, {"events": None, OTHER.topic: 4}, max_records=2)
    assert [len(run.value) for run in result[EVENTS]] == [2, 2, 1]
    assert [len(run.value) for run in result[OTHER]] == [4, 1]


def test_faust_turns_a_run_into_one_message_at_its_last_offset() -> None:
    run = Run(EVENTS, records(EVENTS, range(4, 7)))
    message: Any = app.consumer._to_message(EVENTS, run)  # type: ignore[attr-defined]
    assert (message.tp, message.offset, message.timestamp) == (EVENTS, 6, 1.006)
    assert [r.offset for r in message.value] == [4, 5, 6]
    assert message.key is None


class Message(SimpleNamespace):
    """Weakly referable and hashed by identity, as faust's in-flight set of messages
    needs."""

    __hash__ = object.__hash__


class Stream:
    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs

    def noack(self) -> Stream:
        return self

    async def events(self) -> AsyncIterator[Any]:
        for run in self.runs:
            message = Message(
                tp=EVENTS, topic="events", offset=run.offset, value=run.value, acked=False
            )
            yield SimpleNamespace(message=message)


async def test_each_offset_of_a_run_reaches_the_agent_once(own_tasks: PartitionTasks) -> None:
    own_tasks.assigned({EVENTS})
    task = own_tasks.get(EVENTS)
    assert task is not None
    task.offsets.sought_to_committed(10)
    task.offsets.processed(9)  # anchored: no jump to check with the broker

    stream = Stream(
        [
            Run(EVENTS, records(EVENTS, range(8, 12))),  # fetched before a seek: 8 and 9 were done
            Run(EVENTS, records(EVENTS, range(9, 12))),  # all of it done
            Run(EVENTS, records(EVENTS, range(12, 14))),
        ]
    )
    seen = []
    async for event, todo in runs_once(app, stream):
        seen.append([r.offset for r in todo])
        task.offsets.processed(event.message.offset)
    assert seen == [[10, 11], [12, 13]]
    assert own_tasks.stats.process["skipped_redelivered"] == 1


async def test_a_run_while_the_assignment_closes_is_skipped_and_remembered(
    own_tasks: PartitionTasks,
) -> None:
    own_tasks.assigned({EVENTS})
    task = own_tasks.get(EVENTS)
    assert task is not None
    task.offsets.sought_to_committed(20)
    own_tasks.closing = True
    stream = Stream([Run(EVENTS, records(EVENTS, range(20, 25)))])
    assert [todo async for _, todo in runs_once(app, stream)] == []
    assert own_tasks.stats.process["skipped_closing"] == 1


async def test_a_run_revoked_while_its_jump_is_checked_is_skipped_not_handed_on(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run after a seek jumps offsets, so the broker is asked about them; a
    rebalance that revokes the partition meanwhile must not find the run handed on
    (its step would find no task, and faust would wait for its ack for good)."""
    own_tasks.assigned({EVENTS})
    task = own_tasks.get(EVENTS)
    assert task is not None
    task.offsets.sought_to_committed(20)

    async def revoked_meanwhile(*_: Any) -> bool:
        own_tasks.closing = True
        own_tasks.revoked({EVENTS})
        return False  # only markers between: the jump itself is fine

    monkeypatch.setattr(in_order, "committed_records_between", revoked_meanwhile)
    run = Run(EVENTS, records(EVENTS, range(25, 28)))
    stream = Stream([run])
    assert [todo async for _, todo in runs_once(app, stream)] == []
    assert own_tasks.stats.process["skipped_closing"] == 1
