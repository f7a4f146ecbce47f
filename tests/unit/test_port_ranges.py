"""Broker port ranges for the proxies the tests and the demo start: drawn below the kernel's
ephemeral range, where no outgoing connection can take one between the draw and the proxy's
bind (a CI run lost a rack test to "Address already in use" on a port in that range)."""

from __future__ import annotations

import socket

from kafka_quota_proxy.demo.embedded_broker import _ephemeral_low, free_port_range


def test_ranges_are_free_and_below_the_ephemeral_ports() -> None:
    low = _ephemeral_low()
    for _ in range(50):
        first, last = free_port_range(20)
        assert last - first == 19
        assert first >= 20000 and last < low
        with socket.socket() as s:  # free when drawn
            s.bind(("127.0.0.1", first))
