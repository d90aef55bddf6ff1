"""The jobs in order, in one Spark session: what the CLI and the demo run."""

from __future__ import annotations

import asyncio

from analytics.ingest import ingest
from analytics.lake import Lake
from analytics.reconcile import reconcile
from analytics.spark import spark_session
from analytics.windows import windows
from app.kafka.access import analytics_permissions, check_access
from app.settings import Settings

JOBS = ("ingest", "windows", "reconcile", "all")


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
        if job in ("reconcile", "all"):
            verdict = reconcile(spark, conf)
            print(verdict.summary())
            return verdict.ok
        return True
    finally:
        spark.stop()
