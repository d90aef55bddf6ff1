"""The benchmark suite's smoke run: every measurement runs end to end (the parts side
by side) and lands in the report. Nothing about speed is asserted (the figures are
docs/BENCHMARKS.md's)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from bench.latency import HANDED_WAIT_PARTS
from bench.stalls import log_excerpt

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def table_rows(report: str, heading: str) -> list[list[str]]:
    section = report.split(f"## {heading}", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [
        [cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]
    ]  # after the header and the rule


def number(cell: str) -> float:
    assert re.fullmatch(r"[\d,]+(\.\d+)?", cell), cell
    return float(cell.replace(",", ""))


async def bench_topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {topic for topic in await admin.list_topics() if "bench-" in topic}
    finally:
        await admin.close()


def failure_report(done: subprocess.CompletedProcess[str], before: set[Path]) -> str:
    """What a failed run said last, and the first error and the end of each worker log it
    kept: CI shows the head and tail of a long failure, so the cause must be at the end."""
    logs = sorted(set((ROOT / ".run").glob("bench-*.log")) - before)
    tails = [f"--- {log.name}:\n{log_excerpt(log, lines=15)}" for log in logs]
    stderr = "\n".join(done.stderr.splitlines()[-30:])
    return "\n".join([f"exit status {done.returncode}; stdout:", done.stdout, *tails,
                      "--- the end of stderr:", stderr])  # fmt: skip


def test_the_smoke_run_measures_everything(broker: str, tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    command = [sys.executable, "-m", "bench", "--smoke", "--bootstrap", broker, "--out", str(out),
               "--profile", str(tmp_path / "profile.txt")]  # fmt: skip
    topics, files = asyncio.run(bench_topics(broker)), set((ROOT / ".run").glob("bench-*"))
    done = subprocess.run(command, cwd=ROOT, timeout=600, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(failure_report(done, files), pytrace=False)
    # Runs that succeeded leave no topics and no state behind.
    assert asyncio.run(bench_topics(broker)) <= topics
    assert set((ROOT / ".run").glob("bench-*")) <= files
    report = out.read_text()
    assert "3,000 A/B events" in report
    assert re.search(r"- CPU stolen by the host over the run: \d+\.\d% of the machine", report)
    assert "ran side by side: its figures say nothing about speed" in report
    [pairstream] = table_rows(report, "pairstream, one worker, exactly-once")
    assert pairstream[:2] == ["1", "1"]  # commit interval, run
    last, first, cpu = (number(pairstream[i]) for i in (4, 5, 6))
    assert cpu > 0 and 0 < first <= last
    # 3,000 events can all be through at the first sample: then there is no rate to read.
    assert all(cell == "-" or number(cell) > 0 for cell in pairstream[2:4])
    profiled = report.split("### Where the worker's CPU went", 1)[1]
    assert re.search(
        r"py-spy[^.]*: ([\d,.]+|-) events/s steady, [\d.]+ s CPU; [1-9][\d,]* samples", profiled
    )
    costs = table_rows(report, "What transactions cost on this path")
    assert [row[0] for row in costs] == ["1", "median"]
    with_rate, with_cpu, without_rate, without_cpu, cost = costs[0][1:6]
    assert number(with_cpu) > 0 and number(without_cpu) > 0
    # As above: 3,000 events can be through before a steady rate can be read.
    assert all(cell == "-" or number(cell) > 0 for cell in (with_rate, without_rate))
    assert cost == "-" if "-" in (with_rate, without_rate) else number(cost.rstrip("x")) > 0
    assert costs[1][1:6:2] == costs[0][1:6:2] == [with_rate, without_rate, cost]  # one pair
    latency = table_rows(report, "Latency under load")
    # Each app at each level (50% of the smoke basis, then a fixed 1,000/s), side by side.
    apps = [
        ["pairstream default", "0.02"],
        ["pairstream low latency", "0.01"],
        ["Quix Streams", "0.02"],
    ]
    assert [row[:4] for row in latency] == [
        *(["50%", "500", *app] for app in apps),
        *(["1,000/s", "1,000", *app] for app in apps),
    ]
    for row in latency:
        pairs, p50, p90, p99, worst = (number(cell) for cell in row[4:9])
        assert pairs > 0 and 0 < p50 <= p90 <= p99 <= worst
        app, broker, load, stolen = (number(cell.rstrip("%")) for cell in row[9].split(" / "))
        assert app > 0 and broker > 0 and load > 0  # the broker runs here: seen too
        assert stolen >= 0  # this kernel keeps steal
        if row[2].startswith("pairstream"):  # its commits, from the worker's /stats
            assert number(row[10]) > 0 and number(row[11]) > 0
        else:
            assert row[10:] == ["", ""]
    parts = table_rows(report, "Where a pair's time goes")
    assert [row[0] for row in parts] == list(HANDED_WAIT_PARTS)  # one worker pairs it all
    for row in parts:
        p50, p90, p99 = (float(cell) for cell in row[1:])
        assert 0 < p50 <= p90 <= p99
    assert number(parts[2][1]) > 0  # a commit takes time
    idle = table_rows(report, "An idle worker")
    assert [row[:2] for row in idle] == [["pairstream", "5"], ["Quix Streams", "5"]]
    # Alive: the worker heartbeats, at least; an idle Quix app can round to 0.000.
    assert number(idle[0][2]) > 0 and number(idle[1][2]) >= 0
    patterns = table_rows(report, "Patterns beside pairing")
    assert [row[0] for row in patterns] == ["0", "10"]
    assert all(number(row[1]) > 0 and number(row[5]) > 0 for row in patterns)
    assert all(cell == "-" or number(cell) > 0 for row in patterns for cell in row[2:4])
    assert re.search(r"of [1-9][\d,]* bytes per 1,000 open partial matches", report)
    pattern_latency = table_rows(report, "Patterns: latency")
    assert [row[:2] for row in pattern_latency] == [
        ["watermark interval default", "500"],
        ["watermark interval 0.5 s", "500"],
    ]
    assert all(number(row[2]) > 0 for row in pattern_latency)
    # The change data capture chain: one run beside a JSON one, then one latency level.
    [chain] = table_rows(report, "The change data capture chain: rows from PostgreSQL")
    assert chain[0] == "1" and number(chain[1]) > 2_900  # the workload's distinct events
    # Rates of a short run can be "-"; the chain, JSON, and Connect and the worker alone.
    assert all(cell == "-" or number(cell) > 0 for cell in (*chain[2:4], *chain[5:7]))
    assert number(chain[8]) > 0 and all(number(c) > 0 for c in chain[9].split(" / "))
    [from_commit] = table_rows(report, "The change data capture chain: latency from COMMIT")
    assert from_commit[0] == "500"
    pairs, p50, p90, p99, worst = (number(cell) for cell in from_commit[1:6])
    assert pairs > 0 and 0 < p50 <= p90 <= p99 <= worst
    app, connect, broker, load, stolen = (
        number(cell.rstrip("%")) for cell in from_commit[6].split(" / ")
    )
    assert app > 0 and connect > 0 and broker > 0 and load > 0 and stolen >= 0
    [workers] = table_rows(report, "Two workers against one")
    assert workers[:2] == ["2", "1"]
    # 3,000 events at 1 s commits: all committed at once, no steady rate to read.
    assert workers[2] == "-" or number(workers[2]) > 0
    assert all(number(cell) > 0 for cell in workers[3:5])
    pairs, expected = (number(cell) for cell in workers[5].split(" / "))
    assert pairs == expected > 0  # two workers found every pair, none twice
    assert workers[6] in {"0", "1", "2"}  # restarted workers: printed, and tolerated
    ceiling = table_rows(report, "The ceiling: a bare aiokafka consume -> produce loop")
    assert [row[:2] for row in ceiling] == [
        ["yes", "per record"],
        ["no", "per record"],
        ["yes", "batched"],
    ]
    assert all(number(cell) > 0 for row in ceiling for cell in row[2:4])
    [quix] = table_rows(report, "The peer: the same work as a Quix Streams app, exactly-once")
    assert quix[:2] == ["1", "1"]
    assert all(cell == "-" or number(cell) > 0 for cell in quix[2:4])
    pairs, expected = (number(cell) for cell in quix[7].split(" / "))
    assert pairs == expected > 0  # the peer did the work: every pair, none twice
    [compared] = table_rows(report, "pairstream against the peer")
    assert compared[:2] == ["1", "1 / 1"]
    # One run each: the medians are those runs' own figures.
    assert compared[2:4] == [pairstream[2], quix[2]]
    assert compared[5:7] == [pairstream[3], quix[3]]
    [floor] = table_rows(report, "The floor: the rules and codecs alone")
    assert floor[0] == "3,000"
    assert number(floor[1]) == expected  # the rules did the work
    assert all(number(cell) > 0 for cell in floor[2:])
    [restart] = table_rows(report, "Restart with keys pending")
    assert restart[0] == "3,000"
    for cell in restart[2:4]:  # intact, deleted: first / all probe pairs
        first, last = (number(part) for part in cell.split(" / "))
        assert 0 < first <= last
    assert all(number(cell) > 0 for cell in restart[4:])
