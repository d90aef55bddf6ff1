"""A realistic A/B event stream: out of order, missing partners, duplicates,
conflicts, late arrivals and invalid records, reproducible from a seed.

    python -m tools.generate --count 10000 --rate 2000 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

BASE_TIME = datetime(2024, 2, 9, 21, 0, 0, tzinfo=UTC)

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
    b"\xff\xfe\x00garbage",
    b"",
    None,
]


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
    seed: int = 1


def generate(shape: StreamShape) -> list[bytes | None]:
    rng = random.Random(shape.seed)
    timed: list[tuple[float, int, bytes | None]] = []  # (arrival, tiebreak, record)

    def emit(arrival: float, record: bytes | None) -> None:
        timed.append((arrival, len(timed), record))

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
        if rng.random() < shape.conflicts:
            kinds.append("A")
        for kind in kinds:
            raw = record(kind, at, key_n)
            arrival = at + rng.uniform(0, shape.disorder_s)
            if rng.random() < shape.late:
                arrival += 600 + rng.uniform(0, 300)
            emit(arrival, raw)
            if rng.random() < shape.duplicates:
                emit(arrival + rng.uniform(0, shape.disorder_s), raw)
        if rng.random() < shape.invalid * 2:
            emit(at, rng.choice(INVALID_RECORDS))
        key_n += 1
    timed.sort()
    return [raw for _, _, raw in timed[: shape.count]]


async def produce(
    records: list[bytes | None], bootstrap: str, topic: str, rate: float, progress: bool
) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5, max_request_size=2**21
    )
    await producer.start()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(records), unit="ev", desc=f"producing to {topic}")
    try:
        started = time.monotonic()
        for n, raw in enumerate(records, 1):
            # Producers key by their own notion (here: a source id), never by timestamp.
            await producer.send(topic, raw, key=b"source-%d" % (n % 7), partition=0)
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
            for raw in records:
                text = None if raw is None else raw.decode("latin-1")
                out.write(json.dumps(text) + "\n")
    conf = settings()
    asyncio.run(produce(records, conf.bootstrap_servers, conf.events_topic, args.rate, True))


if __name__ == "__main__":
    main()
