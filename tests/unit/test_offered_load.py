"""Demand is offered load (``spark_jobs.tune.offered_load``): clients whose offered load is known
(``testkit.offered_load``: librdkafka-like producers and consumers run through the project's
quota engine, written as the proxy writes a capture) at 0.5 - 5 x their quota give estimates
within 10 % of the truth, where the per-second rates the capture recorded show the bursts that
follow a throttle. Pure pandas, no Spark."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.spark_jobs import tune
from testkit.offered_load import (
    START_MS,
    Client,
    Consumer,
    Producer,
    quota_section,
    recorded_bytes,
    simulate,
    truth,
)

QUOTA = 1_000_000  # bytes/s
SECONDS = 40
SPAN = 10  # whole spans of 10 s (``TuneOptions.span_seconds``), as for a demo's capture


def demand_of(rows: pd.DataFrame, section: dict[str, Any], pairs: list[tuple[str, str]],
              qt: str, percentile: float = 0.99) -> pd.Series:
    """The tune's demand of the one budget of ``qt`` the capture's clients record into."""
    types = [QuotaType.from_short(qt)]
    segments = tune.offered_load(tune.demand_requests(rows, [qt]))
    intervals = tune.offered_intervals(segments, tune.budget_mapping(pairs, section, types))
    start_s, end_s = tune.whole_minutes(int(rows["ts_ms"].min()), int(rows["ts_ms"].max()),
                                        SPAN)
    got = tune.offered_demand(intervals, start_s, end_s, percentile, SPAN)
    assert len(got) == 1, got
    return got.iloc[0]


def recorded_peak(rows: pd.DataFrame) -> float:
    """The busiest second the capture recorded (what the p99 of recorded seconds chases)."""
    per_second = recorded_bytes(rows).groupby(rows["ts_ms"] // 1000).sum()
    return float(per_second.max())


CASES = [(role, ratio, size) for role in ("producer", "consumer")
         for ratio in (0.5, 1, 2, 3, 5) for size in (16_000, 100_000, 1_000_000)]


def client_of(role: str, ratio: float, size: int) -> Client:
    if role == "producer":
        return Client(Producer(ratio * QUOTA, batch_size=size))
    return Client(Consumer(ratio * QUOTA, fetch_max_bytes=size))


@pytest.mark.parametrize(("role", "ratio", "size"), CASES,
                         ids=[f"{r}-{x:g}x-{s // 1000}KB" for r, x, s in CASES])
def test_the_estimate_is_the_offered_load_within_ten_percent(role: str, ratio: float,
                                                             size: int) -> None:
    client = client_of(role, ratio, size)
    section = quota_section(client.role, QUOTA)
    rows = simulate([client], section, SECONDS)
    qt = "produce" if role == "producer" else "fetch"
    expected = truth(client, SECONDS)
    got = demand_of(rows, section, [("alice", "app")], qt)
    print(f"\n{role} {ratio:g}x quota, {size:,} B: estimate {got['demand']:,.0f} / truth "
          f"{expected:,.0f} = {got['demand'] / expected:.4f}; recorded peak second "
          f"{recorded_peak(rows) / expected:.2f} x truth")
    assert got["demand"] == pytest.approx(expected, rel=0.10)
    held = rows[tune.THROTTLES].max(axis=1) > 0
    assert held.any() == (ratio > 1 or (ratio == 1 and held.any()))  # over its quota: held


@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_the_bursts_after_a_throttle_are_not_demand(role: str) -> None:
    """3 x the quota with 1 MB batches / fetches: once held back the client sends what queued
    in bursts; the capture's busiest second is far above what it offers (about twice), the
    estimate is what it offers."""
    client = client_of(role, 3, 1_000_000)
    section = quota_section(client.role, QUOTA)
    rows = simulate([client], section, 60)
    expected = truth(client, 60)
    got = demand_of(rows, section, [("alice", "app")],
                    "produce" if role == "producer" else "fetch")
    assert recorded_peak(rows) > 1.5 * expected
    assert got["demand"] == pytest.approx(expected, rel=0.10)
    assert got["peak"] == pytest.approx(expected, rel=0.10)  # the peak of the offered load


def test_a_consumer_reading_a_backlog_offers_what_it_can_fetch() -> None:
    """A consumer with always more to read than it fetches would, unthrottled, read as fast as
    its fetches come back (16 kB fetches: some 8 x its quota): that is its offered load."""
    client = Client(Consumer(None, fetch_max_bytes=16_000))
    section = quota_section(client.role, QUOTA)
    rows = simulate([client], section, SECONDS)
    expected = truth(client, SECONDS)
    assert expected > 5 * QUOTA
    got = demand_of(rows, section, [("alice", "app")], "fetch")
    assert got["demand"] == pytest.approx(expected, rel=0.10)


def test_a_client_held_back_within_its_first_second_is_measured_over_that_second() -> None:
    """A rate is measured over at least ``measure_seconds`` (1 s): a client over ten times its
    quota (Kafka's window lets ten seconds' worth of quota through at first) is held back
    within its first second, and its estimate is then that second's bytes, ten times its quota
    or so: a floor, far above the quota all the same."""
    client = Client(Consumer(None, fetch_max_bytes=100_000))
    section = quota_section(client.role, QUOTA)
    rows = simulate([client], section, SECONDS)
    assert truth(client, SECONDS) > 30 * QUOTA
    got = demand_of(rows, section, [("alice", "app")], "fetch")
    assert 10 * QUOTA <= got["demand"] <= 11 * QUOTA


def test_a_capture_that_begins_with_the_client_held_back_gives_a_floor() -> None:
    """What a capture cannot tell: a producer at 3 x whose capture begins once it is held back
    (its first 30 s left out) has no free requests to measure; its estimate is what got
    through, about its quota."""
    client = Client(Producer(3 * QUOTA, batch_size=100_000))
    section = quota_section(client.role, QUOTA)
    rows = simulate([client], section, 90)
    late = rows[rows["ts_ms"] >= START_MS + 30_000]
    got = demand_of(late, section, [("alice", "app")], "produce")
    assert got["demand"] == pytest.approx(QUOTA, rel=0.15)


def test_clients_sharing_a_budget_add_up_while_both_are_there() -> None:
    """Two client-ids of one user (a per-user quota): a at 0.6 x from the start, b at 0.8 x
    from 30 s on. Together they are over the quota and held back; the budget's demand is what
    they offer together, and a alone before."""
    a = Client(Producer(0.6 * QUOTA, batch_size=100_000), client_id="a", connection=1)
    b = Client(Producer(0.8 * QUOTA, batch_size=100_000), client_id="b", connection=2,
               start_s=30)
    section = quota_section(a.role, QUOTA)
    rows = simulate([a, b], section, 90)
    assert (rows.loc[rows["client_id"] == "a", tune.THROTTLES].max(axis=1) > 0).any()
    pairs = [("alice", "a"), ("alice", "b")]
    together = truth(a, 90) + truth(b, 90)
    assert demand_of(rows, section, pairs, "produce")["demand"] == pytest.approx(together,
                                                                                rel=0.10)
    segments = tune.offered_load(tune.demand_requests(rows, ["produce"]))
    mapping = tune.budget_mapping(pairs, section, [QuotaType.PRODUCE])
    intervals = tune.offered_intervals(segments, mapping)
    alone = intervals[intervals["start_s"] < START_MS // 1000 + 30]
    assert alone["clients"].tolist() == [1]
    assert alone["value"].iloc[0] == pytest.approx(truth(a, 90), rel=0.10)
    assert intervals["clients"].tolist() == [1, 2]


def test_an_absent_client_does_not_offer_zero() -> None:
    """A producer at 0.5 x for 20 s, silent for 30 s, then at 2 x: two segments, each at its
    own rate; the silent seconds are not seconds of demand, and the demand is the 2 x."""
    before = Client(Producer(0.5 * QUOTA), stop_s=20)
    after = Client(Producer(2 * QUOTA), start_s=50)
    section = quota_section(before.role, QUOTA)
    rows = simulate([before, after], section, 80)
    segments = tune.offered_load(tune.demand_requests(rows, ["produce"]))
    assert len(segments) == 2
    offered = segments.sort_values("first_ms")["offered"].to_numpy()
    assert offered == pytest.approx([truth(before, 80), truth(after, 80)], rel=0.10)
    got = demand_of(rows, section, [("alice", "app")], "produce")
    assert got["demand"] == pytest.approx(truth(after, 80), rel=0.10)
    # present 0-20 s and 50-80 s: in the whole spans (10 s to 70 s) some 10 + 20 seconds with
    # the boundary ones, not 60
    assert 30 <= got["seconds"] <= 32


# ------------------------------------------------------------------ the rule on small frames


def requests(rows: list[tuple[float, float, float, float]]) -> pd.DataFrame:
    """(read ms, response ms, bytes, hold ms) of one producer connection."""
    frame = pd.DataFrame(rows, columns=["read_ms", "resp_ms", "value", "held_ms"])
    return frame.assign(quota_type="produce", run="r", broker=1, connection=1, user="u",
                        client_id="c", seq=np.arange(len(frame)), at_ms=frame["read_ms"])


def test_free_requests_are_those_read_before_the_first_hold() -> None:
    """10 kB every 100 ms for 5 s; the response to the one read at 5.0 s carries a 2 s hold;
    then what queued behind it (200 kB) at once, and 10 kB every 100 ms again: 100 kB/s
    offered, measured on the free requests only, where the recorded seconds show a 210 kB
    one."""
    rows = [(100.0 * i, 100.0 * i + 3, 10_000.0, 0.0) for i in range(50)]
    rows.append((5000.0, 5003.0, 10_000.0, 2000.0))
    rows.append((7003.0, 7006.0, 200_000.0, 0.0))
    rows += [(7103.0 + 100 * i, 7106.0 + 100 * i, 10_000.0, 0.0) for i in range(20)]
    got = tune.offered_load(requests(rows)).iloc[0]
    assert got["free_requests"] == 51
    assert got["free_rate"] == pytest.approx(51 * 10_000 / 5.1)  # 51 requests, 5.1 s
    assert got["rate"] == pytest.approx(910_000 / (9003 * 72 / 71) * 1000)
    assert got["offered"] == got["free_rate"] > got["rate"]


def test_segments_end_when_the_client_is_absent_or_free_again() -> None:
    """A pause of more than ``idle_ms`` after the last response and hold ends a segment (a long
    hold is no pause); so does, once held back, going ``idle_ms`` with no hold."""
    idle = 11_000.0
    rows = [(0.0, 5.0, 1000.0, 20_000.0),  # held 20 s: the next request is no new segment
            (20_010.0, 20_015.0, 1000.0, 0.0)]
    rows += [(20_100.0 + 1000 * i, 20_105.0 + 1000 * i, 1000.0, 0.0) for i in range(15)]
    rows.append((60_000.0, 60_005.0, 1000.0, 0.0))  # 25 s after the last: absent in between
    got = tune.offered_load(requests(rows), idle).sort_values("first_ms")
    # 0 -> 20.01 s (one segment, the hold is no absence); free again from 31.1 s (the first
    # request read more than 11 s after the hold ended at 20.005 s); absent before 60 s
    assert got["first_ms"].tolist() == [0.0, 31_100.0, 60_000.0]
    assert got["requests"].tolist() == [13, 4, 1]
    assert got["offered"].iloc[2] == 1000.0  # one request: over at least a second


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        tune.TuneOptions(idle_seconds=0)
    with pytest.raises(ValueError):
        tune.TuneOptions(measure_seconds=-1)


def test_the_demand_over_intervals_is_the_demand_over_seconds() -> None:
    """``offered_demand`` over intervals of constant load gives what ``budget_demand`` gives
    over the same load second by second (percentile, busiest broker, peak, whole minutes,
    seconds, total)."""
    rng = np.random.default_rng(5)
    rows = []
    for budget in range(20):
        for broker in (1, 2, 3):
            t = 1000 + int(rng.integers(0, 50))
            while t < 1600:
                length = int(rng.integers(1, 40))
                rows.append(("produce", f"u{budget}", "", broker, t, t + length - 1,
                             float(rng.lognormal(8, 1)), 1))
                t += length + int(rng.integers(0, 30))
    intervals = pd.DataFrame(rows, columns=tune.INTERVAL_COLUMNS)
    seconds = pd.DataFrame(
        [(r.quota_type, r.budget_user, r.budget_client, r.broker, second, r.value)
         for r in intervals.itertuples(index=False)
         for second in range(r.start_s, r.end_s + 1)],
        columns=[*tune.KEYS, "broker", "second", "value"])
    for q, span in ((0.99, 60), (0.5, 10), (0.9, 7)):
        got, expected = (frame.sort_values(tune.KEYS).reset_index(drop=True) for frame in (
            tune.offered_demand(intervals, 1020, 1560, q, span),
            tune.budget_demand(seconds, 1020, 1560, q, span)))
        pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-12)


def test_each_request_records_into_the_types_the_quotas_count_it_in() -> None:
    """``demand_requests`` (and ``demand_arrays``, what the Spark pass reads): a Produce records
    its request less 4 B when read; a consumer Fetch its response less 4 B when the response
    started; any answered request (not a replica fetch) its request time, the exact one where
    recorded, else its duration; a Fetch with no response and a replica fetch record no bytes;
    the hold is the largest throttle."""
    base = {"run": "r", "broker": 1, "connection": 7, "user": "u", "client_id": "c",
            "request_time_ms": 0.0, "follower": False, "throttle_produce_ms": 0,
            "throttle_fetch_ms": 0, "throttle_request_ms": 0, "request_bytes": 104,
            "response_bytes": 54}
    rows = pd.DataFrame([
        {**base, "seq": 1, "ts_ms": 1000, "duration_us": 2500, "api_key": 0,
         "throttle_request_ms": 30, "throttle_produce_ms": 20},
        {**base, "seq": 2, "ts_ms": 2000, "duration_us": -1, "api_key": 1,
         "response_bytes": 1004, "request_time_ms": 0.75},
        {**base, "seq": 3, "ts_ms": 3000, "duration_us": 4000, "api_key": 1,
         "response_bytes": -1},
        {**base, "seq": 4, "ts_ms": 4000, "duration_us": 1000, "api_key": 1,
         "response_bytes": 9004, "follower": True},
        {**base, "seq": 5, "ts_ms": 5000, "duration_us": 1000, "api_key": 3},
    ])
    got = tune.demand_requests(rows, ["produce", "fetch", "request"])
    seen = [(r.quota_type, r.seq, r.value, r.at_ms, r.held_ms) for r in got.itertuples()]
    assert seen == [("produce", 1, 100.0, 1000.0, 30.0), ("fetch", 2, 1000.0, 2000.0, 0.0),
                    ("request", 1, 0.25, 1000.0, 30.0), ("request", 2, 0.075, 2000.0, 0.0),
                    ("request", 5, 0.1, 5000.0, 0.0)]
    assert got["resp_ms"].tolist() == [1002.5, 2000.0, 1002.5, 2000.0, 5001.0]
    arrays = tune.demand_arrays(rows, ["request", "fetch"])
    assert arrays is not None and arrays["kind"].tolist() == [0, 0, 0, 1]
    assert tune.demand_arrays(rows, []) is None
    assert list(tune.demand_requests(rows, []).columns) == list(got.columns)


def plain_offered_load(requests: pd.DataFrame, idle_ms: float = 11_000.0,
                       min_ms: float = 1000.0) -> pd.DataFrame:
    """``tune.offered_load`` as pandas groupbys over each client's rows, step by step (the
    estimator's first form): the oracle for its numpy runs."""
    r = requests.sort_values([*tune.CLIENT, "read_ms", "seq"]).reset_index(drop=True)
    by = r.groupby(tune.CLIENT, sort=False).ngroup()
    end = r["resp_ms"] + r["held_ms"]
    before = end.groupby(by).cummax().groupby(by).shift()
    hold_end = end.where(r["held_ms"] > 0)
    held_before = hold_end.groupby(by).cummax().groupby(by).ffill().groupby(by).shift()
    previous = r["read_ms"].groupby(by).shift()
    read = r["read_ms"]
    starts = (before.isna() | (read - before > idle_ms)
              | (held_before.notna() & (read - held_before > idle_ms)
                 & (previous - held_before <= idle_ms)))
    r["segment"] = starts.astype("int64").groupby(by).cumsum()
    seg = r.groupby([by, r["segment"]], sort=False).ngroup()
    hold_from = (r["resp_ms"].where(r["held_ms"] > 0).groupby(seg).cummin()
                 .groupby(seg).ffill())
    free = hold_from.isna() | (read < hold_from)
    r["free_value"] = r["value"].where(free, 0.0)
    r["free_at"] = r["at_ms"].where(free)
    r["is_free"] = free.astype("int64")
    groups = r.groupby(seg, sort=False)
    out = groups.agg(first_ms=("at_ms", "min"), last_ms=("at_ms", "max"),
                     requests=("value", "size"), bytes=("value", "sum"),
                     free_requests=("is_free", "sum"), free_bytes=("free_value", "sum"),
                     free_first=("free_at", "min"), free_last=("free_at", "max"))
    out = pd.concat([r.loc[groups.head(1).index, [*tune.CLIENT, "segment"]]
                     .reset_index(drop=True), out.reset_index(drop=True)], axis=1)
    out["rate"] = out["bytes"] * 1000.0 / tune._traffic_ms(
        out["requests"], out["first_ms"], out["last_ms"], min_ms)
    out["free_rate"] = out["free_bytes"] * 1000.0 / tune._traffic_ms(
        out["free_requests"], out["free_first"], out["free_last"], min_ms)
    out["offered"] = np.maximum(out["rate"], out["free_rate"])
    return out[tune.SEGMENT_COLUMNS]


@pytest.mark.parametrize("seed", range(16))
def test_the_estimator_is_the_plain_groupby_computation(seed: int) -> None:
    """Random requests of a few clients (several runs, brokers, connections and entities;
    holds of up to 20 s, so segments that end at a pause and at a client free again; reads out
    of order; every quota type): the numpy estimator gives every segment the plain one does."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    rows = pd.DataFrame({
        "run": rng.integers(0, 2, n), "broker": rng.integers(-1, 2, n).astype(np.int32),
        "connection": rng.integers(0, 3, n), "seq": rng.permutation(n),
        # names, or numbers as the Spark pass moves them (numpy's sort)
        "user": rng.choice(["u", "v"], n) if seed % 2 else rng.choice([-(2**62), 5], n),
        "client_id": rng.choice(["a", "b"], n) if seed % 2 else 0,
        "ts_ms": rng.integers(0, 200_000, n), "duration_us": rng.choice([-1, 0, 500, 30_000], n),
        "api_key": rng.integers(0, 3, n).astype(np.int16), "follower": rng.random(n) < 0.1,
        "request_bytes": rng.integers(0, 10**6, n).astype(np.int32),
        "response_bytes": rng.choice([-1, 4, 1000, 50_000], n).astype(np.int32),
        "request_time_ms": rng.random(n) * 2,
        "throttle_produce_ms": np.where(rng.random(n) < 0.1, rng.integers(1, 20_000, n), 0),
        "throttle_fetch_ms": 0,
        "throttle_request_ms": np.where(rng.random(n) < 0.05, rng.integers(1, 5000, n), 0)})
    demand = tune.demand_requests(rows, ["produce", "fetch", "request"])
    got = tune.offered_load(demand)
    want = plain_offered_load(demand)
    assert got["segment"].max() > 1 or n < 50  # (segments end within clients)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12)


def test_running_extremes_skip_gaps_and_stay_within_their_run() -> None:
    values = np.array([np.nan, 3.0, 1.0, np.nan, 5.0, 2.0, np.nan, -1.0, np.nan])
    run = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3])
    top = tune._running(np.maximum, values, run)
    low = tune._running(np.minimum, values, run)
    np.testing.assert_array_equal(top, [np.nan, 3, 3, 3, 5, 5, np.nan, -1, np.nan])
    np.testing.assert_array_equal(low, [np.nan, 3, 1, 1, 5, 2, np.nan, -1, np.nan])
    assert np.isnan(tune._running(np.maximum, np.full(3, np.nan), np.zeros(3, int))).all()
