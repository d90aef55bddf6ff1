"""The click-through rate of the join examples (deploy/patterns/examples.toml): searches
and clicks through a worker's patterns on the real broker, the matches into Delta, and
gold `ctr` equal to a batch join of the same input in Spark."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from pyspark.sql import SparkSession

from analytics.ctr import batch_rates, ctr
from analytics.ingest import ingest
from analytics.lake import Lake
from tests.integration.harness import Pipeline
from tools.demo_patterns import decided, examples_for, matches
from tools.searches import produce_both, searches_and_clicks, stamp

pytestmark = pytest.mark.broker

SEARCHES = 1500


async def test_the_ctr_table_equals_a_batch_join_of_the_same_input(
    broker: str, tmp_path: Path, spark: SparkSession
) -> None:
    probe = Pipeline(broker, tmp_path)
    name = probe.env_vars["PAIRSTREAM_APP_ID"]
    topics = {t: f"{name}-{t}" for t in ("searches", "clicks", "unpaired")}
    path = tmp_path / "patterns.toml"
    path.write_text(examples_for(topics))
    pipeline = Pipeline(
        broker,
        tmp_path,
        PAIRSTREAM_APP_ID=name,
        PAIRSTREAM_UNPAIRED_TOPIC=topics["unpaired"],
        PAIRSTREAM_PATTERNS_FILE=str(path),
        PAIRSTREAM_CTR_SEARCHES_TOPIC=topics["searches"],
        PAIRSTREAM_CTR_CLICKS_TOPIC=topics["clicks"],
        PAIRSTREAM_LAKE_DIR=str(tmp_path / "lake"),
    )
    await pipeline.create_topics()
    conf = pipeline.conf
    searches, clicks = searches_and_clicks(SEARCHES, seed=78)
    # A repeated search is one search.
    searches += searches[:20]
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await produce_both(conf.kafka, searches, clicks, (topics["searches"], topics["clicks"]))
        # Every input partition's progress past the last hour (workers here never go
        # idle): a record no pattern keys in each.
        producer = AIOKafkaProducer(**conf.kafka.aiokafka())
        await producer.start()
        try:
            end = stamp(SEARCHES * 2 + 4 * 3600)
            for topic in topics.values():
                for partition in range(conf.partitions):
                    doc = {"id": f"end-{topic}-{partition}", "timestamp": end}
                    await producer.send(topic, json.dumps(doc).encode(), partition=partition)
        finally:
            await producer.stop()
        deadline = time.monotonic() + 180
        while decided(await matches(conf), conf) < SEARCHES and time.monotonic() < deadline:
            await asyncio.sleep(1)  # polling the match topics
        found = await matches(conf)
        assert decided(found, conf) == SEARCHES, worker.diagnosis()
        worker.stop()
    finally:
        worker.kill()
    await asyncio.to_thread(ingest, spark, conf)  # it runs its own event loop
    assert ctr(spark, conf) >= 5  # an hour or two of searches, five terms
    gold = spark.read.format("delta").load(Lake.of(conf).gold("ctr"))
    batch = batch_rates(spark, conf)
    assert gold.exceptAll(batch).count() == 0 and batch.exceptAll(gold).count() == 0
    rows = gold.collect()
    assert sum(row.searches for row in rows) == SEARCHES
    clicked = sum(row.clicked for row in rows)
    assert 0 < clicked < SEARCHES
    assert clicked == len({m["steps"]["search"][0] for m in found[conf.ctr_join_pattern]})
