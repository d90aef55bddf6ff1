"""The Delta replica of the events table (analytics/replica.py) from change records as
the connector writes them: inserts, a snapshot's rows, updates, deletes, changes sent
again; applied twice, it equals the table the changes describe."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from analytics.replica import events_per_day, reconcile_replica, replicate
from tests.integration.harness import Pipeline, database_settings
from tools import postgres
from tools.generate import Record

pytestmark = pytest.mark.broker

Row = dict[str, str]


def change(op: str, lsn: int, before: Row | None, after: Row | None) -> Record:
    row_id = (after or before or {})["id"]
    value = {"before": before, "after": after, "op": op, "source": {"lsn": lsn}}
    return json.dumps({"id": row_id}).encode(), json.dumps(value).encode()


def history(rows: int, seed: int) -> tuple[list[Record], dict[str, Row]]:
    """Changes of `rows` rows in LSN order, some sent again out of place (as after a
    connector crash), and the table they leave."""
    rng = random.Random(seed)
    table: dict[str, Row] = {}
    records: list[Record] = []
    lsn = 1000
    for n in range(rows):
        lsn += rng.randint(1, 50)
        row = {"id": f"r-{n}", "type": rng.choice("AB"), "ts": f"2024-02-09T21:{n % 60:02d}:00Z",
               "value": f"{rng.randint(-999, 999)}.{rng.randint(0, 99):02d}"}  # fmt: skip
        records.append(change(rng.choice("cr"), lsn, None, row))
        table[row["id"]] = row
        draw = rng.random()
        if draw < 0.2:
            lsn += 1
            updated = {**row, "value": "1" + "0" * 40 + ".5"}
            records.append(change("u", lsn, row, updated))
            table[row["id"]] = updated
        elif draw < 0.3:
            lsn += 1
            records.append(change("d", lsn, {"id": row["id"]}, None))
            del table[row["id"]]
        if rng.random() < 0.1:  # the last few changes sent again
            records.extend(records[-3:])
    records.append((None, b'{"not": "a change"}'))
    return records, table


def fill(cluster: postgres.Cluster, table: dict[str, Row]) -> None:
    with psycopg.connect(postgres.dsn(cluster, postgres.APP)) as connection:
        connection.execute("DELETE FROM events")
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO events (id, type, ts, value) VALUES (%s, %s, %s, %s)",
                [(r["id"], r["type"], r["ts"], r["value"]) for r in table.values()],
            )


async def test_the_replica_equals_the_table_the_changes_describe(
    broker: str, tmp_path: Path, spark: SparkSession, database: postgres.Cluster
) -> None:
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    conf = pipeline.conf.model_copy(
        update={"lake_dir": tmp_path / "lake", **database_settings(database)}
    )
    records, table = history(2000, seed=8)
    await pipeline.produce(records[:1200])
    replicate(spark, conf)
    await pipeline.produce(records[1200:])
    rows = replicate(spark, conf)
    assert replicate(spark, conf) == rows  # nothing new: nothing changes
    replica = spark.read.format("delta").load(str(tmp_path / "lake" / "silver" / "events_replica"))
    found = {r["id"]: {k: r[k] for k in ("id", "type", "ts", "value")}
             for r in replica.where("NOT deleted").collect()}  # fmt: skip
    assert rows == len(table) and found == table
    days = events_per_day(spark, conf)
    report = spark.read.format("delta").load(str(tmp_path / "lake" / "gold" / "events_per_day"))
    per_day = {(str(r["day"]), r["type"]): r["events"] for r in report.collect()}
    assert days == len(per_day) and per_day == Counter(
        (row["ts"][:10], row["type"]) for row in table.values()
    )

    # Against the table itself: the same rows, then one row changed behind the replica's back.
    fill(database, table)
    verdict = reconcile_replica(spark, conf)
    print(f"\n{verdict.summary()}")
    assert verdict.ok and verdict.table_rows == len(table) > 1000
    changed = sorted(table)[7]
    fill(database, {**table, changed: {**table[changed], "value": "0.001"}})
    verdict = reconcile_replica(spark, conf)
    assert not verdict.ok and verdict.different == [changed], verdict.summary()
    assert verdict.summary().startswith("reconciliation: DISCREPANCIES FOUND")
