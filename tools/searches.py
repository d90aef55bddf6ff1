"""A stream of searches and the clicks on their results, by session (seed 003): the input
of the join examples in deploy/patterns/examples.toml.

    python -m tools.searches [--count 3000] [--seed 1] [--searches searches] [--clicks clicks]

Each search has an id (`q<n>`), a time, a session and a term; each term has its own
chance of a click, one or two clicks within the hour after the search, and now and then
a click more than an hour later (which the join leaves out). Times are in the grammar's
format, as pairing's input spells them, from the same first day (tools/generate.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from datetime import timedelta

from app.kafka.connection import KafkaConnection
from app.settings import settings
from tools.generate import BASE_TIME, Record, produce

# Each term's chance that a search for it gets a click within the hour.
CLICK_CHANCE = {"shoes": 0.6, "laptop": 0.35, "coffee": 0.5, "tent": 0.2, "desk": 0.3}


def stamp(seconds: float) -> str:
    return (BASE_TIME + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def searches_and_clicks(
    count: int, seed: int = 1, spacing_s: float = 2.0
) -> tuple[list[Record], list[Record]]:
    """`count` searches about `spacing_s` apart, and their clicks; each list in time
    order, keyed by session. A session has one search or a few: a search starts a new
    one half the time, or goes on with one of the ten last."""
    rng = random.Random(seed)
    terms = sorted(CLICK_CHANCE)
    searches: list[tuple[float, Record]] = []
    clicks: list[tuple[float, Record]] = []
    at = 0.0
    sessions = 0
    for n in range(count):
        at += rng.expovariate(1 / spacing_s)
        if sessions == 0 or rng.random() < 0.5:
            sessions += 1
            session = f"s{sessions - 1}"
        else:
            session = f"s{sessions - 1 - rng.randrange(min(sessions, 10))}"
        term = rng.choice(terms)
        doc = {"id": f"q{n}", "timestamp": stamp(at), "session": session, "term": term}
        searches.append((at, (session.encode(), json.dumps(doc).encode())))
        delays = []
        if rng.random() < CLICK_CHANCE[term]:
            delays += [rng.uniform(1, 3500) for _ in range(rng.choice([1, 1, 2]))]
        if rng.random() < 0.05:
            delays.append(rng.uniform(3700, 7200))  # past the hour
        for k, delay in enumerate(delays):
            click = {"id": f"c{n}-{k}", "timestamp": stamp(at + delay), "session": session}
            clicks.append((at + delay, (session.encode(), json.dumps(click).encode())))
    clicks.sort(key=lambda item: item[0])
    return [record for _, record in searches], [record for _, record in clicks]


async def produce_both(
    kafka: KafkaConnection,
    searches: list[Record],
    clicks: list[Record],
    topics: tuple[str, str],
    rate: float = 0,
) -> None:
    """Searches to the first topic, clicks to the second, side by side."""
    await asyncio.gather(
        produce(searches, kafka, topics[0], rate, False),
        produce(clicks, kafka, topics[1], rate, False),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.searches", description=__doc__)
    parser.add_argument("--count", type=int, default=3000, help="searches")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--searches", default="searches", help="topic of the searches")
    parser.add_argument("--clicks", default="clicks", help="topic of the clicks")
    args = parser.parse_args(argv)
    searches, clicks = searches_and_clicks(args.count, args.seed)
    asyncio.run(produce_both(settings().kafka, searches, clicks, (args.searches, args.clicks)))
    print(f"{len(searches):,} searches to {args.searches}, {len(clicks):,} clicks to {args.clicks}")


if __name__ == "__main__":
    main()
