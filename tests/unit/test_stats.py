from collections import Counter

from faust.types import TP

from app.exactly_once.stats import DURATION_BUCKETS, Durations, Stats, Throughput


def test_throughput_averages_whole_seconds_before_now() -> None:
    rate = Throughput()
    for second in range(100, 110):
        rate.add(second - 99, second + 0.5)  # 1, 2, ... 10 events
    rate.add(1000, 110.2)  # the current second is not complete: not counted
    assert rate.rate(1, 110.9) == 10
    assert rate.rate(10, 110.9) == sum(range(1, 11)) / 10
    assert rate.rate(60, 110.9) == sum(range(1, 11)) / 60


def test_throughput_forgets_seconds_older_than_its_span() -> None:
    rate = Throughput()
    rate.add(5, 100.0)
    rate.add(7, 160.0)  # same bucket, a minute later
    assert rate.rate(60, 161.0) == 7 / 60
    assert rate.rate(1, 300.0) == 0


def test_processed_events_add_to_their_partition() -> None:
    stats = Stats()
    tp = TP("events", 0)
    stats.processed(tp, Counter(events_in=1, valid=1), 10.0)
    stats.processed(tp, Counter(events_in=1, dead_lettered=1), 10.5)
    assert stats.partitions[tp] == Counter(events_in=2, valid=1, dead_lettered=1)
    assert stats.throughput["events"].rate(1, 11.0) == 2


def test_durations_are_a_cumulative_histogram() -> None:
    durations = Durations()
    for seconds in (0.003, 0.04, 0.04, 0.3, 60.0):
        durations.observe(seconds)
    status = durations.status()
    assert status["count"] == 5 and status["sum"] == 0.003 + 0.04 + 0.04 + 0.3 + 60.0
    buckets = status["buckets"]
    assert isinstance(buckets, dict) and list(buckets) == list(DURATION_BUCKETS)
    # At most each bound: the 60 s one only in the count (Prometheus' +Inf).
    assert (buckets[0.005], buckets[0.025], buckets[0.05], buckets[0.25]) == (1, 1, 3, 3)
    assert buckets[0.5] == buckets[10.0] == 4
