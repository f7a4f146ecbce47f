"""Structures keyed by client-chosen names (client-id, user, rack) stay bounded however many
distinct names come and go (docs/security.md, "Bounded per-client state")."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.config.schema import RacksConfig
from kafka_quota_proxy.proxy.features.fetch_routing.routing import (
    OTHER_RACK,
    REDIRECTED_LIMIT,
    FetchRouting,
)
from kafka_quota_proxy.proxy.metrics import ProxyStats, make_registry
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import CACHE_LIMIT, QuotaManager, QuotaSettings


def _scrape(stats: ProxyStats) -> dict[str, float]:
    from prometheus_client import generate_latest

    values: dict[str, float] = {}
    for line in generate_latest(make_registry(stats)).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _through(stats: ProxyStats, client_id: str, request: int, response: int) -> None:
    """What a connection does per request and per response (proxy/connection.py)."""
    c = stats.client(client_id)
    c[0] += request
    c[2] += 1
    stats.client(client_id)[1] += response


def test_per_client_figures_are_kept_only_when_asked_for() -> None:
    stats = ProxyStats()
    for i in range(100_000):
        _through(stats, f"churn-{i}", 100, 10)
    assert stats.per_client == {}
    assert _scrape(stats)['kafka_proxy_client_state_entries{structure="per_client"}'] == 0


def test_per_client_figures_are_kept_for_a_bounded_number_of_client_ids() -> None:
    stats = ProxyStats()
    stats.track_clients(3)
    for _ in range(2):
        for cid in ("alice", "bob"):
            _through(stats, cid, 100, 10)
    for i in range(100_000):
        _through(stats, f"churn-{i}", 100, 10)
    assert stats.per_client["alice"] == [200, 20, 2]
    assert stats.per_client["bob"] == [200, 20, 2]
    assert len(stats.per_client) == 3  # alice, bob and the first of the churn
    _through(stats, "alice", 1, 1)  # tracked ones go on counting
    assert stats.per_client["alice"] == [201, 21, 3]


def _default_user_quota() -> QuotaSettings:
    return QuotaSettings(entities={EntityKey(user=DEFAULT): {QuotaType.PRODUCE: 1e6}})


def test_quota_caches_are_bounded_when_many_client_ids_share_one_budget() -> None:
    """Every client-id of a user with a user quota records into the user's one budget, so
    no sensor expires to clear the per-(user, client-id) caches: they are bounded on their
    own."""
    m = QuotaManager(_default_user_quota())
    for i in range(CACHE_LIMIT * 2 + 10):
        m.record(QuotaType.PRODUCE, "alice", f"churn-{i}", 100, i)
        assert m.resolve(QuotaType.FETCH, "alice", f"churn-{i}").limit is None
    assert len(m.sensors) == 1  # alice's produce budget
    assert m.cache_entries() <= 2 * CACHE_LIMIT
    assert m.record(QuotaType.PRODUCE, "alice", "churn-0", 100, CACHE_LIMIT * 3) == 0


def test_quota_budgets_of_churned_client_ids_expire() -> None:
    settings = QuotaSettings(entities={EntityKey(client_id=DEFAULT): {QuotaType.REQUEST: 50}})
    m = QuotaManager(settings, idle_expiry_ms=10_000)
    for i in range(10_000):
        m.record(QuotaType.REQUEST, "", f"churn-{i}", 0.01, 1_000)
    assert len(m.sensors) == 10_000
    m.record(QuotaType.REQUEST, "", "steady", 0.01, 10_999)
    assert m.expire(11_000) == 10_000
    assert [s.tags for s in m.sensors.values()] == [("", "steady")]
    assert m.cache_entries() == 0


class _Broker:
    def __init__(self, node_id: int, rack: str) -> None:
        self.node_id, self.rack = node_id, rack


class _Metadata:
    def __init__(self, *brokers: _Broker) -> None:
        self.brokers = brokers
        self.topics: list[Any] = []


def test_fetch_bytes_count_unknown_client_racks_under_one_label() -> None:
    config = RacksConfig.model_validate({
        "selector": "rack-aware", "proxy_rack": "p", "brokers": {3: "c"},
        "clients": [{"client-id": "batch-", "rack": "r"}]})
    routing = FetchRouting(config)
    routing.observe_metadata(_Metadata(_Broker(1, "a"), _Broker(2, "b"), _Broker(3, "")))
    for i in range(10_000):
        routing.count_fetch(f"chosen-by-client-{i}", 1, 10)
    for rack in ("a", "b", "c", "p", "r", None):
        routing.count_fetch(rack, 2, 1)
    assert routing.fetch_bytes == {
        (OTHER_RACK, "a"): 100_000, ("a", "b"): 1, ("b", "b"): 1, ("c", "b"): 1,
        ("p", "b"): 1, ("r", "b"): 1, ("", "b"): 1}
    assert routing.cross_rack_bytes == 100_000 + 4


def test_fetch_redirects_remembered_are_bounded() -> None:
    now = [1_000_000]
    routing = FetchRouting(None, clock=lambda: now[0])
    decisions = {("t", 0): 2}
    for i in range(REDIRECTED_LIMIT * 2):
        assert routing.chooser(f"churn-{i}", decisions)("t", 0, -1) == 2
        assert routing.redirect_entries() <= REDIRECTED_LIMIT + 1
    # the newest are remembered: back at the leader too soon, it serves them
    last = f"churn-{REDIRECTED_LIMIT * 2 - 1}"
    assert routing.chooser(last, decisions)("t", 0, -1) is None


def test_sensor_idle_expiry_is_configurable_and_applies_to_every_broker() -> None:
    from kafka_quota_proxy.config.schema import QuotasConfig
    from kafka_quota_proxy.quota.enforcer import QuotaEnforcer

    assert QuotasConfig().sensor_idle_expiry_seconds == 3600  # Kafka's hour
    config = QuotasConfig.model_validate({
        "sensor_idle_expiry_seconds": 5,
        "entities": [{"client-id": "<default>", "request_percentage": 50}]})
    enforcer = QuotaEnforcer(config.settings(), int(config.sensor_idle_expiry_seconds * 1000))
    for broker in (-1, 1, 2):
        enforcer.manager(broker).record(QuotaType.REQUEST, "", f"c{broker}", 0.01, 1_000)
    assert enforcer.entries()[0] == 3
    assert enforcer.expire(5_999) == 0
    assert enforcer.expire(6_000) == 3 and enforcer.entries() == (0, 0)
    enforcer.manager(1).record(QuotaType.REQUEST, "", "c", 0.01, 10_000)
    assert enforcer.expire(12_000, idle_expiry_ms=1_000) == 1  # (a reload's new expiry)


def test_caches_of_a_manager_that_only_resolves_are_cleared_at_every_expiry_run() -> None:
    """``QuotaEnforcer.limits`` resolves in one manager while the budgets are recorded in
    another (the broker's): the first has no budget to expire, its caches go all the same."""
    settings = QuotaSettings(entities={EntityKey(client_id=DEFAULT): {QuotaType.REQUEST: 50}})
    m = QuotaManager(settings, idle_expiry_ms=10_000)
    for i in range(1_000):
        m.resolve(QuotaType.REQUEST, "", f"churn-{i}")
    assert m.cache_entries() == 1_000 and not m.sensors
    assert m.expire(1_000) == 0
    assert m.cache_entries() == 0
