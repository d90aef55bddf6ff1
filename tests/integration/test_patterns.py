"""Patterns on the exactly-once core (agents/patterns.py), on the real broker: two input
topics of 4 partitions, records with random and absent keys, duplicates and invalid
ones, three patterns over two key fields (a join, an absence, a quantifier): two workers,
each SIGKILLed once while the stream flows; and on the secured broker, one worker
started after the whole stream is in the topics. Every match the naive model finds over
the valid events comes out exactly once, and nothing else."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pairing.grammar import Sizes
from pairing.pattern_input import read_pattern_event
from pairing.pattern_state import PatternEvent
from pairing.patterns import PatternFile, load_patterns
from tests.integration.harness import (
    Pipeline,
    Worker,
    read_partitions,
    secured_pipeline,
    stop_workers,
)
from tests.pattern_model import expected_matches
from tools import broker as local_broker

pytestmark = pytest.mark.broker

PARTITIONS = 4
LATENESS = 30  # seconds; the stream's disorder within a partition stays below
START = datetime(2024, 2, 9, 21, 0, tzinfo=UTC)
COUNT, RATE = 6000, 400  # records, a second


def pattern_file(searches: str, clicks: str) -> str:
    return f"""
[input]
topics = ["{searches}", "{clicks}"]
time = "ts"
identity = "id"
topic_field = "stream"

[[pattern]]
name = "search-click"
key = "session"
within = 600
skip = "no_skip"

[[pattern.step]]
name = "search"
where = [{{ field = "stream", op = "==", value = "{searches}" }}]

[[pattern.step]]
name = "click"
where = [{{ field = "stream", op = "==", value = "{clicks}" }}]

[[pattern]]
name = "search-without-click"
key = "session"
within = 600
skip = "no_skip"

[[pattern.step]]
name = "search"
where = [{{ field = "stream", op = "==", value = "{searches}" }}]

[[pattern.step]]
name = "click"
absent = true
where = [{{ field = "stream", op = "==", value = "{clicks}" }}]

[[pattern]]
name = "three-clicks"
key = "user"
within = 300

[[pattern.step]]
name = "clicks"
times = 3
where = [{{ field = "stream", op = "==", value = "{clicks}" }}]
"""


def ts(seconds: float) -> str:
    return (START + timedelta(seconds=seconds)).isoformat()


def stream(rng: random.Random, count: int) -> list[tuple[int, bytes | None, bytes]]:
    """(topic index, key, value) in production order: event time rising with up to 20 s
    of disorder, sessions and users drawn from small sets (or absent), a few exact
    duplicates and invalid records."""
    records: list[tuple[int, bytes | None, bytes]] = []
    for n in range(count):
        topic = rng.randrange(2)
        doc: dict[str, Any] = {"id": f"{'sc'[topic]}{n}", "ts": ts(n * 0.5 - rng.uniform(0, 20))}
        if rng.random() < 0.95:
            doc["session"] = f"s{rng.randrange(200)}"
        if rng.random() < 0.9:
            doc["user"] = rng.randrange(40)
        key = None if rng.random() < 0.3 else str(doc.get("session")).encode()
        value = json.dumps(doc).encode()
        records.append((topic, key, value))
        if rng.random() < 0.02:
            records.append((topic, key, value))  # the same record again: one event
        if rng.random() < 0.01:
            records.append((topic, key, b'{"id": "broken", "ts": '))
    return records


def expected(declared: PatternFile, topics: list[str], records: list[Any]) -> Counter[Any]:
    """The model's matches over the valid events, each once."""
    assert declared.input is not None
    events: dict[tuple[int, str], PatternEvent] = {}
    for topic, key, value in records:
        event = read_pattern_event(
            key, value, topics[topic], declared.input, declared.fields(), Sizes()
        )
        if isinstance(event, PatternEvent):
            events.setdefault(event.position, event)
    found: Counter[Any] = Counter()
    for pattern in declared.patterns:
        for match in expected_matches(pattern, events.values()):
            found[(match.pattern, match.key, match.events)] += 1
    return found


async def produce(
    pipeline: Pipeline, topics: list[str], records: list[Any], rate: float, end: float
) -> None:
    """`records` at `rate` a second, then into every partition of both topics an event
    of no key far past the stream's end: it moves every input partition's progress,
    so the watermark passes every window."""
    producer = AIOKafkaProducer(**pipeline.conf.kafka.aiokafka(), enable_idempotence=True)
    await producer.start()
    try:
        for n, (topic, key, value) in enumerate(records):
            await producer.send(topics[topic], value, key=key)
            if n % 50 == 49:
                await asyncio.sleep(50 / rate)
        for topic in topics:
            for partition in range(PARTITIONS):
                doc = {"id": f"end-{topic}-{partition}", "ts": ts(end)}
                await producer.send(topic, json.dumps(doc).encode(), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


async def read_matches(pipeline: Pipeline, declared: PatternFile) -> Counter[Any]:
    found: Counter[Any] = Counter()
    for pattern in declared.patterns:
        topic = pipeline.conf.match_topic(pattern.name)
        for partition in await read_partitions(pipeline.conf, topic):
            for _, value in partition:
                assert value is not None
                doc = json.loads(value)
                steps = tuple(tuple(doc["steps"][step.name]) for step in pattern.steps)
                found[(doc["pattern"], doc["key"], steps)] += 1
    return found


def declare(tmp_path: Path) -> tuple[list[str], Path, dict[str, str]]:
    """Two input topics of a run of its own, `pattern_file` over them, and the settings
    of a pipeline whose workers match it."""
    name = f"it-{uuid.uuid4().hex[:10]}"
    topics = [f"{name}-searches", f"{name}-clicks"]
    path = tmp_path / "patterns.toml"
    path.write_text(pattern_file(*topics))
    return (
        topics,
        path,
        {
            "PAIRSTREAM_APP_ID": name,
            "PAIRSTREAM_PARTITIONS": str(PARTITIONS),
            "PAIRSTREAM_PATTERNS_FILE": str(path),
            "PAIRSTREAM_PATTERN_LATENESS_SECONDS": str(LATENESS),
        },
    )


async def every_match_once(
    pipeline: Pipeline, topics: list[str], path: Path, workers: int, already_there: bool
) -> None:
    """The stream through `workers` workers, each SIGKILLed once while it flows (or, if
    `already_there`, all of it in the topics before one starts, and no kill): every
    match of the model exactly once, and nothing else."""
    await pipeline.create_topics()
    declared = load_patterns(path)
    records = stream(random.Random(76), COUNT)
    want = expected(declared, topics, records)
    assert sum(want.values()) > 500 and len({p for p, _, _ in want}) == 3
    end = COUNT * 0.5 + 86400
    if already_there:
        await produce(pipeline, topics, records, rate=RATE * 100, end=end)
    running: list[Worker] = [pipeline.worker(i) for i in range(workers)]
    try:
        for worker in running:
            worker.start()
        for worker in running:
            await worker.wait_ready()
        if not already_there:
            producing = asyncio.ensure_future(produce(pipeline, topics, records, RATE, end))
            for victim in running:  # each while the stream flows (15 s of it)
                await asyncio.sleep(5)
                victim.kill()
                victim.start()
            await producing
        deadline = asyncio.get_running_loop().time() + 240
        found: Counter[Any] = Counter()
        while asyncio.get_running_loop().time() < deadline:
            found = await read_matches(pipeline, declared)
            if sum(found.values()) >= sum(want.values()):
                break
            await asyncio.sleep(2)
        await asyncio.sleep(3)  # anything beyond the model would land meanwhile
        await stop_workers(running)
        found = await read_matches(pipeline, declared)
    finally:
        for worker in running:
            worker.kill()
    missing, extra = want - found, found - want
    assert not missing and not extra, (
        f"{sum(found.values())} matches of {sum(want.values())}; missing"
        f" {sum(missing.values())} {list(missing)[:3]}, extra {sum(extra.values())}"
        f" {list(extra)[:3]}\n" + "\n".join(w.diagnosis() for w in running)
    )


async def test_every_match_exactly_once_through_two_sigkills(broker: str, tmp_path: Path) -> None:
    topics, path, overrides = declare(tmp_path)
    pipeline = Pipeline(broker, tmp_path, **overrides)
    await every_match_once(pipeline, topics, path, workers=2, already_there=False)


async def test_every_match_exactly_once_on_the_secured_broker_from_a_waiting_stream(
    secure_broker: list[local_broker.Node], tmp_path: Path
) -> None:
    """SASL_SSL, the worker with exactly the ACLs it needs (the pattern topics' too);
    the whole stream in the topics before it starts."""
    topics, path, overrides = declare(tmp_path)
    pipeline = await secured_pipeline(secure_broker, tmp_path, **overrides)
    await every_match_once(pipeline, topics, path, workers=1, already_there=True)
