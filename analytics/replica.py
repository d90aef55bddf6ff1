"""The Delta replica of the events table: the connector's change topic (docs/cdc.md)
applied with MERGE, inserts, updates and deletes, in the log's order.

Structured Streaming with `Trigger.AvailableNow` and its checkpoint: a run applies what
is new since the last one. Within a batch the last change of each row by LSN (then
offset) is applied; a change applies only over an older one (`lsn` greater), so a batch
applied again after a crash, or a change the connector sent again, changes nothing. A
deleted row stays as a tombstone (`deleted`), so that an older change sent again cannot
bring it back; the table's rows are those not deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from analytics.ingest import read_topic
from analytics.lake import Lake
from app.settings import Settings
from pairing.changes import checksum, row_digest
from pairing.grammar import format_time

ROW = "struct<id:string,type:string,ts:string,value:string>"
ENVELOPE = f"struct<before:{ROW},after:{ROW},op:string,source:struct<lsn:long>>"
REPLICA = StructType(
    [
        *(StructField(name, StringType()) for name in ("id", "type", "ts", "value")),
        StructField("lsn", LongType()),
        StructField("deleted", BooleanType()),
    ]
)
APPLIED_OPS = ("c", "r", "u", "d")


def latest_changes(records: DataFrame) -> DataFrame:
    """Kafka records of the change topic -> the last change of each row among them:
    id, type, ts, value (None for a delete), lsn, deleted. Records that are not a
    change of a row with an id and an LSN are left out (reconciliation counts them)."""
    change = F.from_json(F.col("value").cast("string"), ENVELOPE)
    rows = (
        records.select(change.alias("c"), "partition", "offset")
        .where(F.col("c.op").isin(*APPLIED_OPS) & F.col("c.source.lsn").isNotNull())
        .select(
            F.coalesce("c.after.id", "c.before.id").alias("id"),
            F.col("c.after.type").alias("type"),
            F.col("c.after.ts").alias("ts"),
            F.col("c.after.value").alias("value"),
            F.col("c.source.lsn").alias("lsn"),
            (F.col("c.op") == "d").alias("deleted"),
            "partition",
            "offset",
        )
        .where(F.col("id").isNotNull())
    )
    # A row's changes are in one partition (keyed by primary key); the offset orders
    # changes of one LSN (a change sent again).
    last = Window.partitionBy("id").orderBy(F.desc("lsn"), F.desc("offset"))
    return (
        rows.withColumn("n", F.row_number().over(last))
        .where("n = 1")
        .drop("n", "partition", "offset")
    )


def apply_changes(spark: SparkSession, path: str, batch: DataFrame) -> None:
    """MERGE one batch's last changes into the replica at `path`."""
    changes = latest_changes(batch)
    kept = {name: F.coalesce(f"s.{name}", f"t.{name}") for name in ("type", "ts", "value")}
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedUpdate("s.lsn > t.lsn", {**kept, "lsn": "s.lsn", "deleted": "s.deleted"})
        .whenNotMatchedInsertAll()
        .execute()
    )


def replicate(spark: SparkSession, conf: Settings) -> int:
    """Apply what is new on the change topic; returns the replica's rows (not deleted)."""
    lake = Lake.of(conf)
    path = lake.silver("events_replica")
    DeltaTable.createIfNotExists(spark).location(path).addColumns(REPLICA).execute()
    query = (
        read_topic(spark, conf, conf.events_topic)
        .writeStream.foreachBatch(lambda batch, _: apply_changes(spark, path, batch))
        .option("checkpointLocation", lake.checkpoint("events_replica"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return spark.read.format("delta").load(path).where("NOT deleted").count()


def events_per_day(spark: SparkSession, conf: Settings) -> int:
    """The seed's report: the table's events per day (of `ts`, UTC) and type, from the
    replica, rewritten whole to the gold table `events_per_day`; returns its rows."""
    lake = Lake.of(conf)
    rows = spark.read.format("delta").load(lake.silver("events_replica")).where("NOT deleted")
    report = (
        rows.groupBy(F.to_date(F.to_timestamp("ts")).alias("day"), "type")
        .agg(F.count("*").alias("events"))
        .orderBy("day", "type")
    )
    report.write.format("delta").mode("overwrite").save(lake.gold("events_per_day"))
    return report.count()


@dataclass(frozen=True)
class ReplicaVerdict:
    """The replica against the table itself: rows, an order-independent checksum of
    them, and up to five ids of each kind of difference."""

    table_rows: int
    replica_rows: int
    table_checksum: int
    replica_checksum: int
    missing: list[str]  # in the table, not in the replica
    extra: list[str]  # in the replica, not in the table
    different: list[str]  # in both, with other content

    @property
    def ok(self) -> bool:
        return (self.table_rows, self.table_checksum) == (self.replica_rows, self.replica_checksum)

    def summary(self) -> str:
        verdict = "OK" if self.ok else "DISCREPANCIES FOUND"
        lines = [
            f"reconciliation: {verdict} (the Delta replica against the events table)",
            f"  rows      table {self.table_rows:>16,}  replica {self.replica_rows:>16,}",
            f"  checksum  table {self.table_checksum:016x}  replica {self.replica_checksum:016x}",
        ]
        for kind in ("missing", "extra", "different"):
            if ids := getattr(self, kind):
                lines.append(f"  ! {kind}: {', '.join(ids)}")
        return "\n".join(lines)


def reconcile_replica(spark: SparkSession, conf: Settings) -> ReplicaVerdict:
    """Compare the replica's rows with the events table's, read now: run it once the
    stream is quiet (what the connector has not written yet is missing from the replica)."""
    replica = spark.read.format("delta").load(Lake.of(conf).silver("events_replica"))
    theirs = {
        row["id"]: row_digest(row["id"], row["type"], row["ts"], row["value"])
        for row in replica.where("NOT deleted").toLocalIterator()
    }
    ours = dict(_table_digests(conf))
    return ReplicaVerdict(
        table_rows=len(ours),
        replica_rows=len(theirs),
        table_checksum=checksum(ours.values()),
        replica_checksum=checksum(theirs.values()),
        missing=sorted(ours.keys() - theirs.keys())[:5],
        extra=sorted(theirs.keys() - ours.keys())[:5],
        different=sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k])[:5],
    )


def _table_digests(conf: Settings) -> Iterator[tuple[str, int]]:
    password = conf.postgres_password.get_secret_value() if conf.postgres_password else None
    with (
        psycopg.connect(
            host=conf.postgres_host,
            port=conf.postgres_port,
            dbname=conf.postgres_database,
            user=conf.postgres_user,
            password=password,
        ) as connection,
        connection.cursor(name="replica_reconciliation") as rows,  # server-side: streamed
    ):
        rows.execute("SELECT id, type, ts, value FROM events")
        for row_id, event_type, ts, value in rows:
            yield row_id, row_digest(row_id, event_type, format_time(ts), value)
