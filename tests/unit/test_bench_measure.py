"""The figures the benchmarks report: the steady rate from (seconds, records done)
samples, the CPU of the processes a latency level runs on, and the results of parts of
the suite run apart."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench.ceiling import BatchedSink
from bench.latency import (
    HANDED_WAIT_PARTS,
    WAIT_PARTS,
    LatencyResult,
    Level,
    Timings,
    append_partners,
    levels,
    paced,
    pair_id_of,
    wait_profile,
)
from bench.measure import (
    STOLEN,
    CpuShares,
    Samples,
    collector_paused,
    listening_pid,
    median,
    quiet_since,
    stolen_seconds,
)
from bench.pairstream import PairstreamResult, discard_run, worker_run
from bench.profile import Profile
from bench.quix import QuixResult
from bench.report import (
    Results,
    comparison_section,
    latency_section,
    profile_section,
    run_numbers,
    transactions_section,
)
from bench.report import share as report_share
from bench.report import stolen as report_stolen
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
    low = LatencyResult(
        "pairstream default", 0.5, Level(100.0, 0.25), 10, 0.5, 0.8, 0.9, 1.0, {}, None, None
    )
    high = LatencyResult(
        "pairstream default", 0.5, Level(300.0, 0.75), 30, 0.6, 0.9, 1.0, 1.2, {}, None, None
    )
    restart = RestartResult(3_000, 5.0, 90.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    results = Results(level_seconds=8.0)
    results.add(Results(level_seconds=8.0, latency=[low, high], latency_basis=400.0))
    results.add(Results(level_seconds=8.0, restart=[restart]))
    assert results.latency == [low, high]
    assert results.latency_basis == 400.0
    assert results.restart == [restart]
    assert results.level_seconds == 8.0


def test_a_median_leaves_out_runs_with_no_rate_to_read() -> None:
    assert median([3.0, math.nan, 1.0, 2.0]) == 2.0
    assert math.isnan(median([math.nan]))
    assert math.isnan(median([]))


def ours(interval: float, steady: float, through: float) -> PairstreamResult:
    return PairstreamResult(interval, 1_000, steady, through, 10.0, 1.0, 5.0, None)


def peer(interval: float, steady: float, through: float) -> QuixResult:
    return QuixResult(interval, 1_000, steady, through, 10.0, 1.0, 5.0, 400, 400)


def test_the_comparison_is_of_medians_at_each_interval() -> None:
    mine = [
        ours(0.1, 9.0, 8.0),
        ours(0.1, 11.0, 10.0),
        ours(0.1, 10.0, 12.0),
        ours(1.0, 20.0, 16.0),
    ]
    theirs = [peer(0.1, 5.0, 4.0), peer(0.1, 50.0, 5.0), peer(0.1, 4.0, 6.0), peer(1.0, 25.0, 8.0)]
    rows = [
        line
        for line in comparison_section(mine, theirs)
        if line.startswith("| 0.") or line.startswith("| 1 ")
    ]
    assert rows == [
        "| 0.1 | 3 / 3 | 10 | 5 | 2.00x | 10 | 5 | 2.00x |",
        "| 1 | 1 / 1 | 20 | 25 | 0.80x | 16 | 8 | 2.00x |",
    ]
    # A run over before its steady rate could be read is left out of the median; none
    # left: no ratio.
    rows = comparison_section([ours(1.0, math.nan, 16.0)], [peer(1.0, 25.0, 8.0)])
    assert "| 1 | 1 / 1 | - | 25 | - | 16 | 8 | 2.00x |" in rows


def test_the_cost_of_transactions_is_the_ratio_of_medians_of_readable_runs() -> None:
    pairs = [
        (ours(1.0, 90.0, 80.0), ours(1.0, 100.0, 90.0)),
        (ours(1.0, math.nan, 80.0), ours(1.0, 120.0, 90.0)),
        (ours(1.0, 110.0, 80.0), ours(1.0, 110.0, 90.0)),
    ]
    rows = [line for line in transactions_section(pairs) if line[2:3].isdigit() or "median" in line]
    assert rows == [
        "| 1 | 90 | 5.0 | 100 | 5.0 | 0.90x |",
        # A run over before its steady rate could be read shows no rate and no ratio.
        "| 2 | - | 5.0 | 120 | 5.0 | - |",
        "| 3 | 110 | 5.0 | 110 | 5.0 | 1.00x |",
        "| median | 100 |  | 110 |  | 0.91x |",
    ]


def test_a_profiled_run_with_no_steady_rate_says_so() -> None:
    found = Profile(120, [("aiokafka", 0.5)], [("send", 0.25)])
    text = "\n".join(profile_section(ours(1.0, math.nan, 80.0), found))
    assert ": - events/s steady, 5.0 s CPU; 120 samples" in text


def test_runs_are_numbered_within_their_commit_interval() -> None:
    assert run_numbers([0.1, 0.1, 0.5, 0.1, 0.5]) == ["1", "2", "1", "3", "2"]


def test_a_run_that_succeeded_leaves_nothing_of_its_own_behind(tmp_path: Path) -> None:
    run = tmp_path / "bench-0123abcd"
    for own in (run / "tables", tmp_path / "bench-0123abcd-0" / "tables"):
        own.mkdir(parents=True)
        (own / "state.sst").write_bytes(b"x")
    (tmp_path / "bench-0123abcd-worker.log").write_text("log")
    other = tmp_path / "bench-4567ef01"
    other.mkdir()
    (tmp_path / "bench-4567ef01-worker.log").write_text("log")
    discard_run(run)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench-4567ef01",
        "bench-4567ef01-worker.log",
    ]


def test_a_runs_own_settings_are_not_left_to_the_runs_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The suite's parts run one after the other in one process: a worker without
    # transactions once left every later worker without them.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    without = worker_run(
        "bench", "127.0.0.1:9", 1.0, {"PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS": "1"}
    )
    assert without.env == {"PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS": "1"}
    after = worker_run("bench", "127.0.0.1:9", 0.5)
    assert after.env == {}
    assert "PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS" not in os.environ
    assert after.conf.commit_interval_seconds == 0.5
    assert not after.conf.bench_without_transactions


def test_latency_levels_are_fixed_rates_and_shares_of_the_maximum_by_rate() -> None:
    assert levels(20_000.0, [1_000.0, 10_000.0], [0.25, 0.5, 0.75]) == [
        Level(1_000.0),
        Level(5_000.0, 0.25),
        Level(10_000.0),
        Level(10_000.0, 0.5),
        Level(15_000.0, 0.75),
    ]


def test_the_latency_table_has_each_app_beside_the_others_at_each_level() -> None:
    def run(app: str, interval: float, level: Level, p99: float) -> LatencyResult:
        if app.startswith("pairstream"):  # the worker's CPU and commits, the broker unseen
            cpu, commit_rate, commit_mean = {"app": 0.8, "load": 0.255, "stolen": 0.04}, 12.5, 0.041
            return LatencyResult(
                app, interval, level, 10, 0.25, 0.5, p99, 2.0, cpu, commit_rate, commit_mean
            )
        cpu = {"app": 1.0, "broker": 0.3, "load": math.nan}
        return LatencyResult(app, interval, level, 10, 0.25, 0.5, p99, 2.0, cpu, None, None)

    low, high = Level(1_000.0), Level(7_500.0, 0.75)
    measured = [  # as the part runs them: one app over all its levels at a time
        run("pairstream default", 0.5, low, 0.6),
        run("pairstream default", 0.5, high, 0.9),
        run("pairstream low latency", 0.1, low, 0.2),
        run("pairstream low latency", 0.1, high, 0.4),
        run("Quix Streams", 0.5, low, 0.7),
        run("Quix Streams", 0.5, high, 1.5),
    ]
    lines = latency_section(measured, 10_000.0, 30.0)
    text = "\n".join(lines)
    assert "shares of 10,000 events/s" in text
    assert "pairstream low latency: commit interval 0.01 s, the rest defaults" in text
    assert f"a share of one core of this machine's {os.cpu_count()}" in text
    assert lines[-8] == (
        "| level | events/s offered | app | commit interval (s) | pairs | p50 (s) | p90 (s)"
        " | p99 (s) | max (s) | CPU: app / broker / load / stolen | commits/s | mean commit (s) |"
    )
    ours, quix = "80% / - / 26% / 4% | 12.5 | 0.041 |", "100% / 30% / - / - |  |  |"
    figures = "| 10 | 0.250 | 0.500 |"
    assert lines[-6:] == [
        f"| 1,000/s | 1,000 | pairstream default | 0.5 {figures} 0.600 | 2.000 | {ours}",
        f"| 1,000/s | 1,000 | pairstream low latency | 0.1 {figures} 0.200 | 2.000 | {ours}",
        f"| 1,000/s | 1,000 | Quix Streams | 0.5 {figures} 0.700 | 2.000 | {quix}",
        f"| 75% | 7,500 | pairstream default | 0.5 {figures} 0.900 | 2.000 | {ours}",
        f"| 75% | 7,500 | pairstream low latency | 0.1 {figures} 0.400 | 2.000 | {ours}",
        f"| 75% | 7,500 | Quix Streams | 0.5 | 10 | 0.250 | 0.500 | 1.500 | 2.000 | {quix}",
    ]


def test_a_pair_s_time_is_split_at_its_records_timestamps_and_reads() -> None:
    # Monotonic clock 100 s behind the wall clock. Pair A-1: sent at 1.0, the broker
    # appended its later event at 101.004, ingest wrote it re-keyed at 101.01 and ours
    # read that at 101.05, pairing wrote the pair at 101.06, ours read the pair at 1.10.
    # Pair A-2 likewise, slower; A-3's keyed records unseen, A-4's events unseen.
    timings = Timings(
        pairs=[("A-1", 1.0, 1.10), ("A-2", 2.0, 2.40), ("A-3", 3.0, 3.1), ("A-4", 4.0, 4.1)],
        appended={"A-1": 101.004, "A-2": 102.05, "A-3": 103.01},
        keyed={
            b"k1": (101.01, 101.05, False),
            b"k2": (102.10, 102.20, False),
            b"k4": (104.02, 104.03, False),
        },
        made={
            "A-1": (b"k1", 101.06),
            "A-2": (b"k2", 102.30),
            "A-3": (b"k3", 103.05),
            "A-4": (b"k4", 104.05),
        },
    )
    parts = wait_profile(timings, 100.0)
    assert [p.part for p in parts] == list(WAIT_PARTS)
    # The upper of two: A-2's.
    assert [round(p.p50, 3) for p in parts] == [0.05, 0.05, 0.1, 0.1, 0.1]
    assert [round(p.p99, 3) for p in parts] == [0.05, 0.05, 0.1, 0.1, 0.1]
    alone = wait_profile(replace(timings, pairs=timings.pairs[:1]), 100.0)
    assert [round(p.p50, 3) for p in alone] == [0.004, 0.006, 0.04, 0.01, 0.04]
    for unseen in ("A-3", "A-4"):
        lone = replace(timings, pairs=[pair for pair in timings.pairs if pair[0] == unseen])
        with pytest.raises(RuntimeError, match="input and keyed records"):
            wait_profile(lone, 100.0)
    # Handed to its keyed partition: from the append straight to the pair, in three parts,
    # which the profile takes once more pairs were handed than not.
    handed = replace(
        timings,
        pairs=[*timings.pairs, ("A-5", 5.0, 5.08), ("A-6", 6.0, 6.09)],
        appended={**timings.appended, "A-5": 105.005, "A-6": 106.006},
        keyed={**timings.keyed, b"k5": (105.0, 105.0, True), b"k6": (106.0, 106.0, True)},
        made={**timings.made, "A-5": (b"k5", 105.05), "A-6": (b"k6", 106.07)},
    )
    assert [p.part for p in wait_profile(handed, 100.0)] == list(WAIT_PARTS)  # 2 against 2
    more = replace(handed, pairs=[pair for pair in handed.pairs if pair[0] != "A-2"])
    parts = wait_profile(more, 100.0)
    assert [p.part for p in parts] == list(HANDED_WAIT_PARTS)
    assert [round(p.p50, 3) for p in parts] == [0.006, 0.064, 0.03]  # the upper of


class RecordingSink(BatchedSink):
    """What the load would hand to its producer, kept."""

    def __init__(self) -> None:
        self.values: list[bytes | None] = []

    def append(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.values.append(value)


def test_an_event_the_load_sends_names_its_pair_by_the_a_s_id() -> None:
    sink = RecordingSink()
    assert append_partners(sink, 12) == "A-12"
    assert [json.loads(value or b"")["id"] for value in sink.values] == ["A-12", "B-12"]
    assert [pair_id_of(value or b"") for value in sink.values] == ["A-12", "A-12"]


def test_the_process_listening_on_a_port_is_found() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        port = listening.getsockname()[1]
        assert listening_pid(port) is None  # bound, not listening yet
        listening.listen()
        assert listening_pid(port) == os.getpid()


def test_stolen_time_is_the_steal_column_of_proc_stat_in_seconds(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  10 0 5 900 1 0 2 {3 * ticks} 0 0\ncpu0 5 0 2 450 0 0 1 7 0 0\n")
    assert stolen_seconds(str(stat)) == 3.0
    stat.write_text("cpu  10 0 5 900 1 0 2\n")  # a kernel before steal was kept
    assert math.isnan(stolen_seconds(str(stat)))
    assert math.isnan(stolen_seconds(str(tmp_path / "absent")))
    assert report_stolen(0.1234).startswith("12.3% of the machine's cores")
    assert report_stolen(math.nan) == report_stolen(None) == "not kept by this kernel"


def test_cpu_shares_are_of_one_core_and_nan_for_an_ended_process() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    cpu = CpuShares({"here": os.getpid(), "gone": gone.pid})
    cpu.start()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # busy: this process's CPU grows
        pass
    shares = cpu.shares()
    cores = os.cpu_count() or 1
    assert 0 < shares["here"] <= cores  # shares of one core: up to all of them
    assert math.isnan(shares["gone"])
    assert shares[STOLEN] >= 0 or math.isnan(stolen_seconds())  # NaN only on such a kernel
    assert (report_share(shares["gone"]), report_share(None)) == ("-", "-")
    assert report_share(0.456) == "46%"


async def test_a_process_is_quiet_from_when_it_stopped_working() -> None:
    busy_then_idle = (
        "import time\nend = time.process_time() + 1\n"
        "while time.process_time() < end: pass\ntime.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", busy_then_idle])
    try:
        started = time.monotonic()
        quiet = await asyncio.wait_for(quiet_since(child.pid, window=0.5), timeout=20)
        # Not while it works (1 s of CPU, however long the machine takes to give it).
        assert quiet - started >= 0.75
        assert time.monotonic() - quiet >= 0.5  # a whole quiet window seen
    finally:
        child.kill()
        child.wait()


def test_the_collector_is_off_while_timing_and_back_after() -> None:
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with collector_paused():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what was there before the timing: not looked at
    assert gc.isenabled() and gc.get_freeze_count() == 0


async def test_a_load_is_paced_in_keys_from_the_first_none_twice_none_ahead() -> None:
    handed = [numbers async for numbers in paced(2_000.0, 0.2, first=5)]
    keys = [number for numbers in handed for number in numbers]
    assert keys[0] == 5 and keys == list(range(5, 5 + len(keys)))  # each key once, in order
    assert len(keys) <= 200  # 1,000 keys a second (two events a key) for 0.2 s, never ahead
    assert len(handed) > 1  # handed over in ticks, not at once
