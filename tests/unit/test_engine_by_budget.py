"""The replay's engine budget by budget (``spark_jobs.engine``) gives every request the
throttles ``quota.replay.replay_rows`` gives it, under Kafka's maths with one config:
client-id and user budgets, shared budgets, request quotas, capped throttles, several window
shapes, replica fetches, requests with no response, idle gaps past the sensors' expiry."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kafka_quota_proxy.quota.replay import replay_rows, settings_from_section
from kafka_quota_proxy.spark_jobs import engine

CONFIGS: dict[str, dict[str, Any]] = {
    "client-ids": {"entities": [{"client-id": "<default>", "producer_byte_rate": 300,
                                 "consumer_byte_rate": 500}]},
    "users and overrides": {"window": {"samples": 3, "size_seconds": 2}, "entities": [
        {"user": "<default>", "producer_byte_rate": 4000, "consumer_byte_rate": 2500},
        {"user": "u1", "client-id": "c4", "producer_byte_rate": 300},
        {"client-id": "c7", "consumer_byte_rate": 900}]},
    "request time": {"entities": [{"client-id": "<default>", "request_percentage": 0.05},
                                  {"user": "u2", "producer_byte_rate": 1500}]},
    "capped": {"cap_byte_rate_throttle": True, "window": {"samples": 5, "size_seconds": 1},
               "entities": [{"user": "<default>", "client-id": "<default>",
                             "producer_byte_rate": 700, "consumer_byte_rate": 800}]},
    "one sample": {"window": {"samples": 1, "size_seconds": 1}, "entities": [
        {"client-id": "<default>", "producer_byte_rate": 2000}]},
}


def requests(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(200, 4000))
    gaps = rng.choice([0, 1, 7, 40, 300, 2500, 70_000], n, p=[.1, .2, .2, .2, .15, .14, .01])
    return {
        "times": np.cumsum(gaps).astype(np.int64) + 10_000,
        "codes": rng.integers(0, 9, n),
        "api_key": rng.choice([0, 1, 3], n, p=[.45, .45, .1]).astype(np.int16),
        "request_bytes": rng.integers(40, 6000, n).astype(np.int32),
        "response_bytes": np.where(rng.random(n) < 0.05, -1,
                                   rng.integers(20, 9000, n)).astype(np.int32),
        "request_time_ms": np.where(rng.random(n) < 0.5, rng.uniform(0.01, 40, n), 0.0),
        "follower": rng.random(n) < 0.05,
    }


NAMES = [(f"u{c % 3}", f"c{c}") for c in range(9)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("seed", range(6))
def test_budget_by_budget_is_the_engine(config: str, seed: int) -> None:
    settings = settings_from_section(CONFIGS[config])
    r = requests(seed)
    rows = zip(r["times"].tolist(), [NAMES[c][0] for c in r["codes"]],
               [NAMES[c][1] for c in r["codes"]], r["api_key"].tolist(),
               r["request_bytes"].tolist(), r["response_bytes"].tolist(),
               [0] * len(r["times"]), r["request_time_ms"].tolist(), r["follower"].tolist(),
               [0] * len(r["times"]), [None] * len(r["times"]), strict=True)
    want = replay_rows(rows, settings)
    got = engine.throttles(r["times"], r["codes"], NAMES, r["api_key"], r["request_bytes"],
                           r["response_bytes"], r["request_time_ms"], r["follower"], settings)
    for kind, a, b in zip(("produce", "fetch", "request"), want, got, strict=True):
        assert b.tolist() == list(a), kind
    assert any(np.asarray(a).any() for a in want)  # something throttles


def test_strict_pacing_is_not_for_it() -> None:
    assert engine.applies(settings_from_section(CONFIGS["client-ids"]))
    assert not engine.applies(settings_from_section({**CONFIGS["client-ids"],
                                                     "pacing": "strict"}))
