"""The steady rate the benchmarks report, from (seconds, records done) samples."""

from __future__ import annotations

import math

from bench.measure import Samples


def test_the_steady_rate_leaves_out_the_start_and_the_tail() -> None:
    samples = Samples([(0.0, 0), (1.0, 5), (2.0, 20), (3.0, 60), (4.0, 95), (5.0, 100)])
    # 10% (10) first reached at 2 s, 90% (90) at 4 s.
    assert samples.steady_rate(100) == (95 - 20) / (4.0 - 2.0)


def test_a_run_through_both_marks_between_two_samples_is_read_across_them() -> None:
    samples = Samples([(0.0, 0), (0.25, 0), (0.5, 3_000)])
    assert samples.steady_rate(3_000) == 3_000 / 0.25


def test_no_rate_without_a_sample_before_the_marks() -> None:
    assert math.isnan(Samples([(0.5, 3_000)]).steady_rate(3_000))
