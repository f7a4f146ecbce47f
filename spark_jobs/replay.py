"""Replay: every captured request through the quota engine (``quota.replay``), per run and
broker (the proxy keeps one quota manager per upstream broker), under the config that was live
(reproduction) or a candidate; then per-entity totals and the match rate.

Each (run, broker) is split further into buckets of users or client-ids that share no quota
budget under the configs replayed, so the work spreads over every core evenly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F

from quota.manager import QuotaSettings
from quota.replay import StorageSettings, independent_by, replay_rows, settings_from_section

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
            F.col("request_bytes"), F.col("response_bytes"), F.col("duration_us"),
            F.col("request_time_ms"), F.col("follower"), F.col("quota_generation"),
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


def catalog_of(captures: DataFrame) -> Catalog:
    """One pass over the capture's name columns (a few distinct values among many rows)."""
    rows = (captures.select("run", "user", "client_id").distinct()
            .select(F.xxhash64("run").alias("run_id"), "run",
                    F.xxhash64("user", "client_id").alias("entity"), "user", "client_id")
            .collect())
    runs: dict[int, str] = {}
    entities: dict[int, tuple[str, str]] = {}
    for r in rows:
        if runs.setdefault(r["run_id"], r["run"]) != r["run"]:
            raise ValueError(f"runs {runs[r['run_id']]!r} and {r['run']!r} share a hash")
        names = (r["user"], r["client_id"])
        if entities.setdefault(r["entity"], names) != names:
            raise ValueError(f"entities {entities[r['entity']]} and {names} share a hash")
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
    group, and the produce, fetch and request throttles."""
    pdf = pdf.sort_values(["quota_ms", "seq"], kind="stable")
    run = catalog.runs[int(pdf["run_id"].iloc[0])]

    def settings_of(generation: int) -> QuotaSettings:
        found = live.get((run, generation))
        if found is None:
            raise KeyError(f"no quotas-{run}-{generation:05d}.json in the capture")
        return found

    codes, uniques = pd.factorize(pdf["entity"])
    names = [catalog.entities[int(e)] for e in uniques]
    users = [names[c][0] for c in codes]
    client_ids = [names[c][1] for c in codes]
    columns = [pdf[c].tolist() for c in (
        "api_key", "request_bytes", "response_bytes", "duration_us", "request_time_ms",
        "follower", "quota_generation", "storage_scale")]
    produce, fetch, request = replay_rows(
        zip(pdf["quota_ms"].tolist(), users, client_ids, *columns, strict=True),
        candidate if candidate is not None else settings_of, storage=storage.get(run))
    return (pdf, np.asarray(produce, dtype=np.int32), np.asarray(fetch, dtype=np.int32),
            np.asarray(request, dtype=np.int32))


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
           "matched long")


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
             live: dict[tuple[str, int], QuotaSettings], storage: bool) -> GroupedData:
    """The capture in replay groups: per run, broker (the proxy keeps one quota manager per
    upstream broker) and bucket, the columns the engine needs."""
    configs = [cand] if cand is not None else list(live.values())
    if "storage_scale" not in captures.columns:  # capture schema v1
        captures = captures.withColumn("storage_scale", F.lit(None).cast("double"))
    return captures.select(*_input(configs, storage)).groupBy("run_id", "broker", "bucket")


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
        return _per_request(pdf, cand, live_settings, names, st)

    replayed = _grouped(captures, cand, live_settings, bool(st)).applyInPandas(
        per_group, SCHEMA)
    return (replayed.join(F.broadcast(found.run_frame), "run_id")
            .join(F.broadcast(found.entity_frame), "entity")
            .select("run", "broker", "seq", "user", "client_id",
                    *[c for c in replayed.columns
                      if c not in ("run_id", "broker", "seq", "entity")]))


def replay_summary(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
                   bucket_ms: int = 100, catalog: Catalog | None = None,
                   storage: Mapping[str, Mapping[str, Any]] | None = None) -> DataFrame:
    """The replay summed per (user, client-id, throttle bucket; -1: not throttled), for
    ``entity_totals``, ``throttle_histogram`` and ``match_rate`` at any capture size."""
    cand, live_settings = _settings(candidate, live)
    found = catalog or catalog_of(captures)
    names = found.names
    st = _storage(storage)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _summary(pdf, cand, live_settings, names, st, bucket_ms)

    summary = _grouped(captures, cand, live_settings, bool(st)).applyInPandas(
        per_group, SUMMARY)
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
    back (the largest of the three throttles) and bytes delayed (the bytes of the requests
    after which the client was held back), replayed and as recorded."""
    throttled = F.col("bucket_ms") >= 0
    return summary.groupBy("user", "client_id").agg(
        F.sum("requests").alias("requests"),
        F.sum(F.when(throttled, F.col("requests")).otherwise(0)).alias("throttled_requests"),
        F.sum("throttle_ms").alias("throttle_ms"),
        F.sum(F.when(throttled, F.col("moved")).otherwise(0)).alias("bytes_delayed"),
        F.sum("recorded_throttled_requests").alias("recorded_throttled_requests"),
        F.sum("recorded_throttle_ms").alias("recorded_throttle_ms"),
    )


def throttle_histogram(summary: DataFrame) -> DataFrame:
    """Throttled requests per throttle bucket (lower bound, ms), from ``replay_summary``."""
    return (summary.where(F.col("bucket_ms") >= 0).groupBy("bucket_ms")
            .agg(F.sum("requests").alias("requests")).orderBy("bucket_ms"))
