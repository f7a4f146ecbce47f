"""Profile: what each entity really does, per second and per minute, per broker (quotas are
per broker): rates, percentiles, peaks, top talkers and the share of request time."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window, WindowSpec

PERCENTILES = [0.5, 0.95, 0.99]


def per_interval(captures: DataFrame, seconds: int = 1) -> DataFrame:
    """Bytes and request time per (user, client-id, broker, interval): produce bytes are
    request sizes, fetch bytes consumer response sizes (as the quotas count them)."""
    return _per_interval(captures, [F.col("user"), F.col("client_id")], seconds)


def _per_interval(captures: DataFrame, keys: list[Column], seconds: int) -> DataFrame:
    produce = F.when(F.col("api_key") == 0, F.col("request_bytes") - 4).otherwise(0)
    fetch = F.when((F.col("api_key") == 1) & ~F.col("follower"),
                   F.col("response_bytes") - 4).otherwise(0)
    busy = F.when(F.col("duration_us") > 0, F.col("duration_us")).otherwise(0) / 1000.0
    return captures.groupBy(
        *keys, "broker", (F.col("ts_ms") / (1000 * seconds)).cast("long").alias("interval"),
    ).agg(
        F.count("*").alias("requests"),
        (F.sum(produce) / seconds).alias("produce_rate"),
        (F.sum(fetch) / seconds).alias("fetch_rate"),
        (F.sum(busy) / (10.0 * seconds)).alias("request_percentage"),  # % of one thread
    )


def entity_profile(captures: DataFrame, names: DataFrame | None = None) -> DataFrame:
    """Per (user, client-id): totals, per-second rate percentiles and peaks (over the seconds
    it was active, on any one broker), per-minute peaks, and its share of request time.
    One pass over the capture: minutes and totals are sums of the seconds.

    ``names``: ``replay.Catalog.entity_frame`` (entity, user, client_id): the aggregations
    then key on the entity's hash, cheaper than on two strings, and the names join back at
    the end."""
    if names is None:
        keys = ["user", "client_id"]
        sec = per_interval(captures, 1)
    else:
        keys = ["entity"]
        sec = _per_interval(captures, [F.xxhash64("user", "client_id").alias("entity")], 1)
    sec = sec.cache()
    minute = sec.groupBy(
        *keys, "broker", (F.col("interval") / 60).cast("long").alias("minute")
    ).agg(
        (F.sum("produce_rate") / 60).alias("produce_rate"),
        (F.sum("fetch_rate") / 60).alias("fetch_rate"),
    ).groupBy(*keys).agg(
        F.max("produce_rate").alias("produce_rate_minute_max"),
        F.max("fetch_rate").alias("fetch_rate_minute_max"))
    aggs = [
        F.sum("requests").alias("requests"),
        F.sum("produce_rate").alias("produce_bytes"),  # rate per 1 s interval = bytes
        F.sum("fetch_rate").alias("fetch_bytes"),
        F.sum("request_percentage").alias("busy"),
    ]
    for name in ("produce_rate", "fetch_rate", "request_percentage"):
        aggs.append(F.percentile_approx(name, PERCENTILES, 1000).alias(f"{name}_pct"))
        aggs.append(F.max(name).alias(f"{name}_max"))
    per_second = sec.groupBy(*keys).agg(*aggs)
    for name in ("produce_rate", "fetch_rate", "request_percentage"):
        for i, q in enumerate(PERCENTILES):
            per_second = per_second.withColumn(
                f"{name}_p{int(q * 100)}", F.col(f"{name}_pct")[i])
        per_second = per_second.drop(f"{name}_pct")
    all_busy = F.sum("busy").over(_everything())
    profile = (per_second.join(minute, keys)
               .withColumn("request_time_share", F.col("busy") / all_busy)
               .drop("busy"))
    if names is None:
        return profile
    return (profile.join(F.broadcast(names), "entity")
            .select("user", "client_id", *[c for c in profile.columns if c != "entity"]))


def _everything() -> WindowSpec:
    return Window.partitionBy()


def top_talkers(profile: DataFrame, n: int = 10) -> DataFrame:
    return profile.orderBy(F.desc(F.col("produce_bytes") + F.col("fetch_bytes"))).limit(n)
