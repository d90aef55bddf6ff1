"""Event time as the pairing stage sees it, recomputed from the bronze tables.

- The *watermark* of each keyed partition, as of what the pairing group has
  consumed: its consumed watermark records folded in offset order by the
  pipeline's own `EventClock` (pairing.watermarks).
- Whether each consumed input event was *on time*, from the input topic alone: its
  stamp is the largest valid event time of its input partition up to and including
  it, and it is on time when stamp - time <= expiry. The stamps ingest wrote are not
  read, so this also judges a pipeline that stamps wrongly, or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pairing.records import HANDED_WATERMARK_KEY, WATERMARK_KEY, decode_watermark, loads
from pairing.watermarks import EventClock

WATERMARKS = "pairing_partition int, watermark_us long"
_KEYED_OBJECT = "struct<key:string,type:string,identity:string>"


def keyed_event(value: Column) -> Column:
    """key, type and identity of a keyed topic's record (bronze `value`): an event's
    fields as a JSON array, then a newline and its input's bytes (pairing/records.py), or
    one JSON object as versions before wrote it. All null for watermarks and ticks."""
    text = value.cast("string")
    fields = F.from_json(F.substring_index(text, "\n", 1), "array<string>")
    as_array = F.struct(
        fields[1].alias("key"), fields[0].alias("type"), fields[5].alias("identity")
    )
    return F.when(text.startswith("["), as_array).otherwise(F.from_json(text, _KEYED_OBJECT))


def fold_watermarks(records: Iterable[tuple[int, int, bytes]]) -> dict[int, int | None]:
    """Each keyed partition's watermark after its watermark records, given as
    (partition, offset, value) in any order."""
    clocks: dict[int, EventClock] = {}
    for partition, _, value in sorted(records, key=lambda record: record[:2]):
        clocks.setdefault(partition, EventClock()).observe(decode_watermark(loads(value)))
    return {partition: clock.watermark_us for partition, clock in clocks.items()}


def keyed_watermarks(spark: SparkSession, keyed: DataFrame) -> DataFrame:
    """pairing_partition, watermark_us: each keyed partition that has a watermark.
    `keyed`: bronze rows of the keyed topic, those the pairing group consumed."""
    # Bronze keeps the Kafka record key as bytes. A few thousand records at most
    # (one per input partition per ingest commit): folded on the driver.
    marks = (
        keyed.where(
            (F.col("key") == F.lit(bytearray(WATERMARK_KEY)))
            | (F.col("key") == F.lit(bytearray(HANDED_WATERMARK_KEY)))  # paired in ingest's step
        )
        .select("partition", "offset", "value")
        .collect()
    )
    folded = fold_watermarks((row.partition, row.offset, bytes(row.value)) for row in marks)
    known = [(partition, mark) for partition, mark in folded.items() if mark is not None]
    return spark.createDataFrame(known, WATERMARKS)


def on_time(valid: DataFrame, expiry_us: int) -> DataFrame:
    """The valid inputs that were on time. `valid`: one row per valid input event
    with its input partition and offset, and time_us."""
    so_far = (
        Window.partitionBy("partition")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    stamped = valid.withColumn("stamp_us", F.max("time_us").over(so_far))
    return stamped.where(F.col("stamp_us") - F.col("time_us") <= expiry_us).drop("stamp_us")
