"""Throttled client-seconds (``spark_jobs.held``): the distinct seconds a client's holds
touch, against a brute-force count."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.spark_jobs.held import held_seconds


def test_a_hold_counts_every_second_it_touches_once() -> None:
    entity = np.array([1, 1, 1, 2, 3])
    quota_ms = np.array([500, 900, 5_000, 0, 0])
    throttle = np.array([1_000, 200, 1, 0, 2_000])
    counts = held_seconds(entity, quota_ms, throttle)
    # entity 1: [500, 1500) touches seconds 0 and 1, [900, 1100) the same two, and 5 ->
    # 3 seconds; entity 2 never held back; entity 3: [0, 2000) -> seconds 0 and 1
    assert counts.to_dict() == {1: 3, 3: 2}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20_000), st.integers(0, 4_000)),
                max_size=40))
def test_the_count_is_the_union_of_the_seconds_each_hold_touches(
        rows: list[tuple[int, int, int]]) -> None:
    expected: dict[int, set[int]] = {}
    for e, q, t in rows:
        if t > 0:
            expected.setdefault(e, set()).update(range(q // 1000, (q + t - 1) // 1000 + 1))
    arrays = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    counts = held_seconds(*arrays) if rows else held_seconds(
        np.array([], np.int64), np.array([], np.int64), np.array([], np.int64))
    assert counts.to_dict() == {e: len(s) for e, s in expected.items()}
