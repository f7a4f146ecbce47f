"""The 8-level precedence, Kafka's sharing rules, live config changes and sensor expiry."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType, resolve
from kafka_quota_proxy.quota.manager import ONE_HOUR_MS, QuotaManager, QuotaSettings

P = QuotaType.PRODUCE
LEVELS = {
    EntityKey("alice", "app"): 1,
    EntityKey("alice", DEFAULT): 2,
    EntityKey("alice", None): 3,
    EntityKey(DEFAULT, "app"): 4,
    EntityKey(DEFAULT, DEFAULT): 5,
    EntityKey(DEFAULT, None): 6,
    EntityKey(None, "app"): 7,
    EntityKey(None, DEFAULT): 8,
}
SHARED_BY = {1: "user+client-id", 2: "user+client-id", 3: "user", 4: "user+client-id",
             5: "user+client-id", 6: "user", 7: "client-id", 8: "client-id"}


@pytest.mark.parametrize("first_level", range(1, 9))
def test_precedence_first_configured_level_wins(first_level: int) -> None:
    # Configure every level from ``first_level`` down; the limit names the level it came from.
    quotas = {k: float(level) for k, level in LEVELS.items() if level >= first_level}
    r = resolve(quotas, P, "alice", "app")
    assert r.level == first_level
    assert r.limit == float(first_level)
    assert r.entity is not None and LEVELS[r.entity] == first_level
    assert r.sharing == SHARED_BY[first_level]


def test_nothing_configured_is_unlimited() -> None:
    r = resolve({}, P, "alice", "app")
    assert (r.level, r.limit, r.entity, r.sharing) == (None, None, None, "client-id")


def test_entity_paths() -> None:
    assert EntityKey("alice", "app").path == "users/alice/clients/app"
    assert EntityKey(DEFAULT, DEFAULT).path == "users/<default>/clients/<default>"
    assert EntityKey(None, DEFAULT).path == "clients/<default>"
    assert EntityKey(DEFAULT, None).path == "users/<default>"
    with pytest.raises(ValueError):
        EntityKey(None, None)


def test_client_id_literally_named_default_is_not_the_default() -> None:
    quotas = {EntityKey(None, DEFAULT): 100.0, EntityKey(None, "<default>"): 5.0}
    # the literal name matches its own entity (level 7), the default entity is separate
    r = resolve(quotas, P, "u", "<default>")
    assert (r.level, r.limit, r.entity) == (7, 5.0, EntityKey(None, "<default>"))
    r = resolve({EntityKey(None, "<default>"): 5.0}, P, "u", "other")
    assert r.limit is None  # a literal "<default>" entity is no default for others


def test_resolution_is_per_quota_type() -> None:
    settings = QuotaSettings(entities={
        EntityKey(DEFAULT, None): {QuotaType.FETCH: 10.0},
        EntityKey(None, DEFAULT): {QuotaType.PRODUCE: 20.0, QuotaType.REQUEST: 50.0},
    })
    m = QuotaManager(settings)
    fetch, produce = m.resolve(QuotaType.FETCH, "alice", "c"), m.resolve(P, "alice", "c")
    assert (fetch.level, fetch.sharing, fetch.limit) == (6, "user", 10.0)
    assert (produce.level, produce.sharing, produce.limit) == (8, "client-id", 20.0)


def test_empty_client_id_quirk_matches_kafka() -> None:
    # Kafka's DefaultQuotaCallback looks up nothing for empty tags: a client with an empty
    # client-id and only client-id quotas configured is not limited.
    r = resolve({EntityKey(None, DEFAULT): 10.0}, P, "alice", "")
    assert (r.tags, r.limit) == (("", ""), None)


def _manager(entities: dict[EntityKey, float], samples: int = 2) -> QuotaManager:
    return QuotaManager(QuotaSettings(samples=samples, window_ms=1000,
                                      entities={k: {P: v} for k, v in entities.items()}))


def test_user_level_budget_is_shared_by_all_its_client_ids() -> None:
    m = _manager({EntityKey("alice", None): 1000.0})  # level 3: one budget per user
    assert m.record(P, "alice", "a", 600, 0) == 0  # 600 B over W = 1 s: within 1000 B/s
    assert m.record(P, "alice", "b", 600, 0) > 0  # the same budget: 1200 B/s
    assert m.record(P, "bob", "b", 600, 0) == 0  # another user: unlimited


def test_user_client_level_budget_is_per_client_id() -> None:
    m = _manager({EntityKey("alice", DEFAULT): 1000.0})  # level 2: per (user, client-id)
    assert m.record(P, "alice", "a", 600, 0) == 0
    assert m.record(P, "alice", "b", 600, 0) == 0  # own budget
    assert m.record(P, "alice", "a", 600, 0) > 0


def test_client_level_budget_is_shared_across_users() -> None:
    m = _manager({EntityKey(None, "app"): 1000.0})  # level 7: per client-id
    assert m.record(P, "alice", "app", 600, 0) == 0
    assert m.record(P, "bob", "app", 600, 0) > 0


def test_config_change_updates_live_bounds() -> None:
    m = _manager({EntityKey(None, DEFAULT): 1000.0})
    assert m.record(P, "u", "c", 900, 0) == 0
    m.update(QuotaSettings(samples=2, window_ms=1000,
                           entities={EntityKey(None, DEFAULT): {P: 500.0}}))
    # The same sensor (900 B already recorded) now exceeds the lower bound.
    assert m.record(P, "u", "c", 1, 0) == round((901 - 500) / 500 * 1000)
    m.update(QuotaSettings(samples=2, window_ms=1000, entities={}))
    assert m.record(P, "u", "c", 10_000, 0) == 0  # unlimited now


def test_config_change_moves_entity_to_new_shared_budget() -> None:
    m = _manager({EntityKey(None, "c"): 1000.0})
    m.record(P, "alice", "c", 900, 0)  # per client-id budget: ("", "c")
    m.update(QuotaSettings(samples=2, window_ms=1000, entities={
        EntityKey(None, "c"): {P: 1000.0}, EntityKey("alice", None): {P: 1000.0}}))
    # alice now matches level 3: a fresh per-user budget, not the client-id one
    assert m.record(P, "alice", "c", 900, 0) == 0
    assert m.resolve(P, "alice", "c").tags == ("alice", "")
    assert m.record(P, "bob", "c", 200, 0) > 0  # bob still in the client-id budget (1100)


def test_idle_sensors_expire_after_an_hour() -> None:
    m = _manager({EntityKey(None, DEFAULT): 1000.0})
    for i in range(1000):
        m.record(P, "u", f"client-{i}", 1, 0)
    m.record(P, "u", "busy", 1, ONE_HOUR_MS - 1)
    assert len(m.sensors) == 1001
    assert m.expire(ONE_HOUR_MS) == 1000
    assert [s.tags for s in m] == [("", "busy")]


def test_request_throttle_is_capped_at_one_window_byte_rate_optionally() -> None:
    entities = {EntityKey(None, DEFAULT): {QuotaType.REQUEST: 1.0, P: 1.0}}
    m = QuotaManager(QuotaSettings(samples=11, window_ms=1000, entities=entities))
    assert m.record(QuotaType.REQUEST, "u", "c", 10_000, 0) == 1000
    assert m.record(P, "u", "c", 10_000, 0) > 1000  # Kafka: byte rates are not capped
    capped = QuotaManager(QuotaSettings(samples=11, window_ms=1000,
                                        cap_byte_rate_throttle=True, entities=entities))
    assert capped.record(P, "u", "c", 10_000, 0) == 1000


def test_headroom_counts_values_in_flight_as_recorded() -> None:
    # 1,000 B/s over 11 windows of 1 s: early on W is padded to 10 s, so 10,000 B fill it.
    manager = QuotaManager(QuotaSettings(entities={EntityKey(None, "c"): {
        QuotaType.PRODUCE: 1000.0}}))
    sensor = manager.sensor(QuotaType.PRODUCE, "ANONYMOUS", "c", 0)
    assert sensor.headroom(0)
    manager.record(QuotaType.PRODUCE, "ANONYMOUS", "c", 6000, 0)
    assert sensor.headroom(0)
    sensor.in_flight = 3999
    assert sensor.headroom(0)  # 9,999 B over 10 s: just below the quota
    sensor.in_flight = 4000
    assert not sensor.headroom(0)  # at the quota: the next request waits
    sensor.in_flight = 0
    assert sensor.headroom(0)
    # Unlimited budgets always have headroom.
    free = manager.sensor(QuotaType.PRODUCE, "ANONYMOUS", "other", 0)
    free.in_flight = 1e12
    assert free.headroom(0)
