"""What a request of a client with a quota holds until its response starts (``QuotaFilter``'s
reservations, kept by the filter, not in the request's entry): a Produce's bytes in its
sensor's in-flight count, a consumer Fetch's place among the fetches; released by the
response, and at close for every request still holding something, including one a refusal
dropped from the correlation table (it never gets a response)."""

from __future__ import annotations

from types import SimpleNamespace

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.proxy.features.quotas.filter import QuotaFilter
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings
from testkit.filter_host import FakeFilterHost

NOW = 1_000_000


def _filter() -> tuple[QuotaFilter, QuotaEnforcer, FakeFilterHost]:
    quotas = QuotaEnforcer(QuotaSettings(entities={EntityKey(DEFAULT, None): {
        QuotaType.PRODUCE: 1e6, QuotaType.FETCH: 1e6}}))
    host = FakeFilterHost("alice")
    host.table = CorrelationTable()
    host.client.client_id = "app"
    f = QuotaFilter(host, quotas, ProxyStats())  # type: ignore[arg-type]
    assert f.limited  # (the client has quotas: its requests reserve)
    return f, quotas, host


def _request(f: QuotaFilter, host: FakeFilterHost, key: ApiKey, cid: int,
             size: int) -> InFlight:
    entry = InFlight(int(key), 9 if key == ApiKey.PRODUCE else 12, cid, "app", size, True)
    host.table.add(entry)
    f.request(entry)
    return entry


def _in_flight(quotas: QuotaEnforcer) -> int:
    return quotas.manager(0).sensor(QuotaType.PRODUCE, "alice", "app", NOW).in_flight


def test_a_response_releases_what_its_request_held() -> None:
    f, quotas, host = _filter()
    produce = _request(f, host, ApiKey.PRODUCE, 1, 10_004)
    _request(f, host, ApiKey.FETCH, 2, 100)
    assert _in_flight(quotas) == 10_000 and f._fetching == 1
    host.table.pop(1)
    f.response(produce, NOW, 1.0)
    assert _in_flight(quotas) == 0 and f._fetching == 1


def test_close_releases_requests_in_flight_and_dropped_ones() -> None:
    f, quotas, host = _filter()
    _request(f, host, ApiKey.PRODUCE, 1, 10_004)
    _request(f, host, ApiKey.PRODUCE, 2, 5_004)
    _request(f, host, ApiKey.FETCH, 3, 100)
    host.table.pop(2)  # a refused request: out of the table, never answered
    assert _in_flight(quotas) == 15_000
    f.closed("client_closed")
    assert _in_flight(quotas) == 0 and f._fetching == 0
    f.closed("client_closed")  # (nothing is released twice)
    assert _in_flight(quotas) == 0 and f._fetching == 0


def _produce_rate(quotas: QuotaEnforcer) -> float:
    return quotas.manager(0).sensor(QuotaType.PRODUCE, "alice", "app", NOW).rate.peek(NOW + 1)[0]


def test_produces_sent_whole_but_never_answered_are_recorded_at_close() -> None:
    """A client that writes produce requests and closes without reading their responses: the
    broker writes their records, so the budget is charged for them at close (it was never
    charged, and reconnecting gave it any rate it liked)."""
    f, quotas, host = _filter()
    _request(f, host, ApiKey.PRODUCE, 1, 10_004)
    _request(f, host, ApiKey.PRODUCE, 2, 5_004)
    _request(f, host, ApiKey.FETCH, 3, 100)  # (a fetch's response size is unknown: not charged)
    local = _request(f, host, ApiKey.PRODUCE, 4, 7_004)
    local.local = True  # answered by the proxy itself: never reached the broker
    f.closed("client_closed")
    assert _in_flight(quotas) == 0
    assert _produce_rate(quotas) == 15_000
    recorded = [e.recorded for e in host.table.entries()]
    assert recorded[0] is not None and recorded[1] is not None
    assert recorded[2] is None and recorded[3] is None
    f.closed("client_closed")  # (nothing is recorded twice)
    assert _produce_rate(quotas) == 15_000


def test_a_produce_cut_short_by_the_close_is_not_recorded() -> None:
    """The newest frame had not ended upstream: the broker never reads a truncated frame."""
    f, quotas, host = _filter()
    host.requests = SimpleNamespace(frame_remaining=500_000, measuring=None)
    _request(f, host, ApiKey.PRODUCE, 1, 10_004)
    _request(f, host, ApiKey.PRODUCE, 2, 1_000_004)
    f.closed("upstream_closed")
    assert _produce_rate(quotas) == 10_000


def test_produces_still_buffered_for_the_broker_are_not_recorded() -> None:
    """What never left for the broker (dropped with its connection) is not charged: the
    frames whose last bytes are still buffered, newest first."""
    f, quotas, host = _filter()
    for cid, size in ((1, 10_004), (2, 20_004), (3, 30_004)):
        _request(f, host, ApiKey.PRODUCE, cid, size)
    host.unsent = 30_004 + 1  # the newest frame, and the last byte of the one before
    f.closed("client_closed")
    assert _produce_rate(quotas) == 10_000
