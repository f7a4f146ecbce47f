"""What a request of a client with a quota holds until its response starts (``QuotaFilter``'s
reservations, kept by the filter, not in the request's entry): a Produce's bytes in its
sensor's in-flight count, a consumer Fetch's place among the fetches; released by the
response, and at close for every request still holding something, including one a refusal
dropped from the correlation table (it never gets a response)."""

from __future__ import annotations

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
