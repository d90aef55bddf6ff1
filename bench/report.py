"""docs/BENCHMARKS.md: the machine, the versions, the settings, the command, and what
one run of the suite measured."""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from importlib.metadata import version

from bench.ceiling import CeilingResult
from bench.pairstream import PairstreamResult
from bench.workload import INPUT_PARTITIONS
from tools.broker import POM


def machine() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        model = next(
            (line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "?"
        )
    with open("/proc/meminfo") as meminfo:
        mem_kib = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal")))
    return f"{os.cpu_count()} cores ({model}), {mem_kib / 2**20:.0f} GiB, {platform.platform()}"


def kafka_version() -> str:
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    return found.group(1) if found else "?"


def render(
    command: str,
    events: int,
    pairstream: list[PairstreamResult],
    ceiling: list[CeilingResult],
    ceiling_commit_interval: float,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. One run; figures from",
        "another machine, or from this one under other load, are not comparable.",
        "",
        f"- Machine: {machine()}",
        f"- Python {platform.python_version()}, faust-streaming {version('faust-streaming')},"
        f" aiokafka {version('aiokafka')}, Kafka {kafka_version()} (one local KRaft broker)",
        f"- Workload: {events:,} A/B events pre-produced into a {INPUT_PARTITIONS}-partition input"
        " topic under random producer keys; 5% of keys miss a partner, 2% of events are sent"
        " twice (`bench/workload.py`).",
        "",
        "## pairstream, one worker, exactly-once",
        "",
        "Read off the worker's `/stats` every 0.25 s: an event is *through* once the pairing",
        "stage (the second of two) has acked it. Steady: events through per second between 10%",
        "and 90% of the input. CPU: the worker process, start to end.",
        "",
        "| commit interval (s) | steady events/s | start to last through (s)"
        " | start to first through (s) | worker CPU (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in pairstream:
        first = "-" if r.first_through is None else f"{r.first_through:.1f}"
        lines.append(
            f"| {r.commit_interval:g} | {r.steady_rate:,.0f} | {r.seconds:.1f} | {first}"
            f" | {r.cpu_seconds:.1f} |"
        )
    lines += [
        "",
        "## The ceiling: a bare aiokafka consume -> produce loop",
        "",
        f"One stage, no parsing, no state, commits every {ceiling_commit_interval:g} s"
        " (`bench/ceiling.py`); CPU of the loop's process.",
        "",
        "| transactions | events/s | seconds | CPU (s) |",
        "| --- | --- | --- | --- |",
    ]
    for c in ceiling:
        lines.append(
            f"| {'yes' if c.transactional else 'no'} | {c.rate:,.0f} | {c.seconds:.1f}"
            f" | {c.cpu_seconds:.1f} |"
        )
    return "\n".join(lines) + "\n"
