"""The one pass's work in the Python workers (``spark_jobs.entity_pass``), without Spark: the
per-second rows against a plain groupby of the capture rows by the recording rule, each
entity's bytes per broker, the recorded throttles per bucket, and a group's results keeping
64-bit hashes whole when its parts have different columns. (The Spark side:
tests/spark/test_jobs.py, test_tune.py and test_replay_fast.py.)"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kafka_quota_proxy.spark_jobs import entity_pass
from kafka_quota_proxy.spark_jobs.entity_pass import (
    BYTES_PART,
    PROFILE_PART,
    RECORDED_PART,
    SEGMENT_PART,
    broker_bytes,
    per_group,
    per_second_rows,
)


def capture_rows(seed: int) -> pd.DataFrame:
    """``entity_pass.unpacked``'s shape: the entity in ``user``, api key 0, 1 or 2."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    return pd.DataFrame({
        "run": rng.choice([-(2**63), 3, 2**63 - 1], n),
        "broker": rng.choice(np.array([-1, 0, 2, 2**31 - 1], dtype=np.int32), n),
        "connection": rng.integers(0, 4, n), "user": rng.choice([-(2**62) - 1, 0, 2**62 + 1], n),
        "client_id": 0, "seq": np.arange(n),
        "ts_ms": 1_790_000_000_000 + rng.integers(0, 30_000, n),
        "duration_us": rng.choice([-1, 0, 1, 250, 2_000_000], n),
        "api_key": rng.integers(0, 3, n).astype(np.int16),
        "follower": rng.random(n) < 0.2,
        "request_bytes": rng.integers(0, 2**20, n).astype(np.int32),
        "response_bytes": rng.choice(np.array([-1, 0, 3, 4, 5, 2**31 - 1], dtype=np.int32), n),
        "request_time_ms": 0.0, "throttle_produce_ms": 0, "throttle_fetch_ms": 0,
        "throttle_request_ms": 0})


@pytest.mark.parametrize("seed", range(10))
def test_per_second_rows_are_the_plain_sums(seed: int) -> None:
    c = capture_rows(seed)
    consumer = (c["api_key"] == 1) & ~c["follower"]
    response = c["response_bytes"].astype(np.int64)
    plain = pd.DataFrame({
        "entity": c["user"], "broker": c["broker"], "interval": c["ts_ms"] // 1000,
        "requests": 1,
        "produce_rate": np.where(c["api_key"] == 0, c["request_bytes"] - 4, 0).astype(float),
        "fetch_rate": np.where(consumer, response - 4, 0).astype(float),
        "request_percentage": c["duration_us"].clip(lower=0) / 1000.0,
        "fetch_bound": np.where(consumer, (response - 4).clip(lower=0), 0),
        "moved": np.where(c["api_key"] == 1, response, c["request_bytes"].astype(np.int64)),
    }).groupby(["entity", "broker", "interval"], as_index=False).sum()
    plain["request_percentage"] /= 10.0
    got = per_second_rows(c.sample(frac=1.0, random_state=seed))
    pd.testing.assert_frame_equal(got, plain, check_dtype=False, rtol=1e-12)
    assert got["moved"].max() > 2**31  # (sums of sizes past 32 bits)


def test_bytes_per_broker_count_seconds_above_zero_only() -> None:
    sec = pd.DataFrame({"entity": [7, 7, 7, 8], "broker": [1, 1, 2, 1],
                        "produce_rate": [100.0, -4.0, 5.0, 0.0],
                        "fetch_rate": [-5.0, 30.0, 0.0, 1.0]})
    got = broker_bytes(sec).sort_values(["entity", "broker"]).reset_index(drop=True)
    assert got.to_dict("list") == {"entity": [7, 7, 8], "broker": [1, 2, 1],
                                   "produce_total": [100.0, 5.0, 0.0],
                                   "fetch_total": [30.0, 0.0, 1.0]}


def test_a_groups_parts_keep_their_hashes_whole() -> None:
    """The profile, bytes and segment rows of one group in one frame: the run's and the
    connection's numbers exist only in segment rows, and 64-bit hashes near 2^63 must not pass
    through floats on the way (they did, and the driver then met run hashes it never saw)."""
    c = capture_rows(3)
    run_ids = np.array([2**63 - 25, -(2**63) + 1], dtype=np.int64)
    meta = ((np.arange(len(c)) % 2).astype(np.int64) << 40) | (
        (c["broker"].to_numpy().astype(np.int64) & 0xFFFFFFFF) << 8) | (
        c["follower"].to_numpy().astype(np.int64) << 2) | c["api_key"].to_numpy()
    pdf = pd.DataFrame({
        "group": 0, "entity": c["user"], "connection": c["connection"] + 2**62,
        "seq": c["seq"], "ts_ms": c["ts_ms"], "duration_us": c["duration_us"], "meta": meta,
        "sizes": (c["request_bytes"].to_numpy().astype(np.int64) << 32)
        | (c["response_bytes"].to_numpy().astype(np.int64) & 0xFFFFFFFF),
        "held": np.where(np.arange(len(c)) % 7 == 0, 300, 0)})
    back = entity_pass.unpacked(pdf, run_ids)
    for column in ("broker", "api_key", "follower", "request_bytes", "response_bytes"):
        assert (back[column].to_numpy() == c[column].to_numpy()).all(), column
    assert set(back["run"]) == set(run_ids.tolist())
    out = per_group(pdf, run_ids, 13, ["produce", "fetch"], 11_000.0, 1000.0)
    assert list(out.columns) == entity_pass._SCHEMA_COLUMNS
    assert set(out["part"]) == {PROFILE_PART, BYTES_PART, SEGMENT_PART, RECORDED_PART}
    segments = out[out["part"] == SEGMENT_PART]
    assert set(segments["run_id"]) == set(run_ids.tolist())
    assert set(segments["connection"]) <= set((c["connection"] + 2**62).tolist())
    assert set(out["entity"]) == set(c["user"].tolist())
    for column in entity_pass._INTEGERS:
        assert out[column].dtype == np.int64, column


def test_recorded_throttles_are_bucketed_by_the_hold() -> None:
    c = capture_rows(1).head(6).assign(
        user=[1, 1, 1, 2, 2, 2], api_key=np.array([0, 0, 1, 1, 2, 0], dtype=np.int16),
        request_bytes=np.array([10, 20, 30, 40, 50, 60], dtype=np.int32),
        response_bytes=np.array([-1, 0, 700, 800, 900, 0], dtype=np.int32),
        throttle_produce_ms=[0, 150, 199, 1000, 99, 0])
    got = entity_pass.recorded(c).sort_values(["entity", "bucket_ms"]).reset_index(drop=True)
    assert got.to_dict("list") == {"entity": [1, 2, 2], "bucket_ms": [100, 0, 1000],
                                   "requests": [2, 1, 1], "throttle_ms": [349, 99, 1000],
                                   "moved": [720, 50, 800]}
