"""Every declared pattern over one keyed partition (pairing/pattern_partition.py): over
random patterns, streams, sources, arrival orders and restarts, the matches are the
naive model's whatever source each event came from; late events are refused by the
partition's watermark; an advance reads only the keys it has work for."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairing.pattern_engine import PatternEngine
from pairing.pattern_partition import PatternPartition
from pairing.pattern_state import KeyState, Match, PatternEvent, Refused
from pairing.pattern_store import EncodedPatternStore, MemoryBytes
from pairing.patterns import Pattern, parse_pattern
from pairing.watermarks import EventClock, WatermarkUpdate
from tests.pattern_model import expected_matches
from tests.unit.test_patterns import BytesStore, S, event, patterns, streams, two_steps

DISORDER = 3  # seconds an event may arrive behind the latest of its source
LATENESS = (DISORDER + 1) * S  # the patterns' watermark lags the sources' by more


def progress(source: int, sources: int, time: int | None, idle: bool = False) -> WatermarkUpdate:
    return WatermarkUpdate(source, sources, time, idle)


@st.composite
def arrivals(draw: Any, events: list[PatternEvent]) -> tuple[int, list[tuple[int, int]]]:
    """How many sources, and (source, event) in arrival order: each event on a source
    drawn at random, at most DISORDER seconds behind the latest of its source; the
    sources' arrivals interleaved at random."""
    sources = draw(st.integers(1, 3))
    on = draw(st.lists(st.integers(0, sources - 1), min_size=len(events), max_size=len(events)))
    delay = draw(st.lists(st.integers(0, DISORDER), min_size=len(events), max_size=len(events)))

    def arrives(n: int) -> int:
        return events[n].time + delay[n] * S

    queues = [
        sorted((n for n in range(len(events)) if on[n] == s), key=arrives) for s in range(sources)
    ]
    order: list[tuple[int, int]] = []
    while any(queues):
        source = draw(st.sampled_from([s for s, queue in enumerate(queues) if queue]))
        order.append((source, queues[source].pop(0)))
    return sources, order


def deliver(
    declared: list[Pattern],
    events: list[PatternEvent],
    sources: int,
    order: list[tuple[int, int]],
    steps: list[int],
    expected: list[Match],
) -> None:
    """The events in `order` (source, event) through one partition of the patterns, each
    followed by its source's progress; a step ends (its writes flushed to the bytes, as
    a worker's does) where `steps` says 1 or 2, and at 2 the partition restarts from the
    bytes. At every watermark the matches decided are exactly the `expected` that
    completed at or before it, and in the end all of them, with nothing left stored."""
    engines = [PatternEngine(pattern, 10_000) for pattern in declared]
    data = MemoryBytes()
    store = EncodedPatternStore(data)
    partition = PatternPartition(engines, store, EventClock(), LATENESS)
    heard = {source for source, _ in order}
    for source in set(range(sources)) - heard:
        partition.observe(progress(source, sources, None, idle=True))  # nothing there
    latest: dict[int, int] = {}
    matches: list[Match] = []
    for (source, n), step in zip(order, steps, strict=True):
        latest[source] = max(latest.get(source, events[n].time), events[n].time)
        # Never late: LATENESS covers the disorder.
        assert partition.add(events[n], latest[source]) == []
        matches += partition.observe(progress(source, sources, latest[source])).matches
        watermark = partition.watermark
        decided = [m for m in expected if watermark is not None and m.completed_at <= watermark]
        assert Counter(matches) == Counter(decided)
        if step:
            store.flush()
        if step == 2:
            clock = EventClock(sources, dict(partition.clock.marks), partition.clock.watermark_us)
            store = EncodedPatternStore(data)
            partition = PatternPartition(engines, store, clock, LATENESS)
    for source in range(sources):
        matches += partition.observe(progress(source, sources, 10**6 * S)).matches
    store.flush()
    assert Counter(matches) == Counter(expected)
    assert data == {} and partition.live_keys() == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(), patterns(), st.data())
def test_the_matches_are_the_models_from_any_sources_in_any_order(
    first: dict[str, Any], second: dict[str, Any], data: st.DataObject
) -> None:
    # The second pattern keyed by the first's field (one state a key for both) or another.
    key = data.draw(st.sampled_from([first["key"], "value"]))
    declared = [parse_pattern(first), parse_pattern({**second, "name": "q", "key": key})]
    events = data.draw(streams(first))
    sources, order = data.draw(arrivals(events))
    steps = data.draw(st.lists(st.integers(0, 2), min_size=len(order), max_size=len(order)))
    expected = [m for pattern in declared for m in expected_matches(pattern, events)]
    deliver(declared, events, sources, order, steps, expected)


def test_an_event_at_or_before_the_patterns_watermark_is_late_for_every_pattern() -> None:
    engines = [PatternEngine(two_steps()), PatternEngine(parse_pattern(
        {"name": "any", "key": "account", "within": 60, "step": [{"name": "one"}]}
    ))]  # fmt: skip
    store = BytesStore()
    partition = PatternPartition(engines, store, EventClock(), 10 * S)
    assert partition.add(event(0, "a", account="1", type="A")) == []
    [single] = partition.observe(progress(0, 1, 30 * S)).matches  # the watermark: 20 s - 1 µs
    assert partition.watermark == 20 * S - 1
    assert (single.pattern, single.events) == ("any", (("a",),))
    # Key 1's state of the pattern "p" was not due since, so behind: the partition decides.
    for time in (19.999999, 5):
        late = event(time, f"late{time}", account="1", type="B")
        assert partition.add(late) == [("p", Refused(late, "late")), ("any", Refused(late, "late"))]
    on_time = event(20, "b", account="1", type="B")  # behind by the lateness: on time
    assert partition.add(on_time) == []
    decided = partition.observe(progress(0, 1, 31 * S + 10 * S)).matches
    # Completed at one time: in the order of the patterns' names.
    assert [(m.pattern, m.events) for m in decided] == [("any", (("b",),)), ("p", (("a",), ("b",)))]
    # An event no pattern keys is nobody's: neither refused nor kept.
    assert partition.add(event(40, "c", type="A")) == []


def test_an_event_far_behind_its_own_source_is_late_whatever_the_others() -> None:
    engine = PatternEngine(two_steps())
    partition = PatternPartition([engine], BytesStore(), EventClock(), 10 * S)
    partition.observe(progress(1, 2, 0))  # source 1 holds the watermark at 0
    a = event(100, "a", account="1", type="A")
    assert partition.add(a, 100 * S) == []
    behind = event(89, "b", account="1", type="B")  # more than 10 s behind its source
    assert partition.add(behind, 100 * S) == [("p", Refused(behind, "late"))]
    within = event(90, "c", account="1", type="B")
    assert partition.add(within, 100 * S) == []
    assert partition.watermark is None  # the other source was never near


def test_an_event_routed_by_one_key_is_added_to_the_patterns_of_that_key_only() -> None:
    by_account = PatternEngine(
        parse_pattern(
            {"name": "by-account", "key": "account", "within": 60, "step": [{"name": "one"}]}
        )
    )
    by_value = PatternEngine(parse_pattern(
        {"name": "by-value", "key": "value", "within": 60, "step": [{"name": "one"}]}
    ))  # fmt: skip
    store = BytesStore()
    partition = PatternPartition([by_account, by_value], store, EventClock(), 0)
    both = event(0, "a", account="1", value="v")
    partition.add(both, 0, key_field="value")
    assert set(store.data) == {("value", "v")}
    partition.add(both, 0, key_field="account")
    assert set(store.data) == {("value", "v"), ("account", "1")}
    assert partition.add(both, 0, key_field="nobody") == []


class CountingStore(BytesStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, field: str, key: str) -> KeyState | None:
        self.reads += 1
        return super().get(field, key)


def test_an_advance_reads_only_the_keys_it_has_work_for() -> None:
    store = CountingStore()
    partition = PatternPartition([PatternEngine(two_steps())], store, EventClock(), 0)
    for n in range(500):
        partition.add(event(0, f"a{n}", account=str(n), type="A"))  # windows end at 60 s
    partition.observe(progress(0, 1, 1 * S))  # each key's A taken into a partial
    assert partition.live_keys() == 500
    store.reads = 0
    for second in range(2, 60):
        assert partition.observe(progress(0, 1, second * S)).matches == ()
    assert store.reads == 0
    partition.observe(progress(0, 1, 60 * S + 1))  # every window closes
    assert store.reads == 500 and store.data == {} and partition.live_keys() == 0


def test_a_partition_loads_what_its_patterns_stored_and_leaves_the_rest() -> None:
    store = BytesStore()
    engine = PatternEngine(two_steps())
    partition = PatternPartition([engine], store, EventClock(), 0)
    partition.add(event(0, "a", account="1", type="A"))
    partition.observe(progress(0, 1, 1 * S))  # a partial of p, waiting for a B
    [held] = store.states()
    retired = {"retired": held.partials["p"]}  # of a pattern no longer declared
    store.put(KeyState("other", "1", None, None, (), retired, {}))  # a field nobody keys by
    store.put(KeyState("account", "2", None, None, (), retired, {}))
    again = PatternPartition([engine], store, partition.clock, 0)
    assert again.live_keys() == 1
    assert set(store.data) == {("account", "1"), ("other", "1")}  # key 2 held nothing live
    again.add(event(2, "b", account="1", type="B"))
    [match] = again.observe(progress(0, 1, 3 * S)).matches
    assert match.events == (("a",), ("b",))
    assert set(store.data) == {("other", "1")}
    with pytest.raises(ValueError, match="distinct names"):
        PatternPartition([engine, engine], store, EventClock(), 0)
    with pytest.raises(ValueError, match="lateness"):
        PatternPartition([engine], store, EventClock(), -1)
