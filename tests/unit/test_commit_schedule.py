"""The periodic commits keep to the clock, with handoff commits in between."""

from __future__ import annotations

import pytest

from app.exactly_once.commit_schedule import CommitSchedule, lead


def run(schedule: CommitSchedule, until: float, takes: float = 0.0) -> list[tuple[float, bool]]:
    """The commits up to `until`, each taking `takes` seconds."""
    commits = []
    now = schedule.start
    while True:
        at, everything = schedule.next_after(now)
        if at > until:
            return commits
        commits.append((round(at, 6), everything))
        now = at + takes


def test_commits_keep_to_the_clock_whatever_a_commit_took() -> None:
    schedule = CommitSchedule(start=100.0, interval=1.0, handoff=5.0)  # no handoffs
    assert run(schedule, until=103.0, takes=0.03) == [(101.0, True), (102.0, True), (103.0, True)]


def test_a_commit_that_overruns_skips_the_times_it_missed() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=5.0)
    assert run(schedule, until=5.0, takes=1.5) == [(1.0, True), (2.5, True), (4.0, True)]


def test_handoff_commits_fall_in_between() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=0.25)
    assert run(schedule, until=2.0, takes=0.01) == [
        (0.25, False),
        (0.5, False),
        (0.75, False),
        (1.0, True),
        (1.25, False),
        (1.5, False),
        (1.75, False),
        (2.0, True),
    ]


def test_a_handoff_just_before_a_commit_of_everything_is_left_to_it() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=0.3)
    assert run(schedule, until=1.0) == [(0.3, False), (0.6, False), (1.0, True)]


def test_a_commit_of_everything_due_during_a_handoff_commit_goes_at_once() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=0.02)
    assert schedule.next_after(0.975) == pytest.approx((0.98, False))
    # That handoff commit took 30 ms, past the commit of everything at 1.0.
    assert schedule.next_after(1.01) == (1.01, True)
    assert schedule.next_after(1.03) == pytest.approx((1.04, False))
    assert schedule.next_after(1.99) == (2.0, True)


def test_a_due_output_brings_the_commit_of_everything_forward() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=0.25)
    assert schedule.next_after(0.0, due=0.6) == (0.25, False)
    assert schedule.next_after(0.25, due=0.6) == (0.6, True)
    # Counted from the early commit: the clock's 1.0 would be a second commit at once.
    assert schedule.next_after(0.6) == (0.75, False)
    assert schedule.next_after(0.75) == pytest.approx((1.0, False))
    assert schedule.next_after(1.0) == pytest.approx((1.25, False))
    assert schedule.next_after(1.5) == pytest.approx((1.6, True))


def test_a_due_output_commits_no_sooner_than_half_an_interval_after_the_last() -> None:
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=5.0)  # no handoffs
    assert schedule.next_after(0.0) == (1.0, True)
    assert schedule.next_after(1.01, due=1.2) == (1.5, True)
    assert schedule.next_after(1.51, due=1.6) == (2.0, True)


def test_outputs_overdue_by_half_an_interval_keep_the_clock() -> None:
    # A backlog: every run's inputs were sent long ago.
    schedule = CommitSchedule(start=0.0, interval=1.0, handoff=5.0)
    commits = []
    now = 0.0
    for _ in range(3):
        at, everything = schedule.next_after(now, due=now - 0.5)
        commits.append((at, everything))
        now = at + 0.01
    assert commits == [(1.0, True), (2.0, True), (3.0, True)]
    # Late by less than that, it goes at once.
    assert schedule.next_after(3.6, due=3.2) == (3.6, True)


@pytest.mark.parametrize(
    ("interval", "handoff", "expected"),
    [
        (1.0, 0.05, 0.75),  # a quarter of the interval: more than two handoffs
        (1.0, 0.2, 0.6),  # two slow handoffs: more than a quarter
        (0.5, 0.05, 0.375),
        (0.1, 0.05, 0.05),  # never under half an interval
        (0.1, 0.2, 0.05),  # handoffs never apart (at or above the interval)
    ],
)
def test_outputs_ask_for_their_commit_leaving_room_for_the_commit(
    interval: float, handoff: float, expected: float
) -> None:
    assert lead(interval, handoff) == pytest.approx(expected)
