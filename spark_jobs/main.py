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
from spark_jobs.capture import read_capture, read_live_configs, read_storage_settings
from spark_jobs.profile import entity_profile, per_interval
from spark_jobs.replay import (
    catalog_of,
    entity_totals,
    match_rate,
    replay_summary,
    throttle_histogram,
)
from spark_jobs.session import spark_session
from spark_jobs.tune import TuneOptions, recommend


def run(capture_dir: str | Path, out_dir: str | Path, candidate: Mapping[str, Any] | None,
        master: str | None = None, tune: bool = False,
        options: TuneOptions | None = None) -> dict[str, Any]:
    """Returns the run's facts (also in ``out_dir/summary.json``)."""
    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if candidate is None and not tune and not read_live_configs(capture_dir):
        raise ValueError("nothing to replay: no candidate config and no live configs")
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 1)
        mark = now

    spark = spark_session(master)
    phase("spark start")
    captures = read_capture(spark, capture_dir)
    live = read_live_configs(capture_dir)
    storage = read_storage_settings(capture_dir)
    facts: dict[str, Any] = {"requests": captures.count()}
    catalog = catalog_of(captures)  # the names the replays move as numbers
    phase("read")

    if live:
        reproduction = replay_summary(captures, live=live, catalog=catalog,
                                      storage=storage).cache()
        matched, total = match_rate(reproduction)
        facts["reproduction match"] = f"{matched}/{total} ({matched / max(total, 1):.4%})"
        facts["match_rate"] = matched / max(total, 1)
        phase("reproduction replay")

    profile = _pandas(entity_profile(captures, catalog.entity_frame))
    profile.to_csv(out / "profile.csv", index=False)
    phase("profile")

    chosen = candidate
    label = "candidate config"
    if tune:
        chosen = recommend(profile, options or TuneOptions())
        (out / "recommended-quotas.yaml").write_text(
            yaml.safe_dump({"quotas": chosen}, sort_keys=False))
        label = "recommended config"
        phase("tune")
    if chosen is not None:
        summary = replay_summary(captures, candidate=chosen, catalog=catalog,
                                 storage=storage).cache()
        totals_pd = _pandas(entity_totals(summary))
        totals_pd.to_csv(out / "replay.csv", index=False)
        histogram = _pandas(throttle_histogram(summary))
        facts["throttled requests (replay)"] = int(histogram["requests"].sum())
        phase("replay")
    else:
        summary = reproduction
        totals_pd = _pandas(entity_totals(summary))
        histogram = _pandas(throttle_histogram(summary))

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
    report.plot_throttles(histogram, out / "throttles.png")
    report.plot_before_after(totals_pd, out / "before_after.png", label)
    phase("report")
    facts["seconds"] = round(time.monotonic() - started, 1)
    facts["seconds by phase"] = phases
    report.write_report(out, {k: v for k, v in facts.items() if k != "match_rate"}, profile,
                        totals_pd, plots)
    (out / "summary.json").write_text(json.dumps(facts, indent=1, default=str))
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
