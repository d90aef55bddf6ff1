from collections import Counter
from decimal import Decimal

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pairing.events import Event, parse_event
from pairing.rules import (
    Conflict,
    Duplicate,
    Outcome,
    Paired,
    PairingConfig,
    PairingPartition,
    PendingSummary,
    Unpaired,
)
from tests.reference_model import Expected, ModelPartition
from tests.unit.memory_store import MemoryStore

MINUTE = 60_000_000
CONFIG = PairingConfig(expiry_us=5 * MINUTE, max_wait_s=300.0, dedup_retention_us=60 * MINUTE)
NOW = 1_000.0


def event(kind: str, minute: float, value: int | str = 1, ident: str | None = None) -> Event:
    seconds = int(minute * 60)
    stamp = f"2024-02-09 {21 + seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    id_part = f',"id":"{ident}"' if ident else ""
    parsed = parse_event(
        f'{{"type":"{kind}","timestamp":"{stamp}","value":{value}{id_part}}}'.encode(), 4096
    )
    assert isinstance(parsed, Event), parsed
    return parsed


def engine() -> tuple[PairingPartition, MemoryStore]:
    store = MemoryStore()
    return PairingPartition(store, CONFIG), store


def test_a_then_b_pairs_with_exact_sum() -> None:
    pairing, _ = engine()
    assert pairing.process(event("A", 0, "0.1"), NOW) == []
    [paired] = pairing.process(event("B", 0, "0.2"), NOW)
    assert isinstance(paired, Paired)
    assert paired.sum == Decimal("0.3")
    assert (paired.a.type, paired.b.type) == ("A", "B")


def test_b_then_a_pairs_out_of_order_within_expiry() -> None:
    pairing, _ = engine()
    pairing.process(event("B", 0, 2), NOW)
    pairing.process(event("A", 3, 9), NOW)  # another key moves stream time on
    [paired] = pairing.process(event("A", 0, 5), NOW)
    assert isinstance(paired, Paired) and paired.sum == 7


def test_redelivered_event_is_a_duplicate_while_pending_and_after_pairing() -> None:
    pairing, _ = engine()
    pairing.process(event("A", 0), NOW)
    assert pairing.process(event("A", 0), NOW) == [
        Duplicate(event("A", 0).key, event("A", 0).identity)
    ]
    pairing.process(event("B", 0), NOW)
    assert isinstance(pairing.process(event("B", 0), NOW)[0], Duplicate)


def test_a_different_event_of_a_pending_type_is_a_conflict() -> None:
    pairing, _ = engine()
    pairing.process(event("A", 0, 1), NOW)
    [conflict] = pairing.process(event("A", 0, 2), NOW)
    assert isinstance(conflict, Conflict) and "pending" in conflict.detail


def test_any_new_event_for_a_paired_key_is_a_conflict() -> None:
    pairing, _ = engine()
    pairing.process(event("A", 0, 1), NOW)
    pairing.process(event("B", 0, 1), NOW)
    [conflict] = pairing.process(event("B", 0, 3), NOW)
    assert isinstance(conflict, Conflict) and "paired" in conflict.detail


def test_pending_event_expires_when_stream_time_passes_expiry() -> None:
    pairing, store = engine()
    pairing.process(event("A", 0), NOW)
    assert pairing.process(event("A", 5), NOW) == []  # exactly 5 minutes: still pending
    [expired] = pairing.process(event("A", 5.1), NOW)
    assert isinstance(expired, Unpaired) and expired.reason == "expired"
    assert store.data[event("A", 0).key].pending is None


def test_event_older_than_expiry_is_late_at_once_and_never_held() -> None:
    pairing, store = engine()
    pairing.process(event("A", 10), NOW)
    [late] = pairing.process(event("B", 4), NOW)
    assert isinstance(late, Unpaired) and late.reason == "late"
    assert store.data[event("B", 4).key].pending is None
    assert isinstance(pairing.process(event("B", 4), NOW)[0], Duplicate)


def test_pending_event_expires_after_max_wait_of_wall_clock() -> None:
    pairing, _ = engine()
    pairing.process(event("A", 0), NOW)
    assert pairing.expire_waiting(NOW + 300) == []
    [expired] = pairing.expire_waiting(NOW + 301)
    assert isinstance(expired, Unpaired) and expired.reason == "expired"
    assert pairing.expire_waiting(NOW + 1_000) == []


def test_settled_keys_are_forgotten_after_dedup_retention() -> None:
    pairing, store = engine()
    pairing.process(event("A", 0), NOW)
    pairing.process(event("B", 0), NOW)
    pairing.process(event("A", 60), NOW)
    assert event("A", 0).key in store.data
    pairing.process(event("A", 60.1), NOW)
    assert event("A", 0).key not in store.data
    assert len(store.data) == 2  # both pending events at minute 60


def test_reloaded_engine_carries_on_where_the_old_one_stopped() -> None:
    pairing, store = engine()
    pairing.process(event("A", 0), NOW)
    restarted = PairingPartition.load(store, CONFIG, pairing.stream_time_us)
    [expired] = restarted.process(event("B", 6), NOW)
    assert isinstance(expired, Unpaired) and expired.event.type == "A"


def test_pending_summary_counts_and_finds_the_oldest_and_longest_waiting() -> None:
    pairing, _ = engine()
    assert pairing.pending() == PendingSummary(0, None, None)
    pairing.process(event("A", 2), NOW)
    pairing.process(event("A", 1), NOW + 5)  # older event time, arrived later
    pairing.process(event("B", 3), NOW + 9)
    summary = pairing.pending()
    assert summary.count == 3
    assert summary.oldest_time_us == event("A", 1).time_us
    assert summary.first_waiting_since == NOW
    pairing.process(event("B", 2), NOW + 10)  # pairs the first A
    summary = pairing.pending()
    assert (summary.count, summary.first_waiting_since) == (2, NOW + 5)
    pairing.process(event("A", 9), NOW + 11)  # stream time 9: minute 1 and 3 expire
    assert pairing.pending() == PendingSummary(1, event("A", 9).time_us, NOW + 11)


# --- property: the engine agrees with the naive reference model ----------------

events_strategy = st.lists(
    st.tuples(
        st.sampled_from("AB"),
        st.integers(min_value=0, max_value=90),  # minute: expiry and retention both matter
        st.integers(min_value=0, max_value=3),  # value: same value means same identity
        st.booleans(),  # restart the engine after this event
    ),
    max_size=120,
)


def tally(outcomes: list[Outcome], out: Expected) -> None:
    for outcome in outcomes:
        if isinstance(outcome, Paired):
            key = (outcome.key, outcome.a.identity, outcome.b.identity, str(outcome.sum))
            out.pairs[key] += 1
        elif isinstance(outcome, Unpaired):
            e = outcome.event
            out.unpaired[(outcome.key, e.type, e.identity, outcome.reason)] += 1
        elif isinstance(outcome, Conflict):
            out.conflicts[outcome.event.identity] += 1
        else:
            out.duplicates += 1


@settings(max_examples=300, deadline=None)
@given(events_strategy)
# Found by hypothesis: the second copy of A comes 61 minutes of stream time later.
@example(steps=[("A", 0, 0, False), ("B", 0, 0, False), ("A", 61, 0, False), ("A", 0, 0, False)])
def test_engine_matches_reference_model(steps: list[tuple[str, int, int, bool]]) -> None:
    pairing, store = engine()
    model = ModelPartition(CONFIG.expiry_us, CONFIG.dedup_retention_us)
    got, want = Expected(), Expected()
    distinct: set[str] = set()
    # Copies that came after their key may have been forgotten (dedup retention):
    # such a copy cannot be told from a new event, and is reported late.
    forgotten: set[str] = set()
    stream_minute = -1
    for kind, minute, value, restart in steps:
        e = event(kind, minute, value)
        behind_us = (stream_minute - minute) * MINUTE
        if e.identity in distinct and behind_us >= CONFIG.dedup_retention_us:
            forgotten.add(e.identity)
        stream_minute = max(stream_minute, minute)
        distinct.add(e.identity)
        tally(pairing.process(e, NOW), got)
        model.feed(e, want)
        if restart:
            pairing = PairingPartition.load(store, CONFIG, pairing.stream_time_us)
    got.pending = {s.pending.identity for s in store.data.values() if s.pending}
    want.pending = {k.pending.identity for k in model.keys.values() if k.pending}
    assert got == want
    pending_states = [s for s in store.data.values() if s.pending]
    summary = pairing.pending()
    assert summary.count == len(want.pending)
    assert summary.oldest_time_us == min((s.time_us for s in pending_states), default=None)
    # Every distinct event ends in exactly one place, or is still pending; a copy
    # that came after its key was forgotten adds one late record.
    places: Counter[str] = Counter(got.pending)
    for pair_key in got.pairs:
        places.update([pair_key[1], pair_key[2]])
    places.update(k[2] for k in got.unpaired)
    places.update(got.conflicts)
    assert set(places) == distinct
    assert all(n == 1 for i, n in places.items() if i not in forgotten)
    late = Counter(k[2] for k in got.unpaired if k[3] == "late")
    assert all(n == 1 or (n == 2 and late[i] >= 1) for i, n in places.items() if i in forgotten)
