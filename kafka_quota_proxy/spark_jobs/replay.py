"""Replay: every captured request through the quota engine (``quota.replay``), per run and
broker (the proxy keeps one quota manager per upstream broker), under the config that was live
(reproduction) or a candidate; then per-entity totals and the match rate.

Each (run, broker) is split further into buckets of users or client-ids that share no quota
budget under the configs replayed, so the work spreads over every core evenly.

A capture written by several processes whose runs overlap in time (``process_spans``,
``overlapping``) is also replayed through one quota engine per broker, a single enforcement
point, on one clock (``single_point``): per budget, the rate each process let through
together, against its quota, and what one engine would have done."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, cast

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F

from kafka_quota_proxy.quota.entities import QuotaType, metric_tags, quota_limit
from kafka_quota_proxy.quota.manager import QuotaSettings, percent_of_thread
from kafka_quota_proxy.quota.replay import (
    StorageSettings,
    expiry_times,
    independent_by,
    let_through,
    replay_rows,
    settings_from_section,
)
from kafka_quota_proxy.spark_jobs import bounds
from kafka_quota_proxy.spark_jobs import engine as by_budget
from kafka_quota_proxy.spark_jobs.held import held_seconds

# What crosses to the Python workers: numbers only. Strings cost more to move than the engine
# costs to run, so run and (user, client-id) travel as 64-bit hashes and come back through a
# ``Catalog`` of the capture's few distinct names (``_input``).


BUCKETS = 16  # replay groups per (run, broker), where budgets allow: work for every core


def _input(configs: list[QuotaSettings], storage: bool) -> list[Column]:
    """The replay's input columns; ``bucket`` splits each (run, broker) into groups that share
    no quota budget (``quota.replay.independent_by``), so they replay apart, in parallel."""
    column = independent_by(configs, storage)
    bucket = F.pmod(F.xxhash64(column), F.lit(BUCKETS)) if column else F.lit(0)
    return [bucket.cast("int").alias("bucket"), F.xxhash64("run").alias("run_id"),
            F.col("broker"), F.col("seq"), F.col("quota_ms"),
            F.xxhash64("user", "client_id").alias("entity"), F.col("api_key"),
            F.col("request_bytes"), F.col("response_bytes"), F.col("request_time_ms"),
            F.col("follower"), F.col("quota_generation"),
            F.col("throttle_produce_ms"), F.col("throttle_fetch_ms"),
            F.col("throttle_request_ms"),
            F.coalesce(F.col("storage_scale"), F.lit(-1.0)).alias("storage_scale")]


# Narrow on purpose: this is what crosses from the Python workers back to the JVM.
SCHEMA = ("run_id long, broker int, seq long, entity long, moved long, "
          "produce_ms int, fetch_ms int, request_ms int, throttle_ms int, "
          "recorded_throttle_ms int, matched boolean")


@dataclass(frozen=True)
class Names:
    """The capture's runs and (user, client-id) pairs by the hashes the replay moves them as
    (``_input``). Small: it travels to the Python workers with the replay function."""

    runs: dict[int, str]
    entities: dict[int, tuple[str, str]]


@dataclass(frozen=True)
class Catalog:
    """``Names``, and the same as small DataFrames to join the names back."""

    names: Names
    run_frame: DataFrame  # run_id, run
    entity_frame: DataFrame  # entity, user, client_id


def catalog_of(captures: DataFrame, names: pd.DataFrame | None = None) -> Catalog:
    """The names the replays move as numbers: from ``names`` (``names_of``: the capture's
    names collected with their hashes), else from a pass over the capture's name columns (a
    few distinct values among many rows)."""
    if names is None:
        names = (captures.select("run", "user", "client_id").distinct()
                 .select(F.xxhash64("run").alias("run_id"), "run",
                         F.xxhash64("user", "client_id").alias("entity"), "user", "client_id")
                 .toPandas())
    runs: dict[int, str] = {}
    entities: dict[int, tuple[str, str]] = {}
    for run_id, run, entity, user, client_id in names[
            ["run_id", "run", "entity", "user", "client_id"]].itertuples(index=False):
        if runs.setdefault(int(run_id), run) != run:
            raise ValueError(f"runs {runs[int(run_id)]!r} and {run!r} share a hash")
        pair = (user, client_id)
        if entities.setdefault(int(entity), pair) != pair:
            raise ValueError(f"entities {entities[int(entity)]} and {pair} share a hash")
    spark = captures.sparkSession
    run_frame = spark.createDataFrame(list(runs.items()), "run_id long, run string")
    entity_frame = spark.createDataFrame([(k, u, c) for k, (u, c) in entities.items()],
                                         "entity long, user string, client_id string")
    return Catalog(Names(runs, entities), run_frame, entity_frame)


def _run_engine(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                live: Mapping[tuple[str, int], QuotaSettings],
                catalog: Names, storage: Mapping[str, StorageSettings],
                ) -> tuple[pd.DataFrame, ...]:
    """Sort one (run, broker) group as the proxy recorded it and replay it: the sorted
    group, and the produce, fetch and request throttles.

    Only the requests of budgets that may throttle go through the engine (``_may_throttle``):
    the others get 0, what the engine gives them, and the engine still runs its idle-sensor
    expiry when a replay of every request would (``quota.replay.expiry_times``)."""
    # (a stable sort by quota_ms, then seq: numpy's, without pandas' factorizing the keys)
    pdf = pdf.iloc[np.lexsort((pdf["seq"].to_numpy(), pdf["quota_ms"].to_numpy()))]
    run = catalog.runs[int(pdf["run_id"].iloc[0])]

    def settings_of(generation: int) -> QuotaSettings:
        found = live.get((run, generation))
        if found is None:
            raise KeyError(f"no quotas-{run}-{generation:05d}.json in the capture")
        return found

    codes, uniques = pd.factorize(pdf["entity"])
    names = [catalog.entities[int(e)] for e in uniques]
    times = pdf["quota_ms"].to_numpy()
    n = len(pdf)
    one = _one_config(pdf, candidate, settings_of)
    engine = (None if one is None else _may_throttle(pdf, codes, names, one))
    if engine is None:  # every request
        at: Any = slice(None)
        expire_at = None
    else:
        at = np.flatnonzero(engine)
        expire_at = expiry_times(times.tolist())
    users = [names[c][0] for c in codes[at]]
    client_ids = [names[c][1] for c in codes[at]]
    columns = [pdf[c].to_numpy()[at].tolist() for c in (
        "api_key", "request_bytes", "response_bytes")]
    produce = np.zeros(n, dtype=np.int32)
    fetch = np.zeros(n, dtype=np.int32)
    request = np.zeros(n, dtype=np.int32)
    m = len(users)
    if m and one is not None and by_budget.applies(one):  # budget by budget (``engine``)
        api_key, request_bytes, response_bytes, request_time_ms = [
            pdf[c].to_numpy()[at] for c in (
                "api_key", "request_bytes", "response_bytes", "request_time_ms")]
        each = by_budget.throttles(
            times[at], codes[at], names, api_key, request_bytes, response_bytes,
            request_time_ms, pdf["follower"].to_numpy(dtype=bool)[at], one)
        for out, part in zip((produce, fetch, request), each, strict=True):
            out[at] = part
    elif m:
        got = replay_rows(
            zip(times[at].tolist(), users, client_ids, *columns, repeat(0, m),
                *[pdf[c].to_numpy()[at].tolist() for c in (
                    "request_time_ms", "follower", "quota_generation", "storage_scale")],
                strict=True),
            candidate if candidate is not None else settings_of, storage=storage.get(run),
            expire_at=expire_at)
        for out, values in zip((produce, fetch, request), got, strict=True):
            out[at] = values
    return pdf, produce, fetch, request


def _one_config(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                settings_of: Callable[[int], QuotaSettings]) -> QuotaSettings | None:
    """The config every request of the group is replayed under, when there is one (a
    candidate, or the same config live in every generation of the group) and no storage
    factor is in force: then which budgets can throttle is known before the replay."""
    scale = pdf["storage_scale"].to_numpy(dtype=float)
    if (scale >= 0).any():
        return None
    if candidate is not None:
        return candidate
    configs = [settings_of(int(g)) for g in pdf["quota_generation"].unique()]
    return configs[0] if all(c == configs[0] for c in configs[1:]) else None


def _may_throttle(pdf: pd.DataFrame, codes: np.ndarray, names: list[tuple[str, str]],
                  settings: QuotaSettings) -> np.ndarray | None:
    """Per request of one group (sorted as recorded) under one config: whether a budget it
    records into may throttle. A budget cannot when, at each of its requests, everything it
    recorded over the ``samples + 1`` windows before (the most its samples can hold) over
    ``samples - 1`` windows (the shortest span its rate is measured over) is within its
    quota: the engine gives every request of it 0. None: not known (one sample)."""
    if settings.samples < 2:
        return None
    horizon = (settings.samples + 1) * settings.window_ms
    per_second = 1000.0 / ((settings.samples - 1) * settings.window_ms)
    times = pdf["quota_ms"].to_numpy().astype(np.int64)
    span = int(times[-1] - times[0]) if len(times) else 0
    if span + horizon >= 1 << 40:
        return None
    api_key = pdf["api_key"].to_numpy()
    follower = pdf["follower"].to_numpy(dtype=bool)
    request = pdf["request_bytes"].to_numpy().astype(np.float64)
    response = pdf["response_bytes"].to_numpy().astype(np.float64)
    model = settings.request_time
    recorded = pdf["request_time_ms"].to_numpy(dtype=np.float64)
    # what each quota type records of each request (``quota.recording``); the request
    # quota's percentage of a thread from above (it rounds the time to whole nanoseconds)
    elapsed = np.where(recorded > 0, recorded, (model.base_us + model.per_kib_us * (
        request + np.maximum(response, 0.0)) / 1024.0) / 1000.0)
    recorded_values = {
        QuotaType.PRODUCE: request - 4.0,
        QuotaType.FETCH: response - 4.0,
        QuotaType.REQUEST: elapsed * 0.1 * (1 + 1e-9) + 1e-7,
    }
    engine = np.zeros(len(pdf), dtype=bool)
    for qt, values in recorded_values.items():
        quotas = settings.for_type(qt)
        mask = by_budget.records(qt, api_key, follower, response)
        if not quotas or not mask.any():
            continue
        rows, budget, starts, limits = by_budget.budget_runs(quotas, qt, names, codes, mask)
        if not len(rows):
            continue
        key = budget.astype(np.int64) * (1 << 40) + (times[rows] - times[0])
        total = np.cumsum(np.maximum(values[rows], 0.0))
        first = np.searchsorted(key, key - horizon, side="right")
        window = total - np.where(first > 0, total[np.maximum(first - 1, 0)], 0.0)
        peak = np.maximum.reduceat(window, starts) * per_second
        may = ~(peak <= limits * (1 - 1e-9))
        engine[rows[np.repeat(may, np.diff(np.r_[starts, len(rows)]))]] = True
    return engine


def _per_request(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                 live: Mapping[tuple[str, int], QuotaSettings],
                 catalog: Names, storage: Mapping[str, StorageSettings]) -> pd.DataFrame:
    pdf, p, f, q = _run_engine(pdf, candidate, live, catalog, storage)
    rp = pdf["throttle_produce_ms"].to_numpy()
    rf = pdf["throttle_fetch_ms"].to_numpy()
    rq = pdf["throttle_request_ms"].to_numpy()
    is_fetch = pdf["api_key"].to_numpy() == 1
    return pd.DataFrame({
        "run_id": pdf["run_id"], "broker": pdf["broker"], "seq": pdf["seq"],
        "entity": pdf["entity"],
        # the bytes the quota counts: a fetch's response, anything else's request
        "moved": np.where(is_fetch, pdf["response_bytes"].to_numpy(),
                          pdf["request_bytes"].to_numpy()).astype(np.int64),
        "produce_ms": p, "fetch_ms": f, "request_ms": q,
        "throttle_ms": np.maximum(np.maximum(p, f), q),
        "recorded_throttle_ms": np.maximum(np.maximum(rp, rf), rq).astype(np.int32),
        "matched": (p == rp) & (f == rf) & (q == rq),
    })


SUMMARY = ("entity long, bucket_ms int, requests long, throttle_ms long, "
           "moved long, recorded_throttled_requests long, recorded_throttle_ms long, "
           "matched long, held_seconds long, recorded_held_seconds long")


def _summary(pdf: pd.DataFrame, candidate: QuotaSettings | None,
             live: Mapping[tuple[str, int], QuotaSettings], catalog: Names,
             storage: Mapping[str, StorageSettings], bucket_ms: int) -> pd.DataFrame:
    """The per-request replay of one group, summed per (user, client-id, throttle bucket):
    what crosses back to the JVM is small, whatever the capture's size."""
    r = _per_request(pdf, candidate, live, catalog, storage)
    throttle = r["throttle_ms"].to_numpy()
    r["bucket_ms"] = np.where(throttle > 0, (throttle // bucket_ms) * bucket_ms, -1)
    r["recorded_throttled"] = r["recorded_throttle_ms"] > 0
    out = r.groupby(["entity", "bucket_ms"], sort=False).agg(
        requests=("seq", "size"), throttle_ms=("throttle_ms", "sum"),
        moved=("moved", "sum"), recorded_throttled_requests=("recorded_throttled", "sum"),
        recorded_throttle_ms=("recorded_throttle_ms", "sum"), matched=("matched", "sum"),
    ).reset_index()
    # Throttled client-seconds, replayed and recorded (``held``), on each entity's first row.
    first = ~out["entity"].duplicated()
    entity = r["entity"].to_numpy()
    quota_ms = pdf["quota_ms"].reindex(r.index).to_numpy()  # (r: pdf's rows, sorted)
    for column, held in (("held_seconds", throttle),
                         ("recorded_held_seconds", r["recorded_throttle_ms"].to_numpy())):
        counts = held_seconds(entity, quota_ms, held)
        out[column] = np.where(first, out["entity"].map(counts).fillna(0), 0).astype(np.int64)
    return out


def _settings(candidate: Mapping[str, Any] | None,
              live: Mapping[tuple[str, int], Mapping[str, Any]] | None,
              ) -> tuple[QuotaSettings | None, dict[tuple[str, int], QuotaSettings]]:
    cand = settings_from_section(candidate) if candidate is not None else None
    live_settings = {k: settings_from_section(v) for k, v in (live or {}).items()}
    if cand is None and not live_settings:
        raise ValueError("neither a candidate config nor the capture's live configs")
    return cand, live_settings


def _grouped(captures: DataFrame, cand: QuotaSettings | None,
             live: dict[tuple[str, int], QuotaSettings], storage: bool,
             names: Names, hot: pd.DataFrame | None = None) -> GroupedData:
    """The capture in replay groups: per run, broker (the proxy keeps one quota manager per
    upstream broker) and bucket, the columns the engine needs, packed (``packed``).
    ``hot``: ``bounds.hot_entities``: only the requests ``_sent`` keeps."""
    configs = [cand] if cand is not None else list(live.values())
    if "storage_scale" not in captures.columns:  # capture schema v1
        captures = captures.withColumn("storage_scale", F.lit(None).cast("double"))
    if hot is not None:
        captures = _sent(captures, hot)
    return captures.select(*packed(configs, storage, names)).groupBy("key")


def _sent(captures: DataFrame, hot: pd.DataFrame) -> DataFrame:
    """The requests a replay under the config ``hot`` was found for must send the engine:
    those that record into a budget that may throttle, those the proxy recorded throttled
    (their recorded client-seconds are counted in the Python workers) and those under a
    storage factor."""
    table = captures.sparkSession.createDataFrame(
        hot[["entity", "hot"]] if len(hot) else pd.DataFrame({"entity": [0], "hot": [0]}),
        "entity long, hot int")
    bits = F.coalesce(F.col("_hot"), F.lit(0))

    def on(bit: int) -> Column:
        return bits.bitwiseAND(F.lit(bit)) != 0

    follower = F.col("follower")
    keep = ((F.col("throttle_produce_ms") > 0) | (F.col("throttle_fetch_ms") > 0)
            | (F.col("throttle_request_ms") > 0) | (F.col("storage_scale") >= 0)
            | ((F.col("api_key") == 0) & on(bounds.PRODUCE))
            | ((F.col("api_key") == 1) & ~follower & on(bounds.FETCH))
            | (~follower & (F.col("response_bytes") >= 0) & on(bounds.REQUEST)))
    return (captures.withColumn("_entity", F.xxhash64("user", "client_id"))
            .join(F.broadcast(table.withColumnsRenamed({"entity": "_entity", "hot": "_hot"})),
                  "_entity", "left")
            .where(keep).drop("_entity", "_hot"))


def _with_rest(sent: DataFrame, totals: pd.DataFrame) -> DataFrame:
    """``sent``, the summary of the requests the Python workers were sent (cached), with one
    row per entity (bucket -1: not throttled) for those left out of it: their number and bytes
    are the entity's in ``totals`` (entity, requests, moved: every request of the capture)
    less those sent; the engine gives them 0, and the proxy had recorded none throttled
    (``_sent``)."""
    got = sent.groupBy("entity").agg(F.sum("requests").alias("sent_requests"),
                                     F.sum("moved").alias("sent_moved")).toPandas()
    rest = totals[["entity", "requests", "moved"]].merge(got, on="entity", how="left").fillna(0)
    requests = (rest["requests"] - rest["sent_requests"]).astype("int64")
    moved = (rest["moved"] - rest["sent_moved"]).astype("int64")
    zero = np.zeros(len(rest), dtype=np.int64)
    frame = pd.DataFrame({
        "entity": rest["entity"].astype("int64"), "bucket_ms": np.full(len(rest), -1, np.int32),
        "requests": requests, "throttle_ms": zero, "moved": moved,
        "recorded_throttled_requests": zero, "recorded_throttle_ms": zero,
        "matched": requests, "held_seconds": zero, "recorded_held_seconds": zero,
    })[requests.to_numpy() > 0]
    if (requests < 0).any():
        raise ValueError("the replay was sent more requests than the capture's totals hold")
    return sent.unionByName(sent.sparkSession.createDataFrame(frame, SUMMARY))


# What crosses to the Python workers costs per value: Spark writes the Arrow batches a value
# at a time (10 M requests of 17 columns took 11 s to reach a Python function that did
# nothing with them, 8 columns 7.6 s, of which about 4.5 s is the scan, shuffle and sort of
# the rows). So the replay's columns travel packed into few 64-bit numbers and are unpacked
# by numpy (``unpacked``):
#   key    run << 40 | broker (32 bits, -1 included) << 4 | bucket, where run is the run's
#          index among the capture's runs by name: one exact number per group, which Spark
#          sorts the rows into groups by with a radix sort
#   flags  quota_generation << 17 | follower << 16 | api_key (16 bits)
#   sizes  request_bytes << 32 | response_bytes (32 bits)
#   held   throttle_produce_ms << 32 | throttle_fetch_ms (32 bits), and throttle_request_ms
# with seq, quota_ms and entity as they are; request_time_ms only where a config has a request
# quota (no replay reads it otherwise), storage_scale only with storage settings (without
# them a request that carries one fails the replay, as the engine does).
_LOW32 = 0xFFFFFFFF


def packed(configs: list[QuotaSettings], storage: bool, names: Names) -> list[Column]:
    column = independent_by(configs, storage)
    bucket = F.pmod(F.xxhash64(column), F.lit(BUCKETS)) if column else F.lit(0)
    runs = F.create_map(*[F.lit(x) for i, run in enumerate(_run_order(names))
                          for x in (run, i)])
    key = (runs[F.col("run")].cast("long") * (1 << 40)
           + F.col("broker").cast("long").bitwiseAND(_LOW32) * BUCKETS + bucket.cast("long"))
    flags = (F.col("quota_generation").cast("long") * (1 << 17)
             + F.col("follower").cast("long") * (1 << 16)
             + F.col("api_key").cast("long").bitwiseAND(0xFFFF))
    sizes = (F.col("request_bytes").cast("long") * (1 << 32)
             + F.col("response_bytes").cast("long").bitwiseAND(_LOW32))
    held = (F.col("throttle_produce_ms").cast("long") * (1 << 32)
            + F.col("throttle_fetch_ms").cast("long").bitwiseAND(_LOW32))
    if not storage:
        flags = F.when(F.col("storage_scale") >= 0, F.raise_error(F.lit(
            "requests carry a storage_scale but no storage settings were given"))
        ).otherwise(flags)
    out = [key.alias("key"), F.col("seq"), F.col("quota_ms"),
           F.xxhash64("user", "client_id").alias("entity"), flags.alias("flags"),
           sizes.alias("sizes"), held.alias("held"), F.col("throttle_request_ms")]
    if any(c.for_type(QuotaType.REQUEST) for c in configs):
        out.append(F.col("request_time_ms"))
    if storage:
        out.append(F.coalesce(F.col("storage_scale"), F.lit(-1.0)).alias("storage_scale"))
    return out


def _run_order(names: Names) -> list[str]:
    return sorted(names.runs.values())


def unpacked(pdf: pd.DataFrame, names: Names) -> pd.DataFrame:
    """``packed``'s columns back as the engine reads them: run_id, broker, bucket, seq,
    quota_ms, entity, api_key, request_bytes, response_bytes, request_time_ms, follower,
    quota_generation, the three recorded throttles and storage_scale."""
    key = pdf["key"].to_numpy()
    flags = pdf["flags"].to_numpy()
    sizes = pdf["sizes"].to_numpy()
    held = pdf["held"].to_numpy()
    run_ids = {run: run_id for run_id, run in names.runs.items()}
    order = np.asarray([run_ids[run] for run in _run_order(names)], dtype=np.int64)
    n = len(pdf)
    return pd.DataFrame({
        "run_id": order[key >> 40] if n else np.zeros(0, dtype=np.int64),
        "broker": ((key >> 4) & _LOW32).astype(np.uint32).view(np.int32),
        "bucket": (key & (BUCKETS - 1)).astype(np.int32),
        "seq": pdf["seq"].to_numpy(), "quota_ms": pdf["quota_ms"].to_numpy(),
        "entity": pdf["entity"].to_numpy(),
        "api_key": (flags & 0xFFFF).astype(np.uint16).view(np.int16),
        "request_bytes": (sizes >> 32).astype(np.int32),
        "response_bytes": (sizes & _LOW32).astype(np.uint32).view(np.int32),
        "request_time_ms": (pdf["request_time_ms"].to_numpy() if "request_time_ms" in pdf
                            else np.zeros(n)),
        "follower": ((flags >> 16) & 1).astype(bool),
        "quota_generation": (flags >> 17).astype(np.int32),
        "throttle_produce_ms": (held >> 32).astype(np.int32),
        "throttle_fetch_ms": (held & _LOW32).astype(np.uint32).view(np.int32),
        "throttle_request_ms": pdf["throttle_request_ms"].to_numpy(),
        "storage_scale": (pdf["storage_scale"].to_numpy() if "storage_scale" in pdf
                          else np.full(n, -1.0)),
    })


def _storage(storage: Mapping[str, Mapping[str, Any]] | None) -> dict[str, StorageSettings]:
    return {run: StorageSettings.from_section(s) for run, s in (storage or {}).items()}


def replay_capture(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
                   catalog: Catalog | None = None,
                   storage: Mapping[str, Mapping[str, Any]] | None = None) -> DataFrame:
    """One row per request with its replayed throttles (``throttle_ms``: the largest, what
    the client is held back for), the recorded one, and whether all three match.
    ``candidate``: a ``quotas`` section to replay under; None: the live configs.
    ``catalog``: ``catalog_of(captures)``, when the caller has it already. ``storage``: run ->
    the ``storage`` settings written next to the capture (``read_storage_settings``): the
    storage factor each request records is applied in every replay, whatever the config."""
    cand, live_settings = _settings(candidate, live)
    found = catalog or catalog_of(captures)
    names = found.names
    st = _storage(storage)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _per_request(unpacked(pdf, names), cand, live_settings, names, st)

    replayed = _grouped(captures, cand, live_settings, bool(st), names).applyInPandas(
        per_group, SCHEMA)
    return (replayed.join(F.broadcast(found.run_frame), "run_id")
            .join(F.broadcast(found.entity_frame), "entity")
            .select("run", "broker", "seq", "user", "client_id",
                    *[c for c in replayed.columns
                      if c not in ("run_id", "broker", "seq", "entity")]))


def replay_summary(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
                   bucket_ms: int = 100, catalog: Catalog | None = None,
                   storage: Mapping[str, Mapping[str, Any]] | None = None,
                   peaks: pd.DataFrame | None = None, span: int = 0,
                   clock_spread_ms: int = 0) -> DataFrame:
    """The replay summed per (user, client-id, throttle bucket; -1: not throttled), for
    ``entity_totals``, ``throttle_histogram`` and ``match_rate`` at any capture size.

    ``peaks``: per entity of the capture, ``produce_peak`` and ``fetch_peak`` over ``span``
    seconds, ``requests`` and ``moved`` (``entity_pass.split``'s profile), and
    ``clock_spread_ms`` (``bounds.clock_spread_ms``): replaying a candidate on Kafka's maths
    with no storage settings, whose budgets' spans fit in ``span`` seconds, only the requests
    of entities whose budgets may throttle (``bounds.hot_entities``) cross to the Python
    workers, and the others are counted from ``peaks``: the same sums, without the shuffle,
    sort and Python of most of the rows."""
    cand, live_settings = _settings(candidate, live)
    found = catalog or catalog_of(captures)
    names = found.names
    st = _storage(storage)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _summary(unpacked(pdf, names), cand, live_settings, names, st, bucket_ms)

    hot = None
    if (peaks is not None and cand is not None and not st and bounds.applies(cand)
            and bounds.span_seconds(cand, clock_spread_ms) <= span):
        hot = bounds.hot_entities(peaks, cand, names.entities)
    summary = _grouped(captures, cand, live_settings, bool(st), names, hot).applyInPandas(
        per_group, SUMMARY)
    if hot is not None and peaks is not None:
        summary = summary.cache()
        summary = _with_rest(summary, peaks)
    return summary.join(F.broadcast(found.entity_frame), "entity").drop("entity")


def match_rate(replayed: DataFrame) -> tuple[int, int]:
    """(requests whose three replayed throttles equal the recorded ones, requests), from
    ``replay_capture`` or ``replay_summary``."""
    if "requests" in replayed.columns:
        row = replayed.agg(F.sum("matched").alias("m"), F.sum("requests").alias("n")).first()
    else:
        row = replayed.agg(F.sum(F.col("matched").cast("long")).alias("m"),
                           F.count("*").alias("n")).first()
    assert row is not None
    return int(row["m"] or 0), int(row["n"] or 0)


def entity_totals(summary: DataFrame) -> DataFrame:
    """Per (user, client-id) from ``replay_summary``: requests, throttled requests, time held
    back (the largest of the three throttles), bytes delayed (the bytes of the requests
    after which the client was held back) and throttled client-seconds (``held``), replayed
    and as recorded."""
    throttled = F.col("bucket_ms") >= 0
    return summary.groupBy("user", "client_id").agg(
        F.sum("requests").alias("requests"),
        F.sum(F.when(throttled, F.col("requests")).otherwise(0)).alias("throttled_requests"),
        F.sum("throttle_ms").alias("throttle_ms"),
        F.sum(F.when(throttled, F.col("moved")).otherwise(0)).alias("bytes_delayed"),
        F.sum("recorded_throttled_requests").alias("recorded_throttled_requests"),
        F.sum("recorded_throttle_ms").alias("recorded_throttle_ms"),
        F.sum("held_seconds").alias("held_seconds"),
        F.sum("recorded_held_seconds").alias("recorded_held_seconds"),
    )


def throttle_histogram(summary: DataFrame) -> DataFrame:
    """Throttled requests per throttle bucket (lower bound, ms), from ``replay_summary``."""
    return (summary.where(F.col("bucket_ms") >= 0).groupBy("bucket_ms")
            .agg(F.sum("requests").alias("requests")).orderBy("bucket_ms"))


# ---------------------------------------------------------------- multi-process captures

def name_counts(captures: DataFrame) -> DataFrame:
    """Per name of the capture (process, instance, run, user and client-id): its requests, the
    first and last ``ts_ms``, and the least and most ``quota_ms - ts_ms`` (for
    ``bounds.clock_spread_ms``). Few rows, from one pass over the capture: ``process_spans``
    and ``catalog_of`` take their names from them (cache it to share it)."""
    offset = F.col("quota_ms") - F.col("ts_ms")
    return captures.groupBy("process", "instance", "run", "user", "client_id").agg(
        F.count("*").alias("requests"), F.min("ts_ms").alias("first_ms"),
        F.max("ts_ms").alias("last_ms"), F.min(offset).alias("min_offset_ms"),
        F.max(offset).alias("max_offset_ms"))


def names_of(captures: DataFrame) -> pd.DataFrame:
    """``name_counts`` collected, with the hashes the replays move the names as (``run_id``,
    ``entity``: ``catalog_of``'s): one job, from which ``catalog_of``, ``process_spans`` and
    ``bounds.clock_spread_ms`` take what they need in the driver."""
    return cast(pd.DataFrame, name_counts(captures).withColumns({
        "run_id": F.xxhash64("run"), "entity": F.xxhash64("user", "client_id")}).toPandas())


def process_spans(captures: DataFrame, names: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per process (``process``, ``instance``, ``run``; capture schema v4, defaulted for older
    captures by ``capture.with_processes``): requests, the first and last ``ts_ms``, and, when
    processes ran at the same time (``overlapping``), the offset of its quota clock from the
    wall clock, the median of ``ts_ms - quota_ms`` over its rows (``ts_ms`` is when the
    request was read, ``quota_ms`` when it was recorded: the median takes the usual gap
    between the two with it, the same for every process); otherwise NaN (a capture of one
    process at a time is never put on one clock, and the median is a pass of its own).
    ``names``: ``names_of(captures)``, when the caller has it."""
    keys = ["process", "instance", "run"]
    counts = names if names is not None else names_of(captures)
    out = counts.groupby(keys, as_index=False, sort=False).agg(
        requests=("requests", "sum"), first_ms=("first_ms", "min"), last_ms=("last_ms", "max"))
    out = out.astype({"requests": "int64", "first_ms": "int64", "last_ms": "int64"})
    out["offset_ms"] = np.nan
    if overlapping(out):
        offsets = captures.groupBy(*keys).agg(F.percentile_approx(
            F.col("ts_ms") - F.col("quota_ms"), 0.5, 10_000).alias("offset_ms")).collect()
        out = out.drop(columns="offset_ms").merge(
            pd.DataFrame([r.asDict() for r in offsets], columns=[*keys, "offset_ms"]),
            on=keys)
    return out.sort_values(["first_ms", "process"]).reset_index(drop=True)


def overlapping(spans: pd.DataFrame) -> bool:
    """Whether two processes of ``process_spans`` were running at the same time (their
    ``[first_ms, last_ms]`` intersect): a capture of one process, or of one after the other
    (restarts), is not a multi-process capture."""
    latest = None
    for first, last in sorted(zip(spans["first_ms"], spans["last_ms"], strict=True)):
        if latest is not None and first <= latest:
            return True
        latest = last if latest is None else max(latest, last)
    return False


# Per (broker, budget) from each single-point group (``_single_point_group``).
SINGLE_POINT = ("broker int, quota_type string, budget_user string, budget_client string, "
                "quota double, processes int, requests long, value double, "
                "let_through double, traffic_ms double, recorded_throttled long, "
                "recorded_held_ms long, replayed_throttled long, replayed_held_ms long")

_TYPES = (QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST)


def _single_point_group(pdf: pd.DataFrame, settings: QuotaSettings | Callable[[int], QuotaSettings],
                        code_of: Mapping[tuple[int, int], int] | None,
                        offsets: Mapping[int, int], base: QuotaSettings, catalog: Names,
                        storage: StorageSettings | None) -> pd.DataFrame:
    """One (broker, bucket) of every run on one clock through one quota engine, twice: every
    request recorded (the throttles one engine returns), and the requests it would have let
    through (``quota.replay.let_through``); then summed per budget of ``base`` with a
    quota. ``code_of``: (run id, quota generation) -> the number ``settings`` takes (None:
    ``settings`` is one config)."""
    pdf = pdf.assign(aligned=pdf["quota_ms"] + pdf["run_id"].map(offsets)).sort_values(
        ["aligned", "run_id", "seq"], kind="stable").reset_index(drop=True)
    codes, uniques = pd.factorize(pdf["entity"])
    names = [catalog.entities[int(e)] for e in uniques]
    users = [names[c][0] for c in codes]
    client_ids = [names[c][1] for c in codes]
    generations = [0] * len(pdf)
    if code_of is not None:
        for j, key in enumerate(zip(pdf["run_id"].tolist(), pdf["quota_generation"].tolist(),
                                    strict=True)):
            if key not in code_of:
                raise KeyError(f"no quotas-{catalog.runs[key[0]]}-{key[1]:05d}.json in the "
                               "capture")
            generations[j] = code_of[key]
    rows = list(zip(pdf["aligned"].tolist(), users, client_ids,
                    *[pdf[c].tolist() for c in ("api_key", "request_bytes", "response_bytes")],
                    repeat(0, len(pdf)),  # (duration_us: the engine does not read it)
                    *[pdf[c].tolist() for c in ("request_time_ms", "follower")],
                    generations, pdf["storage_scale"].tolist(), strict=True))
    replayed = replay_rows(rows, settings, storage=storage)
    passed = np.asarray(let_through(
        rows, list(zip(pdf["run_id"].tolist(), pdf["connection"].tolist(), strict=True)),
        settings, storage=storage), dtype=bool)
    api_key = pdf["api_key"].to_numpy()
    follower = pdf["follower"].to_numpy(dtype=bool)
    response = pdf["response_bytes"].to_numpy()
    request = pdf["request_bytes"].to_numpy()
    model = base.request_time
    elapsed = [t if t > 0 else model.broker_ms(q, r) for t, q, r in zip(
        pdf["request_time_ms"].tolist(), request.tolist(), response.tolist(), strict=True)]
    recording = {  # what each quota type records of each request (quota.recording), where
        QuotaType.PRODUCE: (api_key == 0, request - 4.0),
        QuotaType.FETCH: ((api_key == 1) & ~follower, response - 4.0),
        QuotaType.REQUEST: (~follower & (response >= 0),
                            np.asarray([percent_of_thread(e) for e in elapsed], dtype=float)),
    }
    recorded_columns = {QuotaType.PRODUCE: "throttle_produce_ms",
                        QuotaType.FETCH: "throttle_fetch_ms",
                        QuotaType.REQUEST: "throttle_request_ms"}
    full_window = base.samples * base.window_ms
    out = []
    for i, qt in enumerate(_TYPES):
        quotas = base.for_type(qt)
        if not quotas:
            continue
        tags_of = [metric_tags(quotas, user, client_id)[0] for user, client_id in names]
        limits = {tags: quota_limit(quotas, tags)[0] for tags in tags_of}
        mask, values = recording[qt]
        mask = mask & np.asarray([limits[tags_of[c]] is not None for c in codes], dtype=bool)
        if not mask.any():
            continue
        long = pd.DataFrame({
            "budget": [tags_of[c] for c in codes[mask]],
            "aligned": pdf["aligned"].to_numpy()[mask], "run_id": pdf["run_id"].to_numpy()[mask],
            "value": values[mask], "passed": passed[mask],
            "recorded": pdf[recorded_columns[qt]].to_numpy()[mask],
            "replayed": np.asarray(replayed[i])[mask]})
        for tags, g in long.groupby("budget", sort=False):
            times = g["aligned"].to_numpy()  # in order already
            n = len(times)
            gaps = np.minimum(np.diff(times), full_window).sum() if n > 1 else 0
            out.append({
                "broker": int(pdf["broker"].iloc[0]), "quota_type": qt.short,
                "budget_user": tags[0], "budget_client": tags[1],
                "quota": float(limits[tags] or 0),
                "processes": int(g["run_id"].nunique()), "requests": n,
                "value": float(g["value"].sum()),
                "let_through": float(g.loc[g["passed"], "value"].sum()),
                "traffic_ms": float(gaps * n / (n - 1)) if n > 1 else float("nan"),
                "recorded_throttled": int((g["recorded"] > 0).sum()),
                "recorded_held_ms": int(g["recorded"].sum()),
                "replayed_throttled": int((g["replayed"] > 0).sum()),
                "replayed_held_ms": int(g["replayed"].sum())})
    return pd.DataFrame(out, columns=[c.split()[0] for c in SINGLE_POINT.split(", ")])


@dataclass(frozen=True)
class MultiProcess:
    """A multi-process capture: its processes (``process_spans``) and, per budget with a
    quota, the rate recorded and under a single enforcement point (``single_point``)."""

    processes: pd.DataFrame
    budgets: pd.DataFrame
    config: str  # which config the budgets and quotas are of


def single_point(captures: DataFrame, spans: pd.DataFrame,
                 candidate: Mapping[str, Any] | None = None,
                 live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
                 base: Mapping[str, Any] | None = None, catalog: Catalog | None = None,
                 storage: Mapping[str, Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """The capture through one quota engine per broker (a single enforcement point) under
    the live configs (each request under the config live in its run and generation) or
    ``candidate``: every run's requests on one clock, ``quota_ms`` plus the run's
    ``offset_ms`` (``spans``: ``process_spans``), in that order.

    Per (broker, quota type, budget) of ``base`` (default: ``candidate``) with a quota:
    ``requests``, ``value`` (what the budget recorded: bytes; request time as percent of one
    thread times seconds), ``traffic_ms`` (its time with traffic: the gaps between its
    consecutive requests, each counted up to the quota window, ``samples x size``, as a
    longer pause is idle time that Kafka's window forgets, times n / (n - 1) for its n
    requests, so that n requests d apart count n x d), ``rate`` and ``ratio`` (value per
    second of traffic, over the quota), as recorded; ``let_through``, ``single_rate`` and
    ``single_ratio``: the same of the requests one engine would have let through had the
    connections waited out its throttles (``quota.replay.let_through``); throttled requests
    and time held back (of that quota type) as recorded and as one engine gives them."""
    cand, live_settings = _settings(candidate, live)
    base_settings = settings_from_section(base) if base is not None else cand
    if base_settings is None:
        raise ValueError("no config to take the budgets from")
    found = catalog or catalog_of(captures)
    names = found.names
    st = _storage(storage)
    one_storage = st[min(st)] if st else None  # (one process's settings: they are the same)
    offsets_by_run = dict(zip(spans["run"], spans["offset_ms"], strict=True))
    offsets = {rid: int(offsets_by_run[run]) for rid, run in names.runs.items()}
    # One engine meets the configs of every run: each distinct config is one "generation" of
    # it, so that it changes config only where the config does.
    distinct: list[QuotaSettings] = []
    code_of: dict[tuple[int, int], int] | None = None
    if cand is None:
        code_of = {}
        run_ids = {run: rid for rid, run in names.runs.items()}
        for (run, generation), settings in sorted(live_settings.items()):
            if settings not in distinct:
                distinct.append(settings)
            if run in run_ids:
                code_of[(run_ids[run], generation)] = distinct.index(settings)
    chosen: QuotaSettings | Callable[[int], QuotaSettings] = (
        cand if cand is not None else distinct.__getitem__)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _single_point_group(pdf, chosen, code_of, offsets, base_settings, names,
                                   one_storage)

    configs = [cand] if cand is not None else list(live_settings.values())
    configs.append(base_settings)
    inputs = [*_input(configs, bool(st)), F.col("connection")]
    frame = captures
    if "storage_scale" not in frame.columns:  # capture schema v1
        frame = frame.withColumn("storage_scale", F.lit(None).cast("double"))
    got = frame.select(*inputs).groupBy("broker", "bucket").applyInPandas(
        per_group, SINGLE_POINT)
    out = cast(pd.DataFrame, got.toPandas())
    seconds = out["traffic_ms"] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        out["rate"] = out["value"] / seconds.where(seconds > 0)
        out["single_rate"] = out["let_through"] / seconds.where(seconds > 0)
        out["ratio"] = out["rate"] / out["quota"].where(out["quota"] > 0)
        out["single_ratio"] = out["single_rate"] / out["quota"].where(out["quota"] > 0)
    return out.sort_values(["ratio", "value"], ascending=False,
                           na_position="last").reset_index(drop=True)
