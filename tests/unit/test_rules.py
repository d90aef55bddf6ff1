"""The rules, one at a time, with input partitions spelled out. The property test
over random partitioned streams is in test_event_time.py."""

from decimal import Decimal

from pairing.events import Event, parse_event
from pairing.key_state import Conflict, Duplicate, Outcome, Paired, PairingConfig, Unpaired
from pairing.rules import PairingPartition, PendingSummary
from pairing.watermarks import EventClock, SourceProgress, WatermarkUpdate
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


class Topic:
    """A keyed partition fed by `sources` input partitions, each telling its
    progress after every event (a commit per event)."""

    def __init__(self, sources: int = 1) -> None:
        self.store = MemoryStore()
        self.engine = PairingPartition(self.store, CONFIG, EventClock(), NOW)
        self.progress = [SourceProgress(None, NOW) for _ in range(sources)]

    def feed(self, e: Event, source: int = 0, now: float = NOW) -> list[Outcome]:
        stamp = self.progress[source].observe(e.time_us, now)
        outcomes = self.engine.process(e, stamp, now)
        return outcomes + self.tell(source, now)

    def tell(self, source: int, now: float = NOW, idle: bool = False) -> list[Outcome]:
        progress = self.progress[source]
        progress.idle = idle
        update = WatermarkUpdate(source, len(self.progress), progress.progress_us, idle)
        return self.engine.observe(update, now)


def test_a_then_b_pairs_with_exact_sum() -> None:
    topic = Topic()
    assert topic.feed(event("A", 0, "0.1")) == []
    [paired] = topic.feed(event("B", 0, "0.2"))
    assert isinstance(paired, Paired)
    assert paired.sum == Decimal("0.3")
    assert (paired.a.type, paired.b.type) == ("A", "B")


def test_b_then_a_pairs_out_of_order_within_expiry() -> None:
    topic = Topic()
    topic.feed(event("B", 0, 2))
    topic.feed(event("A", 3, 9))  # moves the watermark on
    [paired] = topic.feed(event("A", 0, 5))
    assert isinstance(paired, Paired) and paired.sum == 7


def test_redelivered_event_is_a_duplicate_while_pending_and_after_pairing() -> None:
    topic = Topic()
    topic.feed(event("A", 0))
    assert topic.feed(event("A", 0)) == [Duplicate(event("A", 0).key, event("A", 0).identity)]
    topic.feed(event("B", 0))
    assert isinstance(topic.feed(event("B", 0))[0], Duplicate)


def test_a_different_event_of_a_pending_type_is_a_conflict() -> None:
    topic = Topic()
    topic.feed(event("A", 0, 1))
    [conflict] = topic.feed(event("A", 0, 2))
    assert isinstance(conflict, Conflict) and "pending" in conflict.detail


def test_any_new_event_for_a_paired_key_is_a_conflict() -> None:
    topic = Topic()
    topic.feed(event("A", 0, 1))
    topic.feed(event("B", 0, 1))
    [conflict] = topic.feed(event("B", 0, 3))
    assert isinstance(conflict, Conflict) and "paired" in conflict.detail


def test_pending_event_expires_when_the_watermark_passes_expiry() -> None:
    topic = Topic()
    topic.feed(event("A", 0))
    assert topic.feed(event("A", 5)) == []  # exactly 5 minutes: still pending
    [expired] = topic.feed(event("A", 5.1))
    assert isinstance(expired, Unpaired) and expired.reason == "expired"
    assert topic.store.data[event("A", 0).key].pending is None


def test_the_watermark_is_the_slowest_input_partition() -> None:
    topic = Topic(sources=2)
    topic.feed(event("A", 0), source=0)
    assert topic.engine.watermark_us is None  # partition 1 not heard from yet
    assert topic.feed(event("A", 30), source=0) == []
    topic.feed(event("A", 2), source=1)
    assert topic.engine.watermark_us == event("A", 2).time_us
    # Partition 1 is behind: its B is on time, and pairs.
    [paired] = topic.feed(event("B", 0), source=1)
    assert isinstance(paired, Paired)
    # Partition 1 catches up: the watermark passes minute 30 - 5 minus a bit.
    [expired] = topic.feed(event("B", 12), source=1)
    assert isinstance(expired, Unpaired) and expired.event.identity == event("A", 2).identity


def test_an_idle_partition_stops_holding_the_watermark_back() -> None:
    topic = Topic(sources=2)
    topic.feed(event("A", 0), source=0)
    assert topic.tell(1, idle=True) == []  # never written: idle from the start
    [expired] = topic.feed(event("A", 6), source=0)
    assert isinstance(expired, Unpaired) and expired.event.identity == event("A", 0).identity


def test_late_by_its_own_partition_even_before_the_watermark_moves() -> None:
    topic = Topic(sources=2)
    topic.feed(event("A", 10), source=0)
    # Partition 1 unheard of: no watermark. B at minute 4 is still late, by the
    # progress of its own partition, and held until its key's window closes.
    assert topic.feed(event("B", 4), source=0) == []
    assert topic.store.data[event("B", 4).key].late
    [late] = topic.tell(1, idle=True)
    assert isinstance(late, Unpaired) and late.reason == "late"
    assert isinstance(topic.feed(event("B", 4), source=0)[0], Duplicate)


def test_a_scrape_of_the_pending_summary_changes_no_outcome() -> None:
    # /stats and /metrics call `pending`, which drops index entries whose wait has ended.
    # It took a key holding only a late event for one whose wait had, and the late event
    # then never came out: neither when the watermark passed, nor by max wait.
    for close_by_max_wait in (False, True):
        topic = Topic(sources=2)
        topic.feed(event("A", 10), source=0)
        assert topic.feed(event("B", 4), source=0) == []  # held late (as above)
        summary = topic.engine.pending()
        assert (summary.count, summary.oldest_time_us) == (1, event("B", 4).time_us)
        if close_by_max_wait:
            outcomes = topic.engine.expire_waiting(NOW + 1000)
        else:
            outcomes = topic.tell(1, idle=True)
        late = [o for o in outcomes if isinstance(o, Unpaired) and o.reason == "late"]
        assert [o.event.identity for o in late] == [event("B", 4).identity], close_by_max_wait


def test_the_wait_index_keeps_only_keys_still_open() -> None:
    # Pairs 3 s apart over 150 minutes, with the watermark moving and no scrape: the
    # index of waits held an entry for every key ever pending (3,000 here).
    topic = Topic()
    for second in range(0, 9000, 3):
        topic.feed(event("A", second / 60))
        topic.feed(event("B", second / 60))
    assert len(topic.engine._indexes.by_waiting_since) <= 1
    assert len(topic.engine._indexes.open_by_time) <= 5 * 60 // 3 + 1  # within expiry


def test_pairs_leave_no_index_entries_for_a_scrape_to_clear() -> None:
    # Within the expiry and with no scrape, the heaps kept an entry for every key paired,
    # and the next scrape of /stats popped them all in one turn of the event loop.
    topic = Topic()
    for second in range(240):
        for kind in "AB":
            topic.engine.process(event(kind, second / 60), event("A", 0).time_us, NOW)
    topic.engine.process(event("A", 4.5), event("A", 0).time_us, NOW)
    indexes = topic.engine._indexes
    assert (len(indexes.open_by_time), len(indexes.by_waiting_since)) == (1, 1)
    summary = topic.engine.pending()
    assert (summary.count, summary.oldest_time_us) == (1, event("A", 4.5).time_us)


def test_a_late_copy_of_an_event_taken_on_time_is_a_duplicate_whatever_comes_first() -> None:
    for late_first in (True, False):
        topic = Topic(sources=2)
        topic.feed(event("A", 10), source=0)
        topic.feed(event("A", 1), source=1)
        copy = event("B", 1)
        steps = [(copy, 0), (copy, 1)] if late_first else [(copy, 1), (copy, 0)]
        outcomes = [o for e, source in steps for o in topic.feed(e, source)]
        outcomes += topic.feed(event("A", 11), source=1)
        assert sorted(type(o).__name__ for o in outcomes) == ["Duplicate", "Paired"], late_first


def test_past_dedup_retention_every_copy_is_late_and_nothing_is_remembered() -> None:
    topic = Topic()
    topic.feed(event("A", 70))
    for _ in range(2):
        [late] = topic.feed(event("A", 4))
        assert isinstance(late, Unpaired) and late.reason == "late"
    assert event("A", 4).key not in topic.store.data


def test_max_wait_expires_only_while_the_watermark_stands_still() -> None:
    topic = Topic()
    topic.feed(event("A", 0), now=NOW)
    topic.feed(event("B", 2), now=NOW + 200)  # the watermark advances at +200
    topic.feed(event("A", 0.5), now=NOW + 450)  # behind the watermark: it stands still
    assert topic.engine.expire_waiting(NOW + 400) == []  # A@0 waited 400 s, watermark 200 s
    expired = topic.engine.expire_waiting(NOW + 501)
    assert {o.key for o in expired} == {event("A", 0).key, event("B", 2).key}
    [closed] = topic.engine.expire_waiting(NOW + 751)
    assert isinstance(closed, Unpaired) and closed.event.identity == event("A", 0.5).identity
    # A key closed by max wait takes a later event as late.
    [late] = topic.feed(event("B", 0), now=NOW + 752)
    assert isinstance(late, Unpaired) and late.reason == "late"


def test_keys_are_forgotten_after_expiry_plus_dedup_retention() -> None:
    topic = Topic()
    topic.feed(event("A", 0))
    topic.feed(event("B", 0))
    topic.feed(event("A", 65))
    assert event("A", 0).key in topic.store.data
    topic.feed(event("A", 65.1))
    assert event("A", 0).key not in topic.store.data


def test_reloaded_engine_carries_on_where_the_old_one_stopped() -> None:
    topic = Topic()
    topic.feed(event("A", 0))
    topic.engine = PairingPartition.load(topic.store, CONFIG, topic.engine.clock, NOW)
    [expired] = topic.feed(event("B", 6))
    assert isinstance(expired, Unpaired) and expired.event.type == "A"


def test_pending_summary_counts_and_finds_the_oldest_and_longest_waiting() -> None:
    topic = Topic()
    assert topic.engine.pending() == PendingSummary(0, None, None)
    topic.feed(event("A", 2), now=NOW)
    topic.feed(event("A", 1), now=NOW + 5)  # older event time, arrived later
    topic.feed(event("B", 3), now=NOW + 9)
    summary = topic.engine.pending()
    assert summary.count == 3
    assert summary.oldest_time_us == event("A", 1).time_us
    assert summary.first_waiting_since == NOW
    topic.feed(event("B", 2), now=NOW + 10)  # pairs the first A
    summary = topic.engine.pending()
    assert (summary.count, summary.first_waiting_since) == (2, NOW + 5)
    topic.feed(event("A", 9), now=NOW + 11)  # watermark 9: minutes 1 and 3 expire
    assert topic.engine.pending() == PendingSummary(1, event("A", 9).time_us, NOW + 11)
