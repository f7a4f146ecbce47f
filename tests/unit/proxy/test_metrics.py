"""The metrics the proxy exports: one unit per metric, times in seconds."""

from __future__ import annotations

from prometheus_client import generate_latest

from kafka_quota_proxy.proxy.metrics import ProxyStats, make_registry


def _scrape(stats: ProxyStats) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in generate_latest(make_registry(stats)).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_byte_rates_and_request_percentages_are_different_metrics() -> None:
    stats = ProxyStats()
    stats.quota_entities = lambda: [
        ("111", "produce", "alice", "", 250_000.0, 300_000.0, 3, 1500),
        ("111", "request", "alice", "", 42.5, 50.0, 1, 250),
    ]
    m = _scrape(stats)
    produce = 'broker="111",client_id="",quota="produce",user="alice"'
    request = 'broker="111",client_id="",quota="request",user="alice"'
    assert m[f"kafka_proxy_quota_entity_bytes_per_second{{{produce}}}"] == 250_000
    assert m[f"kafka_proxy_quota_entity_bytes_per_second_limit{{{produce}}}"] == 300_000
    assert m[f"kafka_proxy_quota_entity_request_percentage{{{request}}}"] == 42.5
    assert m[f"kafka_proxy_quota_entity_request_percentage_limit{{{request}}}"] == 50
    assert f"kafka_proxy_quota_entity_bytes_per_second{{{request}}}" not in m
    assert f"kafka_proxy_quota_entity_request_percentage{{{produce}}}" not in m
    assert m[f"kafka_proxy_quota_entity_throttle_seconds_total{{{produce}}}"] == 1.5
    assert m[f"kafka_proxy_quota_entity_throttled_requests_total{{{request}}}"] == 1


def test_throttle_time_is_exported_in_seconds() -> None:
    stats = ProxyStats()
    stats.throttle_ms["produce"] += 2500
    m = _scrape(stats)
    assert m['kafka_proxy_quota_throttle_seconds_total{quota="produce"}'] == 2.5
    assert not any("_ms" in name for name in m), [n for n in m if "_ms" in n]
