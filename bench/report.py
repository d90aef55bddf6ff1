"""docs/BENCHMARKS.md: the machine, the versions, the settings, the command, and what
one run of the suite measured."""

from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from importlib.metadata import version

from bench import profile
from bench.cdc import CDC_SETUP, COPY_ROWS, CdcThroughput
from bench.ceiling import CeilingResult
from bench.latency import (
    PAIRSTREAM_DEFAULT,
    PAIRSTREAM_LOW_LATENCY,
    QUIX,
    SMOKE_LATENCY_BASIS,
    WARM_UP,
    LatencyResult,
    WaitPart,
)
from bench.measure import STOLEN, median
from bench.pairstream import PairstreamResult
from bench.patterns import PatternsThroughput
from bench.quix import QUIXSTREAMS, QuixResult
from bench.restart import HOLD_SECONDS, PROBES, RestartResult
from bench.rules_only import RulesOnlyResult
from bench.workers import WorkersResult
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


def stolen(share_: float | None) -> str:
    """The run's steal, read: a shared host's other tenants slow every figure of a run
    with much of it, and by an amount no other figure shows."""
    if share_ is None or math.isnan(share_):
        return "not kept by this kernel"
    return (
        f"{share_:.1%} of the machine's cores (the steal column of /proc/stat); above a"
        " few percent, other tenants of the host slowed this run's figures"
    )


def kafka_version() -> str:
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    return found.group(1) if found else "?"


@dataclass
class Results:
    """What one run of the suite measured."""

    pairstream: list[PairstreamResult] = field(default_factory=list)
    quix: list[QuixResult] = field(default_factory=list)
    ceiling: list[CeilingResult] = field(default_factory=list)
    restart: list[RestartResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    wait_profile: list[WaitPart] = field(default_factory=list)  # the default worker's, at:
    wait_rate: float | None = None  # events/s offered
    level_seconds: float = 0.0  # how long each latency level ran
    stolen: float | None = None  # share of the machine's cores the host took over the run
    latency_basis: float | None = None  # events/s the latency loads are shares of
    profiled: PairstreamResult | None = None  # one more run, under py-spy
    # Runs with and without transactions at the longest interval, alternating.
    transaction_pairs: list[tuple[PairstreamResult, PairstreamResult]] = field(default_factory=list)
    rules_only: RulesOnlyResult | None = None  # the same workload, no Kafka, no faust
    workers: list[WorkersResult] = field(default_factory=list)  # one app, 1 and 2 workers
    # The change data capture chain: rows of a backlog, each run beside a JSON one; latency.
    cdc_throughput: list[CdcThroughput] = field(default_factory=list)
    cdc_latency: list[LatencyResult] = field(default_factory=list)
    idle: list[tuple[str, float]] = field(default_factory=list)  # (app, share of a core)
    patterns: list[PatternsThroughput] = field(default_factory=list)  # 0, 1, 10, 100 declared
    pattern_state_bytes: float | None = None  # encoded, per 1,000 open partial matches
    pattern_latency: list[LatencyResult] = field(default_factory=list)
    side_by_side: bool = False  # the parts ran at once (a smoke run): no speed to read

    def add(self, part: Results) -> None:
        """Take in what one part of the suite measured."""
        for name in (f.name for f in fields(self)):
            mine, theirs = getattr(self, name), getattr(part, name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif mine is None:
                setattr(self, name, theirs)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def ratio(ours: float, theirs: float) -> str:
    return "-" if not (math.isfinite(ours) and math.isfinite(theirs)) else f"{ours / theirs:.2f}x"


def run_numbers(intervals: list[float]) -> list[str]:
    """Each run's number among the runs at its commit interval, in the order run."""
    seen: dict[float, int] = {}
    numbers = []
    for interval in intervals:
        seen[interval] = seen.get(interval, 0) + 1
        numbers.append(str(seen[interval]))
    return numbers


def comparison_section(ours: list[PairstreamResult], peer: list[QuixResult]) -> list[str]:
    rows = []
    for interval in sorted({r.commit_interval for r in ours}):
        mine = [r for r in ours if r.commit_interval == interval]
        theirs = [q for q in peer if q.commit_interval == interval]
        steady = median(r.steady_rate for r in mine), median(q.steady_rate for q in theirs)
        through = median(r.through_rate for r in mine), median(q.through_rate for q in theirs)
        rows.append(
            [f"{interval:g}", f"{len(mine)} / {len(theirs)}", rate(steady[0]), rate(steady[1]),
             ratio(*steady), rate(through[0]), rate(through[1]), ratio(*through)]
        )  # fmt: skip
    return section(
        "pairstream against the peer",
        "Medians of the runs above at each commit interval; each pairstream run was followed"
        " by a run of the Quix Streams app, so that a phase of the machine (two runs minutes"
        " apart can differ by a third) falls on both alike. Steady and first to last as in"
        " each table above.",
        ["commit interval (s)", "runs: pairstream / Quix", "pairstream: steady events/s",
         "Quix: steady events/s", "steady: pairstream / Quix",
         "pairstream: first to last", "Quix: first to last", "first to last: pairstream / Quix"],
        rows,
    )  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def section(heading: str, text: str, header: list[str], rows: list[list[str]]) -> list[str]:
    return ["", f"## {heading}", "", text, "", *table(header, rows)]


def patterns_section(runs: list[PatternsThroughput], state_bytes: float | None) -> list[str]:
    alone = [r.run.through_rate for r in runs if r.patterns == 0]
    return section(
        "Patterns beside pairing",
        "One worker over the same workload (every event with an id), every topic of"
        f" {INPUT_PARTITIONS} partitions, with N patterns declared over the input, each an A"
        " then a B of one value within its own window (`bench/patterns.py`): through, once"
        " the patterns' match stage acked it (pairing reads an empty topic); 0: pairing"
        " alone. State:"
        " the encoded state (key and value, as the changelog and RocksDB hold it) of"
        f" {'-' if state_bytes is None else f'{state_bytes:,.0f}'} bytes per 1,000 open"
        " partial matches, one a key.",
        ["patterns", "events", "first to last: events/s", "steady events/s",
         "against pairing alone", "worker CPU (s)"],
        [[str(r.patterns), f"{r.run.events:,}", rate(r.run.through_rate), rate(r.run.steady_rate),
          ratio(r.run.through_rate, alone[0]) if alone else "-", f"{r.run.cpu_seconds:.1f}"]
         for r in runs],
    )  # fmt: skip


def profile_section(run: PairstreamResult, found: profile.Profile) -> list[str]:
    lines = [
        "",
        f"### Where the worker's CPU went (commit interval {run.commit_interval:g} s)",
        "",
        f"One more run of the same, under py-spy (`--profile`), not in the table above:"
        f" {rate(run.steady_rate)} events/s steady, {run.cpu_seconds:.1f} s CPU;"
        f" {found.samples:,} samples of the running threads, by the frame executing (self"
        " time).",
        "",
    ]
    lines += table(
        ["package", "share"], [[name, f"{share:.1%}"] for name, share in found.by_package]
    )
    lines.append("")
    lines += table(
        ["function", "share"], [[name, f"{share:.1%}"] for name, share in found.by_function]
    )
    return lines


def transactions_section(pairs: list[tuple[PairstreamResult, PairstreamResult]]) -> list[str]:
    interval = pairs[0][0].commit_interval
    rows = [
        [str(n), rate(with_.steady_rate), f"{with_.cpu_seconds:.1f}",
         rate(without.steady_rate), f"{without.cpu_seconds:.1f}",
         ratio(with_.steady_rate, without.steady_rate)]
        for n, (with_, without) in enumerate(pairs, 1)
    ]  # fmt: skip
    with_median = median(with_.steady_rate for with_, _ in pairs)
    without_median = median(without.steady_rate for _, without in pairs)
    rows.append(
        ["median", rate(with_median), "", rate(without_median), "",
         ratio(with_median, without_median)]
    )  # fmt: skip
    return section(
        "What transactions cost on this path",
        f"The same worker at the same commit interval ({interval:g} s), with transactions and"
        " with `PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS=true` (the same steps and sends through"
        " faust's plain producer, flushed before each offset commit: at-least-once), in turn:"
        f" {len(pairs)} pair(s) of runs, since two single runs differ by more than the cost."
        " -: over before a steady rate could be read.",
        ["pair of runs", "with: events/s", "with: CPU (s)", "without: events/s",
         "without: CPU (s)", "with / without"],
        rows,
    )  # fmt: skip


def rules_only_section(run: RulesOnlyResult) -> list[str]:
    return section(
        "The floor: the rules and codecs alone",
        "The same workload through the pure parts in one process, no Kafka, no faust"
        " (`bench/rules_only.py`): ingest's parse and re-keyed record, then per keyed partition"
        " the record's decode, the rule engine over key states in RocksDB, and the output"
        " records. CPU of the process; events/s is what one core could do if that were all.",
        ["events", "pairs", "CPU (s)", "of it ingest (s)", "µs per event", "events/s"],
        [[f"{run.events:,}", f"{run.pairs:,}", f"{run.cpu_seconds:.2f}",
          f"{run.ingest_cpu_seconds:.2f}", f"{run.micros_per_event:.1f}", f"{run.rate:,.0f}"]],
    )  # fmt: skip


def latency_section(
    measured: list[LatencyResult], basis: float | None, level_seconds: float
) -> list[str]:
    """The apps side by side at each level, lowest rate first."""
    low = "".join(f", `{name}={value}`" for name, value in PAIRSTREAM_LOW_LATENCY.env.items())
    return section(
        "Latency under load",
        "Each app on empty topics, its input produced into as it runs: A/B partners at fixed"
        f" rates and at shares of {rate(basis or math.nan)} events/s (in a full run, the median"
        " first-to-last rate above at the worker's default commit interval, else the"
        f" longest), each level for {level_seconds:g} s, the first {WARM_UP:g} s left out; one"
        " process of each app over all the levels, lowest rate first. Latency: from the send"
        " of a pair's second event to the pair visible to a read_committed consumer"
        " (`bench/latency.py`)."
        f" {PAIRSTREAM_DEFAULT.app}: the worker's defaults (commit interval"
        f" {PAIRSTREAM_DEFAULT.commit_interval:g} s); {PAIRSTREAM_LOW_LATENCY.app}:"
        f" commit interval {PAIRSTREAM_LOW_LATENCY.commit_interval:g} s{low}, the rest"
        f" defaults; {QUIX.app}: the peer below at commit interval {QUIX.commit_interval:g} s,"
        " the rest its own defaults. While each level's load was offered: the CPU of the"
        " app's process, the broker's and the load's (the process that offers it and reads"
        " the outputs, its garbage collector off while it times a level), and what the host"
        " took from all the machine's cores (stolen), each"
        f" as a share of one core of this machine's {os.cpu_count()}; and the worker's"
        " commits (its /stats).",
        ["level", "events/s offered", "app", "commit interval (s)", "pairs", "p50 (s)",
         "p90 (s)", "p99 (s)", "max (s)", "CPU: app / broker / load / stolen", "commits/s",
         "mean commit (s)"],
        [[level_name(r), f"{r.level.rate:,.0f}", r.app, f"{r.commit_interval:g}",
          f"{r.pairs:,}", f"{r.p50:.3f}", f"{r.p90:.3f}", f"{r.p99:.3f}", f"{r.max:.3f}",
          " / ".join(share(r.cpu.get(name)) for name in ("app", "broker", "load", STOLEN)),
          "" if r.commit_rate is None else f"{r.commit_rate:.1f}",
          "" if r.commit_mean is None else f"{r.commit_mean:.3f}"]
         for r in sorted(measured, key=lambda r: r.level.rate)],
    )  # fmt: skip


def share(cpu: float | None) -> str:
    """A share of one core, or a dash when not measured."""
    return "-" if cpu is None or math.isnan(cpu) else f"{cpu:.0%}"


def wait_section(parts: list[WaitPart], offered: float | None, level_seconds: float) -> list[str]:
    return section(
        "Where a pair's time goes",
        f"One more worker at its defaults, {rate(offered or math.nan)} events/s offered for"
        f" {level_seconds:g} s as above, its input, keyed and pairs topics read by a"
        " read_committed consumer of ours. A pair's time, end to end as above, in parts, each"
        " from one moment to the next: its events sent; the later of them appended by the"
        " broker (its Kafka timestamp: this input topic keeps the broker's append time);"
        " pairing's write of the pair (its Kafka timestamp); the pair readable. One worker"
        " pairs what it ingests (docs/configuration.md, `PAIRSTREAM_LOCAL_HANDOFF`), so that"
        " is all; a pair that went through the keyed topic has two more moments after the"
        " append, ingest's write of it re-keyed and that record readable, and five parts"
        " (`bench/latency.py`, `run_wait_profile`: those of most pairs measured).",
        ["part", "p50 (s)", "p90 (s)", "p99 (s)"],
        [[p.part, f"{p.p50:.3f}", f"{p.p90:.3f}", f"{p.p99:.3f}"] for p in parts],
    )


CDC_CPU = ("app", "Connect", "broker", "load", STOLEN)  # the latency table's, in its order


def cdc_sections(
    runs: list[CdcThroughput], measured: list[LatencyResult], level_seconds: float
) -> list[str]:
    """The chain's rate beside the JSON input's, and its latency from COMMIT."""
    lines = section(
        "The change data capture chain: rows from PostgreSQL",
        "PostgreSQL 15 (`pgoutput`), Debezium's PostgreSQL connector on one Kafka Connect"
        " worker (exactly-once source), one pairstream worker reading the change topic"
        f" (`PAIRSTREAM_EVENTS_FORMAT=debezium`, {INPUT_PARTITIONS} partitions), at the"
        " worker's defaults (`bench/cdc.py`, docs/cdc.md). Each run: first one worker over"
        " the workload as JSON (as above), then the chain over the same events as rows"
        f" (duplicates are one row), committed in transactions of {COPY_ROWS:,} while the"
        " connector is paused, a backlog in PostgreSQL's log, then the connector resumed. A"
        " row is through once the pairing stage has acked it (the worker's /stats), first to"
        " last as above. CPU: from the resume to the last row through. Before the chain, its"
        " halves alone over the same rows: Connect filling a change topic with no worker"
        " running (its JVM warmed up by it), then a worker over that topic.",
        ["run", "rows", "CDC chain: rows/s", "JSON: events/s", "CDC / JSON",
         "alone: Connect rows/s", "alone: worker rows/s", "worker alone / JSON",
         "backlog committed: rows/s", "CPU: worker / Connect (s)"],
        [[str(n), f"{r.rows:,}", rate(r.rate), rate(r.json_rate), ratio(r.rate, r.json_rate),
          rate(r.connect_rate), rate(r.drain_rate), ratio(r.drain_rate, r.json_rate),
          rate(r.insert_rate),
          " / ".join(f"{r.cpu.get(name, math.nan):.1f}" for name in ("worker", "Connect"))]
         for n, r in enumerate(runs, 1)],
    )  # fmt: skip
    if runs:
        chain, json = median(r.rate for r in runs), median(r.json_rate for r in runs)
        lines += ["", f"Medians: the chain {rate(chain)} rows/s, JSON {rate(json)} events/s,"
                  f" {ratio(chain, json)}."]  # fmt: skip
    lines += section(
        "The change data capture chain: latency from COMMIT",
        f"{CDC_SETUP.app}, as above: partners inserted at fixed rates, each key's A and B row"
        " in one transaction with the other keys due, one transaction every 5 ms, each level"
        f" for {level_seconds:g} s, the first {WARM_UP:g} s left out; before the levels, one"
        f" more of {level_seconds:g} s at the highest rate, not reported (Connect's JVM warms"
        " up under load: its first seconds lagged by several seconds). Latency: from the"
        " return of a pair's COMMIT to the pair visible to a read_committed consumer. CPU as"
        " a share of one core: the worker, Connect, the broker, the load, and stolen.",
        ["rows/s offered", "pairs", "p50 (s)", "p90 (s)", "p99 (s)", "max (s)",
         "CPU: worker / Connect / broker / load / stolen"],
        [[f"{r.level.rate:,.0f}", f"{r.pairs:,}", f"{r.p50:.3f}", f"{r.p90:.3f}",
          f"{r.p99:.3f}", f"{r.max:.3f}",
          " / ".join(share(r.cpu.get(name)) for name in CDC_CPU)]
         for r in sorted(measured, key=lambda r: r.level.rate)],
    )  # fmt: skip
    return lines


def level_name(result: LatencyResult) -> str:
    load = result.level.load
    return f"{result.level.rate:,.0f}/s" if load is None else f"{load:.0%}"


def render(command: str, events: int, results: Results, ceiling_commit_interval: float) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. One run; figures from",
        "another machine, or from this one under other load, are not comparable.",
        *(
            [
                "",
                "The parts of this run ran side by side: its figures say nothing about speed."
                f" Latency's loads are shares of a fixed {SMOKE_LATENCY_BASIS:,.0f} events/s.",
            ]
            if results.side_by_side
            else []
        ),
        "",
        f"- Machine: {machine()}",
        f"- CPU stolen by the host over the run: {stolen(results.stolen)}",
        f"- Python {platform.python_version()}, faust-streaming {version('faust-streaming')},"
        f" aiokafka {version('aiokafka')}, Kafka {kafka_version()} (one local KRaft broker)",
        f"- Workload: {events:,} A/B events pre-produced into a {INPUT_PARTITIONS}-partition input"
        " topic under random producer keys; 5% of keys miss a partner, 2% of events are sent"
        " twice (`bench/workload.py`).",
    ]
    lines += section(
        "pairstream, one worker, exactly-once",
        "Read off the worker's `/stats` every 0.25 s: an event is *through* once the pairing"
        " stage (the second of two) has acked it. Steady: events through per second between"
        " 10% and 90% of the input. First to last: from the first event through to the last,"
        " which also takes in the phase while ingest still reads the input; the steady rate"
        " can end in pairing's phase alone. CPU: the worker process, start to end. Runs at"
        " each interval in turn with the Quix Streams app's (the peer, below).",
        ["commit interval (s)", "run", "steady events/s", "first to last: events/s",
         "start to last through (s)", "start to first through (s)", "worker CPU (s)"],
        [[f"{r.commit_interval:g}", n, rate(r.steady_rate), rate(r.through_rate),
          f"{r.seconds:.1f}", seconds(r.first_through), f"{r.cpu_seconds:.1f}"]
         for r, n in zip(
             results.pairstream,
             run_numbers([r.commit_interval for r in results.pairstream]),
             strict=True,
         )],
    )  # fmt: skip
    if results.transaction_pairs:
        lines += transactions_section(results.transaction_pairs)
    if results.profiled is not None and results.profiled.profile is not None:
        lines += profile_section(results.profiled, results.profiled.profile)
    lines += latency_section(results.latency, results.latency_basis, results.level_seconds)
    lines += wait_section(results.wait_profile, results.wait_rate, results.level_seconds)
    if results.idle:
        lines += section(
            "An idle worker",
            "One worker at its defaults, its topics empty, from 10 s after it is ready, and"
            " the Quix Streams app at its defaults from 20 s after its start, each for"
            f" {results.level_seconds:g} s (`bench/idle.py`): CPU as a share of one core.",
            ["app", "seconds", "CPU: share of a core"],
            [[app, f"{results.level_seconds:g}", f"{share:.3f}"] for app, share in results.idle],
        )
    if results.patterns:
        lines += patterns_section(results.patterns, results.pattern_state_bytes)
    if results.pattern_latency:
        lines += section(
            "Patterns: latency",
            "One worker, pairing and one pattern (an A then a B of one timestamp) over the"
            " latency part's load, lateness 0 (the load is in time order within each input"
            " partition), for"
            f" {results.level_seconds:g} s (`bench/patterns.py`): from the later of two partners"
            " handed to the producer to their match visible to a read_committed consumer. A"
            " match waits for every input partition's progress to pass it, told at most once"
            " a watermark interval (PAIRSTREAM_PATTERN_WATERMARK_INTERVAL_SECONDS, 0.05 s by"
            " default).",
            ["setting", "events/s", "matches", "p50 (s)", "p90 (s)", "p99 (s)", "worst (s)"],
            [[r.app, rate(r.level.rate), f"{r.pairs:,}", f"{r.p50:.3f}", f"{r.p90:.3f}",
              f"{r.p99:.3f}", f"{r.max:.3f}"] for r in results.pattern_latency],
        )  # fmt: skip
    if results.cdc_throughput or results.cdc_latency:
        lines += cdc_sections(results.cdc_throughput, results.cdc_latency, results.level_seconds)
    lines += section(
        "Two workers against one",
        "Workers of one app started at once over the same pre-produced input, the longest"
        " commit interval (`bench/workers.py`). Steady: the group's committed offsets on the"
        " keyed topic (the pairing stage's input; transaction markers included), 10% to 90%;"
        " a rebalance can move a partition and its uncommitted work, so not /stats. CPU: all"
        " the workers' processes (of a restarted worker, its last). Pairs: visible to a"
        " read_committed consumer, against the workload's own count. Restarts: workers that"
        " exited on their own and were started again, as a supervisor would (the run prints"
        " why). -: over before a steady rate could be read.",
        ["workers", "commit interval (s)", "steady events/s", "start to last pair (s)",
         "workers' CPU (s)", "pairs / expected", "restarts"],
        [[str(w.workers), f"{w.commit_interval:g}", rate(w.steady_rate),
          f"{w.seconds:.1f}", f"{w.cpu_seconds:.1f}", f"{w.pairs:,} / {w.expected_pairs:,}",
          str(w.restarts)]
         for w in results.workers],
    )  # fmt: skip
    lines += section(
        "The peer: the same work as a Quix Streams app, exactly-once",
        f"`bench/quix_app.py` on {QUIXSTREAMS} in its own venv, over the same pre-produced"
        " input: parse, repartition by the pair key, one RocksDB read and one write per event"
        " with a changelog, pairs out; no expiry. Steady: its consumer group's committed"
        " offsets on the repartition topic (transaction markers included, under 0.1%), 10%"
        " to 90%; first to last: from the first commit to the last. Pairs: visible to a"
        " read_committed consumer, against the workload's own count.",
        ["commit interval (s)", "run", "steady events/s", "first to last: events/s",
         "start to last pair (s)", "start to first commit (s)", "app CPU (s)",
         "pairs / expected"],
        [[f"{q.commit_interval:g}", n, rate(q.steady_rate), rate(q.through_rate),
          f"{q.seconds:.1f}", seconds(q.first_through), f"{q.cpu_seconds:.1f}",
          f"{q.pairs:,} / {q.expected_pairs:,}"]
         for q, n in zip(
             results.quix, run_numbers([q.commit_interval for q in results.quix]), strict=True
         )],
    )  # fmt: skip
    if results.pairstream and results.quix:
        lines += comparison_section(results.pairstream, results.quix)
    if results.rules_only is not None:
        lines += rules_only_section(results.rules_only)
    lines += section(
        "The ceiling: a bare aiokafka consume -> produce loop",
        f"One stage, no parsing, no state, commits every {ceiling_commit_interval:g} s"
        " (`bench/ceiling.py`); CPU of the loop's process. Sends: each record through"
        " `send`, or appended to batches (the producer's `create_batch` and `send_batch`,"
        " as the worker's outbox appends): the client's least per record.",
        ["transactions", "sends", "events/s", "seconds", "CPU (s)", "µs CPU per event"],
        [["yes" if c.transactional else "no", "batched" if c.batched else "per record",
          f"{c.rate:,.0f}", f"{c.seconds:.1f}", f"{c.cpu_seconds:.1f}",
          f"{c.cpu_seconds * 1e6 / c.events:.1f}"] for c in results.ceiling],
    )  # fmt: skip
    lines += section(
        "Restart with keys pending",
        "One worker, 1 s commits, takes N A-events without partners (expiry and max wait"
        f" {HOLD_SECONDS:,} s, so all stay pending), is killed with SIGKILL and started again"
        f" at once; then {PROBES} B-events partner pending keys spread over all of them."
        " Back to processing: from the kill to the first probe pair visible to a"
        " read_committed consumer (and to the last), with the local RocksDB intact and"
        " deleted (`bench/restart.py`). Memory and disk: with the N keys pending, before"
        " the kill.",
        ["keys pending", "taken in (s)", "intact: first / all (s)",
         "deleted: first / all (s)", "resident MiB", "local disk MiB",
         "MiB resident per 1M keys", "MiB disk per 1M keys"],
        [[f"{r.pending:,}", f"{r.build_seconds:.1f}",
          f"{r.intact_first:.1f} / {r.intact_all:.1f}",
          f"{r.deleted_first:.1f} / {r.deleted_all:.1f}", f"{r.rss_mib:,.0f}",
          # Hundredths: a smoke run's 3,000 keys take about half a MiB, which rounded to a
          # whole one read 0 or 1 by chance.
          f"{r.disk_mib:,.2f}", f"{r.rss_mib * 1e6 / r.pending:,.0f}",
          f"{r.disk_mib * 1e6 / r.pending:,.0f}"] for r in results.restart],
    )  # fmt: skip
    return "\n".join(lines) + "\n"
