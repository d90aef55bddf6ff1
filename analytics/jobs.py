"""The jobs in order, in one Spark session: what the CLI and the demo run."""

from __future__ import annotations

import asyncio

from analytics.ctr import ctr, declares_ctr
from analytics.ingest import ingest
from analytics.lake import Lake
from analytics.reconcile import reconcile
from analytics.replica import events_per_day, reconcile_replica, replicate
from analytics.spark import spark_session
from analytics.windows import windows
from app.kafka.access import analytics_permissions, check_access
from app.settings import Settings

# `replica`: the events table's Delta replica, applied and reconciled against the table
# (docs/cdc.md); in `all` when the input is its change topic.
# `ctr`: the click-through rate of the join examples (docs/patterns.md); in `all` when the
# pattern file declares them.
JOBS = ("ingest", "windows", "reconcile", "replica", "ctr", "all")


def run(job: str, conf: Settings, master: str | None) -> bool:
    """Run one job (or all, in order); False when reconciliation found discrepancies.
    Raises KafkaAccessError before Spark starts when ingest could not read Kafka."""
    if job in ("ingest", "all"):
        asyncio.run(check_access(conf.kafka, analytics_permissions(conf)))
    spark = spark_session(conf, f"pairstream-{job}", master)
    try:
        if job in ("ingest", "all"):
            rows = ingest(spark, conf)
            print("bronze rows: " + ", ".join(f"{name} {n:,}" for name, n in rows.items()))
        if job in ("windows", "all"):
            rows = windows(spark, conf)
            print("gold windows: " + ", ".join(f"{name} {n:,}" for name, n in rows.items()))
            print(f"chart: {Lake.of(conf).chart}")
        if job == "ctr" or (job == "all" and declares_ctr(conf)):
            print(f"gold ctr: {ctr(spark, conf):,} rows")
        ok = True
        if job in ("reconcile", "all"):
            verdict = reconcile(spark, conf)
            print(verdict.summary())
            ok = verdict.ok
        if job == "replica" or (job == "all" and conf.events_format == "debezium"):
            print(f"replica rows: {replicate(spark, conf):,}")
            print(f"gold events per day: {events_per_day(spark, conf):,} rows")
            replica = reconcile_replica(spark, conf)
            print(replica.summary())
            ok = ok and replica.ok
        return ok
    finally:
        spark.stop()
