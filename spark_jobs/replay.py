"""Replay: every captured request through the quota engine (``quota.replay``), per run and
broker (the proxy keeps one quota manager per upstream broker), under the config that was live
(reproduction) or a candidate; then per-entity totals and the match rate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from quota.manager import QuotaSettings
from quota.replay import replay_rows, settings_from_section

INPUT = ["run", "broker", "seq", "quota_ms", "user", "client_id", "api_key",
         "request_bytes", "response_bytes", "duration_us", "request_time_ms", "follower",
         "quota_generation", "throttle_produce_ms", "throttle_fetch_ms", "throttle_request_ms"]
# Narrow on purpose: this is what crosses from the Python workers back to the JVM.
SCHEMA = ("run string, broker int, seq long, user string, client_id string, moved long, "
          "produce_ms int, fetch_ms int, request_ms int, throttle_ms int, "
          "recorded_throttle_ms int, matched boolean")


def _run_engine(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                live: Mapping[tuple[str, int], QuotaSettings]) -> tuple[pd.DataFrame, ...]:
    """Sort one (run, broker) group as the proxy recorded it and replay it: the sorted
    group, and the produce, fetch and request throttles."""
    pdf = pdf.sort_values(["quota_ms", "seq"], kind="stable")
    run = str(pdf["run"].iloc[0])

    def settings_of(generation: int) -> QuotaSettings:
        found = live.get((run, generation))
        if found is None:
            raise KeyError(f"no quotas-{run}-{generation:05d}.json in the capture")
        return found

    columns = [pdf[c].tolist() for c in (
        "quota_ms", "user", "client_id", "api_key", "request_bytes", "response_bytes",
        "duration_us", "request_time_ms", "follower", "quota_generation")]
    produce, fetch, request = replay_rows(
        zip(*columns, strict=True), candidate if candidate is not None else settings_of)
    return (pdf, np.asarray(produce, dtype=np.int32), np.asarray(fetch, dtype=np.int32),
            np.asarray(request, dtype=np.int32))


def _per_request(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                 live: Mapping[tuple[str, int], QuotaSettings]) -> pd.DataFrame:
    pdf, p, f, q = _run_engine(pdf, candidate, live)
    rp = pdf["throttle_produce_ms"].to_numpy()
    rf = pdf["throttle_fetch_ms"].to_numpy()
    rq = pdf["throttle_request_ms"].to_numpy()
    is_fetch = pdf["api_key"].to_numpy() == 1
    return pd.DataFrame({
        "run": pdf["run"], "broker": pdf["broker"], "seq": pdf["seq"], "user": pdf["user"],
        "client_id": pdf["client_id"],
        # the bytes the quota counts: a fetch's response, anything else's request
        "moved": np.where(is_fetch, pdf["response_bytes"].to_numpy(),
                          pdf["request_bytes"].to_numpy()).astype(np.int64),
        "produce_ms": p, "fetch_ms": f, "request_ms": q,
        "throttle_ms": np.maximum(np.maximum(p, f), q),
        "recorded_throttle_ms": np.maximum(np.maximum(rp, rf), rq).astype(np.int32),
        "matched": (p == rp) & (f == rf) & (q == rq),
    })


SUMMARY = ("user string, client_id string, bucket_ms int, requests long, throttle_ms long, "
           "moved long, recorded_throttled_requests long, recorded_throttle_ms long, "
           "matched long")


def _summary(pdf: pd.DataFrame, candidate: QuotaSettings | None,
             live: Mapping[tuple[str, int], QuotaSettings], bucket_ms: int) -> pd.DataFrame:
    """The per-request replay of one group, summed per (user, client-id, throttle bucket):
    what crosses back to the JVM is small, whatever the capture's size."""
    r = _per_request(pdf, candidate, live)
    throttle = r["throttle_ms"].to_numpy()
    r["bucket_ms"] = np.where(throttle > 0, (throttle // bucket_ms) * bucket_ms, -1)
    r["recorded_throttled"] = r["recorded_throttle_ms"] > 0
    out = r.groupby(["user", "client_id", "bucket_ms"], sort=False).agg(
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


def replay_capture(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None) -> DataFrame:
    """One row per request with its replayed throttles (``throttle_ms``: the largest, what
    the client is held back for), the recorded one, and whether all three match.
    ``candidate``: a ``quotas`` section to replay under; None: the live configs."""
    cand, live_settings = _settings(candidate, live)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _per_request(pdf, cand, live_settings)

    return captures.select(*INPUT).groupBy("run", "broker").applyInPandas(per_group, SCHEMA)


def replay_summary(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
                   bucket_ms: int = 100) -> DataFrame:
    """The replay summed per (user, client-id, throttle bucket; -1: not throttled), for
    ``entity_totals``, ``throttle_histogram`` and ``match_rate`` at any capture size."""
    cand, live_settings = _settings(candidate, live)

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _summary(pdf, cand, live_settings, bucket_ms)

    return captures.select(*INPUT).groupBy("run", "broker").applyInPandas(per_group, SUMMARY)


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
