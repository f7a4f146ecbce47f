"""The replay engine: what the proxy records, replayed per broker, under one config or the
config of each generation."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.replay import (
    Recorded,
    StorageSettings,
    independent_by,
    let_through,
    replay,
    replay_rows,
    settings_from_section,
)

ISSUE_FORM = """
window: {samples: 11, size_seconds: 1}
entities:
  - {user: alice, client-id: clientA, producer_byte_rate: 10485760}
  - {user: "<default>", consumer_byte_rate: 5242880}
  - {client-id: "<default>", producer_byte_rate: 1048576, request_percentage: 50}
"""


def test_settings_from_section_matches_the_validated_config() -> None:
    section = yaml.safe_load(ISSUE_FORM)
    assert settings_from_section(section) == QuotasConfig.model_validate(section).settings()
    assert settings_from_section(section).entities[EntityKey(None, DEFAULT)] == {
        QuotaType.PRODUCE: 1048576.0, QuotaType.REQUEST: 50.0}


def req(seq: int, t: int, api_key: int = 0, size: int = 1004, response: int = 54,
        follower: bool = False, generation: int = 0, client: str = "c") -> Recorded:
    return Recorded(seq, t, "ANONYMOUS", client, api_key, size, response, 2000, 0.0, follower,
                    generation)


PRODUCE_1000 = QuotaSettings(entities={EntityKey(None, "c"): {QuotaType.PRODUCE: 1000.0}})


def test_a_burst_over_quota_is_throttled_and_other_types_are_not_recorded() -> None:
    out = list(replay([req(i, i * 10) for i in range(12)], PRODUCE_1000))
    # 1,000 B per request against 1,000 B/s over a padded 10 s window: the 11th goes over
    assert [t.produce_ms for t in out[:10]] == [0] * 10
    assert out[10].produce_ms > 0 and out[11].produce_ms > out[10].produce_ms
    assert all(t.fetch_ms == t.request_ms == 0 for t in out)
    assert out[11].applied_ms == out[11].produce_ms


def test_follower_fetches_and_acks0_are_exempt_as_in_the_proxy() -> None:
    settings = QuotaSettings(entities={EntityKey(None, "c"): {QuotaType.FETCH: 1.0,
                                                              QuotaType.REQUEST: 0.0001}})
    out = list(replay([req(1, 0, api_key=1, response=10_000, follower=True),
                       req(2, 1, api_key=0, response=-1),  # acks=0: no request time
                       req(3, 2, api_key=1, response=10_000)], settings))
    assert out[0].fetch_ms == out[0].request_ms == 0
    assert out[1].request_ms == 0
    assert out[2].fetch_ms > 0 and out[2].request_ms > 0


def test_generations_apply_the_config_live_at_the_time() -> None:
    generous = QuotaSettings(entities={EntityKey(None, "c"): {QuotaType.PRODUCE: 1e9}})
    configs = {0: generous, 1: PRODUCE_1000}
    requests = [req(i, i * 10, generation=0 if i < 6 else 1) for i in range(12)]
    out = list(replay(requests, configs.__getitem__))
    assert [t.produce_ms > 0 for t in out] == [False] * 10 + [True] * 2  # the budget carried
    assert [t.produce_ms for t in replay(requests, generous)] == [0] * 12


def test_budgets_are_per_client_as_configured() -> None:
    requests = [req(i, i * 10, client="c" if i % 2 else "other") for i in range(24)]
    out = list(replay(requests, PRODUCE_1000))
    assert all(t.produce_ms == 0 for i, t in enumerate(out) if i % 2 == 0)  # unlimited
    assert any(t.produce_ms > 0 for i, t in enumerate(out) if i % 2)


def test_independent_by_follows_the_budgets_configured() -> None:
    def settings(*keys: EntityKey) -> QuotaSettings:
        return QuotaSettings(entities={k: {QuotaType.PRODUCE: 1000.0} for k in keys})

    client_only = settings(EntityKey(None, DEFAULT), EntityKey("u", "c"))
    user_only = settings(EntityKey(DEFAULT, None))
    assert independent_by([client_only]) == "client_id"
    assert independent_by([user_only]) == "user"
    assert independent_by([settings(EntityKey(DEFAULT, DEFAULT))]) == "client_id"
    assert independent_by([settings(EntityKey("u", None), EntityKey(None, "c"))]) is None
    # across generations: budgets per user in one, per client-id in the other
    assert independent_by([client_only, user_only]) is None
    # storage throttling gives producers with no quota a per-client-id budget
    assert independent_by([client_only], storage=True) == "client_id"
    assert independent_by([user_only], storage=True) is None


NAMES = st.sampled_from(["a", "b", "c"])
PARTS = st.one_of(st.none(), st.just(DEFAULT), NAMES)
KEYS = st.tuples(PARTS, PARTS).filter(lambda p: p != (None, None)).map(lambda p: EntityKey(*p))


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(KEYS, min_size=1, max_size=4),
       traffic=st.lists(st.tuples(NAMES, NAMES, st.integers(1, 40),
                                  st.integers(500, 5000)), min_size=40, max_size=120))
def test_replaying_apart_by_the_independent_column_changes_no_throttle(
        keys: list[EntityKey], traffic: list[tuple[str, str, int, int]]) -> None:
    """What lets the Spark replay split a broker's requests: replaying each user's (or each
    client-id's) requests on their own gives every request the throttle it gets in the
    broker's whole replay."""
    config = QuotaSettings(entities={k: {QuotaType.PRODUCE: 1000.0, QuotaType.REQUEST: 5.0}
                                     for k in keys})
    column = independent_by([config])
    assume(column is not None)
    requests, t = [], 0
    for seq, (user, client, gap, size) in enumerate(traffic):
        t += gap
        requests.append(Recorded(seq, t, user, client, 0, size, 54, 3000, 0.0, False, 0))
    whole = {x.seq: x for x in replay(requests, config)}
    apart = {}
    for value in {getattr(r, column) for r in requests}:
        apart.update({x.seq: x for x in replay(
            [r for r in requests if getattr(r, column) == value], config)})
    assert apart == whole
    event(f"throttled: {any(x.applied_ms for x in whole.values())}")


def test_the_storage_factor_a_request_records_is_applied_in_every_replay() -> None:
    """Storage throttling scales produce bounds by the factor each request recorded, and gives
    producers with no quota the base rate: the replay does the same, whatever the config."""
    storage = StorageSettings(10_000.0, exempt_client_ids=frozenset({"agent"}))
    no_quotas = QuotaSettings(samples=3, window_ms=1000)

    def burst(client: str, scale: float | None) -> list[Recorded]:
        return [Recorded(i, i * 10, "ANONYMOUS", client, 0, 2004, 54, 2000, 0.0, False, 0,
                         scale) for i in range(20)]

    assert not any(t.produce_ms for t in replay(burst("c", None), no_quotas, storage=storage))
    halved = [t.produce_ms for t in replay(burst("c", 0.5), no_quotas, storage=storage)]
    full = [t.produce_ms for t in replay(burst("c", 1.0), no_quotas, storage=storage)]
    assert any(halved) and halved.index(next(t for t in halved if t)) < full.index(
        next(t for t in full if t))
    # Paced at 5,000 B/s: 20 x 2,000 B over 190 ms are paid for 8 s, less the free window.
    assert halved[-1] == 8000 - 190 - 1000
    assert not any(t.produce_ms for t in replay(burst("agent", 0.5), no_quotas,
                                                storage=storage))
    assert not any(t.produce_ms for t in replay(burst("c", 0.0), no_quotas, storage=storage))
    with pytest.raises(ValueError, match="storage settings"):
        list(replay(burst("c", 0.5), no_quotas))


def test_let_through_holds_each_connection_for_its_throttles() -> None:
    """One engine, clients that wait out their throttles: of a demand of twice the quota
    (two connections, each at the quota), about the quota is let through; the requests a
    held connection sends in the meantime are not, and are not recorded. Without a quota,
    everything is."""
    quota = QuotaSettings(entities={EntityKey(None, "c"): {QuotaType.PRODUCE: 100_000.0}})
    rows = [(50 * i, "ANONYMOUS", "c", 0, 10_004, 54, 2000, 0.0, False, 0, None)
            for i in range(1200)]  # 60 s, 10,000 B every 50 ms: 200,000 B/s
    connections = [i % 2 for i in range(1200)]
    passed = let_through(rows, connections, quota)
    through = sum(10_000 for p in passed if p) / 60.0
    assert 0.95 < through / 100_000 < 1.1
    assert passed[:100] == [True] * 100  # Kafka's window lets the start through
    # What was let through is exactly what the engine records of those requests alone.
    mine = [r for r, p in zip(rows, passed, strict=True) if p]
    produce, _, _ = replay_rows(mine, quota)
    holds = {0: 0, 1: 0}
    for r, c, p in zip(rows, connections, passed, strict=True):
        assert p == (r[0] >= holds[c])
        if p:
            holds[c] = r[0] + produce.pop(0)
    assert let_through(rows, connections, QuotaSettings()) == [True] * 1200
