"""Profile: what each entity really does, per second and per minute, per broker (quotas are
per broker): rates, percentiles, peaks, top talkers and the share of request time
(``per_second_profile``, run by ``entity_pass``); what each quota budget recorded per second;
and what the proxy recorded of its throttles."""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window, WindowSpec

from kafka_quota_proxy.spark_jobs import bounds
from kafka_quota_proxy.spark_jobs.tune import DEMAND_COLUMNS, KEYS

PERCENTILES = [0.5, 0.95, 0.99]


def per_interval(captures: DataFrame, seconds: int = 1) -> DataFrame:
    """Bytes and request time per (user, client-id, broker, interval): produce bytes are
    request sizes, fetch bytes consumer response sizes (as the quotas count them)."""
    return _per_interval(captures, [F.col("user"), F.col("client_id")], seconds)


def _per_interval(captures: DataFrame, keys: list[Column], seconds: int,
                  recorded: bool = False) -> DataFrame:
    produce = F.when(F.col("api_key") == 0, F.col("request_bytes") - 4).otherwise(0)
    fetch = F.when((F.col("api_key") == 1) & ~F.col("follower"),
                   F.col("response_bytes") - 4).otherwise(0)
    busy = F.when(F.col("duration_us") > 0, F.col("duration_us")).otherwise(0) / 1000.0
    aggs = [
        F.count("*").alias("requests"),
        (F.sum(produce) / seconds).alias("produce_rate"),
        (F.sum(fetch) / seconds).alias("fetch_rate"),
        (F.sum(busy) / (10.0 * seconds)).alias("request_percentage"),  # % of one thread
    ]
    if recorded:
        # What the request quota records (quota.recording): the exact request time where
        # recorded, else the duration; not for replica fetches or requests with no response.
        elapsed = F.when(F.col("request_time_ms") > 0, F.col("request_time_ms")).otherwise(
            F.col("duration_us") / 1000.0)
        recorded_time = F.when(~F.col("follower") & (F.col("response_bytes") >= 0),
                               elapsed).otherwise(0.0)
        aggs.append((F.sum(recorded_time) / (10.0 * seconds)).alias("request_recorded"))
        # for the replay's bounds (``bounds``: fetch bytes at no less than 0) and its counts
        # of the requests it leaves out (the bytes each moved: a fetch's response, else the
        # request)
        aggs.append(F.sum(F.when((F.col("api_key") == 1) & ~F.col("follower"), F.greatest(
            F.col("response_bytes") - 4, F.lit(0))).otherwise(0)).alias("fetch_bound"))
        aggs.append(F.sum(F.when(F.col("api_key") == 1, F.col("response_bytes")).otherwise(
            F.col("request_bytes")).cast("long")).alias("moved"))
    return captures.groupBy(
        *keys, "broker", (F.col("ts_ms") / (1000 * seconds)).cast("long").alias("interval"),
    ).agg(*aggs)


def entity_seconds(captures: DataFrame) -> DataFrame:
    """``per_interval`` per second, keyed on the (user, client-id) hash (``entity``), with
    ``request_recorded``: the request time the request quota records, as a percentage of one
    thread; ``fetch_bound`` (consumer fetch bytes, each at no less than 0) and ``moved`` (the
    bytes of the requests: a fetch's response, else the request). What ``budget_seconds`` is
    made of (``entity_pass.per_second_rows`` is the same in pandas)."""
    return _per_interval(captures, [F.xxhash64("user", "client_id").alias("entity")], 1,
                         recorded=True)


def entity_profile(captures: DataFrame) -> DataFrame:
    """Per (user, client-id): totals, per-second rate percentiles and peaks (over the seconds
    it was active, on any one broker), per-minute peaks, and its share of request time, in
    Spark's own terms (its percentiles ``percentile_approx``'s). The jobs compute the same
    figures in one pass with the rest (``entity_pass``, exact percentiles), held to this in
    the tests."""
    sec = per_interval(captures, 1).cache()
    keys = ["user", "client_id"]
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
    return (per_second.join(minute, keys)
            .withColumn("request_time_share", F.col("busy") / all_busy)
            .drop("busy"))


RATES = ("produce_rate", "fetch_rate", "request_percentage")
PROFILE = ", ".join([
    "entity long", "requests long", "produce_bytes double", "fetch_bytes double",
    *[f"{name}_max double" for name in RATES],
    *[f"{name}_p{int(q * 100)} double" for name in RATES for q in PERCENTILES],
    "produce_rate_minute_max double", "fetch_rate_minute_max double", "busy double",
    "produce_peak double", "fetch_peak double", "moved long"])
FOR_THE_REPLAY = ["produce_peak", "fetch_peak", "moved"]  # (not the profile's own figures)


def per_second_profile(pdf: pd.DataFrame, span: int = 13) -> pd.DataFrame:
    """``entity_profile``'s per-entity figures from its per-second rows
    (``entity_pass.per_second_rows``: entity, broker, interval, requests and ``RATES``) of
    whole entities: in pandas, in the Python workers (``entity_pass``). The
    percentiles are exact: of the ``n`` per-second values in order, the one at rank
    ``ceil(q x n)``, what ``percentile_approx`` gives with its error at zero, so a profile
    does not depend on how the rows were split. With ``fetch_bound`` and ``moved`` (of
    ``entity_seconds``), also ``FOR_THE_REPLAY``: the entity's produce and fetch peaks over
    ``span`` seconds (``bounds.peaks``) and its requests' bytes."""
    if pdf.empty:
        return pd.DataFrame(columns=[c.split()[0] for c in PROFILE.split(", ")])
    codes, entities = pd.factorize(pdf["entity"], sort=True)
    n = np.bincount(codes)
    starts = np.r_[0, np.cumsum(n)[:-1]]
    out: dict[str, object] = {"entity": entities.to_numpy()}
    out["requests"] = np.bincount(codes, pdf["requests"].to_numpy()).astype(np.int64)
    for name, total in (("produce_rate", "produce_bytes"), ("fetch_rate", "fetch_bytes")):
        out[total] = pd.Series(pdf[name].to_numpy()).groupby(codes).sum().to_numpy()
    for name in RATES:
        out[f"{name}_max"] = pd.Series(pdf[name].to_numpy()).groupby(codes).max().to_numpy()
    for name in RATES:
        values = pdf[name].to_numpy()
        ordered = values[np.lexsort((values, codes))]
        for q in PERCENTILES:
            rank = np.maximum(np.ceil(q * n).astype(np.int64), 1)
            out[f"{name}_p{int(q * 100)}"] = ordered[starts + np.minimum(rank, n) - 1]
    minute = pd.DataFrame({"code": codes, "broker": pdf["broker"].to_numpy(),
                           "minute": pdf["interval"].to_numpy() // 60,
                           "produce_rate": pdf["produce_rate"].to_numpy(),
                           "fetch_rate": pdf["fetch_rate"].to_numpy()})
    per_minute = minute.groupby(["code", "broker", "minute"], sort=False)[
        ["produce_rate", "fetch_rate"]].sum() / 60
    peaks = per_minute.groupby(level="code").max().reindex(range(len(n)))
    out["produce_rate_minute_max"] = peaks["produce_rate"].to_numpy()
    out["fetch_rate_minute_max"] = peaks["fetch_rate"].to_numpy()
    out["busy"] = pd.Series(pdf["request_percentage"].to_numpy()).groupby(codes).sum().to_numpy()
    if "fetch_bound" in pdf:
        broker, second = pdf["broker"].to_numpy(), pdf["interval"].to_numpy()
        for name, column in (("produce_peak", "produce_rate"), ("fetch_peak", "fetch_bound")):
            out[name] = bounds.peaks(codes, broker, second,
                                     pdf[column].to_numpy(dtype=np.float64), span, len(n))
        out["moved"] = pd.Series(pdf["moved"].to_numpy()).groupby(codes).sum().to_numpy()
    return pd.DataFrame(out)


def _everything() -> WindowSpec:
    return Window.partitionBy()


def budget_seconds(sec: DataFrame, mapping: pd.DataFrame, names: DataFrame) -> DataFrame:
    """Per (budget, broker, second): what the budget recorded, by the recording rule
    (``quota.recording``): produce bytes (``request_bytes - 4``), consumer fetch bytes
    (``response_bytes - 4``), or request time as a percentage of one thread. ``sec``:
    ``entity_seconds``; ``mapping``: ``tune.budget_mapping``, the budget of each (user,
    client-id) per quota type; ``names``: ``replay.Catalog.entity_frame``. Seconds without
    traffic have no row."""
    columns = {"produce": "produce_rate", "fetch": "fetch_rate", "request": "request_recorded"}
    types = sorted(set(mapping["quota_type"])) or ["produce"]
    pairs = ", ".join(f"'{t}', double(`{columns[t]}`)" for t in types)
    long = sec.select(F.col("entity"), "broker", F.col("interval").alias("second"),
                      F.expr(f"stack({len(types)}, {pairs}) as (quota_type, value)"))
    ids = (sec.sparkSession.createDataFrame(
        mapping[["user", "client_id", "quota_type", "budget"]],
        "user string, client_id string, quota_type string, budget int")
        .join(names, ["user", "client_id"]).select("entity", "quota_type", "budget"))
    per_budget = (long.where(F.col("value") > 0).join(F.broadcast(ids), ["entity", "quota_type"])
                  .select("budget", "broker", "second", "value"))
    if not mapping.duplicated(["budget"]).any():  # no budget is shared: summed already
        return per_budget
    return per_budget.groupBy("budget", "broker", "second").agg(F.sum("value").alias("value"))


QUOTA_TYPES = ["produce", "fetch", "request"]  # (``kind``: the index, what Spark moves)


def budget_demand(seconds: DataFrame, budgets: pd.DataFrame, start_s: int, end_s: int,
                  percentile: float, span_seconds: int = 60) -> pd.DataFrame:
    """``tune.budget_demand`` in Spark, from per-second values (``budget_seconds``): per
    budget (``budgets``: the ``budget`` numbers of ``tune.budget_mapping`` with their
    ``KEYS``), its demand (the exact ``percentile`` of its per-second values over the seconds
    with a value in the whole minutes [start_s, end_s), on its busiest broker), its peak
    second, the whole minutes and seconds with a value, and its total over the whole minutes.
    (Tuning takes the offered load instead: ``entity_pass``.)"""
    whole = seconds.where((F.col("second") >= start_s) & (F.col("second") < end_s))
    per_broker = _pandas(whole.groupBy("budget", "broker").agg(
        F.percentile("value", percentile).alias("demand")))
    per_budget = _pandas(whole.groupBy("budget").agg(
        (F.countDistinct((F.col("second") / span_seconds).cast("long")) * span_seconds / 60.0
         ).alias("minutes"),
        F.countDistinct("second").alias("seconds"), F.sum("value").alias("total")))
    peaks = _pandas(seconds.groupBy("budget").agg(F.max("value").alias("peak")))
    busiest = (per_broker.sort_values(["demand", "broker"], ascending=[False, True])
               .drop_duplicates("budget"))
    names = budgets[["budget", *KEYS]].drop_duplicates("budget")
    out = (names.merge(peaks, on="budget").merge(busiest, on="budget", how="left")
           .merge(per_budget, on="budget", how="left"))
    out["broker"] = out["broker"].fillna(-1)
    out[["demand", "minutes", "seconds", "total"]] = out[
        ["demand", "minutes", "seconds", "total"]].fillna(0)
    return out[list(DEMAND_COLUMNS)].astype(
        {"broker": "int32", "minutes": "float64", "seconds": "int32", "demand": "float64",
         "total": "float64", "peak": "float64"}).reset_index(drop=True)


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def recorded_throttles(captures: DataFrame, names: DataFrame | None = None,
                       bucket_ms: int = 100) -> DataFrame:
    """What the proxy recorded of the requests it held back, per (user, client-id, throttle
    bucket): requests, time held back (the largest of the three throttles, as the client was)
    and the bytes moved (a fetch's response, any other request). ``names``:
    ``replay.Catalog.entity_frame``, to key on the entity's hash and join the names back."""
    held = F.greatest("throttle_produce_ms", "throttle_fetch_ms", "throttle_request_ms")
    moved = F.when(F.col("api_key") == 1, F.col("response_bytes")).otherwise(
        F.col("request_bytes"))
    bucket = (held / bucket_ms).cast("long") * bucket_ms
    keys = ([F.col("user"), F.col("client_id")] if names is None
            else [F.xxhash64("user", "client_id").alias("entity")])
    out = captures.where(held > 0).groupBy(*keys, bucket.cast("int").alias("bucket_ms")).agg(
        F.count("*").alias("requests"), F.sum(held).cast("long").alias("throttle_ms"),
        F.sum(moved).cast("long").alias("moved"))
    if names is None:
        return out
    return (out.join(F.broadcast(names), "entity")
            .select("user", "client_id", "bucket_ms", "requests", "throttle_ms", "moved"))
