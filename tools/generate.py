"""A realistic A/B event stream: out of order, missing partners, duplicates,
conflicts, late arrivals and invalid records, reproducible from a seed.

Records carry producer keys as real producers set them: a source's id (most), a
random key per message, or none; the producer's partitioner spreads them over all
partitions of the topic. A conflicting second A comes from the source of the first
one, under its key (docs/event-time.md: the one decision that depends on which
partition is read first when contenders are on different partitions).

    python -m tools.generate --count 10000 --rate 2000 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from app.kafka.access import EX_CONFIG, KafkaAccessError, check_connection
from app.kafka.connection import KafkaConnection

BASE_TIME = datetime(2024, 2, 9, 21, 0, 0, tzinfo=UTC)
OUTAGE_TRIES = 5  # of aiokafka's 40 s each: a broker away 200 s fails the producer

INVALID_RECORDS: list[bytes | None] = [
    b"{not json",
    b"[1, 2, 3]",
    b'"just a string"',
    b'{"timestamp": "2024-02-09 21:00:00", "value": 1}',
    b'{"type": "C", "timestamp": "2024-02-09 21:00:00", "value": 1}',
    b'{"type": "A", "timestamp": "yesterday", "value": 1}',
    b'{"type": "A", "timestamp": "2024-02-09 21:00:00", "value": "one"}',
    b'{"type": "B", "timestamp": "2024-02-09 21:00:00", "value": NaN}',
    b'{"type": "B", "timestamp": "2024-02-09 21:00:00", "value": Infinity}',
    b'{"type": "A", "timestamp": "2024-02-09 21:00:00"}',
    b'{"type": "A", "timestamp": "9999-12-31 23:59:59", "value": 1}',  # the clock guard's
    b"\xff\xfe\x00garbage",
    b"",
    None,
]


Record = tuple[bytes | None, bytes | None]  # producer key, value


@dataclass(frozen=True)
class StreamShape:
    count: int = 10_000  # records in all, invalid ones included
    disorder_s: float = 120.0  # how far out of order valid events arrive
    missing: float = 0.05  # share of keys with only one of A and B
    duplicates: float = 0.03  # share of events sent twice
    conflicts: float = 0.01  # share of keys with a second, different A
    late: float = 0.01  # share of events held back past the expiry
    invalid: float = 0.02  # share of invalid records
    decimals: float = 0.3  # share of values with two decimals
    ids: float = 0.7  # share of events carrying an id
    spacing_s: float = 1.0  # seconds between successive timestamps
    source_keys: float = 0.6  # share of records keyed by their source's id
    random_keys: float = 0.2  # share keyed at random; the rest have no key
    seed: int = 1


def generate(shape: StreamShape) -> list[Record]:
    rng = random.Random(shape.seed)
    timed: list[tuple[float, int, Record]] = []  # (arrival, tiebreak, record)

    def emit(arrival: float, record: Record) -> None:
        timed.append((arrival, len(timed), record))

    def source_key(kind: str) -> bytes:
        return f"sensor-{kind}-{rng.randrange(16)}".encode()

    def producer_key(kind: str) -> bytes | None:
        draw = rng.random()
        if draw < shape.source_keys:
            return source_key(kind)
        if draw < shape.source_keys + shape.random_keys:
            return b"msg-%032x" % rng.getrandbits(128)
        return None

    def value() -> str:
        if rng.random() < shape.decimals:
            return f"{rng.randint(0, 9999) / 100:.2f}"
        return str(rng.randint(-50, 500))

    def record(kind: str, at: float, n: int) -> bytes:
        stamp = (BASE_TIME + timedelta(seconds=at)).strftime("%Y-%m-%d %H:%M:%S")
        doc = f'{{"type":"{kind}","timestamp":"{stamp}","value":{value()}'
        if rng.random() < shape.ids:
            doc += f',"id":"{kind}-{n}-{rng.randrange(1 << 30)}"'
        return (doc + "}").encode()

    key_n = 0
    while len(timed) < shape.count:
        at = key_n * shape.spacing_s
        kinds = ["A", "B"]
        if rng.random() < shape.missing:
            kinds.remove(rng.choice(kinds))
        conflicting = rng.random() < shape.conflicts
        a_source = source_key("A")
        if conflicting:
            kinds.append("A")
        for kind in kinds:
            raw = record(kind, at, key_n)
            key = a_source if conflicting and kind == "A" else producer_key(kind)
            arrival = at + rng.uniform(0, shape.disorder_s)
            if rng.random() < shape.late:
                arrival += 600 + rng.uniform(0, 300)
            emit(arrival, (key, raw))
            if rng.random() < shape.duplicates:  # a retry: the same key and value
                emit(arrival + rng.uniform(0, shape.disorder_s), (key, raw))
        if rng.random() < shape.invalid * 2:
            bad = rng.choice(INVALID_RECORDS)
            # A record with neither key nor value cannot be sent.
            emit(at, (producer_key("A") if bad is not None else source_key("A"), bad))
        key_n += 1
    timed.sort()
    return [entry for _, _, entry in timed[: shape.count]]


async def produce(
    records: list[Record], kafka: KafkaConnection, topic: str, rate: float, progress: bool
) -> None:
    from aiokafka import AIOKafkaProducer

    await check_connection(kafka, timeout=30)  # a clear reason, not "Unable to bootstrap"
    producer = AIOKafkaProducer(
        **kafka.aiokafka(), enable_idempotence=True, linger_ms=5, max_request_size=2**21
    )
    await producer.start()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(records), unit="ev", desc=f"producing to {topic}")
    try:
        started = time.monotonic()
        for n, (key, value) in enumerate(records, 1):
            # The partitioner places it: by key, at random when there is none.
            await send_through_outage(producer, topic, key, value)
            if bar is not None:
                bar.update()
            if rate > 0:
                ahead = n / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await producer.flush()
    finally:
        if bar is not None:
            bar.close()
        await producer.stop()


async def send_through_outage(
    producer: Any, topic: str, key: bytes | None, value: bytes | None, tries: int = OUTAGE_TRIES
) -> None:
    """Send as an upstream producer would through a broker bounce. aiokafka gives up on
    a record when the partition's batch stays full for its request timeout (40 s): a
    broker restarted on a loaded machine took longer than that (fault matrix, scenario
    4). The record was not taken then, so sending it again adds no duplicate."""
    for attempt in range(1, tries + 1):
        try:
            await producer.send(topic, value, key=key)
            return
        except KafkaTimeoutError:
            if attempt == tries:
                raise
            print(f"broker not taking records; trying again ({attempt} of {tries})", flush=True)


def main(argv: list[str] | None = None) -> None:
    from app.settings import settings

    parser = argparse.ArgumentParser(prog="python -m tools.generate", description=__doc__)
    defaults = StreamShape()
    for name, default in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    parser.add_argument("--rate", type=float, default=0, help="events per second; 0: flat out")
    parser.add_argument("--save", help="also write the records to this file, one JSON line each")
    args = parser.parse_args(argv)
    shape = StreamShape(**{k: getattr(args, k) for k in vars(defaults)})
    records = generate(shape)
    if args.save:
        with open(args.save, "w") as out:
            for _, raw in records:
                text = None if raw is None else raw.decode("latin-1")
                out.write(json.dumps(text) + "\n")
    conf = settings()
    try:
        asyncio.run(produce(records, conf.kafka, conf.events_topic, args.rate, True))
    except KafkaAccessError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        sys.exit(EX_CONFIG)


if __name__ == "__main__":
    main()
