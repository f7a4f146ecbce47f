"""The replay leaves out of the quota engine the requests of budgets that cannot throttle
(``spark_jobs.replay._may_throttle``) and gives every request exactly the throttles a replay
of all of them gives: budgets near, under and far over their quota, shared budgets, request
quotas, idle gaps past the sensors' expiry, quota generations, several windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kafka_quota_proxy.quota.manager import QuotaManager
from kafka_quota_proxy.quota.replay import expiry_times, replay_rows, settings_from_section
from kafka_quota_proxy.spark_jobs import bounds
from kafka_quota_proxy.spark_jobs.capture import read_capture
from kafka_quota_proxy.spark_jobs.entity_pass import entity_pass, split
from kafka_quota_proxy.spark_jobs.replay import (
    BUCKETS,
    Names,
    _may_throttle,
    _run_engine,
    catalog_of,
    entity_totals,
    match_rate,
    names_of,
    packed,
    replay_summary,
    throttle_histogram,
    unpacked,
)
from testkit.synth_capture import generate

RUN = "r-1"
RUN_ID = 7


def group(seed: int, n: int = 6000, gap_ms: int = 0) -> tuple[pd.DataFrame, Names]:
    """One (run, broker) group: 12 clients of 3 users at rates from a tenth to twice
    1,000 B/s (in bytes per request of about 100 B), produce and fetch, some acks=0 and
    replica fetches, over about a minute, with an idle gap of ``gap_ms`` in the middle."""
    rng = np.random.default_rng(seed)
    clients = 12
    rate = np.geomspace(0.1, 2.0, clients) * 1000 / 100  # requests/s
    who = rng.choice(clients, n, p=rate / rate.sum())
    t = np.sort(rng.uniform(0, n / rate.sum() * 1000, n)).astype(np.int64)
    t[n // 2:] += gap_ms
    api = np.where(who % 3 == 2, 1, 0).astype(np.int16)
    size = rng.integers(20, 200, n)
    entities = {1000 + c: (f"u{c % 3}", f"c{c}") for c in range(clients)}
    pdf = pd.DataFrame({
        "run_id": RUN_ID, "broker": 1, "bucket": 0, "seq": np.arange(1, n + 1),
        "quota_ms": 5_000 + t, "entity": 1000 + who, "api_key": api,
        "request_bytes": np.where(api == 0, size + 4, 60).astype(np.int32),
        "response_bytes": np.where(api == 0, np.where(rng.random(n) < 0.05, -1, 50),
                                   size + 4).astype(np.int32),
        "request_time_ms": np.where(rng.random(n) < 0.5, rng.uniform(0.1, 30, n), 0.0),
        "follower": (api == 1) & (rng.random(n) < 0.05),
        "quota_generation": (t > t[n // 3]).astype(np.int32),
        "throttle_produce_ms": 0, "throttle_fetch_ms": 0, "throttle_request_ms": 0,
        "storage_scale": -1.0,
    })
    shuffled = pdf.sample(frac=1.0, random_state=seed)  # the engine's order is its own
    return shuffled, Names({RUN_ID: RUN}, entities)


def every_request(pdf: pd.DataFrame, names: Names,
                  live: dict[tuple[str, int], Any]) -> list[np.ndarray]:
    """The throttles of a replay of every request (the engine's own expiry schedule)."""
    pdf = pdf.sort_values(["quota_ms", "seq"], kind="stable")
    rows = zip(pdf["quota_ms"].tolist(),
               [names.entities[e][0] for e in pdf["entity"]],
               [names.entities[e][1] for e in pdf["entity"]],
               *[pdf[c].tolist() for c in ("api_key", "request_bytes", "response_bytes")],
               [0] * len(pdf),
               *[pdf[c].tolist() for c in ("request_time_ms", "follower",
                                           "quota_generation", "storage_scale")],
               strict=True)
    got = replay_rows(rows, lambda g: live[(RUN, g)])
    return [np.asarray(x, dtype=np.int32) for x in got]


CONFIGS = {
    "client-ids": {"entities": [{"client-id": "<default>", "producer_byte_rate": 1000,
                                 "consumer_byte_rate": 1000}]},
    "users, few windows": {"window": {"samples": 3, "size_seconds": 1}, "entities": [
        {"user": "<default>", "producer_byte_rate": 2500, "consumer_byte_rate": 1500},
        {"user": "u1", "client-id": "c4", "producer_byte_rate": 300}]},
    "request time": {"entities": [{"client-id": "<default>", "request_percentage": 2.0},
                                  {"client-id": "c11", "producer_byte_rate": 900}]},
    "capped": {"cap_byte_rate_throttle": True, "window": {"samples": 5, "size_seconds": 2},
               "entities": [{"client-id": "<default>", "producer_byte_rate": 700}]},
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("gap_ms", [0, 3_700_000])
def test_leaving_out_budgets_that_cannot_throttle_changes_no_throttle(
        config: str, gap_ms: int) -> None:
    section = CONFIGS[config]
    settings = settings_from_section(section)
    for seed in range(3):
        pdf, names = group(seed, gap_ms=gap_ms)
        expected = every_request(pdf, names, {(RUN, 0): settings, (RUN, 1): settings})
        assert sum(int((x > 0).sum()) for x in expected) > 50  # some budgets throttle
        ordered = pdf.sort_values(["quota_ms", "seq"], kind="stable")
        codes, uniques = pd.factorize(ordered["entity"])
        left = _may_throttle(ordered, codes, [names.entities[int(e)] for e in uniques],
                             settings)
        assert left is not None and 0 < left.sum() < len(left)  # some are left out
        for candidate in (settings, None):  # a candidate, or the same config live twice
            _, *got = _run_engine(pdf, candidate,
                                  {(RUN, 0): settings, (RUN, 1): settings}, names, {})
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_array_equal(g, e)


def test_generations_with_different_configs_replay_every_request() -> None:
    pdf, names = group(5)
    live = {(RUN, 0): settings_from_section(CONFIGS["client-ids"]),
            (RUN, 1): settings_from_section(CONFIGS["users, few windows"])}
    _, *got = _run_engine(pdf, None, live, names, {})
    for g, e in zip(got, every_request(pdf, names, live), strict=True):
        np.testing.assert_array_equal(g, e)


def test_the_idle_expiry_runs_when_a_replay_of_every_request_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``expiry_times`` is the engine's own schedule, and a replay of some of the requests
    given it runs each expiry, at its time, before the first of them at or after it."""
    calls: list[int] = []
    original = QuotaManager.expire

    def expire(self: QuotaManager, now_ms: int) -> int:
        calls.append(now_ms)
        return original(self, now_ms)

    monkeypatch.setattr(QuotaManager, "expire", expire)
    settings = settings_from_section(CONFIGS["client-ids"])
    times = [0, 10, 59_999, 60_000, 60_001, 130_000, 130_000, 190_000, 4_000_000, 4_000_001]
    rows = [(t, "u", "c", 0, 104, 50, 0, 0.0, False, 0, None) for t in times]
    replay_rows(rows, settings)
    assert calls == expiry_times(times) == [60_000, 130_000, 190_000, 4_000_000]
    calls.clear()
    replay_rows([rows[i] for i in (1, 6, 9)], settings, expire_at=expiry_times(times))
    assert calls == [60_000, 130_000, 190_000, 4_000_000]


def test_the_columns_cross_to_python_packed_and_come_back_as_they_were(
        spark: SparkSession) -> None:
    """``packed`` folds the replay's columns into few numbers for the trip to the Python
    workers and ``unpacked`` gives every value back: brokers -1 and up to 2**31 - 1, no
    response (-1), api keys, followers, generations, throttles up to 2**31 - 1, several runs,
    request time and storage scale when they travel (0 and -1 when they do not)."""
    rows = []
    for i, (broker, response, throttle) in enumerate(
            [(-1, -1, 0), (0, 54, 1), (2**31 - 1, 2**31 - 1, 2**31 - 1), (7, 0, 123_456)]):
        for run in ("run-b", "run-a"):
            rows.append((run, i, 1000 + i, broker, "u", f"c{i}", i % 3, 2**31 - 1 - i,
                         response, 0.25 * i, i % 2 == 1, 5 * i, throttle, i, throttle // 2,
                         None if i % 2 else 0.5))
    frame = spark.createDataFrame(rows, (
        "run string, seq long, quota_ms long, broker int, user string, client_id string, "
        "api_key short, request_bytes int, response_bytes int, request_time_ms double, "
        "follower boolean, quota_generation int, throttle_produce_ms int, "
        "throttle_fetch_ms int, throttle_request_ms int, storage_scale double"))
    names = Names({11: "run-a", 22: "run-b"}, {})
    requests = settings_from_section({"entities": [
        {"client-id": "<default>", "request_percentage": 5}]})
    for configs, storage in (([requests], True), ([settings_from_section(
            CONFIGS["client-ids"])], False)):
        if not storage:
            frame = frame.where(F.col("storage_scale").isNull())
        got = unpacked(frame.select(*packed(configs, storage, names)).toPandas(), names)
        want = frame.toPandas().assign(
            run_id=lambda d: d["run"].map({"run-a": 11, "run-b": 22}))
        got = got.sort_values(["run_id", "seq"]).reset_index(drop=True)
        want = want.sort_values(["run_id", "seq"]).reset_index(drop=True)
        assert len(got) == len(want) > 0
        for column in ("run_id", "seq", "quota_ms", "broker", "api_key", "request_bytes",
                       "response_bytes", "follower", "quota_generation", "throttle_produce_ms",
                       "throttle_fetch_ms", "throttle_request_ms"):
            assert got[column].tolist() == want[column].tolist(), column
        assert got["bucket"].between(0, BUCKETS - 1).all()
        if storage:
            assert got["request_time_ms"].tolist() == want["request_time_ms"].tolist()
            assert got["storage_scale"].tolist() == want["storage_scale"].fillna(-1.0).tolist()
        else:
            assert (got["request_time_ms"] == 0.0).all() and (got["storage_scale"] == -1).all()


def test_a_request_under_a_storage_factor_fails_a_replay_without_storage_settings(
        spark: SparkSession) -> None:
    frame = spark.createDataFrame(
        [("r", 1, 1, 1, "u", "c", 0, 100, 54, 0.0, False, 0, 0, 0, 0, 0.5)],
        "run string, seq long, quota_ms long, broker int, user string, client_id string, "
        "api_key short, request_bytes int, response_bytes int, request_time_ms double, "
        "follower boolean, quota_generation int, throttle_produce_ms int, "
        "throttle_fetch_ms int, throttle_request_ms int, storage_scale double")
    names = Names({1: "r"}, {})
    configs = [settings_from_section(CONFIGS["client-ids"])]
    with pytest.raises(Exception, match="storage_scale but no storage settings"):
        frame.select(*packed(configs, False, names)).collect()


def test_leaving_cold_entities_out_changes_no_total(spark: SparkSession,
                                                     tmp_path: Path) -> None:
    """``replay_summary`` with the profile's peaks sends the Python workers only the
    requests of entities whose budgets may throttle, and counts the others from the
    profile: every total, histogram bucket and match is what the replay of every request
    gives, on a capture of two instances (two quota clocks) whose tenants span from far under
    to far over their quotas, with recorded throttles."""
    live = {"entities": [{"client-id": "<default>", "producer_byte_rate": 200_000,
                          "consumer_byte_rate": 300_000}]}
    generate(tmp_path / "capture", 60_000, 40, 3, duration_s=120, instances=2, live=live)
    captures = read_capture(spark, tmp_path / "capture")
    names = names_of(captures)
    catalog = catalog_of(captures, names)
    spread = bounds.clock_spread_ms(names)
    candidate = {"entities": [{"client-id": "<default>", "producer_byte_rate": 150_000,
                               "consumer_byte_rate": 250_000},
                              {"user": "<default>", "producer_byte_rate": 50_000_000}]}
    span = bounds.span_seconds(settings_from_section(candidate), spread)
    peaks = split(entity_pass(captures, catalog.names, span).toPandas(), catalog.names)[0]
    hot = bounds.hot_entities(peaks, settings_from_section(candidate), catalog.names.entities)
    assert 0 < len(hot) < len(catalog.names.entities)  # some are left out, not all

    def totals(summary: Any) -> tuple[pd.DataFrame, pd.DataFrame, tuple[int, int]]:
        t = entity_totals(summary).toPandas().sort_values(["user", "client_id"])
        h = throttle_histogram(summary).toPandas()
        return t.reset_index(drop=True), h, match_rate(summary)

    every = totals(replay_summary(captures, candidate=candidate, catalog=catalog))
    some = totals(replay_summary(captures, candidate=candidate, catalog=catalog, peaks=peaks,
                                 span=span, clock_spread_ms=spread))
    pd.testing.assert_frame_equal(some[0], every[0])
    pd.testing.assert_frame_equal(some[1], every[1])
    assert some[2] == every[2]
    assert every[0]["throttled_requests"].sum() > 0
    assert every[0]["recorded_throttled_requests"].sum() > 0


def test_peaks_are_the_most_in_any_span_of_seconds() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    codes = rng.integers(0, 4, n)
    broker = rng.integers(0, 3, n)
    second = rng.integers(0, 200, n)
    values = np.where(rng.random(n) < 0.2, -5.0, rng.integers(0, 1000, n).astype(float))
    got = bounds.peaks(codes, broker, second, values, 13, 5)
    for c in range(5):
        best = 0.0
        for b in range(3):
            own = (codes == c) & (broker == b)
            for s in range(-13, 201):
                inside = own & (second >= s) & (second < s + 13)
                best = max(best, np.maximum(values[inside], 0).sum())
        assert got[c] == best, c
