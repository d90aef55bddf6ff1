"""The rules of /ready and /live (app/health.py)."""

from __future__ import annotations

from faust.types import TP

from app.health import ProgressWatch, WorkerFacts, not_ready, stuck

READY = WorkerFacts(
    generation=3, rebalancing=False, restoring=False, flowing=True, stopped_stages=()
)
P0, P1 = TP("events", 0), TP("events", 1)


def test_ready_only_when_every_fact_says_so() -> None:
    assert not_ready(READY) == []
    before_join = WorkerFacts(-1, False, True, False, ("agents.pairing.pair",))
    assert not_ready(before_join) == [
        "not in its consumer group yet",
        "restoring its tables",
        "records are not flowing to its stages",
        "stages not running: agents.pairing.pair",
    ]
    assert not_ready(WorkerFacts(4, True, False, True, ())) == ["rebalancing"]


def test_a_partition_waits_from_the_first_look_that_finds_it_standing_with_records() -> None:
    watch = ProgressWatch()
    assert watch.standing({P0: 10, P1: 5}) == {}  # never looked at: nothing stands yet
    assert watch.look({P0: 10, P1: 5}, set(), now=100.0) == {}
    assert watch.standing({P0: 10, P1: 6}) == {P0: 10}
    assert watch.look({P0: 10, P1: 6}, {P0}, now=110.0) == {P0: 0.0}
    assert watch.look({P0: 10, P1: 6}, {P0, P1}, now=130.0) == {P0: 20.0, P1: 0.0}
    assert stuck({P0: 20.0, P1: 0.0}, limit=20) == ["events[0] for 20 s"]


def test_progress_or_nothing_to_read_resets_the_wait() -> None:
    watch = ProgressWatch()
    watch.look({P0: 10}, set(), now=0.0)
    watch.look({P0: 10}, {P0}, now=10.0)
    assert watch.look({P0: 11}, {P0}, now=20.0) == {}  # it moved: no wait
    assert watch.look({P0: 11}, {P0}, now=30.0) == {P0: 0.0}
    assert watch.look({P0: 11}, set(), now=40.0) == {}  # at its end
    assert watch.look({P0: 11}, {P0}, now=50.0) == {P0: 0.0}


def test_a_worker_not_ready_starts_over_and_forgets_revoked_partitions() -> None:
    watch = ProgressWatch()
    watch.look({P0: 10, P1: 3}, set(), now=0.0)
    watch.look({P0: 10}, {P0}, now=5.0)
    assert watch.standing({P0: 10, P1: 3}) == {P0: 10}  # P1 was revoked meanwhile
    watch.forget()
    assert watch.standing({P0: 10}) == {}
    assert watch.look({P0: 10}, {P0}, now=9.0) == {}
