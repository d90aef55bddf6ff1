"""When ingest's partitions commit between the commits of everything: only while a
partition they feed has processed everything committed to it, and they have no backlog
of their own."""

from __future__ import annotations

import pytest
from faust.types import TP

from app.exactly_once.partition_tasks import MARKER_SLACK, PartitionTasks
from app.faust_app import app

EVENTS, KEYED, OTHER = TP("events", 0), TP("keyed", 1), TP("other", 0)


def test_a_handoff_is_due_when_a_partition_it_feeds_is_caught_up_and_it_has_no_backlog(
    own_tasks: PartitionTasks,
) -> None:
    own_tasks.assigned({EVENTS, KEYED, OTHER})
    own_tasks.handoffs["events"] = "keyed"
    pending = {EVENTS: 0, KEYED: 5_000, OTHER: 0}
    due = own_tasks.handoff_due
    assert not due(pending.__getitem__, 500)  # the next stage has a backlog: no handoff
    pending[KEYED] = MARKER_SLACK  # only transaction markers left
    assert due(pending.__getitem__, 500)
    pending[EVENTS] = 501  # the handing-off partition has a backlog of its own
    assert not due(pending.__getitem__, 500)
    pending[EVENTS] = 500
    assert due(pending.__getitem__, 500)
    own_tasks.handoffs.clear()
    assert not due(pending.__getitem__, 500)  # nothing handed off


def test_unprocessed_is_what_was_committed_and_not_yet_processed(
    own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    stable: dict[TP, int | None] = {KEYED: 120}
    monkeypatch.setattr(app.consumer, "assignment", lambda: {KEYED})
    monkeypatch.setattr(app.consumer, "highwater", stable.__getitem__)
    unprocessed = app.consumer._unprocessed
    assert unprocessed(KEYED) > 10**9  # no task: unknown, a backlog
    own_tasks.assigned({KEYED})
    task = own_tasks.get(KEYED)
    assert task is not None
    assert unprocessed(KEYED) > 10**9  # not yet sought to the committed offset
    task.offsets.sought_to_committed(100)
    assert unprocessed(KEYED) == 20
    task.offsets.processed(119)
    assert unprocessed(KEYED) == 0
    stable[KEYED] = None  # nothing fetched yet
    assert unprocessed(KEYED) == 0
    monkeypatch.setattr(app.consumer, "assignment", lambda: set())
    assert unprocessed(KEYED) > 10**9  # revoked in the client already
