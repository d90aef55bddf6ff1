"""The click-through rate per search term, from the patterns' join of searches and clicks
(deploy/patterns/examples.toml, docs/patterns.md): gold `ctr`, one row per tumbling
window of search time (`PAIRSTREAM_CTR_WINDOW_SECONDS`) and term.

A search the join decided is in exactly one of the two match topics: with a click within
the window of the pattern (`PAIRSTREAM_CTR_JOIN_PATTERN`, one match per click), or with
none (`PAIRSTREAM_CTR_OUTER_PATTERN`). So its clicked flag is whether the first holds it,
its term and time are the search's own (the bronze table of the searches' topic), and a
search not decided yet (its hour still open) is in neither and not counted.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics.ingest import sources
from analytics.lake import Lake
from app.settings import Settings

MATCH = "pattern string, key string, steps map<string, array<string>>"
SEARCH = "id string, timestamp string, session string, term string"


def searches(spark: SparkSession, conf: Settings, topic: str | None = None) -> DataFrame:
    """id, ts, session, term of each search (or click, of `topic`), once: a repeated
    record is one event."""
    topic = topic or conf.ctr_searches_topic
    [name] = [n for n, read in sources(conf).items() if read == topic]
    bronze = spark.read.format("delta").load(Lake.of(conf).bronze(name))
    return (
        bronze.select(F.from_json(F.col("value").cast("string"), SEARCH).alias("s"))
        .select(
            F.col("s.id").alias("id"),
            F.to_timestamp("s.timestamp").alias("ts"),
            F.col("s.session").alias("session"),
            F.col("s.term").alias("term"),
        )
        .where(F.col("id").isNotNull() & F.col("ts").isNotNull())
        .dropDuplicates(["id"])
    )


def decided_searches(spark: SparkSession, conf: Settings) -> DataFrame:
    """id, clicked: every search the join has decided."""
    lake = Lake.of(conf)

    def first_step(pattern: str, clicked: bool) -> DataFrame:
        bronze = spark.read.format("delta").load(lake.bronze(conf.match_topic(pattern)))
        return bronze.select(
            F.from_json(F.col("value").cast("string"), MATCH)["steps"]["search"][0].alias("id"),
            F.lit(clicked).alias("clicked"),
        ).distinct()

    return first_step(conf.ctr_join_pattern, True).unionByName(
        first_step(conf.ctr_outer_pattern, False)
    )


def rates(frame: DataFrame, window_seconds: int) -> DataFrame:
    """window_start, window_end, term, searches, clicked, ctr from (ts, term, clicked)."""
    window = F.window("ts", f"{window_seconds} seconds")
    return (
        frame.groupBy(window.alias("w"), "term")
        .agg(
            F.count(F.lit(1)).alias("searches"),
            F.sum(F.col("clicked").cast("long")).alias("clicked"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "term",
            "searches",
            "clicked",
            (F.col("clicked") / F.col("searches")).alias("ctr"),
        )
    )


def ctr(spark: SparkSession, conf: Settings) -> int:
    """Recompute gold `ctr`; returns its rows."""
    decided = decided_searches(spark, conf).join(searches(spark, conf), "id")
    path = Lake.of(conf).gold("ctr")
    rates(decided, conf.ctr_window_seconds).write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(path)
    return spark.read.format("delta").load(path).count()


def batch_rates(spark: SparkSession, conf: Settings) -> DataFrame:
    """The same rates by a batch join of the inputs, as a check of the patterns': a
    search is clicked when a click of its session comes after it (by time, then id) and
    at most the join pattern's `within` later."""
    assert conf.patterns is not None
    [join] = [p for p in conf.patterns.patterns if p.name == conf.ctr_join_pattern]
    search = searches(spark, conf).where(F.col("session").isNotNull()).alias("s")
    click = searches(spark, conf, conf.ctr_clicks_topic).alias("c")
    after = (F.col("c.ts") > F.col("s.ts")) | (
        (F.col("c.ts") == F.col("s.ts")) & (F.col("c.id") > F.col("s.id"))
    )
    in_time = F.unix_micros(F.col("c.ts")) - F.unix_micros(F.col("s.ts")) <= join.within_us
    clicked = (
        search.join(click, (F.col("s.session") == F.col("c.session")) & after & in_time)
        .select(F.col("s.id").alias("id"))
        .distinct()
        .withColumn("clicked", F.lit(True))
    )
    decided = search.join(clicked, F.col("s.id") == clicked["id"], "left").select(
        F.col("s.ts").alias("ts"),
        F.col("s.term").alias("term"),
        F.coalesce(clicked["clicked"], F.lit(False)).alias("clicked"),
    )
    return rates(decided, conf.ctr_window_seconds)


def declares_ctr(conf: Settings) -> bool:
    """Whether the pattern file declares the join's two patterns and reads the searches."""
    inputs, _ = conf.pattern_topics()
    names = {pattern.name for pattern in conf.patterns.patterns} if conf.patterns else set()
    wanted = {conf.ctr_join_pattern, conf.ctr_outer_pattern}
    wanted_inputs = {conf.ctr_searches_topic, conf.ctr_clicks_topic}
    return wanted_inputs <= set(inputs) and wanted <= names
