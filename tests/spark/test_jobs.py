"""The Spark jobs' transforms on small fixed DataFrames (one local session for all)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from kafka_quota_proxy.quota.replay import Recorded, replay, settings_from_section
from kafka_quota_proxy.spark_jobs.entity_pass import entity_pass, split, unpacked
from kafka_quota_proxy.spark_jobs.entity_pass import packed as entity_pass_packed
from kafka_quota_proxy.spark_jobs.held import held_seconds
from kafka_quota_proxy.spark_jobs.profile import (
    FOR_THE_REPLAY,
    entity_profile,
    per_interval,
)
from kafka_quota_proxy.spark_jobs.replay import (
    catalog_of,
    entity_totals,
    match_rate,
    replay_capture,
    replay_summary,
    throttle_histogram,
)
from kafka_quota_proxy.spark_jobs.tune import TuneOptions, recommend

COLUMNS = ["run", "seq", "ts_ms", "quota_ms", "connection", "broker", "user", "client_id",
           "client_address", "api_key", "api_version", "request_bytes", "response_bytes",
           "duration_us", "request_time_ms", "follower", "throttle_produce_ms",
           "throttle_fetch_ms", "throttle_request_ms", "client_rack", "quota_generation"]
SCHEMA = ("run string, seq long, ts_ms long, quota_ms long, connection long, broker int, "
          "user string, client_id string, client_address string, api_key short, "
          "api_version short, request_bytes int, response_bytes int, duration_us long, "
          "request_time_ms double, follower boolean, throttle_produce_ms int, "
          "throttle_fetch_ms int, throttle_request_ms int, client_rack string, "
          "quota_generation int")


def capture(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    base = {"run": "r", "connection": 1, "broker": 1, "user": "ANONYMOUS", "client_address": "",
            "api_version": 9, "response_bytes": 54, "duration_us": 1000,
            "request_time_ms": 0.0, "follower": False, "throttle_produce_ms": 0,
            "throttle_fetch_ms": 0, "throttle_request_ms": 0, "client_rack": None,
            "quota_generation": 0, "api_key": 0, "request_bytes": 50}
    full = [{**base, **r} for r in rows]
    for r in full:
        r.setdefault("quota_ms", r["ts_ms"])
    return spark.createDataFrame([tuple(r[c] for c in COLUMNS) for r in full], SCHEMA)


PRODUCE_1000 = {"entities": [{"client_id": "c", "producer_byte_rate": 1000}]}


def burst(spark: SparkSession, recorded: list[int] | None = None) -> DataFrame:
    """12 produce requests of 1,000 B (plus framing) 10 ms apart, from client c."""
    recorded = recorded or [0] * 12
    return capture(spark, [{"seq": i, "ts_ms": 10 * i, "client_id": "c",
                            "request_bytes": 1004, "throttle_produce_ms": recorded[i]}
                           for i in range(12)])


def test_replay_throttles_the_burst_and_matches_what_was_recorded(spark: SparkSession) -> None:
    replayed = replay_capture(burst(spark), candidate=PRODUCE_1000)
    got = replayed.select("seq", "produce_ms").orderBy("seq").toPandas()
    assert list(got["produce_ms"][:10]) == [0] * 10 and all(got["produce_ms"][10:] > 0)
    # Recorded under that same config: a full match; recorded without quotas: 10 of 12.
    truth = list(got["produce_ms"])
    assert match_rate(replay_capture(burst(spark, truth), candidate=PRODUCE_1000)) == (12, 12)
    assert match_rate(replayed) == (10, 12)


def test_replay_uses_the_live_config_of_each_generation(spark: SparkSession) -> None:
    frame = burst(spark)
    live = {("r", 0): {"entities": []}}
    replayed = replay_capture(frame, live=live)
    assert match_rate(replayed) == (12, 12)  # nothing was throttled, nothing is


def test_replay_in_buckets_gives_what_the_engine_gives_the_whole_broker(
        spark: SparkSession) -> None:
    """Each broker's requests are replayed in buckets of client-ids (here): every request
    still gets the throttle the pure engine gives it over the broker's requests in order."""
    rows = [{"seq": i, "ts_ms": 7 * i, "client_id": f"c{i % 5}", "broker": 1 + i % 2,
             "request_bytes": 600 + 37 * (i % 11)} for i in range(300)]
    section = {"entities": [{"client-id": "<default>", "producer_byte_rate": 2000}]}
    got = replay_capture(capture(spark, rows), candidate=section).select(
        "seq", "client_id", "produce_ms").toPandas()
    expected = {}
    for broker in (1, 2):
        mine = [Recorded(r["seq"], r["ts_ms"], "ANONYMOUS", r["client_id"], 0,
                         r["request_bytes"], 54, 1000, 0.0, False, 0)
                for r in rows if r["broker"] == broker]
        expected.update({t.seq: t.produce_ms
                         for t in replay(mine, settings_from_section(section))})
    assert dict(zip(got["seq"], got["produce_ms"], strict=True)) == expected
    assert sum(1 for v in expected.values() if v > 0) >= 20
    assert set(got["client_id"]) == {f"c{i}" for i in range(5)}


def test_entity_totals(spark: SparkSession) -> None:
    replayed = replay_capture(burst(spark), candidate=PRODUCE_1000)
    throttled = replayed.where("throttle_ms > 0").toPandas()
    summary = replay_summary(burst(spark), candidate=PRODUCE_1000, bucket_ms=10_000)
    assert list(throttle_histogram(summary).toPandas()["requests"]) == [2]
    assert match_rate(summary) == match_rate(replayed) == (10, 12)
    # throttled client-seconds: the seconds the two holds touch, from each request's time
    rows = burst(spark).select("seq", "quota_ms").toPandas().merge(
        replayed.select("seq", "throttle_ms").toPandas(), on="seq")
    held = int(held_seconds(np.zeros(len(rows), np.int64), rows["quota_ms"].to_numpy(),
                            rows["throttle_ms"].to_numpy()).sum())
    assert held >= 2
    expected = spark.createDataFrame(pd.DataFrame([{
        "user": "ANONYMOUS", "client_id": "c", "requests": 12, "throttled_requests": 2,
        "throttle_ms": int(throttled["throttle_ms"].sum()), "bytes_delayed": 2008,
        "recorded_throttled_requests": 0, "recorded_throttle_ms": 0,
        "held_seconds": held, "recorded_held_seconds": 0}]))
    assertDataFrameEqual(entity_totals(summary), expected, checkRowOrder=False)


def test_per_second_rates(spark: SparkSession) -> None:
    frame = capture(spark, [
        {"seq": 1, "ts_ms": 0, "client_id": "p", "request_bytes": 504},
        {"seq": 2, "ts_ms": 500, "client_id": "p", "request_bytes": 504},
        {"seq": 3, "ts_ms": 1500, "client_id": "p", "request_bytes": 1004},
        {"seq": 4, "ts_ms": 200, "client_id": "f", "api_key": 1, "response_bytes": 2004},
        {"seq": 5, "ts_ms": 300, "client_id": "f", "api_key": 1, "response_bytes": 9004,
         "follower": True},  # replica fetches do not count
    ])
    expected = spark.createDataFrame([
        ("ANONYMOUS", "f", 1, 0, 2, 0.0, 2000.0, 0.2),
        ("ANONYMOUS", "p", 1, 0, 2, 1000.0, 0.0, 0.2),
        ("ANONYMOUS", "p", 1, 1, 1, 1000.0, 0.0, 0.1),
    ], "user string, client_id string, broker int, interval long, requests long, "
       "produce_rate double, fetch_rate double, request_percentage double")
    assertDataFrameEqual(per_interval(frame, 1), expected, checkRowOrder=False)
    profile = entity_profile(frame).toPandas().set_index("client_id")
    assert profile.loc["p", "produce_rate_max"] == 1000.0
    assert profile.loc["p", "produce_bytes"] == 2000  # as the quota counts: frames less 4 B
    assert abs(profile["request_time_share"].sum() - 1.0) < 1e-9
    # The jobs' pass (numbers to the Python workers, the names joined back): the same profile.
    names = catalog_of(frame).names
    passed = split(entity_pass(frame, names).toPandas(), names)[0]
    pd.testing.assert_frame_equal(
        passed.drop(columns=["entity", *FOR_THE_REPLAY]),
        profile.reset_index()[passed.columns.drop(["entity", *FOR_THE_REPLAY])]
        .sort_values(["user", "client_id"]).reset_index(drop=True), check_dtype=False)


def test_tune_defaults_and_overrides_for_outliers() -> None:
    rows = [{"client_id": f"c{i}", "produce_rate_p99": 1000.0 + i, "fetch_rate_p99": 0.0,
             "request_percentage_p99": 1.0} for i in range(20)]
    rows.append({"client_id": "whale", "produce_rate_p99": 1e6, "fetch_rate_p99": 5e5,
                 "request_percentage_p99": 30.0})
    section = recommend(pd.DataFrame(rows), TuneOptions(headroom=1.5, default_percentile=0.9))
    by_client = {e["client-id"]: e for e in section["entities"]}
    default = by_client["<default>"]["producer_byte_rate"]
    assert 1500 <= default <= 1600  # 1.5 x the 90th percentile of the small clients
    assert by_client["whale"]["producer_byte_rate"] == 1_500_000
    assert set(by_client) == {"<default>", "whale"}
    capped = recommend(pd.DataFrame(rows), TuneOptions(capacity_bytes={"produce": 500_000}))
    caps = {e["client-id"]: e.get("producer_byte_rate") for e in capped["entities"]}
    assert caps["whale"] + 20 * caps["<default>"] <= 500_000


def test_a_quota_is_drawn_as_steps_at_each_generation() -> None:
    """rates.png: the live quota as it was over time (a reload at 30 s: 1 -> 2 MB/s), to the
    end of the plot; a generation before the plot starts holds from its start."""
    from kafka_quota_proxy.spark_jobs.report import QuotaLine

    line = QuotaLine("live", [(990.0, 1e6), (1030.0, 2e6), (1100.0, 3e6)])
    assert line.steps(1000, 1060) == ([0.0, 30.0, 60.0], [1e6, 2e6, 2e6])
    assert QuotaLine("x", [(0.0, 5.0)]).steps(1000, 1010) == ([0.0, 10.0], [5.0, 5.0])


def test_the_pass_moves_every_request_column_whole(spark: SparkSession) -> None:
    """``entity_pass.packed`` and ``unpacked``: extreme values (broker -1 and 2^31-1, no
    response, sizes to 2^31-1, throttles to 2^31-1 (the largest kept), api keys other than
    produce and fetch, replica fetches, two runs) come back as the capture holds them."""
    big = 2**31 - 1
    frame = capture(spark, [
        {"seq": 1, "ts_ms": 0, "client_id": "a", "broker": -1, "response_bytes": -1,
         "throttle_fetch_ms": big, "api_key": 1, "follower": True},
        {"seq": 2, "ts_ms": 5, "client_id": "b", "broker": big, "request_bytes": big,
         "response_bytes": big, "throttle_produce_ms": 7, "throttle_request_ms": 9},
        {"seq": 3, "ts_ms": 9, "run": "s", "client_id": "a", "api_key": 18,
         "duration_us": -1, "request_time_ms": 2.5, "connection": 2**62},
    ])
    names = catalog_of(frame).names
    rows = frame.select(*entity_pass_packed(frame, names, True)).toPandas()
    order = np.asarray([{r: i for i, r in names.runs.items()}[run]
                        for run in sorted(names.runs.values())], dtype=np.int64)
    back = unpacked(rows, order).sort_values("seq").reset_index(drop=True)
    assert back["broker"].tolist() == [-1, big, 1]
    assert back["response_bytes"].tolist() == [-1, big, 54]
    assert back["request_bytes"].tolist() == [50, big, 50]
    assert back["throttle_produce_ms"].tolist() == [big, 9, 0]  # the largest of the three
    assert back["api_key"].tolist() == [1, 0, 2] and back["follower"].tolist() == [
        True, False, False]
    assert back["duration_us"].tolist() == [1000, 1000, -1]
    assert back["request_time_ms"].tolist() == [0.0, 0.0, 2.5]
    assert back["connection"].tolist() == [1, 1, 2**62]
    assert [names.runs[r] for r in back["run"]] == ["r", "r", "s"]
    assert [names.entities[e] for e in back["user"]] == [
        ("ANONYMOUS", "a"), ("ANONYMOUS", "b"), ("ANONYMOUS", "a")]


def test_the_report_draws_the_budgets_that_moved_the_most(spark: SparkSession) -> None:
    """``main._top_budgets``: the produce/fetch budgets that moved the most bytes on one
    broker (from the pass's bytes per broker), drawn from a pass over their own requests:
    the same series as the per-second rows of every budget give (``budget_seconds``). Carol's
    two client-ids share one user budget; a replica fetch and seconds below zero do not
    count."""
    from kafka_quota_proxy.quota.entities import QuotaType
    from kafka_quota_proxy.spark_jobs.main import _top_budgets
    from kafka_quota_proxy.spark_jobs.profile import budget_seconds, entity_seconds
    from kafka_quota_proxy.spark_jobs.tune import budget_mapping

    rows = []
    for s in range(5):
        rows += [{"seq": 10 * s, "ts_ms": 1000 * s, "user": "alice", "client_id": "a",
                  "request_bytes": 3004},
                 {"seq": 10 * s + 1, "ts_ms": 1000 * s + 1, "user": "carol", "client_id": "c1",
                  "request_bytes": 1504, "broker": 2},
                 {"seq": 10 * s + 2, "ts_ms": 1000 * s + 2, "user": "carol", "client_id": "c2",
                  "request_bytes": 1004, "broker": 2},
                 {"seq": 10 * s + 3, "ts_ms": 1000 * s + 3, "user": "bob", "client_id": "b",
                  "api_key": 1, "response_bytes": 2004 if s else -1},
                 {"seq": 10 * s + 4, "ts_ms": 1000 * s + 4, "user": "eve", "client_id": "e",
                  "api_key": 1, "response_bytes": 9_000_004, "follower": True},
                 {"seq": 10 * s + 5, "ts_ms": 1000 * s + 5, "user": "dan", "client_id": "d",
                  "request_bytes": 104}]
    frame = capture(spark, rows)
    catalog = catalog_of(frame)
    section = {"entities": [{"user": "carol", "producer_byte_rate": 10},
                            {"client-id": "<default>", "producer_byte_rate": 10,
                             "consumer_byte_rate": 10}]}
    mapping = budget_mapping(list(catalog.names.entities.values()), section,
                             [QuotaType.PRODUCE, QuotaType.FETCH])
    per_broker = split(entity_pass(frame, catalog.names).toPandas(), catalog.names)[2]
    series, quotas = _top_budgets(frame, per_broker, mapping, catalog, section, "x", [], n=3)
    assert list(quotas) == ["clients/a produce", "users/carol produce", "clients/b fetch"]
    every = budget_seconds(entity_seconds(frame), mapping, catalog.entity_frame).toPandas()
    labels = {"users/carol produce": ("carol", "produce", 2),
              "clients/a produce": ("a", "produce", 1), "clients/b fetch": ("b", "fetch", 1)}
    for label, (name, qt, broker) in labels.items():
        budget = mapping[(mapping["quota_type"] == qt) & (
            (mapping["budget_user"] == name) | (mapping["budget_client"] == name))][
            "budget"].iloc[0]
        want = every[(every["budget"] == budget) & (every["broker"] == broker)].sort_values(
            "second")
        got = series[series["label"] == label]
        assert got["second"].tolist() == want["second"].tolist()
        assert got["value"].tolist() == want["value"].tolist()
    assert series[series["label"] == "users/carol produce"]["value"].tolist() == [2500.0] * 5
    assert series[series["label"] == "clients/b fetch"]["value"].tolist() == [2000.0] * 4


def test_the_pass_counts_the_recorded_throttles(spark: SparkSession) -> None:
    """``entity_pass``'s recorded throttles: per (user, client-id, 100 ms bucket) of the
    requests the proxy held back, what ``profile.recorded_throttles`` sums in Spark (holds of
    every quota type, the largest of the three; a fetch moves its response)."""
    from kafka_quota_proxy.spark_jobs.profile import recorded_throttles

    frame = capture(spark, [
        {"seq": 1, "ts_ms": 0, "client_id": "p", "request_bytes": 504,
         "throttle_produce_ms": 250},
        {"seq": 2, "ts_ms": 10, "client_id": "p", "request_bytes": 604,
         "throttle_produce_ms": 299, "throttle_request_ms": 120},
        {"seq": 3, "ts_ms": 20, "client_id": "p", "request_bytes": 704},
        {"seq": 4, "ts_ms": 30, "client_id": "f", "api_key": 1, "response_bytes": 9004,
         "throttle_fetch_ms": 1050},
        {"seq": 5, "ts_ms": 40, "client_id": "q", "api_key": 3, "throttle_request_ms": 99},
    ])
    names = catalog_of(frame).names
    got = split(entity_pass(frame, names).toPandas(), names)[3]
    want = recorded_throttles(frame).toPandas()
    key = ["user", "client_id", "bucket_ms"]
    pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                  want.sort_values(key).reset_index(drop=True),
                                  check_dtype=False)
    assert got.sort_values(key)["requests"].tolist() == [1, 2, 1]  # f, p (200 ms), q
