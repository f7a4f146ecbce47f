"""``replay --tune`` end to end (``spark_jobs.main.run``) on synthetic multi-tenant captures
with known demand (``bench/synth_tenants.py``), recorded under a deliberately bad live config.

Throttled client-seconds: per broker, the seconds in which each client was held back by a
throttle, summed (``synth_tenants.throttled_client_seconds``, the quota engine over the
capture's requests; what the report counts, ``spark_jobs.held``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.quota.entities import EntityKey, QuotaType, metric_tags, quota_limit
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.spark_jobs import profile, tune
from kafka_quota_proxy.spark_jobs.capture import read_capture
from kafka_quota_proxy.spark_jobs.entity_pass import entity_pass, split
from kafka_quota_proxy.spark_jobs.main import run
from kafka_quota_proxy.spark_jobs.replay import catalog_of
from testkit.offered_load import Client, Consumer, Producer, simulate, truth, write_capture
from testkit.synth_tenants import BAD_LIVE, generate, throttled_client_seconds


@dataclass
class Tuned:
    rows: pd.DataFrame
    out: Path
    facts: dict[str, Any]
    section: dict[str, Any]


def tune_capture(spark: SparkSession, directory: Path, seconds: float) -> Tuned:
    rows = generate(directory / "capture", seconds=seconds)
    out = directory / "out"
    facts = run(directory / "capture", out, None, master="local[2]", tune=True)
    section = yaml.safe_load((out / "recommended-quotas.yaml").read_text())["quotas"]
    return Tuned(rows, out, facts, section)


@pytest.fixture(scope="module")
def tuned(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Tuned:
    """Twelve minutes of nine tenants on two brokers."""
    return tune_capture(spark, tmp_path_factory.mktemp("tenants"), 720)


def entities(section: dict[str, Any]) -> dict[EntityKey, set[str]]:
    """Each entity's key (user, client-id, as the engine reads them) and its quota types."""
    out = {}
    for e in section["entities"]:
        [(key, quotas)] = settings_from_section({"entities": [e]}).entities.items()
        out[key] = {qt.value for qt in quotas}
    return out


def totals(rows: pd.DataFrame, section: dict[str, Any]) -> dict[str, float]:
    """Per quota type, the sum of the limits of the budgets the capture's clients record
    into (per broker)."""
    settings = settings_from_section(section)
    kinds = {QuotaType.PRODUCE: rows["api_key"] == 0, QuotaType.FETCH: rows["api_key"] == 1,
             QuotaType.REQUEST: rows["api_key"] >= 0}
    out = {}
    for qt, mask in kinds.items():
        quotas = settings.for_type(qt)
        pairs = rows.loc[mask, ["user", "client_id"]].drop_duplicates().itertuples(index=False)
        budgets = {metric_tags(quotas, u, c)[0] for u, c in pairs}
        out[qt.value] = sum(quota_limit(quotas, tags)[0] or 0.0 for tags in budgets)
    return out


def test_the_spark_demand_is_the_reference_rule(spark: SparkSession) -> None:
    """``profile.budget_demand`` (Spark) gives what ``tune.budget_demand`` (pandas) does."""
    rng = np.random.default_rng(3)
    mapping = tune.budget_mapping([("u1", "a"), ("u2", "b"), ("u2", "c")],
                                  {"entities": [{"user": "<default>", "producer_byte_rate": 1}]},
                                  [QuotaType.PRODUCE, QuotaType.FETCH])
    start = 1_790_000_040
    rows = [(int(b), int(broker), start - 20 + s, float(rng.lognormal(8, 1)))
            for b in mapping["budget"].unique() for broker in (1, 2)
            for s in range(0, 400, int(b) + broker)]
    seconds = pd.DataFrame(rows, columns=["budget", "broker", "second", "value"])
    got = profile.budget_demand(
        spark.createDataFrame(seconds, "budget int, broker int, second long, value double"),
        mapping, start, start + 300, 0.99, 30)
    names = mapping[["budget", *tune.KEYS]].drop_duplicates("budget")
    expected = tune.budget_demand(seconds.merge(names, on="budget"), start, start + 300, 0.99,
                                  30)
    key = tune.KEYS
    pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  expected.sort_values(key).reset_index(drop=True),
                                  check_dtype=False)


def test_the_spark_offered_load_is_the_pandas_one(spark: SparkSession, tmp_path: Path) -> None:
    """On one simulated capture (``testkit.offered_load``: alice's producer at 3 x her quota,
    bob's consumer at 2 x his, carol's two producers sharing her quota, dave's below his, never
    held back), the Spark estimator (``entity_pass``: one pass with the profile) gives
    the segments the pandas one does, so the same demand, and that is the offered load."""
    section = {"window": {"samples": 11, "size_seconds": 1}, "entities": [
        {"user": "<default>", "producer_byte_rate": 1_000_000,
         "consumer_byte_rate": 1_000_000}]}
    clients = [Client(Producer(3_000_000, batch_size=100_000), "alice", "a", 1),
               Client(Consumer(2_000_000, fetch_max_bytes=1_000_000), "bob", "b", 2),
               Client(Producer(600_000), "carol", "c1", 3),
               Client(Producer(800_000), "carol", "c2", 4, start_s=20),
               Client(Producer(300_000, batch_size=16_000), "dave", "d", 5)]
    rows = simulate(clients, section, 60)
    captures = read_capture(spark, write_capture(rows, tmp_path / "capture", section))
    catalog = catalog_of(captures)
    pairs = sorted({(c.user, c.client_id) for c in clients})
    mapping = tune.budget_mapping(pairs, section, [QuotaType.PRODUCE, QuotaType.FETCH])
    types = ["fetch", "produce"]
    start, end = tune.whole_minutes(int(rows["ts_ms"].min()), int(rows["ts_ms"].max()), 10)

    def spark_segments(types: list[str]) -> pd.DataFrame:
        return split(entity_pass(captures, catalog.names, types=types).toPandas(),
                     catalog.names)[1]

    segments = spark_segments(types)
    expected = tune.offered_load(tune.demand_requests(rows, types))
    order = [*tune.CLIENT, "segment"]
    pd.testing.assert_frame_equal(segments.sort_values(order).reset_index(drop=True),
                                  expected.sort_values(order).reset_index(drop=True),
                                  check_dtype=False)
    # request time too (what crosses to the Python workers is packed: every quota type)
    with_requests = spark_segments([*types, "request"])
    expected_all = tune.offered_load(tune.demand_requests(rows, [*types, "request"]))
    assert set(expected_all["quota_type"]) == {"fetch", "produce", "request"}
    pd.testing.assert_frame_equal(with_requests.sort_values(order).reset_index(drop=True),
                                  expected_all.sort_values(order).reset_index(drop=True),
                                  check_dtype=False)
    got = tune.offered_demand(tune.offered_intervals(segments, mapping), start, end, 0.99, 10)
    demand = {(r.quota_type, r.budget_user): r.demand for r in got.itertuples()}
    for qt, user, offered in (("produce", "alice", truth(clients[0], 60)),
                              ("fetch", "bob", truth(clients[1], 60)),
                              ("produce", "carol",
                               truth(clients[2], 60) + truth(clients[3], 60)),
                              ("produce", "dave", truth(clients[4], 60))):
        assert demand[(qt, user)] == pytest.approx(offered, rel=0.10), (qt, user)


def test_the_recommendation_keeps_every_live_entity_and_cuts_throttling(tuned: Tuned) -> None:
    live, recommended = entities(BAD_LIVE), entities(tuned.section)
    # (a) every live entity, at its level, with the quota types it had
    for key, types in live.items():
        assert recommended.get(key) == types, (key, recommended)
    # New entities: overrides of users/<default> for the heavy users, at the user level.
    added = set(recommended) - set(live)
    assert {EntityKey("bob", None), EntityKey("erin", None)} <= added
    assert all(isinstance(k.user, str) and k.client_id is None for k in added), added
    QuotasConfig.model_validate(tuned.section)  # a config the proxy loads
    # (b) at equal or lower total quota
    before, after = totals(tuned.rows, BAD_LIVE), totals(tuned.rows, tuned.section)
    print("\ntotal quota per broker, live -> recommended: "
          + ", ".join(f"{k} {before[k]:,.0f} -> {after[k]:,.0f}" for k in before))
    assert all(after[k] <= before[k] for k in before), (before, after)
    # (c) at least halves the throttled client-seconds
    bad = throttled_client_seconds(tuned.rows, BAD_LIVE)
    good = throttled_client_seconds(tuned.rows, tuned.section)
    print(f"throttled client-seconds: live (bad) config {bad}, recommended {good}")
    assert bad > 1000 and good <= 0.5 * bad
    # (d) no request percentage above 100 x the broker's threads (11 by default)
    assert all(e.get("request_percentage", 0) <= 1100 for e in tuned.section["entities"])
    assert tuned.facts["reproduction match"].endswith("(100.0000%)")


def test_the_report_shows_the_yaml_the_rule_and_before_after(tuned: Tuned) -> None:
    report = (tuned.out / "report.md").read_text()
    assert "```yaml\nquotas:\n" in report
    assert yaml.safe_dump({"quotas": tuned.section}, sort_keys=False).rstrip() in report
    assert "**Rule.** Demand of a budget" in report and "is its offered load" in report
    assert "## Before / after per entity" in report
    assert "| recorded: throttled requests | recorded: held back (s) | recorded: bytes " \
           "delayed | replayed: throttled requests |" in report
    assert "users/<default> | producer_byte_rate | 1,000,000 |" in report  # live -> new
    before_after = pd.read_csv(tuned.out / "before_after.csv").set_index("client_id")
    assert before_after.loc["bob-app", "recorded_throttled_requests"] > 1000
    # Throttled client-seconds, recorded and under the recommendation, per client and in
    # total: the engine's own count over the capture, in the report and the run's facts.
    bad = throttled_client_seconds(tuned.rows, BAD_LIVE)
    good = throttled_client_seconds(tuned.rows, tuned.section)
    assert int(before_after["recorded_held_seconds"].sum()) == bad
    assert int(before_after["held_seconds"].sum()) == good
    assert before_after.loc["bob-app", "recorded_held_seconds"] > 100
    assert tuned.facts["throttled client-seconds (recorded)"] == bad
    assert tuned.facts["throttled client-seconds (replayed, recommended config)"] == good
    assert f"**Total throttled client-seconds**: recorded {bad:,}, replayed (recommended " \
           f"config) {good:,}." in report
    assert "| recorded: throttled client-s | replayed: throttled client-s |" in report
    assert before_after["throttled_requests"].sum() < before_after[
        "recorded_throttled_requests"].sum() / 2
    for png in ("rates.png", "throttles.png", "before_after.png"):
        assert f"]({png})" in report
        assert (tuned.out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_short_capture_keeps_the_live_values_and_says_so(
        spark: SparkSession, tmp_path: Path) -> None:
    short = tune_capture(spark, tmp_path, 150)  # two whole minutes
    assert short.section["entities"] == BAD_LIVE["entities"]
    report = (short.out / "report.md").read_text()
    assert "capture too short: 2 whole minutes < min_minutes (5): kept live values" in report
