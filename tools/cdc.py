"""Events inserted into the events table, as an application commits them (docs/cdc.md):

    python -m tools.cdc insert [--count N] [--rate R] [--seed S]

The generator's events as rows, inserted in transactions of 1 to 50 rows, about one
transaction in twenty rolled back (its rows never exist). Connects with the
PAIRSTREAM_POSTGRES_* settings; prints how many rows were committed.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from app.settings import Settings, settings
from pairing.events import Event, parse_event
from tools.generate import Record, StreamShape, generate

MAX_TRANSACTION_ROWS = 50
ROLLED_BACK = 0.05  # share of transactions


@dataclass(frozen=True)
class Row:
    id: str
    type: str
    ts: str
    value: str


@dataclass
class Inserted:
    committed: list[Row]
    rolled_back: list[Row]
    transactions: int = 0


def rows_of(records: list[Record]) -> list[Row]:
    """The valid events of `records` as rows, once each (a table holds a row once; the
    invalid records have no row: the table's constraints would refuse them)."""
    rows: dict[str, Row] = {}
    for _, raw in records:
        event = parse_event(raw, 65_536)
        if isinstance(event, Event):
            rows.setdefault(
                event.identity, Row(event.identity, event.type, event.key, str(event.value))
            )
    return list(rows.values())


def transactions(rows: list[Row], rng: random.Random) -> Iterator[tuple[list[Row], bool]]:
    """`rows` cut into transactions of mixed sizes, each with whether it commits."""
    at = 0
    while at < len(rows):
        size = rng.randint(1, MAX_TRANSACTION_ROWS)
        yield rows[at : at + size], rng.random() >= ROLLED_BACK
        at += size


def connect(conf: Settings) -> psycopg.Connection[tuple[object, ...]]:
    password = conf.postgres_password.get_secret_value() if conf.postgres_password else None
    return psycopg.connect(
        host=conf.postgres_host,
        port=conf.postgres_port,
        dbname=conf.postgres_database,
        user=conf.postgres_user,
        password=password,
    )


def insert(conf: Settings, rows: list[Row], seed: int, rate: float = 0) -> Inserted:
    """Insert `rows` in transactions (`transactions`), at about `rate` rows a second
    (0: as fast as it goes)."""
    rng = random.Random(seed)
    done = Inserted([], [])
    started = time.monotonic()
    with connect(conf) as connection:
        for batch, commits in transactions(rows, rng):
            with connection.transaction(force_rollback=not commits), connection.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO events (id, type, ts, value) VALUES (%s, %s, %s, %s)",
                    [(r.id, r.type, r.ts, r.value) for r in batch],
                )
            (done.committed if commits else done.rolled_back).extend(batch)
            done.transactions += 1
            if rate:
                ahead = started + (len(done.committed) + len(done.rolled_back)) / rate
                time.sleep(max(0.0, ahead - time.monotonic()))
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.cdc", description=__doc__)
    parser.add_argument("command", choices=["insert"])
    parser.add_argument("--count", type=int, default=10_000, help="generated records")
    parser.add_argument("--rate", type=float, default=0, help="rows a second (0: at once)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = rows_of(generate(StreamShape(count=args.count, seed=args.seed, conflicts=0)))
    done = insert(settings(), rows, args.seed, args.rate)
    print(
        f"{len(done.committed):,} rows committed, {len(done.rolled_back):,} rolled back,"
        f" in {done.transactions:,} transactions"
    )


if __name__ == "__main__":
    main()
