"""python -m bench [--smoke] [--events N] [--out PATH]

Starts the local broker if none runs, then measures and writes the report."""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cdc import chain, run_cdc_latency, run_cdc_throughput
from bench.ceiling import consume_produce
from bench.idle import run_idle, run_quix_idle
from bench.latency import (
    DEFAULT_COMMIT_INTERVAL,
    PAIRSTREAM_DEFAULT,
    PAIRSTREAM_LOW_LATENCY,
    QUIX,
    SMOKE_LATENCY_BASIS,
    Level,
    levels,
    run_latency,
    run_quix_latency,
    run_wait_profile,
)
from bench.measure import median, stolen_seconds
from bench.pairstream import run_worker
from bench.patterns import (
    COUNTS,
    PAIRING_WATERMARK_INTERVAL,
    records_for,
    run_pattern_latency,
    run_patterns,
    state_bytes_per_1000_partials,
    with_ids,
)
from bench.quix import python, run_quix
from bench.report import Results, render
from bench.restart import run_restart
from bench.rules_only import run_rules_only
from bench.workers import run_workers
from bench.workload import INPUT_PARTITIONS, delete_topics, pre_produce, workload
from tools import broker
from tools.generate import Record

ROOT = Path(__file__).resolve().parent.parent
CEILING_COMMIT_INTERVAL = 1.0
NOTES = "<!-- written by hand from here on; a new run keeps it -->"


@dataclass(frozen=True)
class Plan:
    """What one run of the suite measures."""

    bootstrap: str
    records: list[Record]
    intervals: list[float]  # ascending: the last gives the highest rate
    rounds: int  # runs of pairstream and of the peer at each interval, in turn
    latency_rates: list[float]  # events/s offered at fixed rates
    loads: list[float]  # and at these shares of the basis
    latency_basis: float | None  # events/s the loads are shares of; None: measured first
    level_seconds: float
    pending: list[int]
    transaction_pairs: int
    workers: list[int]
    cdc_rates: list[float]  # rows/s offered to the change data capture chain
    pattern_counts: list[int]  # patterns declared beside pairing, one run each
    timeout: float
    profile_to: Path | None


# A part of the suite: runs its measurements and puts them in the results.
Part = Callable[[Plan, Results], Coroutine[Any, Any, None]]


async def throughput_and_peer(plan: Plan, results: Results) -> None:
    """One worker and the Quix Streams app over the same workload at each commit
    interval, in turn, `plan.rounds` times: two runs minutes apart differ by more than
    the two apps do, so the comparison is of medians of runs taken side by side in
    time."""
    source = f"bench-input-{uuid.uuid4().hex[:8]}"
    await pre_produce(plan.bootstrap, source, plan.records)
    for interval in plan.intervals:
        for round_ in range(1, plan.rounds + 1):
            print(f"pairstream, commit interval {interval:g} s, run {round_} ...", flush=True)
            results.pairstream.append(
                await run_worker(plan.bootstrap, plan.records, interval, plan.timeout)
            )
            print(f"Quix Streams, commit interval {interval:g} s, run {round_} ...", flush=True)
            results.quix.append(
                await run_quix(plan.bootstrap, source, plan.records, interval, plan.timeout)
            )
    await delete_topics(plan.bootstrap, source)


async def latency(plan: Plan, results: Results) -> None:
    """Latency at fixed rates and at shares of `plan.latency_basis`; without one, of the
    median first-to-last rate of the pairstream runs before it (the parts then run one
    after the other) at the worker's default commit interval (else the longest): the rate
    both stages keep up together, as under a live input. The steady rate of this
    pre-produced input can end in pairing's phase alone, once ingest has read everything
    (1.45x the first-to-last rate at 1 s commits on `277c66e`), and half of it offered
    live was more than the worker kept up with (p99 3.0-6.7 s). The same levels for the
    worker at its defaults and at a low-latency profile, and for the Quix Streams app at
    the default commit interval, one app over all levels at a time; then where a pair's
    time goes, at the highest fixed rate."""
    interval = (
        DEFAULT_COMMIT_INTERVAL if DEFAULT_COMMIT_INTERVAL in plan.intervals else plan.intervals[-1]
    )
    rate = plan.latency_basis
    if rate is None:
        at_basis = [r for r in results.pairstream if r.commit_interval == interval]
        rate = median([r.through_rate for r in at_basis])
        if not math.isfinite(rate):  # runs over within one sample: their whole runs' rate
            rate = median([len(plan.records) / r.seconds for r in at_basis])
    offered = levels(rate, plan.latency_rates, plan.loads)
    results.latency_basis = rate
    for setup in (PAIRSTREAM_DEFAULT, PAIRSTREAM_LOW_LATENCY):
        print(f"latency, {setup.app}, commit interval {setup.commit_interval:g} s ...", flush=True)
        results.latency += await run_latency(plan.bootstrap, setup, offered, plan.level_seconds)
    print(f"latency, {QUIX.app}, commit interval {QUIX.commit_interval:g} s ...", flush=True)
    results.latency += await run_quix_latency(plan.bootstrap, QUIX, offered, plan.level_seconds)
    # Where the time goes, at the highest fixed rate: the worker's topics read besides.
    results.wait_rate = plan.latency_rates[-1]
    print(f"where a pair's time goes, {results.wait_rate:,.0f} events/s ...", flush=True)
    results.wait_profile = await run_wait_profile(
        plan.bootstrap, PAIRSTREAM_DEFAULT, Level(results.wait_rate), plan.level_seconds
    )


async def transactions(plan: Plan, results: Results) -> None:
    interval = plan.intervals[-1]
    for n in range(1, plan.transaction_pairs + 1):
        print(f"with and without transactions, pair {n}, commit interval {interval:g} s")
        with_ = await run_worker(plan.bootstrap, plan.records, interval, plan.timeout)
        without = await run_worker(
            plan.bootstrap, plan.records, interval, plan.timeout, transactions=False
        )
        results.transaction_pairs.append((with_, without))


async def profiled(plan: Plan, results: Results) -> None:
    if plan.profile_to is not None:
        print(f"pairstream under py-spy, commit interval {plan.intervals[-1]:g} s ...")
        results.profiled = await run_worker(
            plan.bootstrap, plan.records, plan.intervals[-1], plan.timeout, plan.profile_to
        )


async def workers(plan: Plan, results: Results) -> None:
    interval = plan.intervals[-1]
    for count in plan.workers:
        print(f"{count} worker(s), commit interval {interval:g} s ...", flush=True)
        results.workers.append(
            await run_workers(plan.bootstrap, plan.records, interval, count, plan.timeout)
        )


async def ceiling(plan: Plan, results: Results) -> None:
    source = f"bench-input-{uuid.uuid4().hex[:8]}"
    await pre_produce(plan.bootstrap, source, plan.records)
    for transactional, batched in ((True, False), (False, False), (True, True)):
        print(f"ceiling, transactions {transactional}, batched {batched} ...", flush=True)
        results.ceiling.append(
            await consume_produce(
                plan.bootstrap, source, len(plan.records), transactional,
                CEILING_COMMIT_INTERVAL, batched,
            )
        )  # fmt: skip
    await delete_topics(plan.bootstrap, source)


async def restarts(plan: Plan, results: Results) -> None:
    for count in plan.pending:
        print(f"restart with {count:,} keys pending ...", flush=True)
        results.restart.append(await run_restart(plan.bootstrap, count, plan.timeout))


async def cdc(plan: Plan, results: Results) -> None:
    """The change data capture chain on a PostgreSQL and a Connect worker of its own:
    `plan.rounds` runs over the workload, each beside a JSON run; then its latency."""
    async with chain(plan.bootstrap) as on:
        for round_ in range(1, plan.rounds + 1):
            print(f"CDC chain and JSON, run {round_} ...", flush=True)
            results.cdc_throughput.append(await run_cdc_throughput(on, plan.records, plan.timeout))
        print("latency, CDC chain ...", flush=True)
        offered = [Level(rate) for rate in plan.cdc_rates]
        results.cdc_latency = await run_cdc_latency(on, offered, plan.level_seconds)


async def idle(plan: Plan, results: Results) -> None:
    print("an idle worker, and the Quix Streams app ...", flush=True)
    results.idle.append(("pairstream", await run_idle(plan.bootstrap, plan.level_seconds)))
    results.idle.append((QUIX.app, await run_quix_idle(plan.bootstrap, plan.level_seconds)))


async def patterns(plan: Plan, results: Results) -> None:
    results.pattern_state_bytes = state_bytes_per_1000_partials()
    records = with_ids(plan.records)
    for count in plan.pattern_counts:
        print(f"{count} patterns beside pairing ...", flush=True)
        run_records = records_for(records, count)
        results.patterns.append(
            await run_patterns(plan.bootstrap, run_records, count, plan.timeout)
        )
    rate = plan.cdc_rates[-1]  # 5,000 events/s (smoke: 500)
    print(f"latency, a pattern, {rate:,.0f} events/s ...", flush=True)
    for interval in (None, PAIRING_WATERMARK_INTERVAL):
        results.pattern_latency += await run_pattern_latency(
            plan.bootstrap, [Level(rate)], plan.level_seconds, interval
        )


PARTS: list[Part] = [
    throughput_and_peer, latency, idle, patterns, cdc, transactions, profiled, workers, ceiling,
    restarts,
]  # fmt: skip


def measure(plan: Plan, side_by_side: bool) -> Results:
    """Every part of the suite, one after the other, each seeing what those before it
    measured; or `side_by_side`, each in a process of its own (a smoke run: its figures
    then say nothing about speed, and it is over in a fraction of the time). Each part
    gives its runs their own topics and state."""
    stolen_before, began = stolen_seconds(), time.monotonic()
    print("the rules and codecs alone ...", flush=True)
    results = Results(
        level_seconds=plan.level_seconds,
        rules_only=run_rules_only(plan.records, INPUT_PARTITIONS),
        side_by_side=side_by_side,
    )
    if side_by_side:
        with ProcessPoolExecutor(
            len(PARTS), mp_context=multiprocessing.get_context("fork")
        ) as pool:
            for measured in pool.map(run_part, PARTS, [plan] * len(PARTS)):
                results.add(measured)
    else:
        for part in PARTS:
            asyncio.run(part(plan, results))
    cores = os.cpu_count() or 1
    results.stolen = (stolen_seconds() - stolen_before) / (time.monotonic() - began) / cores
    return results


def run_part(part: Part, plan: Plan) -> Results:
    results = Results(level_seconds=plan.level_seconds)
    asyncio.run(part(plan, results))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every measurement once, small, side by side: 3,000 events, 1 s commits",
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument(
        "--pending",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[100_000, 1_000_000],
        help="keys pending in the restart runs, comma-separated",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="one more pairstream run (longest commit interval) under py-spy, raw output to FILE",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--bootstrap", help="a running broker; default: the local one on 9092")
    args = parser.parse_args(argv)
    events = 3_000 if args.smoke else args.events
    intervals = [1.0] if args.smoke else [DEFAULT_COMMIT_INTERVAL, 0.5, 1.0]
    pending = [3_000] if args.smoke else args.pending
    loads = [0.5] if args.smoke else [0.25, 0.5, 0.75]
    # A smoke run's levels are small: its parts run side by side on a loaded machine.
    latency_rates = [1_000.0] if args.smoke else [1_000.0, 10_000.0]
    level_seconds = 5.0 if args.smoke else 30.0
    repeats = 1 if args.smoke else 3  # runs to take a median of, where runs spread
    if args.bootstrap is None:
        nodes = broker.cluster(1, 9092)
        broker.start(nodes, timeout=120)
        args.bootstrap = broker.bootstrap_servers(nodes)
    plan = Plan(
        args.bootstrap,
        workload(events),
        intervals,
        repeats,
        latency_rates,
        loads,
        SMOKE_LATENCY_BASIS if args.smoke else None,
        level_seconds,
        pending,
        repeats,
        [2] if args.smoke else [1, 2],
        [500.0] if args.smoke else [1_000.0, 5_000.0],
        [0, 10] if args.smoke else COUNTS,
        120 if args.smoke else 3600,
        args.profile,
    )
    python()  # the Quix Streams app's venv, made before any part's clients start
    results = measure(plan, side_by_side=args.smoke)
    command = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    # What was written by hand below the marker (the reading of the figures) stays.
    notes = args.out.read_text().partition(NOTES)[2] if args.out.exists() else "\n"
    report = render(command, events, results, CEILING_COMMIT_INTERVAL)
    args.out.write_text(f"{report}\n{NOTES}{notes}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
