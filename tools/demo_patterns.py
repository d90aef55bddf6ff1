"""The pattern examples, end to end (docs/patterns.md): a local broker, a worker running
pairing and the patterns of deploy/patterns/examples.toml, the generated pairing stream
and a stream of searches and clicks (tools/searches.py), then the click-through rate in
Delta, checked against a batch join of the same input.

    python -m tools.demo_patterns [--count 20000] [--searches 3000] [--seed 1]

Each run uses fresh topics (prefixed with a run id). The searches end with a marker two
days past the last (no session: no pattern keys it) so that every window closes in event
time once the inputs are idle; a live stream closes them as its time goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from analytics.ctr import batch_rates, ctr
from analytics.ingest import ingest
from analytics.lake import Lake
from analytics.spark import spark_session
from app.kafka.admin import ensure_topics
from app.settings import Settings
from tools import broker
from tools.demo import ROOT, run_settings, start_worker, stop_worker, topic_values, wait_ready
from tools.generate import BASE_TIME, Record, StreamShape, generate, produce
from tools.searches import produce_both, searches_and_clicks, stamp

EXAMPLES = ROOT / "deploy" / "patterns" / "examples.toml"


def examples_for(topics: Mapping[str, str]) -> str:
    """The examples with their topics renamed as `topics` says: a topic's name is a quoted
    string, in [input] and in the conditions on the field that names it."""
    text = EXAMPLES.read_text()
    for old, new in topics.items():
        text = text.replace(json.dumps(old), json.dumps(new))
    return text


def pattern_settings(run_id: str, unpaired: str) -> dict[str, str]:
    path = ROOT / ".run" / f"{run_id}-patterns.toml"
    names = {"searches": f"{run_id}.searches", "clicks": f"{run_id}.clicks"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(examples_for({**names, "unpaired": unpaired}))
    return {
        "PAIRSTREAM_PATTERNS_FILE": str(path),
        # `unpaired` is an output, in the order pairing's partitions decide (a late event
        # at once, an expired one as its partition's watermark passes it), and here event
        # time runs about 2,000 times faster than the wall clock: pairing's partitions a
        # second apart are more than half an hour of event time apart.
        "PAIRSTREAM_PATTERN_LATENESS_SECONDS": str(4 * 3600),
        "PAIRSTREAM_CTR_SEARCHES_TOPIC": names["searches"],
        "PAIRSTREAM_CTR_CLICKS_TOPIC": names["clicks"],
    }


async def matches(conf: Settings) -> dict[str, list[dict[str, Any]]]:
    """Every committed match, by pattern."""
    assert conf.patterns is not None
    return {
        pattern.name: [
            json.loads(value) for value in await topic_values(conf, conf.match_topic(pattern.name))
        ]
        for pattern in conf.patterns.patterns
    }


def decided(found: Mapping[str, list[dict[str, Any]]], conf: Settings) -> int:
    """Searches the join has decided, clicked or not."""
    ids = set()
    for pattern in (conf.ctr_join_pattern, conf.ctr_outer_pattern):
        for match in found.get(pattern, []):
            ids.add(match["steps"]["search"][0])
    return len(ids)


async def until_decided(
    conf: Settings, searches: int, timeout: float = 300
) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout
    while True:
        found = await matches(conf)
        if decided(found, conf) >= searches or time.monotonic() > deadline:
            return found
        await asyncio.sleep(1)


def with_unpartnered_burst(events: list[Record]) -> list[Record]:
    """The generated stream with a sensor that sends A events of value 777 and no B: three
    within ten minutes (one match of `three-expired-a`), then two more (none). Each goes
    where the stream has reached its time, about two records a second of event time."""
    burst = [600, 780, 900, 2400, 2700]
    for at in reversed(burst):
        # Half a second past the stream's whole seconds: a pairing key of its own.
        at_half = (BASE_TIME + timedelta(seconds=at + 0.5)).isoformat()
        doc = {"type": "A", "timestamp": at_half, "value": 777, "id": f"burst-{at}"}
        events.insert(min(len(events), 2 * at), (b"sensor-burst", json.dumps(doc).encode()))
    return events


async def run(args: argparse.Namespace) -> Settings:
    run_id = f"patterns-{time.strftime('%Y%m%d-%H%M%S')}"
    env = run_settings(run_id)
    env.update(pattern_settings(run_id, env["PAIRSTREAM_UNPAIRED_TOPIC"]))
    os.environ.update(env)
    conf = Settings()
    await ensure_topics(conf)
    log_path = ROOT / ".run" / f"{run_id}-worker.log"
    print(f"run {run_id}: patterns {conf.patterns_file}, worker log {log_path}")
    worker = start_worker(log_path)
    try:
        await wait_ready(log_path, worker)
        events = with_unpartnered_burst(generate(StreamShape(count=args.count, seed=args.seed)))
        searches, clicks = searches_and_clicks(args.searches, args.seed)
        end = json.dumps({"id": "end", "timestamp": stamp(args.searches * 2 + 2 * 86400)})
        searches.append((None, end.encode()))
        topics = (conf.ctr_searches_topic, conf.ctr_clicks_topic)
        print(f"producing {len(events):,} events, {len(searches) - 1:,} searches and"
              f" {len(clicks):,} clicks ...", flush=True)  # fmt: skip
        await asyncio.gather(
            produce(events, conf.kafka, conf.events_topic, 4000, False),
            produce_both(conf.kafka, searches, clicks, topics, 2000),
        )
        print("waiting for every search to be decided ...", flush=True)
        found = await until_decided(conf, len(searches) - 1)
        await asyncio.sleep(5)  # what the idle unpaired partitions let through last
        found = await matches(conf)
    finally:
        stop_worker(worker)
    print("\nMatches (read_committed), by pattern:")
    for name, records in found.items():
        print(f"  {name:<22} {len(records):>7}")
        for record in records[:1]:
            print(f"    e.g. {json.dumps(record)}")
    print(f"  searches decided: {decided(found, conf):,} of {len(searches) - 1:,}")
    return conf


def report_ctr(conf: Settings) -> bool:
    """Ingest into Delta, gold `ctr`, and its check against the batch join."""
    spark = spark_session(conf, "pairstream-ctr", None)
    try:
        ingest(spark, conf)
        ctr(spark, conf)
        gold = spark.read.format("delta").load(Lake.of(conf).gold("ctr"))
        rows = gold.orderBy("window_start", "term").collect()
        print(f"\ngold ctr ({Lake.of(conf).gold('ctr')}), the first hours:")
        for row in rows[:10]:
            print(f"  {row.window_start:%Y-%m-%d %H:%M}  {row.term:<8} {row.clicked:>4} of"
                  f" {row.searches:>4} searches clicked  ctr {row.ctr:.3f}")  # fmt: skip
        batch = batch_rates(spark, conf)
        same = gold.exceptAll(batch).count() == 0 and batch.exceptAll(gold).count() == 0
        print(f"  {len(rows)} rows; equal to the batch join of the same input: {same}")
        return same
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.demo_patterns", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000, help="pairing events")
    parser.add_argument("--searches", type=int, default=3_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    broker.start(broker.cluster(1, broker.PORT), timeout=120)
    conf = asyncio.run(run(args))
    if not report_ctr(conf):
        raise SystemExit("the click-through rate differs from the batch join (see above)")
    print("\nthe broker keeps running; `make stop` stops it, `make clean` removes all data")


if __name__ == "__main__":
    main()
