"""The windowed stream-stream join of searches and clicks by session within one hour,
declared as two patterns (deploy/patterns/examples.toml): over random streams from
random sources in any order, its matches are exactly a nested-loop join's, inner pairs
and the searches the left outer join adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairing.pattern_state import Match, PatternEvent
from pairing.patterns import load_patterns
from tests.unit.test_pattern_partition import arrivals, deliver
from tests.unit.test_patterns import S

ROOT = Path(__file__).resolve().parents[2]
DECLARED = load_patterns(ROOT / "deploy" / "patterns" / "examples.toml")
HOUR = 3600 * S


def nested_loop_join(events: list[PatternEvent]) -> list[Match]:
    """Every (search, click) of one session with the click after the search (in position
    order: time, then identity) and at most an hour later; every search with none."""
    matches = []
    for search in events:
        if search.fields["stream"] != "searches":
            continue
        session = search.fields["session"]
        assert isinstance(session, str)
        clicks = [
            click
            for click in events
            if click.fields["stream"] == "clicks"
            and click.fields["session"] == session
            and search.position < click.position
            and click.time - search.time <= HOUR
        ]
        for click in clicks:
            steps = ((search.identity,), (click.identity,))
            matches.append(
                Match("search-click", session, steps, search.time, click.time, click.time)
            )
        if not clicks:
            steps = ((search.identity,), ())
            deadline = search.time + HOUR
            matches.append(
                Match("search-without-click", session, steps, search.time, search.time, deadline)
            )
    return matches


@st.composite
def searches_and_clicks(draw: Any) -> list[PatternEvent]:
    """Up to 16 searches and clicks of 1 to 3 sessions over 3 hours, at whole minutes
    (so ties and the hour's very edge come up)."""
    count = draw(st.integers(0, 16))
    sessions = ["s1", "s2", "s3"][: draw(st.integers(1, 3))]
    names = draw(st.permutations(range(count)))
    events = []
    for n in range(count):
        stream = draw(st.sampled_from(["searches", "clicks"]))
        fields = {"stream": stream, "session": draw(st.sampled_from(sessions))}
        events.append(PatternEvent(draw(st.integers(0, 180)) * 60 * S, f"e{names[n]:02d}", fields))
    return events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(searches_and_clicks(), st.data())
def test_the_join_is_a_nested_loop_join_from_any_sources_in_any_order(
    events: list[PatternEvent], data: st.DataObject
) -> None:
    sources, order = data.draw(arrivals(events))
    steps = data.draw(st.lists(st.integers(0, 2), min_size=len(order), max_size=len(order)))
    deliver(list(DECLARED.patterns), events, sources, order, steps, nested_loop_join(events))


def test_a_click_an_hour_after_its_search_joins_and_one_a_second_later_does_not() -> None:
    search = PatternEvent(0, "s", {"stream": "searches", "session": "x"})
    on_edge = PatternEvent(HOUR, "c1", {"stream": "clicks", "session": "x"})
    too_late = PatternEvent(HOUR + S, "c2", {"stream": "clicks", "session": "x"})
    [inner] = nested_loop_join([search, on_edge, too_late])
    assert inner.events == (("s",), ("c1",))
    deliver(list(DECLARED.patterns), [search, on_edge, too_late], 1,
            [(0, 0), (0, 1), (0, 2)], [0] * 3, [inner])  # fmt: skip
    [outer] = nested_loop_join([search, too_late])
    assert (outer.pattern, outer.completed_at) == ("search-without-click", HOUR)
    deliver(list(DECLARED.patterns), [search, too_late], 1, [(0, 0), (0, 1)], [2] * 2, [outer])
