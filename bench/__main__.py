"""python -m bench [--smoke] [--events N] [--out PATH]

Starts the local broker if none runs, then measures and writes the report."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import uuid
from pathlib import Path

from bench.ceiling import consume_produce
from bench.latency import run_latency
from bench.pairstream import run_worker
from bench.quix import run_quix
from bench.report import Results, render
from bench.restart import run_restart
from bench.rules_only import run_rules_only
from bench.workers import run_workers
from bench.workload import INPUT_PARTITIONS, pre_produce, workload
from tools import broker

ROOT = Path(__file__).resolve().parent.parent
CEILING_COMMIT_INTERVAL = 1.0
NOTES = "<!-- written by hand from here on; a new run keeps it -->"


async def measure(
    bootstrap: str,
    events: int,
    intervals: list[float],
    loads: list[float],
    level_seconds: float,
    pending: list[int],
    transaction_pairs: int,
    workers: list[int],
    timeout: float,
    profile_to: Path | None,
) -> Results:
    results = Results(level_seconds=level_seconds)
    records = workload(events)
    print("the rules and codecs alone ...", flush=True)
    results.rules_only = run_rules_only(records, INPUT_PARTITIONS)
    for interval in intervals:
        print(f"pairstream, commit interval {interval:g} s ...", flush=True)
        results.pairstream.append(await run_worker(bootstrap, records, interval, timeout))
    at_max = results.pairstream[-1]  # the longest commit interval: the highest rate
    print(f"latency, commit interval {at_max.commit_interval:g} s ...", flush=True)
    # A smoke run is over before a steady rate can be read.
    rate = at_max.steady_rate if math.isfinite(at_max.steady_rate) else events / at_max.seconds
    results.latency = await run_latency(
        bootstrap, at_max.commit_interval, rate, loads, level_seconds
    )
    for n in range(1, transaction_pairs + 1):
        print(
            f"with and without transactions, pair {n}, commit interval {at_max.commit_interval:g} s"
        )
        with_ = await run_worker(bootstrap, records, at_max.commit_interval, timeout)
        without = await run_worker(
            bootstrap, records, at_max.commit_interval, timeout, transactions=False
        )
        results.transaction_pairs.append((with_, without))
    if profile_to is not None:
        print(f"pairstream under py-spy, commit interval {at_max.commit_interval:g} s ...")
        results.profiled = await run_worker(
            bootstrap, records, at_max.commit_interval, timeout, profile_to
        )
    for count in workers:
        print(f"{count} worker(s), commit interval {at_max.commit_interval:g} s ...", flush=True)
        results.workers.append(
            await run_workers(bootstrap, records, at_max.commit_interval, count, timeout)
        )
    source = f"bench-input-{uuid.uuid4().hex[:8]}"
    await pre_produce(bootstrap, source, records)
    for interval in intervals:
        print(f"Quix Streams, commit interval {interval:g} s ...", flush=True)
        results.quix.append(await run_quix(bootstrap, source, records, interval, timeout))
    for transactional, batched in ((True, False), (False, False), (True, True)):
        print(f"ceiling, transactions {transactional}, batched {batched} ...", flush=True)
        results.ceiling.append(
            await consume_produce(
                bootstrap, source, len(records), transactional, CEILING_COMMIT_INTERVAL, batched
            )
        )
    for count in pending:
        print(f"restart with {count:,} keys pending ...", flush=True)
        results.restart.append(await run_restart(bootstrap, count, timeout))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds: 3,000 events, 1 s commits"
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
    intervals = [1.0] if args.smoke else [0.1, 0.5, 1.0]
    pending = [3_000] if args.smoke else args.pending
    loads = [0.5] if args.smoke else [0.25, 0.5, 0.75]
    level_seconds = 8.0 if args.smoke else 30.0
    if args.bootstrap is None:
        nodes = broker.cluster(1, 9092)
        broker.start(nodes, timeout=120)
        args.bootstrap = broker.bootstrap_servers(nodes)
    timeout = 120 if args.smoke else 3600
    results = asyncio.run(
        measure(
            args.bootstrap,
            events,
            intervals,
            loads,
            level_seconds,
            pending,
            1 if args.smoke else 3,
            [2] if args.smoke else [1, 2],
            timeout,
            args.profile,
        )
    )
    command = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    # What was written by hand below the marker (the reading of the figures) stays.
    notes = args.out.read_text().partition(NOTES)[2] if args.out.exists() else "\n"
    report = render(command, events, results, CEILING_COMMIT_INTERVAL)
    args.out.write_text(f"{report}\n{NOTES}{notes}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
