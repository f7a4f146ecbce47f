"""Profile: what each entity really does, per second and per minute, per broker (quotas are
per broker): rates, percentiles, peaks, top talkers and the share of request time; what each
quota budget recorded per second, and the load its clients offered (for ``tune``: its
demand); and what the proxy recorded of its throttles."""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window, WindowSpec

from kafka_quota_proxy.spark_jobs import bounds
from kafka_quota_proxy.spark_jobs.tune import (
    DEMAND_COLUMNS,
    KEYS,
    SEGMENT_COLUMNS,
    THROTTLES,
    offered_load,
)

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
    bytes of the requests: a fetch's response, else the request). What ``entity_profile`` and
    ``budget_seconds`` are made of (cache it to share)."""
    return _per_interval(captures, [F.xxhash64("user", "client_id").alias("entity")], 1,
                         recorded=True)


def cached_entity_seconds(captures: DataFrame) -> DataFrame:
    """``entity_seconds``, cached, planned without partial aggregation: nearly every (entity,
    broker, second) holds one request or two (the bench's 10 M requests make 4.8 M), so
    summing each task's rows before the shuffle only builds a hash map as large as its input
    (without it: 6.7 against 7.8 s on the bench's capture). The plan is made when the frame is
    cached, so the setting is the session's for that moment only."""
    spark = captures.sparkSession
    key = "spark.sql.execution.bypassPartialAggregation"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "true")
    try:
        return entity_seconds(captures).cache()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def entity_profile(captures: DataFrame, names: DataFrame | None = None,
                   sec: DataFrame | None = None, span: int = 13) -> DataFrame:
    """Per (user, client-id): totals, per-second rate percentiles and peaks (over the seconds
    it was active, on any one broker), per-minute peaks, and its share of request time.
    One pass over the capture: minutes and totals are sums of the seconds.

    ``names``: ``replay.Catalog.entity_frame`` (entity, user, client_id): the aggregations
    then key on the entity's hash, cheaper than on two strings, and the names join back at
    the end; ``sec``: ``entity_seconds(captures)``, when the caller has it (with ``names``).
    With ``names``, also ``produce_peak``, ``fetch_peak`` (``bounds.peaks`` over ``span``
    seconds) and ``moved``, for the replay (``bounds.hot_entities``)."""
    if names is None:
        keys = ["user", "client_id"]
        sec = per_interval(captures, 1).cache()
    else:
        if sec is None:
            sec = entity_seconds(captures)
        profile = sec.select("entity", "broker", "interval", "requests", *RATES,
                             "fetch_bound", "moved").groupBy(
            F.pmod(F.col("entity"), F.lit(PROFILE_GROUPS)).alias("group")).applyInPandas(
            lambda pdf: per_second_profile(pdf, span), PROFILE)
        profile = profile.withColumn(
            "request_time_share", F.col("busy") / F.sum("busy").over(_everything())
        ).drop("busy")
        return (profile.join(F.broadcast(names), "entity")
                .select("user", "client_id", *[c for c in profile.columns if c != "entity"]))
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
PROFILE_GROUPS = 32  # groups of entities the per-second profile is computed in
PROFILE = ", ".join([
    "entity long", "requests long", "produce_bytes double", "fetch_bytes double",
    *[f"{name}_max double" for name in RATES],
    *[f"{name}_p{int(q * 100)} double" for name in RATES for q in PERCENTILES],
    "produce_rate_minute_max double", "fetch_rate_minute_max double", "busy double",
    "produce_peak double", "fetch_peak double", "moved long"])
FOR_THE_REPLAY = ["produce_peak", "fetch_peak", "moved"]  # (not the profile's own figures)


def per_second_profile(pdf: pd.DataFrame, span: int = 13) -> pd.DataFrame:
    """``entity_profile``'s per-entity figures from its per-second rows (``entity_seconds``:
    entity, broker, interval, requests and ``RATES``) of whole entities: in pandas, in the
    Python workers, where Spark's partial aggregates cost more to build and merge. The
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


def demand_requests(captures: DataFrame, types: list[str]) -> DataFrame:
    """``tune.demand_requests`` in Spark: per request, one row per quota type of ``types`` it
    records into, with ``seq``, ``read_ms``, ``resp_ms``, ``at_ms``, ``value`` and
    ``held_ms``, and its client as numbers (cheaper to move and sort than its names):
    ``kind`` (the quota type's index in ``QUOTA_TYPES``), ``run_id`` and ``entity`` (the
    hashes of ``replay.catalog_of``), ``broker`` and ``connection``. Produce and fetch rows
    come from one pass over the capture (a request is one or the other); request rows, when
    asked for, from another."""
    read = F.col("ts_ms").cast("double")
    resp = read + F.greatest(F.col("duration_us").cast("double"), F.lit(0.0)) / 1000.0
    answered = ~F.col("follower") & (F.col("response_bytes") >= 0)
    produce = F.col("api_key") == 0
    fetch = (F.col("api_key") == 1) & answered
    wanted = set(types or ["produce"])
    client: list[Column | str] = [
        F.xxhash64("run").alias("run_id"), "broker", "connection",
        F.xxhash64("user", "client_id").alias("entity"), "seq", read.alias("read_ms"),
              resp.alias("resp_ms"),
              F.greatest(*[F.col(c) for c in THROTTLES]).cast("double").alias("held_ms")]
    parts = []
    if wanted & {"produce", "fetch"}:
        kinds = [QUOTA_TYPES.index(t) for t in ("produce", "fetch") if t in wanted]
        parts.append(captures.select(
            F.when(produce, F.lit(0)).when(fetch, F.lit(1)).alias("kind"),
            F.when(produce, F.col("request_bytes") - 4.0).otherwise(
                F.col("response_bytes") - 4.0).cast("double").alias("value"),
            F.when(produce, read).otherwise(resp).alias("at_ms"), *client)
            .where(F.col("kind").isin(*kinds)))
    if "request" in wanted:
        elapsed = F.when(F.col("request_time_ms") > 0, F.col("request_time_ms")).otherwise(
            F.col("duration_us") / 1000.0)
        parts.append(captures.where(answered).select(
            F.lit(2).alias("kind"), (elapsed / 10.0).cast("double").alias("value"),
            read.alias("at_ms"), *client))
    out: DataFrame = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


CLIENT_GROUPS = 8  # groups of connections per (run, broker): work for every core
SEGMENTS = ("kind int, run_id long, broker int, connection long, entity long, segment long, "
            "first_ms double, last_ms double, requests long, bytes double, "
            "free_requests long, free_bytes double, rate double, free_rate double, "
            "offered double")


def offered_segments(requests: DataFrame, runs: DataFrame, entities: DataFrame,
                     idle_ms: float = 11_000.0, min_ms: float = 1000.0) -> DataFrame:
    """``tune.offered_load`` over Spark, from ``demand_requests``: per client segment, the
    offered load (``offered``), its free and overall rates, and its first and last request;
    ``runs`` and ``entities``: ``replay.Catalog.run_frame`` and ``entity_frame``, which give
    the numbers their names back. One shuffle of the requests (numbers only) into groups of
    whole clients (per run, broker and group of connections), each estimated by
    ``tune.offered_load`` itself in the Python workers, so the two cannot differ."""

    # Packed for the trip to the Python workers (as the replay's columns are:
    # ``replay.packed``): one exact key per group, run (its index among the capture's runs)
    # << 40 | broker (32 bits) << 4 | group of connections; the hold and the quota type in
    # one number; ``at_ms`` is ``read_ms``, or ``resp_ms`` for a fetch.
    order = sorted(int(r[0]) for r in runs.select("run_id").collect())
    index = F.create_map(*[F.lit(x) for i, run_id in enumerate(order) for x in (run_id, i)])
    key = (index[F.col("run_id")].cast("long") * (1 << 40)
           + F.col("broker").cast("long").bitwiseAND(0xFFFFFFFF) * 16
           + F.pmod(F.col("connection"), F.lit(CLIENT_GROUPS)))
    flags = F.col("held_ms").cast("long") * 4 + F.col("kind")
    run_ids = np.asarray(order, dtype=np.int64)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        k = pdf["key"].to_numpy()
        f = pdf["flags"].to_numpy()
        kind = f & 3
        read, resp = pdf["read_ms"].to_numpy(), pdf["resp_ms"].to_numpy()
        # the client's names as numbers: tune groups by them and moves them through
        rows = pd.DataFrame({
            "quota_type": kind.astype(np.int32), "value": pdf["value"].to_numpy(),
            "at_ms": np.where(kind == 1, resp, read),
            "run": run_ids[k >> 40] if len(k) else np.zeros(0, dtype=np.int64),
            "broker": ((k >> 4) & 0xFFFFFFFF).astype(np.uint32).view(np.int32),
            "connection": pdf["connection"].to_numpy(), "user": pdf["entity"].to_numpy(),
            "seq": pdf["seq"].to_numpy(), "read_ms": read, "resp_ms": resp,
            "held_ms": (f >> 2).astype(np.float64), "client_id": 0})
        out = offered_load(rows, idle_ms, min_ms)
        return out.drop(columns="client_id").rename(
            columns={"quota_type": "kind", "run": "run_id", "user": "entity"})

    out = (requests.select(key.alias("key"), "connection", "entity", "seq", "read_ms",
                           "resp_ms", "value", flags.alias("flags"))
           .groupBy("key").applyInPandas(per_group, SEGMENTS))
    kinds = F.array(*[F.lit(t) for t in QUOTA_TYPES])
    return (out.withColumn("quota_type", kinds[F.col("kind")])
            .join(F.broadcast(runs), "run_id").join(F.broadcast(entities), "entity")
            .select(*SEGMENT_COLUMNS))


def budget_demand(seconds: DataFrame, budgets: pd.DataFrame, start_s: int, end_s: int,
                  percentile: float, span_seconds: int = 60) -> pd.DataFrame:
    """``tune.budget_demand`` in Spark, from per-second values (``budget_seconds``): per
    budget (``budgets``: the ``budget`` numbers of ``tune.budget_mapping`` with their
    ``KEYS``), its demand (the exact ``percentile`` of its per-second values over the seconds
    with a value in the whole minutes [start_s, end_s), on its busiest broker), its peak
    second, the whole minutes and seconds with a value, and its total over the whole minutes.
    (Tuning takes the offered load instead: ``offered_segments``.)"""
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
    and the bytes moved (a fetch's response, any other request). ``names``: as in
    ``entity_profile``."""
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
