"""End-to-end latency under load: one worker, A/B partners produced at a steady rate
(each B right after its A, no producer key), and each pair's latency from the send of
its second event to the pair being visible to a read_committed consumer."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta

from aiokafka import AIOKafkaProducer

from app.kafka.admin import ensure_topics
from app.kafka.connection import KafkaConnection
from bench.ceiling import BatchedSink
from bench.pairstream import worker_run
from bench.workload import INPUT_PARTITIONS, create_topic
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import BASE_TIME
from tools.read_outputs import OutputReader

SPACING = timedelta(milliseconds=1)  # between keys: each key's timestamp is its own
WARM_UP = 3.0  # seconds of each level left out of its figures
DRAIN_SECONDS = 120.0  # after a level, for its last pairs
TICK = 0.005  # seconds between two hand-overs of the load generator
# What a smoke run's loads are shares of: its parts run side by side, so no rate it
# measures is worth basing them on.
SMOKE_LATENCY_BASIS = 1_000.0


@dataclass(frozen=True)
class LatencyResult:
    commit_interval: float
    load: float  # the share of the measured maximum
    events_per_second: float  # offered
    pairs: int  # measured (after the warm-up)
    p50: float  # seconds
    p99: float
    max: float


def percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def offer(
    producer: AIOKafkaProducer, topic: str, rate: float, seconds: float, first: int
) -> dict[str, float]:
    """Partners at `rate` events/s for `seconds`: when each pair's second event was handed
    to the producer, by the first event's id. Each event goes to a partition at random, as
    aiokafka's partitioner sends a record with no key. What is due is handed over every
    `TICK`, in one batch per partition: through `send`, an await per record, the generator
    took 39-58% of a core at 8,000 events/s, beside the worker on this machine's two."""
    keys_per_second = rate / 2
    sent: dict[str, float] = {}
    sink = BatchedSink(producer, topic)
    started = time.monotonic()
    n = first
    while (elapsed := time.monotonic() - started) < seconds:
        due = first + int(elapsed * keys_per_second)
        keys = []
        for number in range(n, due):
            stamp = (BASE_TIME + number * SPACING).strftime("%Y-%m-%d %H:%M:%S.%f")
            for kind in ("A", "B"):
                value = (
                    f'{{"type":"{kind}","timestamp":"{stamp}","value":1,"id":"{kind}-{number}"}}'
                )
                sink.append(random.randrange(INPUT_PARTITIONS), None, value.encode())
            keys.append(f"A-{number}")
        n = max(n, due)
        await sink.hand_over()
        handed_over = time.monotonic()
        for key in keys:
            sent[key] = handed_over
        await asyncio.sleep(TICK)
    await sink.delivered()
    return sent


async def read_pairs(reader: OutputReader, seen: dict[str, float]) -> None:
    while True:
        before = len(reader.outputs.pairs)
        await reader.poll()
        now = time.monotonic()
        for pair in reader.outputs.pairs[before:]:
            seen[pair["a_id"]] = now


async def run_latency(
    bootstrap: str, commit_interval: float, max_rate: float, loads: list[float], seconds: float
) -> list[LatencyResult]:
    run = worker_run("bench-latency", bootstrap, commit_interval)
    conf, log_path = run.conf, run.log_path
    await create_topic(bootstrap, conf.events_topic)
    await ensure_topics(conf)
    worker = start_worker(log_path)
    producer = AIOKafkaProducer(
        **KafkaConnection(bootstrap).aiokafka(), enable_idempotence=True, linger_ms=5
    )
    try:
        await wait_ready(log_path, worker)
        await producer.start()
        async with OutputReader(conf) as reader:
            seen: dict[str, float] = {}
            reading = asyncio.ensure_future(read_pairs(reader, seen))
            try:
                results = await measure_levels(
                    producer, conf.events_topic, seen, commit_interval, max_rate, loads, seconds
                )
            finally:
                reading.cancel()
                with suppress(asyncio.CancelledError):
                    await reading
    finally:
        await producer.stop()
        stop_worker(worker)
    await run.discard()
    return results


async def measure_levels(
    producer: AIOKafkaProducer,
    topic: str,
    seen: dict[str, float],
    commit_interval: float,
    max_rate: float,
    loads: list[float],
    seconds: float,
) -> list[LatencyResult]:
    results = []
    first = 0
    for load in loads:
        rate = max_rate * load
        sent = await offer(producer, topic, rate, seconds, first)
        first += len(sent)
        measured = list(sent.items())[int(len(sent) * WARM_UP / seconds) :]
        deadline = time.monotonic() + DRAIN_SECONDS
        while missing := [key for key, _ in measured if key not in seen]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(missing)} pairs not visible, e.g. {missing[:3]}")
            await asyncio.sleep(0.5)
        ordered = sorted(seen[key] - at for key, at in measured)
        results.append(
            LatencyResult(
                commit_interval,
                load,
                rate,
                len(ordered),
                percentile(ordered, 0.5),
                percentile(ordered, 0.99),
                ordered[-1],
            )
        )
    return results


def main(argv: list[str] | None = None) -> None:
    """One level on its own, for comparing two versions of the worker in turn."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency",
        description="Latency at one rate: one worker, a steady load, p50/p99/max from send"
        " to visible (the suite's latency part at one level).",
    )
    parser.add_argument("rate", type=float, help="events per second offered")
    parser.add_argument("--seconds", type=float, default=25.0, help="of load (default 25)")
    parser.add_argument("--commit-interval", type=float, default=1.0)
    parser.add_argument("--bootstrap", required=True, help="a running broker")
    args = parser.parse_args(argv)
    [level] = asyncio.run(
        run_latency(args.bootstrap, args.commit_interval, args.rate, [1.0], args.seconds)
    )
    print(
        f"{level.events_per_second:,.0f} events/s offered, {level.pairs} pairs measured:"
        f" p50 {level.p50:.3f} s, p99 {level.p99:.3f} s, max {level.max:.3f} s"
    )


if __name__ == "__main__":
    main()
