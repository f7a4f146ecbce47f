"""The tune rule on small pandas frames (``spark_jobs.tune``: no Spark session): sustained
demand over whole minutes, the base config's structure kept, overrides only where the data
supports them and at the level they came from, the caps, and the minimum of data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.spark_jobs.tune import (
    TuneOptions,
    budget_demand,
    budget_mapping,
    reasons,
    retune,
    sustained,
    whole_minutes,
)

START = 1_790_000_040  # a minute boundary (seconds)


def seconds_frame(values: dict[int, float], broker: int = 1, qt: str = "produce",
                  user: str = "bob", client: str = "") -> pd.DataFrame:
    return pd.DataFrame({"quota_type": qt, "budget_user": user, "budget_client": client,
                         "broker": broker, "second": list(values),
                         "value": list(values.values())})


def demand(*rows: tuple[str, str, str, float] | tuple[str, str, str, float, float]
           ) -> pd.DataFrame:
    """(quota type, budget user, budget client, demand[, whole minutes of data])."""
    out = []
    for r in rows:
        qt, user, client, d = r[:4]
        minutes = r[4] if len(r) > 4 else 10
        out.append({"quota_type": qt, "budget_user": user, "budget_client": client,
                    "broker": 1, "demand": float(d), "peak": float(d) * 2,
                    "minutes": minutes, "total": float(d) * 600})
    return pd.DataFrame(out)


def keys_of(section: dict[str, Any]) -> dict[EntityKey, dict[str, Any]]:
    out = {}
    for e in section["entities"]:
        key = next(iter(settings_from_section({"entities": [e]}).entities))
        out[key] = {k: v for k, v in e.items() if k not in ("user", "client-id", "client_id")}
    return out


BASE = {"window": {"samples": 11, "size_seconds": 1}, "entities": [
    {"user": "alice", "client-id": "clientA", "producer_byte_rate": 100_000},
    {"user": "<default>", "producer_byte_rate": 1_000_000, "request_percentage": 50.0},
]}
USERS = [("alice", "clientA"), ("bob", "b"), ("carol", "c"), ("dave", "d"), ("erin", "e")]


# ------------------------------------------------------------------ sustained demand


def test_a_client_that_sends_now_and_then_is_given_what_its_requests_need() -> None:
    """One 1 MB request a minute: the demand is its rate in the seconds it sends, not the 0 of
    the 59 idle ones (a quota below it would throttle every request)."""
    values = {START + 60 * m + 7: 1_000_000.0 for m in range(10)}
    got = budget_demand(seconds_frame(values), START, START + 600, 0.99).iloc[0]
    assert got["demand"] == pytest.approx(1_000_000.0)
    assert (got["minutes"], got["seconds"]) == (10, 10)
    assert sustained(np.array([0.0, 0.0]), 0.99) == 0.0


def test_sustained_p99_over_whole_minutes_ignores_a_one_second_spike() -> None:
    """Ten minutes at 1,000 B/s and one second at 100x: the demand stays 1,000, the peak is
    the spike."""
    steady = {START + s: 1000.0 for s in range(600)}
    steady[START + 300] = 100_000.0
    got = budget_demand(seconds_frame(steady), START, START + 600, 0.99).iloc[0]
    assert got["demand"] == pytest.approx(1000.0)
    assert got["peak"] == 100_000.0
    assert got["minutes"] == 10


def test_partial_minutes_are_left_out_and_the_busiest_broker_counts() -> None:
    # Whole minutes: the capture's first request at :20, its last at :40, 12 minutes later.
    start_s, end_s = whole_minutes(START * 1000 - 40_000, (START + 660) * 1000 + 40_000)
    assert (start_s, end_s) == (START, START + 660)
    values = {START - 30 + s: 500.0 for s in range(700)}
    values[START - 10] = 1e9  # in the partial first minute: not demand
    frame = pd.concat([seconds_frame(values, broker=1),
                       seconds_frame({START + s: 2000.0 for s in range(660)}, broker=2)])
    got = budget_demand(frame, start_s, end_s, 0.99).iloc[0]
    assert got["broker"] == 2 and got["demand"] == pytest.approx(2000.0)
    assert (got["minutes"], got["seconds"]) == (11, 660)
    assert got["total"] == 500.0 * 660 + 2000.0 * 660  # nothing from the partial minutes


def test_short_spans_instead_of_minutes_for_captures_of_a_minute() -> None:
    """``span_seconds=10``: whole 10 s spans count (a demo's capture is a minute long)."""
    start_s, end_s = whole_minutes(START * 1000 + 3_000, START * 1000 + 95_000, 10)
    assert (start_s, end_s) == (START + 10, START + 90)
    values = {START + 3 + s: 1000.0 for s in range(92)}
    got = budget_demand(seconds_frame(values), start_s, end_s, 0.99, span_seconds=10).iloc[0]
    assert got["minutes"] == pytest.approx(80 / 60)
    d = demand(("produce", "alice", "clientA", 800_000, 80 / 60))
    r = retune(BASE, d, USERS, TuneOptions(min_minutes=0.5, span_seconds=10,
                                           total_budget="free"), 80 / 60)
    assert keys_of(r.section)[EntityKey("alice", "clientA")] == {
        "producer_byte_rate": 1_200_000}


def test_budget_mapping_is_the_engines_resolution() -> None:
    mapping = budget_mapping(USERS, BASE, [QuotaType.PRODUCE, QuotaType.REQUEST])
    tags = {(r.user, r.quota_type): (r.budget_user, r.budget_client)
            for r in mapping.itertuples()}
    assert tags[("alice", "produce")] == ("alice", "clientA")  # its own entity
    assert tags[("bob", "produce")] == ("bob", "")  # users/<default>: a budget per user
    assert tags[("alice", "request")] == ("alice", "")


# ------------------------------------------------------------------ the recommendation


def test_structure_is_kept_and_overrides_are_added_only_where_the_data_supports_them() -> None:
    d = demand(("produce", "alice", "clientA", 800_000), ("produce", "bob", "", 1_200_000),
               ("produce", "carol", "", 50_000), ("produce", "dave", "", 80_000),
               ("produce", "erin", "", 60_000),
               ("request", "alice", "", 5.0), ("request", "bob", "", 4.0),
               ("request", "carol", "", 3.0), ("request", "dave", "", 3.5),
               ("request", "erin", "", 2.0))
    r = retune(BASE, d, USERS, TuneOptions(total_budget="free"), minutes=10)
    got = keys_of(r.section)
    live = keys_of(BASE)
    for key, quotas in live.items():  # every live entity, with its quota types only
        assert set(got[key]) == set(quotas), key
    alice = EntityKey("alice", "clientA")
    assert got[alice]["producer_byte_rate"] == 1_200_000  # 1.5 x its demand
    # users/<default>: 1.5 x the p90 (nearest below) of the users' demands; bob, far above
    # it, gets an override of his own at the user level, nobody else does.
    assert got[EntityKey(DEFAULT, None)] == {"producer_byte_rate": 120_000,
                                             "request_percentage": 6.0}
    assert set(got) == set(live) | {EntityKey("bob", None)}
    assert got[EntityKey("bob", None)] == {"producer_byte_rate": 1_800_000}
    assert r.section["window"] == BASE["window"]
    assert not r.notes or all("too short" not in n for n in r.notes)


def test_overrides_come_at_the_level_of_the_default_they_came_from() -> None:
    base = {"entities": [
        {"client-id": "<default>", "consumer_byte_rate": 100_000},
        {"user": "alice", "client-id": "<default>", "producer_byte_rate": 100_000},
    ]}
    pairs = [("u1", "x"), ("u2", "y"), ("u3", "z"), ("alice", "p"), ("alice", "q"),
             ("alice", "s")]
    d = demand(("fetch", "", "x", 10_000), ("fetch", "", "y", 12_000),
               ("fetch", "", "z", 900_000),
               ("produce", "alice", "p", 5_000), ("produce", "alice", "q", 6_000),
               ("produce", "alice", "s", 700_000))
    got = keys_of(retune(base, d, pairs, TuneOptions(total_budget="free"), 10).section)
    assert got[EntityKey(None, "z")] == {"consumer_byte_rate": 1_350_000}
    assert got[EntityKey("alice", "s")] == {"producer_byte_rate": 1_050_000}
    assert len(got) == 4


def test_no_override_without_enough_minutes_and_named_entities_keep_their_value() -> None:
    d = demand(("produce", "alice", "clientA", 800_000, 3),  # 3 whole minutes < 5
               ("produce", "bob", "", 1_200_000, 4), ("produce", "carol", "", 50_000),
               ("produce", "dave", "", 80_000), ("produce", "erin", "", 60_000))
    r = retune(BASE, d, USERS, TuneOptions(), minutes=10)
    got = keys_of(r.section)
    assert got[EntityKey("alice", "clientA")] == {"producer_byte_rate": 100_000}
    assert EntityKey("bob", None) not in got  # above the default, but only 4 minutes
    assert any("users/alice/clients/clientA producer_byte_rate: only 3 whole minutes" in n
               for n in r.notes)


def test_a_short_capture_keeps_every_live_value_and_says_so() -> None:
    d = demand(("produce", "bob", "", 1_200_000, 2), ("produce", "alice", "clientA", 9e6, 2))
    r = retune(BASE, d, USERS, TuneOptions(min_minutes=5), minutes=2)
    assert r.section["entities"] == BASE["entities"]
    assert any(n.startswith("capture too short: 2 whole minutes < min_minutes (5)")
               for n in r.notes)
    assert set(r.entities["basis"]) == {"kept: capture too short"}


def test_request_percentage_is_capped_at_100_per_broker_thread() -> None:
    d = demand(("request", "alice", "", 50_000.0), ("request", "bob", "", 40_000.0))
    for threads in (11, 2):
        r = retune(BASE, d, USERS, TuneOptions(broker_threads=threads, total_budget="free"),
                   minutes=10)
        values = [e["request_percentage"] for e in r.section["entities"]
                  if "request_percentage" in e]
        assert values and max(values) == 100.0 * threads


def test_the_total_stays_within_the_live_total() -> None:
    """Ten users at 1 MB/s each live: one needs 8 MB/s, nine 100 kB/s at most. Together they
    fit in the live total once the light users give up what they do not use."""
    base = {"entities": [{"user": "<default>", "producer_byte_rate": 1_000_000}]}
    pairs = [(f"u{i}", "c") for i in range(10)]
    d = demand(("produce", "u0", "", 8_000_000),
               *[("produce", f"u{i}", "", 10_000 * i) for i in range(1, 10)])
    keep = retune(base, d, pairs, TuneOptions(), minutes=10)
    free = retune(base, d, pairs, TuneOptions(total_budget="free"), minutes=10)
    totals = keep.totals.set_index("quota").loc["producer_byte_rate"]
    assert totals["live_total"] == 10_000_000
    assert totals["recommended_total"] <= 10_000_000
    assert free.totals.set_index("quota").loc["producer_byte_rate", "recommended_total"] > (
        10_000_000)
    assert any("scaled by" in n for n in keep.notes)
    got = keys_of(keep.section)
    assert got[EntityKey("u0", None)]["producer_byte_rate"] >= 8_000_000
    assert 90_000 <= got[EntityKey(DEFAULT, None)]["producer_byte_rate"] < 135_000


def test_no_override_that_would_move_other_clients_to_another_budget() -> None:
    """A user override under ``users/<default>`` would take that user's ``special`` client
    from ``users/<default>/clients/special``: none is added."""
    base = {"entities": [
        {"user": "<default>", "producer_byte_rate": 100_000},
        {"user": "<default>", "client-id": "special", "producer_byte_rate": 100_000},
    ]}
    pairs = [("bob", "app"), ("bob", "special"), ("carol", "app"), ("dave", "app")]
    d = demand(("produce", "bob", "", 5_000_000), ("produce", "carol", "", 10_000),
               ("produce", "dave", "", 12_000), ("produce", "bob", "special", 1000))
    r = retune(base, d, pairs, TuneOptions(total_budget="free"), minutes=10)
    assert EntityKey("bob", None) not in keys_of(r.section)
    assert any("would move other clients" in n for n in r.notes)


def test_with_no_quota_in_the_base_a_default_per_client_id_is_proposed() -> None:
    pairs = [("u", f"c{i}") for i in range(12)] + [("u", "whale")]
    d = demand(*[("produce", "", f"c{i}", 1000.0 + i) for i in range(12)],
               ("produce", "", "whale", 1e6), ("request", "", "whale", 99_999.0))
    r = retune({"entities": []}, d, pairs, TuneOptions(), minutes=10)
    by_client = {e["client-id"]: e for e in r.section["entities"]}
    assert set(by_client) == {"<default>", "whale"}
    assert by_client["whale"]["producer_byte_rate"] == 1_500_000
    assert by_client["<default>"]["request_percentage"] <= 1100
    short = retune({"entities": []}, d, pairs, TuneOptions(), minutes=1)
    assert short.section["entities"] == [] and any("too short" in n for n in short.notes)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        TuneOptions(total_budget="more")
    with pytest.raises(ValueError):
        TuneOptions(percentile=99)
    with pytest.raises(ValueError):
        TuneOptions(span_seconds=0)


def test_no_whole_span_sets_no_value_whatever_min_minutes_allows() -> None:
    """``--min-minutes 0`` on a capture with no whole span: no demand was measured, so nothing
    is set from it (it read as zero demand and gave 1,024 B/s)."""
    d = demand(("produce", "bob", "", 0.0, 0), ("produce", "alice", "clientA", 0.0, 0))
    for minutes in (0, 10):
        r = retune(BASE, d, USERS, TuneOptions(min_minutes=0), minutes=minutes)
        assert r.section["entities"] == BASE["entities"], minutes
    r = retune(BASE, d, USERS, TuneOptions(min_minutes=0), minutes=0)
    assert any(n.startswith("capture too short: no whole minute") for n in r.notes)
    r = retune(BASE, d, USERS, TuneOptions(min_minutes=0), minutes=10)
    assert "kept: no whole span of traffic" in set(r.entities["basis"])


def test_each_entity_gets_one_line_saying_why() -> None:
    """A starved tenant and one with headroom at the same total: the budget moves, and each
    line says what the clients offered against the live quota."""
    base = {"entities": [{"user": "alice", "producer_byte_rate": 2_000_000},
                         {"user": "carol", "producer_byte_rate": 3_000_000}]}
    d = demand(("produce", "alice", "", 3_000_000), ("produce", "carol", "", 1_000_000))
    r = retune(base, d, [("alice", "a"), ("carol", "c")], TuneOptions(), minutes=10)
    got = keys_of(r.section)
    alice = got[EntityKey("alice", None)]["producer_byte_rate"]
    carol = got[EntityKey("carol", None)]["producer_byte_rate"]
    assert alice > 3_000_000 > 1_000_000 < carol < 3_000_000
    assert alice + carol <= 5_000_000
    lines = reasons(r, {("users/alice", "producer_byte_rate"): (55, 0)})
    assert lines == [
        f"users/alice producer_byte_rate: 2.00 MB/s -> {alice / 1e6:.2f} MB/s: its clients "
        "offered 3.00 MB/s, more than the live quota; throttled client-seconds 55 recorded, "
        "0 replayed under the recommendation (1.5 x demand, x 0.83 (total))",
        f"users/carol producer_byte_rate: 3.00 MB/s -> {carol / 1e6:.2f} MB/s: its clients "
        "offered 1.00 MB/s, 33% of the live quota (1.5 x demand, x 0.83 (total))"]
