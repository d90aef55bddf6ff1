"""Windowed analytics over event time, from bronze into Delta gold tables.

Every window kind is computed from one frame of outcomes, a row per record:
a pair, an unpaired event (expired or late), or a valid event as pairing saw it
(for the duplicate rate). Gold tables are recomputed whole on each run.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from analytics.event_time import keyed_event
from analytics.lake import Lake
from app.settings import Settings
from pairing.grammar import fixed_point
from pairing.records import loads

# Spark's widest decimal: 20 digits before the point and 18 after. A pair's sum is read
# into it only where it fits exactly (docs/grammar.md); the others are counted apart.
AMOUNT = DecimalType(38, 18)
PAIR = "struct<timestamp:string,a_id:string,b_id:string,paired_at:string>"
UNPAIRED = "struct<timestamp:string,id:string,reason:string>"


@F.udf(returnType=AMOUNT, useArrow=False)
def _pair_sum(value: bytes) -> Decimal | None:
    """The pair's exact sum, or None where `decimal(38,18)` cannot hold it exactly."""
    return fixed_point(loads(value)["sum"], AMOUNT.precision - AMOUNT.scale, AMOUNT.scale)


def latency_ms(later: str, earlier: str) -> Column:
    micros = F.unix_micros(F.to_timestamp(later)) - F.unix_micros(F.to_timestamp(earlier))
    return micros / 1000


def outcomes(spark: SparkSession, lake: Lake) -> DataFrame:
    """ts, kind (pair | expired | late | valid), amount, latency_ms, identity."""

    def bronze(source: str) -> DataFrame:
        return spark.read.format("delta").load(lake.bronze(source))

    def parsed(source: str, schema: str, *extra: Column) -> DataFrame:
        return bronze(source).select(
            F.from_json(F.col("value").cast("string"), schema).alias("r"), *extra
        )

    pairs = parsed("pairs", PAIR, _pair_sum(F.col("value")).alias("amount")).select(
        F.to_timestamp("r.timestamp").alias("ts"),
        F.lit("pair").alias("kind"),
        "amount",
        (
            (
                F.unix_micros(F.to_timestamp("r.paired_at"))
                - F.unix_micros(F.to_timestamp("r.timestamp"))
            )
            / 1000
        ).alias("latency_ms"),
        F.lit(None).cast("string").alias("identity"),
    )
    unpaired = parsed("unpaired", UNPAIRED).select(
        F.to_timestamp("r.timestamp").alias("ts"),
        F.col("r.reason").alias("kind"),
        F.lit(None).cast(AMOUNT).alias("amount"),
        F.lit(None).cast("double").alias("latency_ms"),
        F.lit(None).cast("string").alias("identity"),
    )
    valid = (
        bronze("keyed")
        .select(keyed_event(F.col("value")).alias("r"))
        .where(F.col("r.key").isNotNull())  # ticks carry no key
        .select(
            F.to_timestamp("r.key").alias("ts"),
            F.lit("valid").alias("kind"),
            F.lit(None).cast(AMOUNT).alias("amount"),
            F.lit(None).cast("double").alias("latency_ms"),
            F.col("r.identity").alias("identity"),
        )
    )
    return pairs.unionByName(unpaired).unionByName(valid).where(F.col("ts").isNotNull())


def _count(kind: str) -> Column:
    return F.count(F.when(F.col("kind") == kind, 1))


def _unsummed() -> Column:
    """Pairs whose sum `decimal(38,18)` cannot hold: in `pairs`, not in the sum or mean."""
    return F.count(F.when((F.col("kind") == "pair") & F.col("amount").isNull(), 1))


def _settled_rates(frame: DataFrame) -> DataFrame:
    """Shares of the settled events: both sides of each pair, expired, late."""
    settled = F.col("pairs") * 2 + F.col("expired") + F.col("late")
    return frame.withColumn(
        "match_rate", F.when(settled > 0, F.col("pairs") * 2 / settled)
    ).withColumn("late_rate", F.when(settled > 0, F.col("late") / settled))


def aggregate(frame: DataFrame, window: Column) -> DataFrame:
    """Counts, sums, mean, rates and latency percentiles per window."""
    pair = F.col("kind") == "pair"
    grouped = frame.groupBy(window.alias("window")).agg(
        _count("pair").alias("pairs"),
        F.sum(F.when(pair, F.col("amount"))).alias("pair_sum"),
        F.avg(F.when(pair, F.col("amount"))).alias("pair_mean"),
        _unsummed().alias("pairs_unsummed"),
        _count("expired").alias("expired"),
        _count("late").alias("late"),
        _count("valid").alias("valid"),
        F.count_distinct(F.when(F.col("kind") == "valid", F.col("identity"))).alias(
            "distinct_valid"
        ),
        F.percentile_approx(F.when(pair, F.col("latency_ms")), [0.5, 0.95, 0.99]).alias("p"),
    )
    return (
        _settled_rates(
            grouped.select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "pairs",
                "pair_sum",
                "pair_mean",
                "pairs_unsummed",
                "expired",
                "late",
                "valid",
                "distinct_valid",
                F.col("p")[0].alias("latency_p50_ms"),
                F.col("p")[1].alias("latency_p95_ms"),
                F.col("p")[2].alias("latency_p99_ms"),
            )
        )
        .withColumn(
            "duplicate_rate",
            F.when(F.col("valid") > 0, 1 - F.col("distinct_valid") / F.col("valid")),
        )
        .orderBy("window_start")
    )


SLIDING_BUCKET_SECONDS = 3600
"""The sliding windows are computed per bucket of event time this long (or the window's
look-back, if longer): a window with no partition would move every row to one task."""


def sliding(frame: DataFrame, seconds: int) -> DataFrame:
    """One window per distinct event time t, covering [t - seconds, t]. Only additive
    measures: distinct counts and percentiles do not slide.

    Spread over buckets of event time: an instant within the look-back of the next
    bucket's start is carried into that bucket too (not emitted there), so the window of
    every instant lies within its own bucket, a bucket being no shorter than the
    look-back."""
    span_us = seconds * 1_000_000
    bucket_us = max(span_us, SLIDING_BUCKET_SECONDS * 1_000_000)
    per_instant = frame.groupBy(F.unix_micros("ts").alias("t")).agg(
        _count("pair").alias("pairs"),
        F.sum(F.when(F.col("kind") == "pair", F.col("amount"))).alias("pair_sum"),
        _unsummed().alias("pairs_unsummed"),
        _count("expired").alias("expired"),
        _count("late").alias("late"),
    )
    bucket = F.floor(F.col("t") / bucket_us)
    into_next = F.col("t") + span_us >= (bucket + 1) * bucket_us
    copies = F.when(into_next, F.array(F.lit(False), F.lit(True))).otherwise(F.array(F.lit(False)))
    bucketed = per_instant.select("*", F.explode(copies).alias("carried")).withColumn(
        "bucket", bucket + F.col("carried").cast("long")
    )
    span = Window.partitionBy("bucket").orderBy("t").rangeBetween(-span_us, 0)
    slid = (
        bucketed.select(
            F.timestamp_micros(F.col("t") - span_us).alias("window_start"),
            F.timestamp_micros("t").alias("window_end"),
            *(
                F.sum(c).over(span).alias(c)
                for c in ("pairs", "pair_sum", "pairs_unsummed", "expired", "late")
            ),
            "carried",
        )
        .where(~F.col("carried"))
        .drop("carried")
    )
    summed = F.col("pairs") - F.col("pairs_unsummed")
    mean = F.when(summed > 0, F.col("pair_sum") / summed)
    return _settled_rates(slid.withColumn("pair_mean", mean)).orderBy("window_end")


def with_sessions(frame: DataFrame, gap_seconds: int) -> DataFrame:
    """`frame` with `session`, the session window of its event time, as Spark's
    `session_window` makes it (a session starts at an event at least the gap after the
    one before; it ends the gap after its last), computed without moving every row to
    one task as `session_window` over the whole stream does.

    Per bucket of event time (no shorter than the gap): whether an instant starts a
    session needs only the instant before it, in its bucket or the last of the bucket
    before (an instant after an empty bucket is more than the gap after any before it);
    its session's start is the latest start at or before it, in its bucket or, for the
    instants before the bucket's first start, the latest start of the buckets before,
    a running maximum over one number a bucket, made on the driver."""
    gap_us = gap_seconds * 1_000_000
    bucket_us = max(gap_us, SLIDING_BUCKET_SECONDS * 1_000_000)
    instants = (
        frame.select(F.unix_micros("ts").alias("t"))
        .distinct()
        .withColumn("bucket", F.floor(F.col("t") / bucket_us))
    )
    in_bucket = Window.partitionBy("bucket").orderBy("t")
    last_of = instants.groupBy("bucket").agg(F.max("t").alias("last"))
    before = F.coalesce(F.lag("t").over(in_bucket), F.col("last"))
    starts = (
        instants.join(last_of.withColumn("bucket", F.col("bucket") + 1), "bucket", "left")
        .withColumn("starts", before.isNull() | (F.col("t") - before >= gap_us))
        .withColumn(
            "own_start",
            F.max(F.when(F.col("starts"), F.col("t"))).over(
                in_bucket.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
    )
    per_bucket = starts.groupBy("bucket").agg(F.max("own_start").alias("start"))
    latest: int | None = None
    carried: list[tuple[int, int | None]] = []
    for row in per_bucket.orderBy("bucket").collect():  # one row a bucket
        carried.append((row.bucket, latest))
        latest = latest if row.start is None else row.start  # starts grow with buckets
    earlier = frame.sparkSession.createDataFrame(carried, "bucket long, earlier long")
    of_instant = starts.join(earlier, "bucket", "left").select(
        "t", F.coalesce("own_start", "earlier").alias("start")
    )
    ends = of_instant.groupBy("start").agg((F.max("t") + gap_us).alias("end"))
    session = F.struct(
        F.timestamp_micros("start").alias("start"), F.timestamp_micros("end").alias("end")
    )
    return (
        frame.withColumn("t", F.unix_micros("ts"))
        .join(of_instant, "t")
        .join(ends, "start")
        .withColumn("session", session)
        .drop("t", "start", "end")
    )


def window_tables(frame: DataFrame, conf: Settings) -> dict[str, DataFrame]:
    def seconds(n: int) -> str:
        return f"{n} seconds"

    return {
        "tumbling": aggregate(frame, F.window("ts", seconds(conf.tumbling_window_seconds))),
        "hopping": aggregate(
            frame,
            F.window(
                "ts", seconds(conf.hopping_window_seconds), seconds(conf.hopping_slide_seconds)
            ),
        ),
        "session": aggregate(with_sessions(frame, conf.session_gap_seconds), F.col("session")),
        "sliding": sliding(frame, conf.sliding_window_seconds),
    }


def windows(spark: SparkSession, conf: Settings) -> dict[str, int]:
    """Recompute every gold window table and the chart; returns rows per table."""
    lake = Lake.of(conf)
    frame = outcomes(spark, lake).cache()
    rows = {}
    for name, table in window_tables(frame, conf).items():
        table.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(
            lake.gold(f"windows_{name}")
        )
        rows[name] = spark.read.format("delta").load(lake.gold(f"windows_{name}")).count()
    frame.unpersist()
    draw_chart(spark.read.format("delta").load(lake.gold("windows_tumbling")), lake)
    return rows


def draw_chart(tumbling: DataFrame, lake: Lake) -> None:
    """Pairs and unpaired events per tumbling window, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    series = tumbling.select("window_start", "pairs", "expired", "late").collect()
    starts = [row.window_start for row in series]
    figure, axes = plt.subplots(figsize=(10, 4))
    axes.plot(starts, [row.pairs for row in series], label="pairs")
    axes.plot(starts, [row.expired + row.late for row in series], label="unpaired (expired + late)")
    axes.set_xlabel("event time (UTC)")
    axes.set_ylabel("records per window")
    axes.set_title("pairstream: pairs vs unpaired per tumbling window")
    axes.legend()
    figure.autofmt_xdate()
    lake.chart.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(lake.chart, dpi=100)
    plt.close(figure)
