"""The thin entry point: read a capture, reproduce it (match rate), replay it under a
candidate config, profile it, optionally tune, and write the report."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pandas as pd
import yaml
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs import report
from spark_jobs.capture import read_capture, read_live_configs
from spark_jobs.profile import entity_profile, per_interval
from spark_jobs.replay import entity_totals, match_rate, replay_capture, with_applied
from spark_jobs.session import spark_session
from spark_jobs.tune import TuneOptions, recommend


def run(capture_dir: str | Path, out_dir: str | Path, candidate: Mapping[str, Any] | None,
        master: str | None = None, tune: bool = False,
        options: TuneOptions | None = None) -> dict[str, Any]:
    """Returns the run's facts (also in ``out_dir/summary.json``)."""
    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spark = spark_session(master)
    captures = read_capture(spark, capture_dir).cache()
    live = read_live_configs(capture_dir)
    facts: dict[str, Any] = {"requests": captures.count()}

    if live:
        matched, total = match_rate(replay_capture(captures, live=live))
        facts["reproduction match"] = f"{matched}/{total} ({matched / max(total, 1):.4%})"
        facts["match_rate"] = matched / max(total, 1)

    profile = _pandas(entity_profile(captures))
    profile.to_csv(out / "profile.csv", index=False)

    chosen = candidate
    label = "candidate config"
    if tune:
        chosen = recommend(profile, options or TuneOptions())
        (out / "recommended-quotas.yaml").write_text(
            yaml.safe_dump({"quotas": chosen}, sort_keys=False))
        label = "recommended config"
    if chosen is not None:
        replayed = with_applied(replay_capture(captures, candidate=chosen)).cache()
        totals_pd = _pandas(entity_totals(replayed))
        totals_pd.to_csv(out / "replay.csv", index=False)
        throttles = _pandas(replayed.where(F.col("throttle_ms") > 0).select("throttle_ms"))
        facts["throttled requests (replay)"] = len(throttles)
    else:
        totals_pd = _pandas(entity_totals(replay_capture(captures, live=live)))

    # Rates of the top talkers over time, with the quota each would get.
    top = profile.assign(total=profile["produce_bytes"] + profile["fetch_bytes"]).nlargest(
        4, "total")
    rates = (per_interval(captures.where(F.col("client_id").isin(list(top["client_id"]))))
             .groupBy("client_id", "interval")
             .agg(F.max(F.greatest("produce_rate", "fetch_rate")).alias("rate")))
    rates_pd = _pandas(rates)
    limits = _limits(chosen, list(top["client_id"])) if chosen is not None else {}
    plots = {"Rate vs quota, top entities": "rates.png",
             "Throttle distribution": "throttles.png",
             "Before / after": "before_after.png"}
    report.plot_rates(rates_pd, limits, out / "rates.png")
    report.plot_throttles(
        throttles["throttle_ms"] if chosen is not None else totals_pd["throttle_ms"],
        out / "throttles.png")
    report.plot_before_after(totals_pd, out / "before_after.png", label)
    facts["seconds"] = round(time.monotonic() - started, 1)
    report.write_report(out, {k: v for k, v in facts.items() if k != "match_rate"}, profile,
                        totals_pd, plots)
    (out / "summary.json").write_text(json.dumps(facts, indent=1, default=str))
    captures.unpersist()
    return facts


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def _limits(section: Mapping[str, Any], client_ids: list[str]) -> dict[str, float | None]:
    """The byte-rate limit each client-id gets under ``section`` (override, else default)."""
    default: float | None = None
    by_client: dict[str, float] = {}
    for e in section.get("entities", []):
        cid = e.get("client-id", e.get("client_id"))
        rate = e.get("producer_byte_rate") or e.get("consumer_byte_rate")
        if rate is None or e.get("user") is not None:
            continue
        if cid == "<default>":
            default = float(rate)
        elif cid is not None:
            by_client[str(cid)] = float(rate)
    return {c: by_client.get(c, default) for c in client_ids}
