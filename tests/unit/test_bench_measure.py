"""The figures the benchmarks report: the steady rate from (seconds, records done)
samples, and the results of parts of the suite run apart."""

from __future__ import annotations

import math

from bench.latency import LatencyResult
from bench.measure import Samples
from bench.report import Results
from bench.restart import RestartResult


def test_the_steady_rate_leaves_out_the_start_and_the_tail() -> None:
    samples = Samples([(0.0, 0), (1.0, 5), (2.0, 20), (3.0, 60), (4.0, 95), (5.0, 100)])
    # 10% (10) first reached at 2 s, 90% (90) at 4 s.
    assert samples.steady_rate(100) == (95 - 20) / (4.0 - 2.0)


def test_a_run_through_both_marks_between_two_samples_is_read_across_them() -> None:
    samples = Samples([(0.0, 0), (0.25, 0), (0.5, 3_000)])
    assert samples.steady_rate(3_000) == 3_000 / 0.25


def test_the_through_rate_runs_from_the_first_record_done_to_the_last() -> None:
    samples = Samples([(0.0, 0), (1.0, 5), (2.0, 20), (3.0, 60), (4.0, 95), (5.0, 100)])
    assert samples.through_rate(100) == (100 - 5) / (5.0 - 1.0)
    assert math.isnan(Samples([(0.0, 0), (0.5, 3_000)]).through_rate(3_000))


def test_no_rate_without_a_sample_before_the_marks() -> None:
    assert math.isnan(Samples([(0.5, 3_000)]).steady_rate(3_000))


def test_parts_run_apart_come_together_in_one_report() -> None:
    # A smoke run measures each part in a process of its own (bench/__main__.py).
    low = LatencyResult(1.0, 0.25, 100.0, 10, 0.5, 0.9, 1.0)
    high = LatencyResult(1.0, 0.75, 300.0, 30, 0.6, 1.0, 1.2)
    restart = RestartResult(3_000, 5.0, 90.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    results = Results(level_seconds=8.0)
    results.add(Results(level_seconds=8.0, latency=[low, high]))
    results.add(Results(level_seconds=8.0, restart=[restart]))
    assert results.latency == [low, high]
    assert results.restart == [restart]
    assert results.level_seconds == 8.0
