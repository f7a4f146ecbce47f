"""Kafka's ``ConnectionQuotas.inc`` counts (``quota.connection_limits``): the total over every
listener, and per address: ``max.connections.per.ip`` N lets N connections of an address
through and refuses the N+1th, an override replaces the default for its address, 0 refuses
them all; a closed connection frees its place; an IPv4-mapped IPv6 address is the IPv4 one."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.connection_limits import MAX_INT, ConnectionLimits


def test_per_ip_limit_refuses_the_connection_past_it() -> None:
    limits = ConnectionLimits(100, per_ip=2)
    a = [limits.take() for _ in range(3)]
    assert all(s is not None for s in a)
    assert limits.claim(a[0], "10.0.0.1") is None
    assert limits.claim(a[1], "10.0.0.1") is None
    assert limits.claim(a[2], "10.0.0.1") == 2  # the third: refused, its slot released
    assert a[2].released and limits.total == 2
    assert {str(k): v for k, v in limits.counts.items()} == {"10.0.0.1": 2}
    other = limits.take()
    assert other is not None and limits.claim(other, "10.0.0.2") is None  # another address
    limits.release(a[0])
    again = limits.take()
    assert again is not None and limits.claim(again, "10.0.0.1") is None  # a place freed


def test_overrides_replace_the_default_and_zero_refuses_all() -> None:
    limits = ConnectionLimits(100, per_ip=1, overrides={"10.0.0.9": 3, "10.0.0.8": 0})
    assert limits.limits_addresses
    slots = [limits.take() for _ in range(5)]
    assert [limits.claim(s, "10.0.0.9") for s in slots[:4]] == [None, None, None, 3]
    assert limits.claim(slots[4], "10.0.0.8") == 0


def test_ipv4_mapped_addresses_count_as_the_ipv4_address() -> None:
    limits = ConnectionLimits(100, per_ip=1)
    first, second = limits.take(), limits.take()
    assert first is not None and second is not None
    assert limits.claim(first, "10.0.0.1") is None
    assert limits.claim(second, "::ffff:10.0.0.1") == 1


def test_total_refuses_past_max_connections_and_release_is_once() -> None:
    limits = ConnectionLimits(2)
    assert not limits.limits_addresses and limits.per_ip == MAX_INT
    a, b = limits.take(), limits.take()
    assert a is not None and b is not None and limits.take() is None
    limits.release(a)
    limits.release(a)  # a second release frees nothing more
    assert limits.total == 1
    assert limits.take() is not None and limits.take() is None


def test_a_slot_without_an_ip_address_counts_against_no_address() -> None:
    limits = ConnectionLimits(10, per_ip=0, overrides={"10.0.0.1": 1})
    s = limits.take()
    assert s is not None and limits.claim(s, None) is None and limits.counts == {}


def test_an_override_must_be_an_address() -> None:
    with pytest.raises(ValueError, match="not an IP address"):
        ConnectionLimits(10, overrides={"lb.example.com": 1})
