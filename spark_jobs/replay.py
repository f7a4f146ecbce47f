"""Replay: every captured request through the quota engine (``quota.replay``), per run and
broker (the proxy keeps one quota manager per upstream broker), under the config that was live
(reproduction) or a candidate; then per-entity totals and the match rate."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from quota.manager import QuotaSettings
from quota.replay import Recorded, replay, settings_from_section

INPUT = ["run", "broker", "seq", "quota_ms", "ts_ms", "user", "client_id", "api_key",
         "request_bytes", "response_bytes", "duration_us", "request_time_ms", "follower",
         "quota_generation", "throttle_produce_ms", "throttle_fetch_ms", "throttle_request_ms"]
SCHEMA = ("run string, broker int, seq long, ts_ms long, user string, client_id string, "
          "api_key short, request_bytes int, response_bytes int, follower boolean, "
          "recorded_produce_ms int, recorded_fetch_ms int, recorded_request_ms int, "
          "produce_ms int, fetch_ms int, request_ms int")


def _replay_group(pdf: pd.DataFrame, candidate: QuotaSettings | None,
                  live: Mapping[tuple[str, int], QuotaSettings]) -> pd.DataFrame:
    pdf = pdf.sort_values(["quota_ms", "seq"], kind="stable")
    run = str(pdf["run"].iloc[0])

    def settings_of(generation: int) -> QuotaSettings:
        found = live.get((run, generation))
        if found is None:
            raise KeyError(f"no quotas-{run}-{generation:05d}.json in the capture")
        return found

    columns = [pdf[c].tolist() for c in (
        "seq", "quota_ms", "user", "client_id", "api_key", "request_bytes", "response_bytes",
        "duration_us", "request_time_ms", "follower", "quota_generation")]
    requests: Iterator[Recorded] = (Recorded(*row) for row in zip(*columns, strict=True))
    produce, fetch, request = [], [], []
    for t in replay(requests, candidate if candidate is not None else settings_of):
        produce.append(t.produce_ms)
        fetch.append(t.fetch_ms)
        request.append(t.request_ms)
    return pd.DataFrame({
        "run": pdf["run"], "broker": pdf["broker"], "seq": pdf["seq"], "ts_ms": pdf["ts_ms"],
        "user": pdf["user"], "client_id": pdf["client_id"], "api_key": pdf["api_key"],
        "request_bytes": pdf["request_bytes"], "response_bytes": pdf["response_bytes"],
        "follower": pdf["follower"],
        "recorded_produce_ms": pdf["throttle_produce_ms"],
        "recorded_fetch_ms": pdf["throttle_fetch_ms"],
        "recorded_request_ms": pdf["throttle_request_ms"],
        "produce_ms": produce, "fetch_ms": fetch, "request_ms": request,
    })


def replay_capture(captures: DataFrame, candidate: Mapping[str, Any] | None = None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]] | None = None) -> DataFrame:
    """One row per request with the recorded and the replayed throttle of each quota type.
    ``candidate``: a ``quotas`` section to replay under; None: the live configs."""
    cand = settings_from_section(candidate) if candidate is not None else None
    live_settings = {k: settings_from_section(v) for k, v in (live or {}).items()}
    if cand is None and not live_settings:
        raise ValueError("neither a candidate config nor the capture's live configs")

    def per_group(pdf: pd.DataFrame) -> pd.DataFrame:
        return _replay_group(pdf, cand, live_settings)

    return captures.select(*INPUT).groupBy("run", "broker").applyInPandas(per_group, SCHEMA)


def with_applied(replayed: DataFrame) -> DataFrame:
    """Add what the client was held back for: the largest throttle, replayed and recorded."""
    return replayed.withColumn(
        "throttle_ms", F.greatest("produce_ms", "fetch_ms", "request_ms")
    ).withColumn(
        "recorded_throttle_ms",
        F.greatest("recorded_produce_ms", "recorded_fetch_ms", "recorded_request_ms"))


def match_rate(replayed: DataFrame) -> tuple[int, int]:
    """(requests whose three replayed throttles equal the recorded ones, requests)."""
    same = ((F.col("produce_ms") == F.col("recorded_produce_ms"))
            & (F.col("fetch_ms") == F.col("recorded_fetch_ms"))
            & (F.col("request_ms") == F.col("recorded_request_ms")))
    row = replayed.agg(F.sum(same.cast("long")).alias("m"), F.count("*").alias("n")).first()
    assert row is not None
    return int(row["m"] or 0), int(row["n"])


def entity_totals(replayed: DataFrame) -> DataFrame:
    """Per (user, client-id): requests, throttled requests, time held back and bytes delayed
    (the bytes of the requests after which the client was held back), replayed and
    recorded."""
    r = with_applied(replayed)
    moved = F.when(F.col("api_key") == 1, F.col("response_bytes")).otherwise(
        F.col("request_bytes"))
    return r.groupBy("user", "client_id").agg(
        F.count("*").alias("requests"),
        F.sum((F.col("throttle_ms") > 0).cast("long")).alias("throttled_requests"),
        F.sum("throttle_ms").alias("throttle_ms"),
        F.sum(F.when(F.col("throttle_ms") > 0, moved).otherwise(0)).alias("bytes_delayed"),
        F.sum((F.col("recorded_throttle_ms") > 0).cast("long")).alias(
            "recorded_throttled_requests"),
        F.sum("recorded_throttle_ms").alias("recorded_throttle_ms"),
    )
