"""Reconciliation: proof, from the topics alone, that every input was accounted for
exactly once, and that every decision was the one the rules allow.

Scope: inputs the pairing app has committed as consumed (offsets from the latest
progress snapshot of ingest). A valid event is *settled* once the watermark of its
pairing partition, as of the watermark records the pairing app has consumed, has
passed it by more than the expiry: it can no longer be pending, so it must be in
exactly one output (a pair side, an unpaired record or a conflict). Invalid inputs
must each have one dead letter.

Decisions are judged by whether each input was on time, computed from the input
topic alone (analytics.event_time): a `late` unpaired event must have no on-time
occurrence, an `expired` one a key without on-time events of both types (those
pair), and each side of a pair an on-time occurrence.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from analytics.event_time import keyed_event, keyed_watermarks, on_time
from analytics.ingest import sources
from analytics.lake import Lake
from app.settings import Settings
from pairing.changes import parser_for
from pairing.events import Rejection, read_event
from pairing.grammar import add_exact
from pairing.records import HANDED, loads

PARSED = StructType(
    [
        StructField("valid", BooleanType()),
        StructField("identity", StringType()),
        StructField("key", StringType()),
        StructField("time_us", LongType()),
        StructField("type", StringType()),
    ]
)
PAIR = "struct<timestamp:string,a_id:string,b_id:string>"
UNPAIRED = "struct<timestamp:string,id:string,reason:string>"
DEAD_LETTER = "struct<reason:string,source_partition:int,source_offset:long,id:string>"


@dataclass(frozen=True)
class Verdict:
    counts: dict[str, int]
    discrepancies: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.discrepancies.values())

    def summary(self) -> str:
        lines = [f"reconciliation: {'OK' if self.ok else 'DISCREPANCIES FOUND'}"]
        lines += [
            f"  {name.replace('_', ' '):<24} {count:>9,}" for name, count in self.counts.items()
        ]
        lines += [
            f"  ! {kind:<22} {count:>9,}" for kind, count in self.discrepancies.items() if count
        ]
        return "\n".join(lines)


def _parse_input(conf: Settings):  # type: ignore[no-untyped-def]  # a Spark UDF
    """The worker's own reader: validity and identity exactly as ingest decides them,
    sizes and the clock guard included (its record's timestamp, as ingest reads it)."""
    sizes, max_ahead_us, parse_value = conf.sizes, conf.max_ahead_us, parser_for(conf.events_format)

    def parse(
        key: bytes | None, raw: bytes | None, record_ms: int
    ) -> tuple[bool, str | None, str | None, int | None, str | None]:
        event = read_event(key, raw, record_ms, sizes, max_ahead_us, parse_value)
        if isinstance(event, Rejection):
            return (False, None, None, None, None)
        return (True, event.identity, event.key, event.time_us, event.type)

    return F.udf(parse, PARSED, useArrow=False)


@F.udf(returnType=BooleanType(), useArrow=False)
def _exact_sum(value: bytes) -> bool:
    record = loads(value)
    # Exactly: the default context rounds to 28 digits, and values may have 100.
    return bool(add_exact(record["a_value"], record["b_value"]) == record["sum"])


def _found(kind: str, frame: DataFrame, subject: str, detail: str) -> DataFrame:
    """Discrepancy rows: kind, subject, detail."""
    return frame.select(
        F.lit(kind).alias("kind"),
        F.col(subject).cast("string").alias("subject"),
        F.col(detail).cast("string").alias("detail"),
    )


def _settled(valid: DataFrame, watermarks: DataFrame, conf: Settings) -> DataFrame:
    """Identities of the valid inputs whose pairing partition's watermark has passed
    them by more than the expiry: none of them can still be pending."""
    return (
        valid.withColumn(
            "pairing_partition",
            (F.crc32(F.col("key").cast("binary")) % conf.partitions).cast("int"),
        )
        .join(watermarks, "pairing_partition")
        .where(F.col("watermark_us") - F.col("time_us") > conf.pairing.expiry_us)
        .select("identity")
        .distinct()
    )


def _unmatched_pairs(pairs: DataFrame, occurrences: DataFrame) -> DataFrame:
    """The pairs whose A or B is not among `occurrences` (key, identity, type) under
    the pair's timestamp and that side's type: timestamp, and the sides not found."""

    def side(kind: str) -> DataFrame:
        return (
            occurrences.where(F.col("type") == kind)
            .select(
                F.col("key").alias("timestamp"),
                F.col("identity").alias(f"{kind.lower()}_id"),
                F.lit(True).alias(f"{kind}_found"),
            )
            .distinct()
        )

    a_missing, b_missing = F.col("A_found").isNull(), F.col("B_found").isNull()
    return (
        pairs.join(side("A"), ["timestamp", "a_id"], "left")
        .join(side("B"), ["timestamp", "b_id"], "left")
        .where(a_missing | b_missing)
        .select(
            "timestamp",
            F.concat_ws(
                ",", F.when(a_missing, F.col("a_id")), F.when(b_missing, F.col("b_id"))
            ).alias("sides"),
        )
    )


def _wrongly_unpaired(unpaired: DataFrame, punctual: DataFrame) -> DataFrame:
    """Unpaired outputs the rules would not give: `late` for an event that was on
    time, `expired` for a key with on-time events of both types (they pair)."""
    records = unpaired.select(
        F.col("r.timestamp").alias("key"),
        F.col("r.id").alias("identity"),
        F.col("r.reason").alias("reason"),
    )
    late = records.where("reason = 'late'").join(punctual, ["key", "identity"], "left_semi")
    both_types = punctual.groupBy("key").agg(F.count_distinct("type").alias("types"))
    expired = records.where("reason = 'expired'").join(
        both_types.where("types = 2"), "key", "left_semi"
    )
    return _found("wrongly_unpaired", late.unionByName(expired), "identity", "reason")


def reconcile(spark: SparkSession, conf: Settings) -> Verdict:
    lake = Lake.of(conf)
    topics = sources(conf)

    def bronze(name: str, schema: str | None = None) -> DataFrame:
        table = spark.read.format("delta").load(lake.bronze(name))
        if schema is None:
            return table
        return table.withColumn("r", F.from_json(F.col("value").cast("string"), schema))

    progress = spark.read.format("delta").load(lake.progress)
    latest = progress.agg(F.max("taken_at").alias("taken_at"))
    committed = progress.join(latest, "taken_at")

    def consumed(table: DataFrame, topic: str) -> DataFrame:
        """Rows the pairing app committed as consumed."""
        marks = committed.where(F.col("topic") == topic).select("partition", "committed_offset")
        return table.join(marks, "partition").where(F.col("offset") < F.col("committed_offset"))

    # Cached: every check below reads the parsed inputs, and parsing is a Python UDF.
    inputs = (
        consumed(bronze("events"), topics["events"])
        .withColumn("p", _parse_input(conf)("key", "value", F.unix_millis("timestamp")))
        .cache()
    )
    keyed = bronze("keyed").withColumn("r", keyed_event(F.col("value")))
    consumed_keyed = consumed(keyed, topics["keyed"])
    valid = inputs.where("p.valid").select(
        "partition", "offset", "p.identity", "p.key", "p.type", "p.time_us"
    )
    settled_identities = _settled(valid, keyed_watermarks(spark, consumed_keyed), conf)
    punctual = on_time(valid, conf.pairing.expiry_us).cache()

    pairs = bronze("pairs", PAIR)
    unpaired = bronze("unpaired", UNPAIRED)
    dead_letters = bronze("dead_letters", DEAD_LETTER)
    is_conflict = F.col("r.reason").startswith("conflict")
    conflicts = dead_letters.where(is_conflict)
    invalid_letters = dead_letters.where(~is_conflict)

    # Each distinct pair record once; an exact copy is a duplicate pair, not two outputs.
    distinct_pairs = pairs.select("r.timestamp", "r.a_id", "r.b_id").distinct()
    outputs = (
        distinct_pairs.select(F.col("a_id").alias("identity"))
        .unionByName(distinct_pairs.select(F.col("b_id").alias("identity")))
        .unionByName(unpaired.select(F.col("r.id").alias("identity")))
        .unionByName(conflicts.select(F.col("r.id").alias("identity")))
    )
    per_identity = outputs.groupBy("identity").count()
    valid_identities = valid.select("identity").distinct()
    # Handed events were paired in the transaction of their input's offset; pairing consumes
    # their records only after it: all of them count, wherever pairing's offset stands.
    handed = keyed.where(F.col("key").cast("string").startswith(HANDED.decode()))
    keyed_events = (
        consumed_keyed.select(*keyed.columns)
        .unionByName(handed)
        .where(F.col("r.key").isNotNull())  # no watermarks, no ticks
    )
    keyed_types = keyed_events.select(
        F.col("r.identity").alias("identity"),
        F.col("r.key").alias("key"),
        F.col("r.type").alias("type"),
    )

    invalid_inputs = inputs.where("not p.valid").select("partition", "offset")
    letters_per_input = invalid_letters.groupBy(
        F.col("r.source_partition").alias("partition"), F.col("r.source_offset").alias("offset")
    ).count()
    discrepancies = (
        _found(
            "missing",
            settled_identities.join(per_identity, "identity", "left_anti"),
            "identity",
            "identity",
        )
        .unionByName(_found("output_twice", per_identity.where("count > 1"), "identity", "count"))
        .unionByName(
            _found(
                "unexplained_output",
                per_identity.join(valid_identities, "identity", "left_anti"),
                "identity",
                "count",
            )
        )
        .unionByName(
            _found(
                "duplicate_pair",
                pairs.groupBy(F.col("r.timestamp").alias("key")).count().where("count > 1"),
                "key",
                "count",
            )
        )
        .unionByName(
            _found(
                "inexact_sum",
                pairs.where(~_exact_sum(F.col("value"))).withColumn("key", F.col("r.timestamp")),
                "key",
                "offset",
            )
        )
        .unionByName(
            _found(
                "pair_mismatch", _unmatched_pairs(distinct_pairs, keyed_types), "timestamp", "sides"
            )
        )
        .unionByName(
            _found(
                "unexpected_pair",
                _unmatched_pairs(distinct_pairs, punctual),
                "timestamp",
                "sides",
            )
        )
        .unionByName(_wrongly_unpaired(unpaired, punctual))
        .unionByName(
            _found(
                "dead_letter_missing",
                invalid_inputs.join(letters_per_input, ["partition", "offset"], "left_anti"),
                "offset",
                "partition",
            )
        )
        .unionByName(
            _found("dead_letter_twice", letters_per_input.where("count > 1"), "offset", "count")
        )
        .unionByName(
            _found(
                "dead_letter_unexplained",
                letters_per_input.join(invalid_inputs, ["partition", "offset"], "left_anti"),
                "offset",
                "partition",
            )
        )
        .cache()
    )
    by_kind = {row["kind"]: row["count"] for row in discrepancies.groupBy("kind").count().collect()}
    kinds = [
        "missing",
        "output_twice",
        "unexplained_output",
        "duplicate_pair",
        "inexact_sum",
        "pair_mismatch",
        "unexpected_pair",
        "wrongly_unpaired",
        "dead_letter_missing",
        "dead_letter_twice",
        "dead_letter_unexplained",
        "nothing_consumed",
    ]
    is_valid = F.col("p.valid")
    of_inputs = inputs.agg(
        F.count("*").alias("consumed"),
        F.count(F.when(is_valid, 1)).alias("valid"),
        F.count_distinct(F.when(is_valid, F.col("p.identity"))).alias("distinct_valid"),
    ).first()
    of_unpaired = unpaired.agg(
        F.count(F.when(F.col("r.reason") == "expired", 1)).alias("expired"),
        F.count(F.when(F.col("r.reason") == "late", 1)).alias("late"),
    ).first()
    of_letters = dead_letters.agg(
        F.count(F.when(is_conflict, 1)).alias("conflicts"),
        F.count(F.when(~is_conflict, 1)).alias("invalid"),
    ).first()
    assert of_inputs is not None and of_unpaired is not None and of_letters is not None
    counts = {
        "inputs_in_lake": bronze("events").count(),
        "inputs_consumed": of_inputs["consumed"],
        "valid": of_inputs["valid"],
        "distinct_valid": of_inputs["distinct_valid"],
        "duplicates": of_inputs["valid"] - of_inputs["distinct_valid"],
        "invalid": of_inputs["consumed"] - of_inputs["valid"],
        "settled": settled_identities.count(),
        "pairs": pairs.count(),
        "unpaired_expired": of_unpaired["expired"],
        "unpaired_late": of_unpaired["late"],
        "conflicts": of_letters["conflicts"],
        "dead_letters_invalid": of_letters["invalid"],
    }
    # Inputs but no committed progress: a wrong app id or an ingest that never
    # recorded offsets. Checking nothing must not pass.
    by_kind["nothing_consumed"] = int(
        counts["inputs_in_lake"] > 0 and counts["inputs_consumed"] == 0
    )
    verdict = Verdict(counts, {kind: by_kind.get(kind, 0) for kind in kinds})
    _record(spark, lake, verdict, discrepancies)
    discrepancies.unpersist()
    punctual.unpersist()
    inputs.unpersist()
    return verdict


def _record(spark: SparkSession, lake: Lake, verdict: Verdict, discrepancies: DataFrame) -> None:
    """One row per run in reconciliation_runs; its discrepancies in the detail table."""
    run_id = str(uuid.uuid4())
    run_at = time.time()
    row = {
        "run_id": run_id,
        "run_at": run_at,
        "ok": verdict.ok,
        **verdict.counts,
        **{f"{kind}_count": n for kind, n in verdict.discrepancies.items()},
    }
    (
        spark.createDataFrame([row])
        .withColumn("run_at", F.to_timestamp(F.col("run_at")))
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(lake.gold("reconciliation_runs"))
    )
    (
        discrepancies.withColumn("run_id", F.lit(run_id))
        .write.format("delta")
        .mode("append")
        .save(lake.gold("reconciliation_discrepancies"))
    )
