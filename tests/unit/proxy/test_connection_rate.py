"""Connection-creation rates at accept (``proxy.features.connection_rates``, KIP-612 rules C3, C6
and C10 of the issue-17 spec on the asyncio side): a connection over its address's rate is held
unread and closed after its throttle time, never handed to a proxied connection; one over its
listener's rate waits, then is served, and the ones behind it wait their turn; the PROXY header's
source is the address; the metrics' names. The numbers themselves are
``tests/unit/quota/test_connection_rate.py``'s."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.protocol.proxy_header import encode_v1
from kafka_quota_proxy.proxy.accept import SecuredServer
from kafka_quota_proxy.proxy.features.connection_rates import (
    CLOSE_REASON,
    Admission,
)
from kafka_quota_proxy.proxy.server import Proxy
from kafka_quota_proxy.quota.connection_rate import address_of
from testkit.accept import Conn, accept, guard


async def test_c3_over_the_address_rate_held_unread_then_closed() -> None:
    g, stats = guard([{"ip": "<default>", "connection_creation_rate": 20}])
    for _ in range(20):  # 20/s over W = 1 s: 20 served at t=0
        transport, _, made = accept(g)
        assert len(made) == 1 and made[0].transport is transport and transport.protocol is made[0]
    started = time.monotonic()
    transport, protocol, made = accept(g)  # the 21st: round((21 - 20) / 20 * 1000) = 50 ms
    assert made == [] and transport.protocol is None  # no proxied connection, no upstream
    assert not transport.reading and g.held == 1
    protocol.data_received(b"\x00\x00\x00\x10request")  # read before the pause took hold
    await asyncio.sleep(0)
    assert not transport.reading and transport.closed_at is None
    while transport.closed_at is None:
        await asyncio.sleep(0.005)
    assert transport.closed_at - started >= 0.050  # never before its throttle time
    assert made == [] and g.held == 0
    assert stats.closed[CLOSE_REASON] == 1
    assert g.rates.counts["bootstrap"].ip_throttled == 1


async def test_c3_no_room_for_another_held_connection_closes_at_once() -> None:
    g, stats = guard([{"ip": "<default>", "connection_creation_rate": 1}], room=False)
    accept(g)
    transport, _, made = accept(g)
    assert transport.closed_at is not None and made == [] and g.held == 0
    assert stats.closed[CLOSE_REASON] == 1


async def test_served_connection_is_handed_over_with_what_was_read_early() -> None:
    g, _ = guard([{"ip": "10.9.9.9", "connection_creation_rate": 1}], listener_rate=20)
    for _ in range(20):
        accept(g)
    transport, protocol, made = accept(g)  # delayed 50 ms by the listener's rate
    assert made == [] and not transport.reading
    protocol.data_received(b"early")
    while not made:
        await asyncio.sleep(0.005)
    assert made[0].transport is transport and made[0].data == [b"early"]
    # no rate applies at all: the proxied connection itself, no step in between
    g, _ = guard([])
    assert isinstance(g.protocol_factory("bootstrap", None, -1, Conn)(), Conn)


async def test_c6_over_the_listener_rate_waits_its_turn_then_is_served() -> None:
    g, stats = guard([], listener_rate=20)
    order: list[tuple[int, float]] = []
    started = time.monotonic()

    def go(i: int) -> Any:
        return lambda: order.append((i, time.monotonic() - started))

    for i in range(20):
        g.turn(Admission("bootstrap", None, -1), go(i), lambda: True)
    assert [i for i, _ in order] == list(range(20))  # at once
    gone = Admission("bootstrap", None, -1)
    g.turn(Admission("bootstrap", None, -1), go(20), lambda: True)  # delayed 50 ms
    g.turn(gone, go(99), lambda: False)  # its client went away while waiting: skipped
    g.turn(Admission("bootstrap", None, -1), go(21), lambda: True)  # recorded after the 20th
    assert len(order) == 20
    while len(order) < 22:
        await asyncio.sleep(0.005)
    # 21st after 50 ms; the 22nd recorded when the 21st went (clock 0: 22 / 1 s -> 100 ms)
    assert [i for i, _ in order[20:]] == [20, 21]
    assert order[20][1] >= 0.050 and order[21][1] >= 0.150
    assert not gone.recorded
    assert g.rates.counts["bootstrap"].delayed == 2
    assert g.rates.counts["bootstrap"].delay_ms == 150
    assert stats.closed == {}


async def test_the_proxy_header_source_is_the_address_and_no_handshake_when_throttled(
) -> None:
    """A listener with PROXY protocol: the header's source is rated, not the socket's peer
    (127.0.0.1); a throttled connection gets no byte and is closed after its throttle."""
    g, stats = guard([{"ip": "203.0.113.5", "connection_creation_rate": 2}])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    made: list[tuple[str, int] | None] = []

    def make(source: tuple[str, int] | None, scope: int) -> asyncio.Protocol:
        made.append(source)
        return Conn(scope)

    server = SecuredServer(sock, "v1", None, make, 5.0, lambda reason: None, "LB:bootstrap",
                           g, "LB", -1)
    loop = asyncio.get_running_loop()
    clients = []
    try:
        for i in range(3):  # 2/s over W = 1 s: two served, the third throttled (500 ms)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_v1(("203.0.113.5", 40000 + i), ("127.0.0.1", port))
                         + b"\x00\x00\x00\x05hello")
            await writer.drain()
            clients.append((reader, writer))
            if i < 2:
                while len(made) < i + 1:
                    await asyncio.sleep(0.005)
        started = loop.time()
        assert await asyncio.wait_for(_until_closed(clients[2][0]), 5) == b""  # nothing sent
        assert loop.time() - started >= 0.45  # after its 500 ms throttle (less the wait above)
        assert made == [("203.0.113.5", 40000), ("203.0.113.5", 40001)]
        assert stats.closed[CLOSE_REASON] == 1
        # another source has no quota; the socket's peer (127.0.0.1) is not what is rated
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_v1(("198.51.100.1", 1), ("127.0.0.1", port)))
        clients.append((reader, writer))
        while len(made) < 3:
            await asyncio.sleep(0.005)
    finally:
        for _, writer in clients:
            writer.close()
        server.close()
        await server.wait_closed()


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the peer sent before closing (a reset: it closed with our bytes unread)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


def test_c10_metric_names_and_labels() -> None:
    g, _ = guard([{"ip": "<default>", "connection_creation_rate": 1}], listener_rate=1)
    g.rates.record_listener("bootstrap", 1, 0)
    g.rates.record_listener("bootstrap", 1, 0)
    g.rates.record_ip("bootstrap", -1, "10.0.0.1", 0)
    g.rates.record_ip("bootstrap", -1, "10.0.0.1", 0)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in g.metric_families() for s in family.samples}
    listener = (("listener", "bootstrap"),)
    assert samples == {
        ("kafka_proxy_connections_ip_throttled_total", listener): 1,
        ("kafka_proxy_connections_ip_throttle_seconds_total", listener): 1.0,
        ("kafka_proxy_connections_listener_delayed_total", listener): 1,
        ("kafka_proxy_connections_listener_delay_seconds_total", listener): 1.0,
        ("kafka_proxy_connection_accept_rate", listener): 2.0,
        ("kafka_proxy_connections_throttled_held", ()): 0,
        ("kafka_proxy_ip_connection_rate_sensors", ()): 1,
    }


def test_reload_and_alters_apply_to_the_live_rates() -> None:
    """A reload applies ``ip_entities`` and the listener kinds' rates live (the listeners'
    other keys need a restart); an altered ip quota applies over the file's."""
    base = """\
listeners: {bootstrap: "127.0.0.1:9192", advertised_host: h, broker_ports: "9193-9194"%s}
upstream: {bootstrap_servers: ["127.0.0.1:9092"]}
quotas:
  ip_entities: [{ip: "<default>", connection_creation_rate: %d}]
"""
    proxy = Proxy(parse_config(base % ("", 5)))
    rates = proxy.connection_rates
    assert rates.active and rates.kind_rates == {} and rates.rates.ip_quotas.default == 5
    proxy.reloads.apply(parse_config(base % (", max_connection_creation_rate: 7", 6)))
    assert rates.kind_rates == {None: 7} and rates.rates.ip_quotas.default == 6
    assert proxy.stats.reloads["success"] == 1
    proxy.quota_admin.admin.overrides = {(("ip", "10.0.0.1"),): {"connection_creation_rate": 2.0}}
    proxy.quotas_changed()
    assert rates.rates.ip_quotas.rates == {address_of("10.0.0.1"): 2}
    assert rates.kind_rates == {None: 7}  # an alter leaves the listeners' rates alone
    assert rates.rates.ip_quotas.default == 6
