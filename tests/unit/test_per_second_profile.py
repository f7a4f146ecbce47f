"""The profile's per-entity figures from its per-second rows (``profile.per_second_profile``,
what the Python workers compute): exact percentiles (rank ``ceil(q x n)`` of the values in
order, what ``percentile_approx`` gives with no error), sums, peaks and per-minute peaks, held
to a plain computation of each on random rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kafka_quota_proxy.spark_jobs.profile import PERCENTILES, PROFILE, RATES, per_second_profile


def rows(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    return pd.DataFrame({
        "entity": rng.choice([-(2**62), -5, 0, 7, 2**62], n),
        "broker": rng.integers(0, 3, n).astype(np.int32),
        "interval": 1_790_000_000 + rng.integers(0, 400, n),
        "requests": rng.integers(1, 9, n),
        # ties, zeros and spread values
        "produce_rate": np.where(rng.random(n) < 0.3, 0.0, rng.integers(0, 50, n) * 100.0),
        "fetch_rate": rng.lognormal(8, 2, n).round(),
        "request_percentage": rng.random(n) * 3,
        "fetch_bound": rng.integers(0, 5000, n).astype(float),
        "moved": rng.integers(0, 10_000, n),
    }).drop_duplicates(["entity", "broker", "interval"])


@pytest.mark.parametrize("seed", range(12))
def test_each_figure_is_the_plain_computation(seed: int) -> None:
    pdf = rows(seed)
    got = per_second_profile(pdf.sample(frac=1.0, random_state=seed)).set_index("entity")
    assert list(got.reset_index().columns) == [c.split()[0] for c in PROFILE.split(", ")]
    for entity, own in pdf.groupby("entity"):
        row = got.loc[entity]
        assert row["requests"] == own["requests"].sum()
        assert row["produce_bytes"] == own["produce_rate"].sum()
        assert row["busy"] == pytest.approx(own["request_percentage"].sum(), rel=1e-12)
        for name in RATES:
            values = np.sort(own[name].to_numpy())
            assert row[f"{name}_max"] == values[-1]
            for q in PERCENTILES:
                rank = max(math.ceil(q * len(values)), 1)
                assert row[f"{name}_p{int(q * 100)}"] == values[rank - 1], (name, q)
                assert values[rank - 1] == np.quantile(values, q, method="inverted_cdf")
        minute = own.assign(minute=own["interval"] // 60).groupby(["broker", "minute"])
        assert row["produce_rate_minute_max"] == pytest.approx(
            (minute["produce_rate"].sum() / 60).max(), rel=1e-12)
        assert row["fetch_rate_minute_max"] == pytest.approx(
            (minute["fetch_rate"].sum() / 60).max(), rel=1e-12)
    assert set(got.index) == set(pdf["entity"])
    for entity, own in pdf.groupby("entity"):
        assert got.loc[entity, "moved"] == own["moved"].sum()
        for name, column in (("produce_peak", "produce_rate"), ("fetch_peak", "fetch_bound")):
            best = 0.0
            for _, one in own.groupby("broker"):  # every 13 whole seconds, by a rolling sum
                per = one.set_index("interval")[column].clip(lower=0)
                full = per.reindex(range(per.index.min(), per.index.max() + 1), fill_value=0)
                best = max(best, full.rolling(13, min_periods=1).sum().max())
            assert got.loc[entity, name] == best, (entity, name)


def test_no_rows_no_entities() -> None:
    assert per_second_profile(rows(0).iloc[:0]).empty
