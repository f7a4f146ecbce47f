"""Under Kafka's maths, a budget's sensor removed after its idle expiry and one kept give
every later request the same throttle (a sensor idle that long holds no sample its rate
counts): what lets a replay run budgets apart and leave requests out of the engine
(``spark_jobs.bounds``, ``spark_jobs.engine``). Under strict pacing they can differ: a
budget's level can be ahead of the clock when its sensor goes."""

from __future__ import annotations

import random

import pytest

from kafka_quota_proxy.quota.replay import replay_rows, settings_from_section

SECTION = {"entities": [{"client-id": "<default>", "producer_byte_rate": 3000,
                         "consumer_byte_rate": 5000, "request_percentage": 0.01}]}


def workload(seed: int) -> list[tuple[object, ...]]:
    rnd = random.Random(seed)
    rows, t = [], 0
    for _ in range(3000):
        t += rnd.choice([1, 5, 50, 300, 2000, 25_000, 40_000])
        rows.append((t, "", f"c{rnd.randint(0, 5)}", rnd.choice([0, 1, 3]),
                     rnd.randint(10, 90_000), rnd.randint(10, 90_000), 0, rnd.random() * 5,
                     False, 0, None))
    return rows


@pytest.mark.parametrize("seed", range(10))
def test_expiring_idle_sensors_changes_no_throttle_on_kafkas_maths(seed: int) -> None:
    settings = settings_from_section(SECTION)
    rows = workload(seed)
    soon = replay_rows(rows, settings, idle_expiry_ms=20_000)  # (more than 11 x 1 s)
    never = replay_rows(rows, settings, idle_expiry_ms=10**12)
    assert soon == never
    assert sum(1 for kind in soon for t in kind if t) > 100


def test_under_strict_pacing_it_can() -> None:
    settings = settings_from_section({**SECTION, "pacing": "strict"})
    differ = 0
    for seed in range(10):
        rows = workload(seed)
        differ += replay_rows(rows, settings, idle_expiry_ms=20_000) != replay_rows(
            rows, settings, idle_expiry_ms=10**12)
    assert differ
