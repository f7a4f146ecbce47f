"""The thin entry point: read a capture, reproduce it (match rate), replay it under a
candidate config, profile it, optionally tune (keeping the base config's structure), and write
the report."""

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

from kafka_quota_proxy.quota.entities import QuotaType, resolve
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.spark_jobs import report
from kafka_quota_proxy.spark_jobs.bounds import clock_spread_ms, span_seconds
from kafka_quota_proxy.spark_jobs.capture import (
    read_capture,
    read_live_config_times,
    read_live_configs,
    read_storage_settings,
)
from kafka_quota_proxy.spark_jobs.entity_pass import entity_pass, split
from kafka_quota_proxy.spark_jobs.profile import (
    FOR_THE_REPLAY,
    budget_seconds,
    entity_seconds,
)
from kafka_quota_proxy.spark_jobs.replay import (
    Catalog,
    MultiProcess,
    catalog_of,
    entity_totals,
    match_rate,
    names_of,
    overlapping,
    process_spans,
    replay_summary,
    single_point,
    throttle_histogram,
)
from kafka_quota_proxy.spark_jobs.session import spark_session
from kafka_quota_proxy.spark_jobs.tune import (
    KEYS,
    Recommendation,
    TuneOptions,
    budget_mapping,
    governing,
    offered_demand,
    offered_intervals,
    reasons,
    retune,
    whole_minutes,
)


def run(capture_dir: str | Path, out_dir: str | Path, candidate: Mapping[str, Any] | None,
        master: str | None = None, tune: bool = False,
        options: TuneOptions | None = None) -> dict[str, Any]:
    """Returns the run's facts (also in ``out_dir/summary.json``). ``tune``: recommend quotas
    that keep the structure of the base config (``candidate``, else the last config live in
    the capture; ``spark_jobs.tune``) and replay the capture under them."""
    started = time.monotonic()
    options = options or TuneOptions()
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
    names = names_of(captures)  # one pass over the capture for its names
    spans = process_spans(captures, names)  # per process: requests, first, last, clock offset
    start_s, end_s = whole_minutes(int(spans["first_ms"].min()), int(spans["last_ms"].max()),
                                   options.span_seconds)
    minutes = (end_s - start_s) / 60
    facts: dict[str, Any] = {"requests": int(spans["requests"].sum()),
                             "whole minutes": int(minutes) if minutes.is_integer()
                             else round(minutes, 2),
                             "processes": len(spans)}
    catalog = catalog_of(captures, names)  # the names the replays move as numbers
    spread = clock_spread_ms(names)  # (how far the quota clocks wander from the wall clock)
    pairs = list(catalog.names.entities.values())
    phase("read")

    if live:
        reproduction = replay_summary(captures, live=live, catalog=catalog,
                                      storage=storage).cache()
        matched, total = match_rate(reproduction)
        facts["reproduction match"] = f"{matched}/{total} ({matched / max(total, 1):.4%})"
        facts["match_rate"] = matched / max(total, 1)
        phase("reproduction replay")

    multi = _multi_process(captures, spans, candidate, live, catalog, storage)
    if multi is not None:
        instances = multi.processes["instance"].replace("", None).nunique()
        facts["multi-process capture"] = (
            f"{len(multi.processes)} processes ({instances or 'unknown'} instances) ran at the "
            "same time: see \"Multi-process capture\"")
        multi.processes.to_csv(out / "processes.csv", index=False)
        multi.budgets.to_csv(out / "multi_process.csv", index=False)
        phase("single-point replay")

    # The config whose budgets are measured (and, with --tune, whose structure is kept).
    base, base_label = _base(candidate, live)
    # Each entity's peaks over as many seconds as a budget of the base config's window spans
    # (the replay of a config with that window leaves out the entities that cannot throttle)
    span = span_seconds(settings_from_section(base or {}), spread)
    mapping = budget_mapping(pairs, base or {}, _types(base, tune))
    # One pass over the requests (``entity_pass``): the profile, each entity's bytes per
    # broker and, tuning, the load its clients offered (``tune.offered_load``: what each client
    # would have sent had nothing held it back, not the recorded bursts).
    profile, segments, per_broker, recorded = split(_pandas(entity_pass(
        captures, catalog.names, span,
        (sorted(set(mapping["quota_type"])) or ["produce"]) if tune else (),
        options.idle_seconds * 1000.0, options.measure_seconds * 1000.0)), catalog.names)
    profile.drop(columns=["entity", *FOR_THE_REPLAY]).to_csv(out / "profile.csv", index=False)
    peaks = profile[["entity", "requests", *FOR_THE_REPLAY]]
    phase("profile")

    chosen = candidate
    label = "candidate config"
    recommendation: Recommendation | None = None
    if tune:
        demand = offered_demand(offered_intervals(segments, mapping), start_s, end_s,
                                options.percentile, options.span_seconds)
        recommendation = retune(base or {}, demand, pairs, options, minutes)
        last_live = _base(None, live)[0]
        if candidate is not None and last_live is not None and (
                settings_from_section(candidate).entities
                != settings_from_section(last_live).entities):
            recommendation.notes.append(
                "the base (--config) is not the config last live in the capture: what was "
                "recorded is the live config's doing")
        chosen = recommendation.section
        (out / "recommended-quotas.yaml").write_text(
            yaml.safe_dump({"quotas": chosen}, sort_keys=False))
        demand.to_csv(out / "demand.csv", index=False)
        label = "recommended config"
        facts["recommended from"] = base_label
        phase("tune")
    if chosen is not None:
        summary = replay_summary(captures, candidate=chosen, catalog=catalog,
                                 storage=storage, peaks=peaks, span=span,
                                 clock_spread_ms=spread).cache()
        totals_pd = _pandas(entity_totals(summary))
        totals_pd.to_csv(out / "replay.csv", index=False)
        histogram = _pandas(throttle_histogram(summary))
        phase("replay")
    else:
        summary = reproduction
        totals_pd = _pandas(entity_totals(summary))
        histogram = _pandas(throttle_histogram(summary))
        label = "live config"
    recorded_histogram = (recorded.groupby("bucket_ms")["requests"].sum().reset_index()
                          .sort_values("bucket_ms"))
    facts["throttled requests (recorded)"] = int(recorded_histogram["requests"].sum())
    facts[f"throttled requests (replayed, {label})"] = int(histogram["requests"].sum())
    facts["throttled client-seconds (recorded)"] = int(totals_pd["recorded_held_seconds"].sum())
    facts[f"throttled client-seconds (replayed, {label})"] = int(totals_pd["held_seconds"].sum())

    # Rates of the top budgets over time, with the quota each has.
    series, quotas = _top_budgets(captures, per_broker, mapping, catalog, chosen, label,
                                  _history(live, read_live_config_times(capture_dir)))
    plots = {"Rate vs quota, top budgets": "rates.png",
             "Throttle distribution: recorded vs replayed": "throttles.png",
             "Before / after": "before_after.png"}
    report.plot_rates(series, quotas, out / "rates.png")
    report.plot_throttles(recorded_histogram, histogram, out / "throttles.png", label)
    report.plot_before_after(totals_pd, out / "before_after.png", label)
    before_after = _before_after(totals_pd, recorded, pairs, chosen or base or {})
    before_after.to_csv(out / "before_after.csv", index=False)
    if recommendation is not None:
        recommendation.why = reasons(recommendation, _held_by_entity(before_after, base or {}))
        facts["why, per entity"] = recommendation.why
    phase("report")
    facts["seconds"] = round(time.monotonic() - started, 1)
    facts["seconds by phase"] = phases
    report.write_report(out, {k: v for k, v in facts.items()
                              if k not in ("match_rate", "why, per entity")}, profile,
                        before_after, plots, recommendation, label, base_label, multi)
    (out / "summary.json").write_text(json.dumps(facts, indent=1, default=str))
    return facts


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def _multi_process(captures: DataFrame, spans: pd.DataFrame,
                   candidate: Mapping[str, Any] | None,
                   live: Mapping[tuple[str, int], Mapping[str, Any]],
                   catalog: Catalog, storage: Mapping[str, Mapping[str, Any]],
                   ) -> MultiProcess | None:
    """For a capture of processes that ran at the same time (``replay.overlapping``): each
    budget's rate as recorded and under one enforcement point, under the configs that were
    live (budgets and quotas of the last one), else the config given. None for a capture of
    one process at a time, or with no config to measure budgets by."""
    if not overlapping(spans):
        return None
    if live:
        base, base_label = _base(None, live)
        config = ("the configs live in the capture (each request under its own run's), "
                  f"budgets and quotas as in {base_label}")
        budgets = single_point(captures, spans, live=live, base=base, catalog=catalog,
                               storage=storage)
    elif candidate is not None:
        config = "the config given (--config): the capture has no live config"
        budgets = single_point(captures, spans, candidate=candidate, catalog=catalog,
                               storage=storage)
    else:
        return None
    return MultiProcess(spans, budgets, config)


def _base(candidate: Mapping[str, Any] | None,
          live: Mapping[tuple[str, int], Mapping[str, Any]]
          ) -> tuple[Mapping[str, Any] | None, str]:
    """The config given, else the last one live in the capture (the latest run, by its start
    time, and its latest generation)."""
    if candidate is not None:
        return candidate, "the config given (--config)"
    if not live:
        return None, "no config (none given, none live in the capture)"

    def order(key: tuple[str, int]) -> tuple[int, str, int]:
        run, generation = key
        start = run.rsplit("-", 1)[-1]
        return (int(start) if start.isdigit() else 0, run, generation)

    run, generation = max(live, key=order)
    return live[(run, generation)], f"the live config of run {run}, generation {generation}"


def _types(base: Mapping[str, Any] | None, tune: bool) -> list[QuotaType]:
    """The quota types whose budgets are measured: produce and fetch (plotted), and request
    when the base config has a request quota (or, tuning, none at all)."""
    settings = settings_from_section(base or {})
    types = [QuotaType.PRODUCE, QuotaType.FETCH]
    if settings.for_type(QuotaType.REQUEST) or (tune and not settings.entities):
        types.append(QuotaType.REQUEST)
    return types


def _label(qt: QuotaType, tags: tuple[str, str]) -> str:
    user, client = tags
    if user and client:
        path = f"users/{user}/clients/{client}"
    elif user:
        path = f"users/{user}"
    else:
        path = f"clients/{client}"
    return f"{path} {qt.short}"


def _history(live: Mapping[tuple[str, int], Mapping[str, Any]],
             times: Mapping[tuple[str, int], int]) -> list[tuple[float, Mapping[str, Any]]]:
    """The live configs in the order they took effect: (Unix s, ``quotas`` section)."""
    return sorted(((times.get(key, 0) / 1000.0, section) for key, section in live.items()),
                  key=lambda item: item[0])


def _top_budgets(captures: DataFrame, per_broker: pd.DataFrame, mapping: pd.DataFrame,
                 catalog: Catalog, chosen: Mapping[str, Any] | None, label: str,
                 history: list[tuple[float, Mapping[str, Any]]], n: int = 4,
                 ) -> tuple[pd.DataFrame, dict[str, list[report.QuotaLine]]]:
    """The per-second rates of the ``n`` produce/fetch budgets that moved the most bytes, on
    the busiest broker of each (``per_broker``: ``entity_pass.split``'s bytes per entity and
    broker), and each one's quota over time: as the live configs set it (``history``, a step
    at each generation) and under the replayed config (``chosen``, ``label``). The rates come
    from a pass over those budgets' requests only (``profile.budget_seconds``)."""
    names = mapping[["budget", *KEYS]].drop_duplicates("budget")
    names = names[names["quota_type"].isin(["produce", "fetch"])]
    totals = per_broker.melt(id_vars=["user", "client_id", "broker"],
                             value_vars=["produce_total", "fetch_total"],
                             var_name="quota_type", value_name="total")
    totals["quota_type"] = totals["quota_type"].str.removesuffix("_total")
    totals = totals[totals["total"] > 0].merge(
        mapping[["user", "client_id", "quota_type", "budget"]],
        on=["user", "client_id", "quota_type"])
    per_broker_budget = totals.groupby(["budget", "broker"], as_index=False)["total"].sum()
    top = (per_broker_budget.merge(names, on="budget").sort_values("total", ascending=False)
           .drop_duplicates("budget").head(n))
    if top.empty:
        return pd.DataFrame(columns=["label", "second", "value"]), {}
    members = mapping[mapping["budget"].isin(top["budget"])]
    hashes = {pair: entity for entity, pair in catalog.names.entities.items()}
    entities = sorted({hashes[(u, c)] for u, c in zip(members["user"], members["client_id"],
                                                      strict=True)})
    theirs = captures.where(F.xxhash64("user", "client_id").isin(entities)
                            & F.col("broker").isin(sorted({int(b) for b in top["broker"]})))
    seconds = budget_seconds(entity_seconds(theirs), members, catalog.entity_frame)
    picked = captures.sparkSession.createDataFrame(top[["budget", "broker"]],
                                                   "budget int, broker int")
    rates = _pandas(seconds.join(F.broadcast(picked), ["budget", "broker"]))
    quotas: dict[str, list[report.QuotaLine]] = {}
    labels = {}
    for r in top.itertuples(index=False):
        qt = QuotaType.from_short(str(r.quota_type))
        tags = (str(r.budget_user), str(r.budget_client))
        name = labels[r.budget] = _label(qt, tags)
        lines = []
        if chosen is not None:
            lines.append(report.QuotaLine(label, [(0.0, governing(chosen, qt, tags)[0])]))
        if history:
            lines.append(report.QuotaLine("live", [(at, governing(config, qt, tags)[0])
                                                   for at, config in history]))
        quotas[name] = [q for q in lines if any(v is not None for _, v in q.changes)]
    rates["label"] = rates["budget"].map(labels)
    order = {budget: i for i, budget in enumerate(labels)}
    rates = rates.assign(_order=rates["budget"].map(order)).sort_values(["_order", "second"])
    return rates[["label", "second", "value"]], quotas


def _held_by_entity(before_after: pd.DataFrame, section: Mapping[str, Any]
                    ) -> dict[tuple[str, str], tuple[int, int]]:
    """(entity path, quota) -> the throttled client-seconds of the (user, client-id) pairs it
    governs under ``section``, recorded and replayed."""
    settings = settings_from_section(section)
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for r in before_after.itertuples(index=False):
        for qt in QuotaType:
            entity = resolve(settings.for_type(qt), qt, str(r.user), str(r.client_id)).entity
            if entity is not None:
                key = (entity.path, qt.value)
                before, after = out.get(key, (0, 0))
                out[key] = (before + int(r.recorded_held_seconds), after + int(r.held_seconds))
    return out


def _before_after(totals: pd.DataFrame, recorded: pd.DataFrame,
                  pairs: list[tuple[str, str]], section: Mapping[str, Any]) -> pd.DataFrame:
    """Per (user, client-id): the entities whose budgets it records into under ``section``,
    then throttled client-seconds (``held``), throttled requests, time held back and bytes
    delayed, recorded and replayed."""
    rec = recorded.groupby(["user", "client_id"]).agg(
        recorded_throttled_requests=("requests", "sum"),
        recorded_held_back_s=("throttle_ms", "sum"),
        recorded_bytes_delayed=("moved", "sum")).reset_index()
    rec["recorded_held_back_s"] = rec["recorded_held_back_s"] / 1000.0
    replayed = totals[["user", "client_id", "throttled_requests", "throttle_ms",
                       "bytes_delayed", "held_seconds", "recorded_held_seconds"]].assign(
        held_back_s=totals["throttle_ms"] / 1000.0)
    out = replayed.drop(columns="throttle_ms").merge(rec, on=["user", "client_id"],
                                                     how="outer")
    numbers = [c for c in out.columns if c not in ("user", "client_id")]
    out[numbers] = out[numbers].fillna(0)
    counts = ["throttled_requests", "bytes_delayed", "recorded_throttled_requests",
              "recorded_bytes_delayed", "held_seconds", "recorded_held_seconds"]
    out[counts] = out[counts].astype("int64")
    settings = settings_from_section(section)
    names = {}
    for user, client_id in pairs:
        found = []
        for qt in QuotaType:
            entity = resolve(settings.for_type(qt), qt, user, client_id).entity
            if entity is not None:
                found.append(f"{entity.path} ({qt.short})")
        names[(user, client_id)] = ", ".join(found) or "none"
    out["entities"] = [names.get((u, c), "none")
                       for u, c in zip(out["user"], out["client_id"], strict=True)]
    return out
