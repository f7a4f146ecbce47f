"""Shadow quotas (``quotas.shadow``) on the request path: a candidate config recorded with
what the live quotas record, on the same connections, whose throttles are counted and never
applied; switched on, off and changed by a reload.

The connections here are driven hook by hook, in chain order (the live ``QuotaFilter``, the
``ShadowQuotaFilter``, the ``CaptureFilter``), on a clock of the test's, through produce
(acks=1 and acks=0), fetch and metadata requests, responses and a close with produce requests
unanswered. The same traffic without the shadow gives the same throttles, mutes, live budgets
and capture rows; and a replay of the capture under the shadow's config gives the shadow's
would-be throttles per budget, to the ms."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.config.schema import ProxyConfig
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.proxy import reload as reload_module
from kafka_quota_proxy.proxy.features import capture as capture_package
from kafka_quota_proxy.proxy.features import shadow_quotas as shadow_package
from kafka_quota_proxy.proxy.features.capture import filter as capture_filter
from kafka_quota_proxy.proxy.features.quotas import filter as quota_filter
from kafka_quota_proxy.proxy.features.shadow_quotas import (
    ShadowQuotaFilter,
    ShadowQuotasFeature,
    ShadowSwitch,
)
from kafka_quota_proxy.proxy.features.shadow_quotas import filter as shadow_filter
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.proxy.reload import ConfigReload
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.quota.shadow import (
    ShadowQuotas,
    capture_by_broker,
    per_type,
    replayed_budgets,
)
from testkit import config_errors
from testkit.filter_host import FakeFilterHost, RecordingLog

START = 5_000_000
LIVE_NOT_BINDING = {"entities": [{"client-id": "<default>", "producer_byte_rate": 50_000_000}]}
SHADOW = {"window": {"samples": 3, "size_seconds": 1}, "entities": [
    {"client-id": "<default>", "producer_byte_rate": 40_000},
    {"user": "alice", "consumer_byte_rate": 60_000},
    {"user": "bob", "request_percentage": 0.5}]}


class Clock:
    def __init__(self) -> None:
        self.ms = START

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The quota clock of every filter here is the test's."""
    c = Clock()
    for module in (quota_filter, shadow_filter, capture_filter):
        monkeypatch.setattr(module, "_now_ms" if module is not capture_filter else "now_ms", c)
    return c


class FakeCapture:
    run = "run-1"
    instance = "proxy"
    process = "proxy/1"

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def record(self, row: Any) -> None:
        self.rows.append(row)


@dataclass
class Conn:
    host: FakeFilterHost
    chain: list[Any]
    client_id: str
    entries: list[InFlight] = field(default_factory=list)
    cid: int = 0


def _traffic(seed: int, live: dict[str, Any], shadow: ShadowQuotas | None, clock: Clock
             ) -> tuple[QuotaEnforcer, FakeCapture, list[Conn]]:
    """Seeded traffic of four clients (two users, two brokers) through the live quotas, the
    shadow (when given) and the capture; every connection closed at the end with what it
    still has in flight."""
    rng = random.Random(seed)
    quotas = QuotaEnforcer(settings_from_section(live))
    stats = ProxyStats()
    capture = FakeCapture()
    switch = ShadowSwitch()
    switch.engine = shadow
    conns = []
    for i, (user, client_id, scope) in enumerate((("alice", "a1", 1), ("alice", "a2", 2),
                                                  ("bob", "b1", 1), ("carol", "c1", 2))):
        host = FakeFilterHost(user, conn_id=i, scope=scope)
        host.table = CorrelationTable()
        host.client.client_id = client_id
        host.responses = SimpleNamespace(in_progress=None)
        chain: list[Any] = [quota_filter.QuotaFilter(host, quotas, stats)]  # type: ignore[arg-type]
        if shadow is not None:
            chain.append(ShadowQuotaFilter(host, switch, quotas))  # type: ignore[arg-type]
        chain.append(capture_filter.CaptureFilter(host, capture, quotas))  # type: ignore[arg-type]
        conns.append(Conn(host, chain, client_id))

    def send(c: Conn, api_key: int, size: int, acks0: bool = False) -> None:
        c.cid += 1
        entry = InFlight(api_key, 9 if api_key == 0 else 12, c.cid, c.client_id, size,
                         not acks0)
        entry.proxy_ms = rng.random() * 2
        c.chain[0].serial()  # (the connection asks before each read)
        if not acks0:
            c.host.table.add(entry)
        for f in c.chain:
            f.request(entry)
        c.entries.append(entry)

    def answer(c: Conn) -> None:
        entry = next(iter(c.host.table.entries()), None)
        if entry is None:
            return
        c.host.table.pop(entry.correlation_id)
        entry.response_size = rng.randint(40_000, 300_000) if entry.api_key == 1 else 60
        for f in c.chain:
            f.response(entry, clock.ms, 1.0)
        for f in c.chain:
            if hasattr(f, "response_done"):
                f.response_done(entry)

    for _ in range(600):
        c = rng.choice(conns)
        action = rng.random()
        if action < 0.3:
            send(c, 0, rng.randint(1_000, 30_000), acks0=rng.random() < 0.15)
        elif action < 0.45:
            send(c, 1, 100)
        elif action < 0.5:
            send(c, 3, 40)
        else:
            answer(c)
        clock.ms += rng.choice((0, 0, 1, 5, 40, 150))
    for c in conns:
        for f in c.chain:
            f.closed("client_closed")
    return quotas, capture, conns


def _what_clients_saw(conns: list[Conn]) -> list[Any]:
    return [(c.host.mutes, [(e.throttle_ms, e.throttled_by) for e in c.entries])
            for c in conns]


def _same_records(conns: list[Conn], plain: list[Conn]) -> None:
    """What the live quotas recorded of each request is the same; where they recorded
    nothing of a produce left unanswered (no live quota), the shadow left its clock reading
    for the capture's row."""
    for c, p in zip(conns, plain, strict=True):
        for e, q in zip(c.entries, p.entries, strict=True):
            if q.recorded is not None or e.recorded is None:
                assert e.recorded == q.recorded
            else:
                assert e.api_key == 0 and e.recorded[1:] == (0.0, 0, 0, 0)


def _live_budgets(quotas: QuotaEnforcer) -> dict[Any, Any]:
    return {(scope, s.quota_type, s.tags): (s.rate.peek(START + 10**7), s.throttled_requests,
                                            s.throttle_ms_total, s.in_flight, s.last_record_ms)
            for scope, m in quotas.managers.items() for s in m}


def _rows(capture: FakeCapture) -> list[dict[str, Any]]:
    return [{k: v for k, v in row._asdict().items() if k != "ts_ms"} for row in capture.rows]


@pytest.mark.parametrize("live", [LIVE_NOT_BINDING, {}], ids=["live-quota", "no-live-quota"])
@pytest.mark.parametrize("seed", range(4))
def test_the_shadow_changes_nothing_clients_see_and_a_replay_gives_its_throttles(
        clock: Clock, seed: int, live: dict[str, Any]) -> None:
    settings = settings_from_section(SHADOW)
    shadow = ShadowQuotas(settings)
    quotas, capture, conns = _traffic(seed, live, shadow, clock)
    clock.ms = START
    plain_quotas, plain_capture, plain_conns = _traffic(seed, live, None, clock)
    # the shadow would have throttled every quota type, and nobody saw any of it
    assert all(shadow.throttled[qt] >= 3 for qt in QuotaType), shadow.throttled
    assert _what_clients_saw(conns) == _what_clients_saw(plain_conns)
    _same_records(conns, plain_conns)
    assert not any(mutes for c in conns for mutes in [c.host.mutes])
    assert _live_budgets(quotas) == _live_budgets(plain_quotas)
    assert _rows(capture) == _rows(plain_capture)
    # a replay of the capture under the shadow's config: the same would-be throttles
    rows = _rows(capture)
    assert any(r["response_bytes"] == -1 and r["api_key"] == 0 for r in rows)  # acks=0, unanswered
    replayed = replayed_budgets(capture_by_broker(rows), settings)
    assert replayed == shadow.budgets()
    assert per_type(replayed) == {qt: (shadow.throttled[qt], shadow.throttle_ms[qt])
                                  for qt in QuotaType}


# ---------------------------------------------------------------- on and off by reload

QUOTAS_YAML = """\
quotas:
  entities:
    - {client-id: "<default>", producer_byte_rate: 50000000}
"""
SHADOW_YAML = """\
  shadow:
    entities:
      - {client-id: "<default>", producer_byte_rate: %d}
"""


def _config(shadow_rate: int | None, enabled: bool = True) -> ProxyConfig:
    text = config_errors.BASE + QUOTAS_YAML
    if shadow_rate is not None:
        text += SHADOW_YAML % shadow_rate
        if not enabled:
            text += "    enabled: false\n"
    return parse_config(text, "shadow.yaml")


class FakeProxy:
    """What a reload changes of the proxy (``proxy.reload.Reloaded``) and what features use
    of it (``proxy.feature.Runtime``)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.stats = ProxyStats()
        self.quotas = QuotaEnforcer(config.quotas.settings())
        self.features: list[Any] = []
        self.reconfigured = 0

    def reconfigure(self) -> None:
        self.reconfigured += 1
        self.quotas.update(self.config.quotas.settings())

    def as_run(self, config: ProxyConfig) -> ProxyConfig:
        return config

    def spawn(self, coro: Any) -> None:
        raise AssertionError("not here")


def _families(feature: ShadowQuotasFeature) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in feature.metric_families()}


def _throttled(feature: ShadowQuotasFeature) -> float:
    (n,) = [v for labels, v in _families(feature)["kafka_proxy_shadow_quota_throttled_requests"]
            if labels["quota"] == "produce"]
    return n


def _producing(feature: ShadowQuotasFeature, proxy: FakeProxy, clock: Clock
               ) -> Callable[[int], None]:
    host = FakeFilterHost("alice", scope=1)
    host.client.client_id = "app"
    ((cls, make),) = feature.filters(1)
    assert cls is ShadowQuotaFilter
    live = quota_filter.QuotaFilter(host, proxy.quotas, proxy.stats)  # type: ignore[arg-type]
    shadow = make(host)
    cid = [0]

    def produce(n: int) -> None:
        for _ in range(n):
            cid[0] += 1
            entry = InFlight(0, 9, cid[0], "app", 20_004, True)
            entry.response_size = 60
            for f in (live, shadow):
                f.request(entry)
            for f in (live, shadow):
                f.response(entry, clock.ms, 1.0)
            assert entry.throttle_ms == 0  # the live quota does not bind
            clock.ms += 10
    return produce


def test_a_reload_switches_the_shadow_on_off_and_to_another_candidate(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = RecordingLog()
    monkeypatch.setattr(shadow_package, "log", logs)
    monkeypatch.setattr(reload_module, "log", RecordingLog())
    proxy = FakeProxy(_config(None))
    feature = ShadowQuotasFeature(proxy)  # type: ignore[arg-type]
    proxy.features = [feature]
    reloads = ConfigReload(proxy, "shadow.yaml")  # type: ignore[arg-type]
    produce = _producing(feature, proxy, clock)  # a connection open before any shadow
    produce(50)
    families = _families(feature)
    assert families["kafka_proxy_shadow_quota_enabled"] == [({}, 0)]
    assert _throttled(feature) == 0
    assert "kafka_proxy_shadow_quota_entity_throttled_requests" not in families

    reloads.apply(_config(50_000))  # on: the connection already open is evaluated
    assert logs.names() == ["shadow_quotas_enabled"]
    assert proxy.reconfigured == 0 and proxy.quotas.generation == 0  # live quotas untouched
    produce(50)
    on = _throttled(feature)
    assert on > 10
    families = _families(feature)
    assert families["kafka_proxy_shadow_quota_enabled"] == [({}, 1)]
    ((labels, n),) = families["kafka_proxy_shadow_quota_entity_throttled_requests"]
    assert labels == {"broker": "1", "quota": "produce", "user": "", "client_id": "app"}
    assert n == on
    (limit,) = families["kafka_proxy_shadow_quota_entity_bytes_per_second_limit"]
    assert limit[1] == 50_000

    reloads.apply(_config(200_000))  # another candidate: its budgets keep what they measured
    assert logs.names()[-1] == "shadow_quotas_reloaded"
    assert logs.events[-1][2]["throttled_produce"] == on
    (limit,) = _families(feature)["kafka_proxy_shadow_quota_entity_bytes_per_second_limit"]
    assert limit[1] == 200_000

    reloads.apply(_config(200_000, enabled=False))  # off: the totals stop, the budgets go
    assert logs.names()[-1] == "shadow_quotas_disabled"
    off = _throttled(feature)
    produce(50)
    assert _throttled(feature) == off
    families = _families(feature)
    assert families["kafka_proxy_shadow_quota_enabled"] == [({}, 0)]
    assert "kafka_proxy_shadow_quota_entity_throttled_requests" not in families
    assert feature.state_entries() == {"shadow_quota_budgets": 0, "shadow_quota_caches": 0}

    reloads.apply(_config(50_000))  # on again: afresh, the totals going on from where they were
    assert logs.names()[-1] == "shadow_quotas_enabled"
    produce(50)
    assert _throttled(feature) > off
    reloads.apply(_config(None))
    assert logs.names()[-1] == "shadow_quotas_disabled"
    assert proxy.reconfigured == 0 and proxy.quotas.generation == 0
    # a change of the live quotas still reconfigures them
    reloads.apply(parse_config(config_errors.BASE + QUOTAS_YAML.replace("50000000", "60000000"),
                               "shadow.yaml"))
    assert proxy.reconfigured == 1


def test_the_capture_writes_the_live_quotas_only(tmp_path: Any) -> None:
    """The capture's ``quotas-*.json`` are what was in force: a shadow is not, and a change of
    it alone writes no new generation."""
    config = _config(100_000)
    runtime = SimpleNamespace(quotas=SimpleNamespace(generation=0), config=config)
    feature = capture_package.CaptureFeature(runtime, None)  # type: ignore[arg-type]
    feature.capture = SimpleNamespace(run="r", directory=tmp_path)  # type: ignore[assignment]
    feature.reconfigure(config.quotas, 0)
    (written,) = tmp_path.glob("quotas-r-*.json")
    doc = json.loads(written.read_text())
    assert "shadow" not in doc["quotas"]
    assert doc["quotas"]["entities"] == [{"client_id": "<default>",
                                          "producer_byte_rate": 50000000}]
