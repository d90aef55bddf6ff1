"""The promise: the outputs depend on what each input partition holds, never on the
order in which partitions are read, when sources commit, or where components
restart. Checked against the naive model over random streams and interleavings."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, example, find, given, settings
from hypothesis import strategies as st

from pairing.key_state import PairingConfig
from pairing.watermarks import EventClock
from tests.reference_model import AmbiguousStream, Expected, Reading, expected_outputs
from tests.unit.simulation import ClockFactory, Simulation

MINUTE = 60_000_000
CONFIG = PairingConfig(expiry_us=5 * MINUTE, max_wait_s=300.0, dedup_retention_us=60 * MINUTE)
# Every record produced at 22:20 (minute 80 of the streams, which start at 21:00), with
# the clock guard at 5 minutes: events of minutes 86 and on are refused.
PRODUCED_MS = 1_707_512_400_000 + 80 * 60_000
READING = Reading(max_ahead_us=5 * MINUTE, record_time_ms=PRODUCED_MS)


def record(kind: str, minute: int, value: int) -> bytes:
    return (
        f'{{"type":"{kind}","timestamp":"2024-02-09 {21 + minute // 60:02d}:{minute % 60:02d}:00",'
        f'"value":{value}}}'
    ).encode()


@st.composite
def partitioned_streams(draw: Any) -> list[list[bytes | None]]:
    """Events of random times (expiry and retention both matter) spread over 1 to 4
    input partitions. Same type, time and value is the same event: its copies go
    anywhere. Different events of one type and time come from one source, so on one
    partition (the rules cannot order them across partitions: docs/event-time.md)."""
    count = draw(st.integers(min_value=1, max_value=4))
    sources: list[list[bytes | None]] = [[] for _ in range(count)]
    home: dict[tuple[str, int], tuple[int, int]] = {}  # (type, minute) -> (value, partition)
    steps = st.tuples(
        st.sampled_from("AB"),
        # Minutes: mostly close together (pairs, conflicts), some far (expiry, retention),
        # some past the clock guard.
        st.integers(min_value=0, max_value=8)
        | st.integers(min_value=0, max_value=90)
        | st.integers(min_value=84, max_value=170),
        st.integers(min_value=0, max_value=2),
        st.integers(min_value=0, max_value=count - 1),
        st.integers(min_value=0, max_value=30),
    )
    for kind, minute, value, partition, noise in draw(st.lists(steps, max_size=80)):
        if noise == 0:
            sources[partition].append(None)  # an invalid record
            continue
        first_value, first_partition = home.setdefault((kind, minute), (value, partition))
        if value != first_value:
            partition = first_partition
        sources[partition].append(record(kind, minute, value))
    return sources


def outputs(e: Expected) -> tuple[Any, ...]:
    return (e.pairs, e.unpaired, e.conflicts, e.invalid)


def model(sources: list[list[bytes | None]], drained: bool, all_idle: bool) -> Expected:
    return expected_outputs(
        sources, CONFIG.expiry_us, CONFIG.dedup_retention_us, READING, drained, all_idle
    )


def agrees_with_model(
    sources: list[list[bytes | None]], seed: int, partitions: int, clock: ClockFactory
) -> bool | None:
    """Whether a run (ending with every source idle, or not: drawn from the seed)
    gives the model's outputs, and again once drained; None where the rules leave
    the outcome to the order of reading (`AmbiguousStream`)."""
    end_idle = seed % 2 == 1
    try:
        want = model(sources, drained=False, all_idle=end_idle)
    except AmbiguousStream:
        return None
    simulation = Simulation(
        sources, partitions, CONFIG, random.Random(seed), clock, end_idle=end_idle, reading=READING
    )
    got = simulation.run()
    if outputs(got) != outputs(want) or simulation.pending() != want.pending:
        return False
    drained, want_drained = simulation.drain(), model(sources, True, end_idle)
    return (
        outputs(drained) == outputs(want_drained)
        and drained.duplicates == want_drained.duplicates
        and not simulation.held_late()
    )


def as_is(restored: EventClock) -> EventClock:
    return restored


interleavings = st.tuples(
    partitioned_streams(), st.integers(min_value=0), st.integers(min_value=1, max_value=3)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleavings, st.integers(min_value=0))
# Found by a run: a source restarted after it went idle tells its progress, not idle,
# and must be declared idle again for the watermark to reach the others' progress.
@example(
    (
        [
            [None, b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":0}'],
            [b'{"type":"A","timestamp":"2024-02-09 21:06:00","value":0}'],
            [b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":0}'],
            [b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":0}'],
        ],
        285,
        1,
    ),
    0,
)
def test_every_interleaving_gives_the_models_outcome(
    case: tuple[list[list[bytes | None]], int, int], other_seed: int
) -> None:
    sources, seed, partitions = case
    agrees = agrees_with_model(sources, seed, partitions, as_is)
    assume(agrees is not None)
    assert agrees
    # And so two interleavings of the same partitions agree with each other.
    first = Simulation(sources, partitions, CONFIG, random.Random(seed), reading=READING).run()
    second = Simulation(
        sources, partitions, CONFIG, random.Random(other_seed), reading=READING
    ).run()
    assert outputs(first) == outputs(second)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interleavings, st.lists(st.tuples(st.integers(0, 3), st.integers(0, 80)), max_size=6))
def test_events_past_the_clock_guard_change_nothing_else(
    case: tuple[list[list[bytes | None]], int, int], inserted: list[tuple[int, int]]
) -> None:
    """An event stamped past the guard, anywhere in any partition, is refused and the
    outcome of every other record stays what it was: it moves no watermark."""
    sources, seed, partitions = case
    ahead = [list(records) for records in sources]
    for n, (where, at) in enumerate(inserted):
        records = ahead[where % len(ahead)]
        records.insert(at % (len(records) + 1), record("AB"[n % 2], 86 + n, n))
    try:
        want = model(sources, drained=False, all_idle=True)
    except AmbiguousStream:
        return
    got = Simulation(
        ahead, partitions, CONFIG, random.Random(seed), end_idle=True, reading=READING
    ).run()
    assert (got.pairs, got.unpaired, got.conflicts) == (want.pairs, want.unpaired, want.conflicts)
    refused = Counter(record("AB"[n % 2], 86 + n, n) for n in range(len(inserted)))
    assert got.invalid == want.invalid + refused


class LargestProgress(EventClock):
    """Stream time as it was: the largest progress seen, whichever partition it is on."""

    def _minimum(self) -> int | None:
        known = [m.progress_us for m in self.marks.values() if m.progress_us is not None]
        return max(known) if known else None


def leading(restored: EventClock) -> EventClock:
    return LargestProgress(restored.sources, restored.marks, restored.watermark_us)


def test_with_the_largest_progress_as_stream_time_some_interleaving_disagrees() -> None:
    """The property above can fail: with stream time as the largest progress (the
    rule before watermarks) hypothesis finds a stream and an order that break it."""
    sources, seed, partitions = find(
        interleavings,
        lambda case: agrees_with_model(case[0], case[1], case[2], leading) is False,
        settings=settings(max_examples=2000, deadline=None, database=None),
    )
    assert agrees_with_model(sources, seed, partitions, leading) is False
    assert agrees_with_model(sources, seed, partitions, as_is) is True
