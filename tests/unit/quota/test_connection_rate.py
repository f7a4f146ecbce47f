"""Kafka's connection-creation rate quotas (KIP-612) as ``ConnectionQuotas`` applies them: one
test per rule C1-C6 and C10's counts of the issue-17 spec (section 3), with Kafka's numbers
for a fake clock (ms). C9 (a listener rate <= 0 is refused) is a config rule:
``tests/unit/config/test_connection_rate_config.py``. C7 (the inter-broker listener) and C8
(``max.connections.per.ip``) are not implemented (``docs/connection-rate.md``). The waiting,
holding and closing around these numbers is ``tests/unit/proxy/test_connection_rate.py``'s."""

from __future__ import annotations

import ipaddress

import pytest

from kafka_quota_proxy.quota.connection_rate import (
    IP_CONNECTION_RATE_DEFAULT,
    IP_SENSOR_EXPIRY_MS,
    ConnectionRates,
    IpConnectionQuotas,
    ListenerCounts,
    address_of,
)

IP = "10.0.0.1"
OTHER = "10.0.0.2"
L = "bootstrap"


def rates(*entities: tuple[str | None, float], samples: int = 11,
          window_ms: int = 1000) -> ConnectionRates:
    return ConnectionRates(samples, window_ms, IpConnectionQuotas.of(entities))


def attempts(r: ConnectionRates, times: list[int], ip: str = IP, scope: int = 0) -> list[int]:
    """The throttle time of a connection from ``ip`` at each time (0: served)."""
    return [r.record_ip(L, scope, ip, t) for t in times]


# --- C1: the IP quota applies only when the effective rate is not Integer.MAX_VALUE -------

def test_c1_ip_quota_off_at_integer_max_value() -> None:
    r = rates()  # no ip entity: every address gets 2147483647
    assert attempts(r, [0] * 1000) == [0] * 1000
    assert r.ips == {}  # nothing recorded at all
    r = rates((None, IP_CONNECTION_RATE_DEFAULT))
    assert attempts(r, [0] * 1000) == [0] * 1000 and r.ips == {}
    assert not r.ip_quotas.enabled
    # an address whose own entity says 2147483647 is unlimited while the default holds others
    r = rates((None, 5), (IP, IP_CONNECTION_RATE_DEFAULT))
    assert attempts(r, [0] * 100) == [0] * 100
    assert attempts(r, [0] * 51, ip=OTHER)[-1] == 200
    assert list(r.ips) == [(0, ipaddress.ip_address(OTHER))]


# --- C2: the address's own entity beats the default; removing either falls back ------------

def test_c2_override_beats_default_and_removal_falls_back() -> None:
    r = rates((None, 2), (IP, 5))
    # 11 x 1 s, fresh sensor: W = 10 s, so limit x 10 connections at t=0, then throttled
    assert attempts(r, [0] * 51).count(0) == 50  # its own 5/s
    assert attempts(r, [0] * 21, ip=OTHER).count(0) == 20  # the default 2/s
    # the override removed: the same sensor (50 recorded) now meets the default 2/s
    r.configure(11, 1000, IpConnectionQuotas.of([(None, 2)]))
    assert r.record_ip(L, 0, IP, 100) == 1000  # round((50/10.1 - 2)/2 * 10100), bounded
    # the default removed too: unlimited (2147483647), nothing recorded
    r.configure(11, 1000, IpConnectionQuotas.of([]))
    assert attempts(r, [200] * 100) == [0] * 100
    assert IpConnectionQuotas.of([(None, 2), (IP, 5)]).rate_for(
        ipaddress.ip_address(OTHER)) == 2


# --- C3: over the rate: not counted, throttled for throttleMs ----------------------------

def test_c3_connection_over_the_ip_rate_is_throttled_and_not_counted() -> None:
    r = rates((None, 5))
    assert attempts(r, [0] * 50) == [0] * 50
    sensor = r.ips[(0, ipaddress.ip_address(IP))]
    assert r.record_ip(L, 0, IP, 0) == 200  # the 51st: held 200 ms, then closed
    assert sensor.rate.total() == 50  # the throttled one is not counted
    assert r.counts[L] == ListenerCounts(ip_throttled=1, ip_throttle_ms=200)


# --- C4: throttleMs = min(round((rate - limit) / limit * W), one window) -------------------

def test_c4_throttle_time_and_window_of_a_fresh_sensor() -> None:
    # 11 x 1 s, 5/s: W = 10 s + elapsed, so in the first second a connection every ms gets
    # 50 through at once, then one each 200 ms (50 + t/200): 54 in all
    r = rates((None, 5))
    served = [t for t, throttle in zip(range(1000), attempts(r, list(range(1000))),
                                       strict=True) if throttle == 0]
    assert len(served) == 54
    assert served[-5:] == [49, 200, 400, 600, 800]
    # the 55th at t=801: rate 55/10.801 -> round((5.0921 - 5)/5 * 10801) = 199 ms
    r = rates((None, 5))
    attempts(r, [0] * 50)
    assert r.record_ip(L, 0, IP, 1) == 199  # round((51/10.001 - 5) / 5 * 10001) = 199
    assert r.record_ip(L, 0, IP, 150) == 50
    # 2 x 1 s, 3/s: W = 1 s at first: 3 served at t=0, the 4th throttled round(1/3 * 1000)
    r = rates((None, 3), samples=2)
    assert attempts(r, [0] * 4) == [0, 0, 0, 333]


def test_c4_throttle_time_is_bounded_at_one_window() -> None:
    r = rates((None, 5))
    attempts(r, [0] * 50)
    r.configure(11, 1000, IpConnectionQuotas.of([(None, 1)]))  # the quota lowered
    assert r.record_ip(L, 0, IP, 0) == 1000  # round((5.1 - 1) / 1 * 10000) = 41000 -> 1000
    # one window of the configured size: 11 x 2 s, a listener at 1/s (W = 20 s)
    r = rates(window_ms=2000)
    delays = [r.record_listener(L, 1, 0) for _ in range(42)]
    assert delays[19:22] == [0, 1000, 2000]  # 20 at once, then round((n/20 - 1) * 20000)
    assert delays[-1] == 2000  # round((42/20 - 1) * 20000) = 22000 -> 2000
    assert r.max_throttle_ms == 2000


# --- C5: a throttled connection is taken back from the address's and the listener's rates --

def test_c5_throttled_connection_unrecords_ip_and_listener() -> None:
    r = rates((None, 5))
    for _ in range(50):
        assert r.record_listener(L, 1000, 0) == 0
        assert r.record_ip(L, 0, IP, 0, listener_recorded=True) == 0
    assert r.record_listener(L, 1000, 0) == 0
    assert r.record_ip(L, 0, IP, 0, listener_recorded=True) == 200
    assert r.listeners[L].rate.total() == 50  # the 51st taken back from the listener too
    # had it been kept, the next at t=200 would see 52 / 10.2 > 5; it sees 51 / 10.2 = 5
    assert r.record_ip(L, 0, IP, 200) == 0
    # a connection the listener did not count is not taken back from it
    r.record_ip(L, 0, IP, 200, listener_recorded=False)
    assert r.listeners[L].rate.total() == 50


# --- C6: over the listener's rate: delayed, still counted, then served ---------------------

def test_c6_listener_rate_delays_and_keeps_the_connection() -> None:
    r = rates((None, 1000))
    delays = [r.record_listener(L, 5, 0) for _ in range(56)]
    # 50 at once; then 200, 400, 600, 800, 1000 ms: each counted (unlike an IP throttle)
    assert delays[:50] == [0] * 50
    assert delays[50:] == [200, 400, 600, 800, 1000, 1000]
    assert r.listeners[L].rate.total() == 56
    assert r.counts[L] == ListenerCounts(delayed=6, delay_ms=4000)
    # the delayed connection then goes on to its address's rate, and is served
    assert r.record_ip(L, 0, IP, 200, listener_recorded=True) == 0
    # Kafka's acceptor records the next connection only once the delay is over: at 200 ms
    r = rates()
    for _ in range(50):
        r.record_listener(L, 5, 0)
    assert r.record_listener(L, 5, 0) == 200
    assert r.record_listener(L, 5, 200) == 200  # round((52/10.2 - 5) / 5 * 10200)
    assert r.record_listener(L, None, 0) == 0  # no rate: nothing recorded
    assert r.listeners[L].rate.total() == 52


# --- C10: the counts behind the metrics (per listener) -------------------------------------

def test_c10_counts_per_listener() -> None:
    r = rates((None, 1))
    for listener in ("bootstrap", "SSL:broker-1"):
        attempts_l = [r.record_ip(listener, 0 if listener == "bootstrap" else 1, IP, 0)
                      for _ in range(12)]
        assert attempts_l.count(0) == 10
    assert r.counts == {"bootstrap": ListenerCounts(2, 2000),
                        "SSL:broker-1": ListenerCounts(2, 2000)}
    r.record_listener("bootstrap", 1, 0)
    assert r.listener_rate("bootstrap", 0) == pytest.approx(0.1)
    assert r.listener_rate("broker-2", 0) is None


# --- the sensors themselves ---------------------------------------------------------------

def test_sensors_per_scope_and_address_as_kafka_compares_them() -> None:
    r = rates((None, 1))
    assert attempts(r, [0] * 11, scope=0)[-1] == 1000
    assert attempts(r, [0] * 11, scope=7)[-1] == 1000  # another broker: its own sensor
    # an IPv4-mapped IPv6 address is the IPv4 address (Java's InetAddress)
    assert r.record_ip(L, 0, "::ffff:10.0.0.1", 0) == 1000
    assert address_of("::ffff:10.0.0.1") == ipaddress.ip_address(IP)
    assert address_of("0:0::1") == ipaddress.ip_address("::1")
    # not an address (a peer the socket could not name): no quota
    assert r.record_ip(L, 0, None, 0) == 0 and r.record_ip(L, 0, "?", 0) == 0
    # the entities' spellings are compared the same way
    assert IpConnectionQuotas.of([("::ffff:10.0.0.1", 3)]).rate_for(
        ipaddress.ip_address(IP)) == 3


def test_ip_sensors_expire_after_an_hour_without_a_record() -> None:
    r = rates((None, 1))
    attempts(r, [0] * 11)
    assert r.expire(IP_SENSOR_EXPIRY_MS) == 0  # Sensor.hasExpired: strictly more than an hour
    assert r.expire(IP_SENSOR_EXPIRY_MS + 1) == 1 and r.ips == {}
    assert r.record_ip(L, 0, IP, IP_SENSOR_EXPIRY_MS + 2) == 0  # a fresh sensor


def test_a_new_window_starts_the_sensors_afresh() -> None:
    r = rates((None, 1))
    attempts(r, [0] * 11)
    r.record_listener(L, 1, 0)
    r.configure(11, 1000, IpConnectionQuotas.of([(None, 2)]))
    assert r.ips  # same window: the sensors stay, with the new quota
    r.configure(5, 1000, IpConnectionQuotas.of([(None, 2)]))
    assert r.ips == {} and r.listeners == {}


def test_ip_sensors_are_bounded_and_the_least_recently_used_go_first() -> None:
    """Not Kafka's (unbounded): many addresses cannot grow the proxy's memory without end."""
    r = rates((None, 1))
    r.max_ip_sensors = 100
    for i in range(100):
        r.record_ip(L, 0, f"10.1.0.{i}", i)
    assert len(r.ips) == 100 and r.evicted == 0
    r.record_ip(L, 0, "10.1.0.0", 100)  # recently used again: kept
    r.record_ip(L, 0, "10.2.0.1", 101)  # full: the tenth least recently used go
    assert len(r.ips) == 91 and r.evicted == 1
    kept = {str(a) for _, a in r.ips}
    assert "10.1.0.0" in kept and "10.2.0.1" in kept
    assert not {f"10.1.0.{i}" for i in range(1, 11)} & kept
