"""Patterns beside pairing (docs/patterns.md): one worker over the pre-produced JSON input
with 0, 1, 10 and 100 declared patterns, and the state an open partial match takes.

    python -m bench.patterns --bootstrap 127.0.0.1:9592 [--events 100000] [--counts 0,1,10,100]

Pattern i is "an A then a B of the same value within 60 + i seconds" (each its own
window, so each its own state): every event is routed once (one key field) and added to
every pattern. The patterns read the workload's topic and pairing an empty one (a topic
is one stage's); with 0 patterns, pairing reads the workload. An event is through once
the last stage has acked it, read off the worker's /stats; with patterns, the last is
through once the worker has processed them all (`drained`).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path

from app.kafka.admin import ensure_topics, read_committed
from app.settings import Settings
from bench.ceiling import BatchedSink
from bench.cli import part_parser
from bench.latency import (
    DEFAULT_COMMIT_INTERVAL,
    KafkaLoad,
    LatencyResult,
    Level,
    PairIds,
    Setup,
    append_partners,
    kafka_load,
    measure_levels,
    worker_watched,
)
from bench.measure import quiet_since
from bench.pairstream import (
    PairstreamResult,
    run_worker,
    settings_fields,
    through_pairing,
    worker_run,
    worker_stats,
)
from bench.workload import INPUT_PARTITIONS, create_topic, workload
from pairing.pattern_engine import PatternEngine
from pairing.pattern_partition import PatternPartition
from pairing.pattern_state import PatternEvent, decode
from pairing.pattern_store import EncodedPatternStore, MemoryBytes
from pairing.patterns import FieldValue, parse_patterns
from pairing.watermarks import EventClock, WatermarkUpdate
from tools.demo import start_worker, stop_worker, wait_ready
from tools.generate import Record

COUNTS = [0, 1, 10, 100]


@dataclass(frozen=True)
class PatternsThroughput:
    patterns: int
    run: PairstreamResult


def records_for(records: list[Record], count: int) -> list[Record]:
    """The input of the run with `count` patterns: beyond 10, a share of it (100: a
    tenth), since a run's time grows with the patterns; at least 1,000 events."""
    return records[: max(1_000, len(records) * 10 // max(10, count))]


def pattern_file(topic: str, count: int) -> str:
    """`count` patterns over `topic`: an A then a B of one value within 60 + i s."""
    text = f'[input]\ntopics = ["{topic}"]\n'
    for i in range(count):
        text += f"""
[[pattern]]
name = "a-then-b-{i}"
key = "value"
within = {60 + i}

[[pattern.step]]
name = "a"
where = [{{ field = "type", op = "==", value = "A" }}]

[[pattern.step]]
name = "b"
where = [{{ field = "type", op = "==", value = "B" }}]
"""
    return text


def with_ids(records: list[Record]) -> list[Record]:
    """The workload, every event with an id (a pattern input needs one)."""
    out: list[Record] = []
    for n, (key, value) in enumerate(records):
        if value is not None and b'"id"' not in value:
            value = value[:-1] + b',"id":"e%d"}' % n
        out.append((key, value))
    return out


def patterns_over_input(conf: Settings, text: str) -> dict[str, str]:
    """Settings for a worker whose patterns (`text`, a pattern file) read the run's
    input, and whose pairing reads an empty topic of the run (a topic is one stage's)."""
    path = Path(conf.data_dir).with_name(f"{Path(conf.data_dir).name}-patterns.toml")
    path.write_text(text)
    return {
        "PAIRSTREAM_PATTERNS_FILE": str(path),
        "PAIRSTREAM_EVENTS_TOPIC": f"{conf.events_topic}.unused",
    }


async def through_patterns(url: str) -> int:
    """Events through the patterns' match stage, per /stats."""
    stats = await worker_stats(url)
    routed = os.environ["PAIRSTREAM_APP_ID"] + "-pattern-events"
    matched = sum(
        p["counters"].get("pattern_events_in", 0)
        for p in stats["partitions"]
        if p["topic"] == routed and p["role"] == "active"
    )
    return int(matched)


async def drained(conf: Settings, pid: int) -> float:
    """When the worker had matched every event counted through: an event is counted as
    the match stage buffers it, and processed once the watermark passes it (the
    lateness and its window later), so the last ones are processed only when every
    input partition's progress moves on. One event a day later, with no key field, on
    each partition of each input moves it past them all; then the worker goes quiet."""
    assert conf.patterns is not None and conf.patterns.input is not None
    later = {"type": "A", "timestamp": "2024-02-12 00:00:00", "id": "later"}
    async with kafka_load(conf.bootstrap_servers, "") as load:
        sent = [
            await load.producer.send(topic, json.dumps(later).encode(), partition=partition)
            for topic in conf.patterns.input.topics
            for partition in range(INPUT_PARTITIONS)
        ]
        await asyncio.gather(*sent)
    return await quiet_since(pid)


async def run_patterns(
    bootstrap: str, records: list[Record], count: int, timeout: float
) -> PatternsThroughput:
    """One worker with `count` patterns (none: pairing alone) over `records`, at the
    default commit interval; the input's partition count for every topic (a pattern
    input has PAIRSTREAM_PARTITIONS partitions)."""

    def setup(conf: Settings) -> dict[str, str]:
        env = {"PAIRSTREAM_PARTITIONS": str(INPUT_PARTITIONS)}
        if count:
            env.update(patterns_over_input(conf, pattern_file(conf.events_topic, count)))
        return env

    through = through_patterns if count else through_pairing
    run = await run_worker(
        bootstrap,
        records,
        DEFAULT_COMMIT_INTERVAL,
        timeout,
        setup=setup,
        through=through,
        drain=drained if count else None,
    )
    return PatternsThroughput(count, run)


# The latency load's partners (bench/latency.py) share a timestamp and nothing else: a
# match of this is a pair.
LATENCY_PATTERN = """
[[pattern]]
name = "a-then-b"
key = "timestamp"
within = 1

[[pattern.step]]
name = "a"
where = [{ field = "type", op = "==", value = "A" }]

[[pattern.step]]
name = "b"
where = [{ field = "type", op = "==", value = "B" }]
"""


class PairThenLater(KafkaLoad):
    """The latency load, each of whose runs is followed by the next pair: a match is
    decided once every input partition's progress is past its events' time (or the
    partition is idle), and the last pair of a run leaves the progress at its own time.
    The next run sends that pair again, in its warm-up: a duplicate, refused."""

    async def first(self) -> str:
        first_pair = await super().first()
        await self._then(1)
        return first_pair

    async def offer(self, rate: float, seconds: float, first: int) -> dict[str, float]:
        sent = await super().offer(rate, seconds, first)
        await self._then(first + len(sent))
        return sent

    async def _then(self, number: int) -> None:
        sink = BatchedSink(self.producer, self.topic)
        append_partners(sink, number)
        await sink.hand_over()
        await sink.delivered()


async def match_ids(conf: Settings, topic: str) -> PairIds:
    """The A ids of the matches on `topic` as they become visible (read_committed)."""
    async with read_committed(conf) as consumer:
        consumer.subscribe([topic])
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            yield [
                json.loads(record.value)["steps"]["a"][0]
                for records in batches.values()
                for record in records
                if record.value
            ]


# A match is decided once every input partition's progress has passed its last event,
# and each input partition tells its progress at most once a watermark interval: the
# latency runs at the default (0.05 s) and at pairing's (0.5 s).
PAIRING_WATERMARK_INTERVAL = 0.5


async def run_pattern_latency(
    bootstrap: str, offered: list[Level], seconds: float, watermark_interval: float | None = None
) -> list[LatencyResult]:
    """From the later of two partners handed to the producer to their match visible to
    a read_committed consumer, a worker with pairing and the one pattern, lateness 0:
    the load is in time order within each input partition. `watermark_interval`:
    PAIRSTREAM_PATTERN_WATERMARK_INTERVAL_SECONDS (None: the default)."""
    run = worker_run("bench-pattern-latency", bootstrap, DEFAULT_COMMIT_INTERVAL)
    more = {
        "PAIRSTREAM_PARTITIONS": str(INPUT_PARTITIONS),
        **patterns_over_input(
            run.conf, f'[input]\ntopics = ["{run.conf.events_topic}"]\n{LATENCY_PATTERN}'
        ),
        "PAIRSTREAM_PATTERN_LATENESS_SECONDS": "0",
        # The first pairs reach only some input partitions: the others go idle soon.
        "PAIRSTREAM_IDLE_TIMEOUT_SECONDS": "2",
    }
    if watermark_interval is not None:
        more["PAIRSTREAM_PATTERN_WATERMARK_INTERVAL_SECONDS"] = str(watermark_interval)
    run.env.update(more)
    load_topic = run.conf.events_topic
    conf = Settings(**{**run.conf.model_dump(), **settings_fields(more)})
    await create_topic(bootstrap, load_topic)
    await ensure_topics(conf)
    worker = start_worker(run.log_path, run.env)
    interval = "default" if watermark_interval is None else f"{watermark_interval:g} s"
    setup = Setup(f"watermark interval {interval}", DEFAULT_COMMIT_INTERVAL, more)
    try:
        await wait_ready(run.log_path, worker)
        async with kafka_load(bootstrap, load_topic) as load:
            results = await measure_levels(
                PairThenLater(load.producer, load.topic),
                match_ids(conf, conf.match_topic("a-then-b")),
                setup,
                offered,
                seconds,
                worker_watched(bootstrap, worker.pid, run),
            )
    finally:
        stop_worker(worker)
    await run.discard()
    return results


def state_bytes_per_1000_partials(keys: int = 1000) -> float:
    """Encoded state (what the changelog and RocksDB hold for it) of `keys` keys each with
    one open partial match (an A taken, its B awaited), per 1,000 partials."""
    [pattern] = parse_patterns(pattern_file("events", 1)).patterns
    data = MemoryBytes()
    store = EncodedPatternStore(data)
    partition = PatternPartition([PatternEngine(pattern)], store, EventClock(), 0)
    for n in range(keys):
        fields: dict[str, FieldValue] = {"type": "A", "value": n}
        partition.add(PatternEvent(1_707_512_400_000_000, f"A-{n}-123456789", fields))
    partition.observe(WatermarkUpdate(0, 1, 1_707_512_401_000_000, False))
    store.flush()
    partials = sum(len(held) for raw in data.values() for held in decode(raw).partials.values())
    assert partials == keys, partials
    return sum(len(key) + len(raw) for key, raw in data.items()) / keys * 1000


def main(argv: list[str] | None = None) -> None:
    parser = part_parser("python -m bench.patterns", __doc__ or "")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--rate", type=float, default=5_000, help="events/s of the latency run")
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args(argv)
    for interval in (None, PAIRING_WATERMARK_INTERVAL):
        [level] = asyncio.run(
            run_pattern_latency(args.bootstrap, [Level(args.rate)], args.seconds, interval)
        )
        print(
            f"{level.app}, {level.level.rate:,.0f} events/s: {level.pairs:,} matches, p50"
            f" {level.p50:.3f} s, p99 {level.p99:.3f} s, worst {level.max:.3f} s,"
            f" worker CPU {level.cpu['app']:.2f} of a core"
        )
    records = with_ids(workload(args.events))
    print(f"state per 1,000 open partial matches: {state_bytes_per_1000_partials():,.0f} bytes")
    for count in [int(c) for c in args.counts.split(",")]:
        run_records = records_for(records, count)
        result = asyncio.run(run_patterns(args.bootstrap, run_records, count, args.timeout))
        run = result.run
        print(
            f"{count:>3} patterns, {len(run_records):,} events: {run.through_rate:,.0f}"
            " events/s first to last, steady"
            f" {run.steady_rate:,.0f}, worker CPU {run.cpu_seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
