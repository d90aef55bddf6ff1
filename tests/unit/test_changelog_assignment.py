"""An input partition is processed only together with the changelog partitions of its
state: an assignment without them stops the worker before any step of it runs."""

from __future__ import annotations

from typing import Any

import pytest
from faust.types import TP

import agents  # noqa: F401  (declares every table with the input topics it serves)
from app.exactly_once.consumer import ChangelogsNotAssigned
from app.exactly_once.partition_tasks import PartitionTasks
from app.faust_app import app
from app.settings import settings
from tables import pairing_state, source_progress
from tests.unit.test_internals import unconnected_consumer

conf = settings()
PAIRING = pairing_state.table.changelog_topic.get_topic_name()
PROGRESS = source_progress.table.changelog_topic.get_topic_name()


def test_each_input_topic_names_the_changelogs_of_its_state() -> None:
    changelogs = app.partition_tasks.changelogs
    assert PAIRING in changelogs[conf.keyed_topic]
    assert PROGRESS in changelogs[conf.events_topic]
    assert PAIRING not in changelogs[conf.events_topic]


def test_only_the_changelog_partitions_of_assigned_inputs_are_missed() -> None:
    tasks = PartitionTasks()
    tasks.state_in(["keyed", "other-keyed"], "state-changelog")
    tasks.state_in(["keyed"], "more-changelog")
    actives = {
        TP("keyed", 0),
        TP("state-changelog", 0),
        TP("more-changelog", 0),
        TP("keyed", 2),
        TP("state-changelog", 2),
        TP("other-keyed", 3),
        TP("unrelated", 1),
    }
    assert tasks.changelogs_missing(actives) == [
        TP("more-changelog", 2),
        TP("state-changelog", 3),
    ]
    completed = actives | {TP("more-changelog", 2), TP("state-changelog", 3)}
    assert tasks.changelogs_missing(completed) == []


async def test_an_assignment_without_the_changelogs_stops_the_worker_unprocessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keyed = TP(conf.keyed_topic, 1)
    assigned = {keyed, TP(PROGRESS, 1)}  # a changelog, but not the keyed partition's
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    async def taken_on(*_: Any) -> None:
        raise AssertionError("faust took the assignment on")

    tasks = PartitionTasks()
    tasks.changelogs = app.partition_tasks.changelogs
    monkeypatch.setattr(app, "partition_tasks", tasks)
    monkeypatch.setattr(app, "crash", crash)
    monkeypatch.setattr(app.assignor, "assigned_actives", lambda: assigned)
    consumer = unconnected_consumer(taken_on)
    monkeypatch.setattr(type(consumer).__mro__[1], "on_partitions_assigned", taken_on)

    await consumer.on_partitions_assigned(assigned)

    assert len(crashed) == 1 and isinstance(crashed[0], ChangelogsNotAssigned)
    assert TP(PAIRING, 1) in crashed[0].missing
    assert f"{PAIRING}[1]" in str(crashed[0])
    assert tasks.closing and tasks.get(keyed) is None
