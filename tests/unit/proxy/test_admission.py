"""Slots and trusted sources at accept (``proxy.admission``) on the asyncio side: a plain
listener's connection going through the connection rates takes its slot at accept, keeps it
while held, is counted against its address when it passes and hands the slot to the proxied
connection; a listener that takes PROXY headers refuses a source outside its networks before
reading a byte and counts the header's source, not the socket's peer; refusals are counted."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from kafka_quota_proxy.protocol.proxy_header import encode_v1
from kafka_quota_proxy.proxy.accept import SecuredServer
from kafka_quota_proxy.proxy.admission import UNTRUSTED_SOURCE, ConnectionSlots, TrustedSources
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.connection_limits import ConnectionLimits
from testkit.accept import Conn, Transport, accept, guard


def test_trusted_sources_match_networks_and_mapped_addresses() -> None:
    trusted = TrustedSources(["10.0.0.0/24", "2001:db8::/32", "192.0.2.7"])
    assert trusted.trusts("10.0.0.200") and trusted.trusts("::ffff:10.0.0.1")
    assert trusted.trusts("2001:db8::1") and trusted.trusts("192.0.2.7")
    assert not trusted.trusts("10.0.1.1") and not trusted.trusts("192.0.2.8")
    assert not trusted.trusts(None) and not trusted.trusts("")


async def test_a_gated_plain_connection_holds_its_slot_from_accept() -> None:
    g, stats = guard([{"ip": "<default>", "connection_creation_rate": 1}])
    slots = ConnectionSlots(stats, ConnectionLimits(3, per_ip=1))
    g.slots = slots
    _, _, made = accept(g)  # served: counted against 10.0.0.1, handed over
    assert len(made) == 1 and slots.of(made[0]) is not None and slots.in_use == 1
    held, gate, made = accept(g)  # over 1/s: held, keeps its slot (not its address's)
    assert made == [] and g.held == 1 and slots.in_use == 2
    _, _, made = accept(g, peer="10.0.0.2")  # another address: rates are per address
    assert len(made) == 1 and slots.in_use == 3
    # full: the next socket is refused at once, before any step
    transport = Transport("10.0.0.3")
    factory = g.protocol_factory("bootstrap", None, -1, Conn)
    factory().connection_made(transport)  # type: ignore[arg-type]
    assert transport.closed_at is not None and stats.refused["max_connections"] == 1
    # the held one closes after its throttle: its slot goes with it
    while held.closed_at is None:
        await asyncio.sleep(0.005)
    gate.connection_lost(None)
    assert slots.in_use == 2


async def test_a_gated_plain_connection_over_its_address_limit_is_refused() -> None:
    g, stats = guard([{"ip": "<default>", "connection_creation_rate": 100}])
    slots = ConnectionSlots(stats, ConnectionLimits(10, per_ip=1))
    g.slots = slots
    accept(g)
    _, gate, made = accept(g)
    assert made == [] and stats.refused["max_connections_per_ip"] == 1 and slots.in_use == 1
    gate.connection_lost(None)  # (the abort) frees nothing more
    assert slots.in_use == 1


async def _closed_unanswered(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def test_secured_server_trusted_sources_and_per_address_slots() -> None:
    stats = ProxyStats()
    slots = ConnectionSlots(stats, ConnectionLimits(10, per_ip=1))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    made: list[tuple[str, int] | None] = []
    protocols: list[Conn] = []
    refused: list[str] = []

    def make(source: tuple[str, int] | None, scope: int) -> asyncio.Protocol:
        made.append(source)
        protocols.append(Conn(scope))
        return protocols[-1]

    def serve(trusted: list[str]) -> SecuredServer:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        s.setblocking(False)
        return SecuredServer(s, "v1", None, make, 5.0, refused.append, "LB:bootstrap",
                             slots=slots, trusted=TrustedSources(trusted))

    untrusting = serve(["10.0.0.0/8"])
    server = SecuredServer(sock, "v1", None, make, 5.0, refused.append, "LB:bootstrap",
                           slots=slots, trusted=TrustedSources(["127.0.0.1/32"]))
    writers: list[Any] = []
    try:
        # from 127.0.0.1, not in 10.0.0.0/8: closed before its header is read
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", untrusting.sock.getsockname()[1])
        writers.append(writer)
        writer.write(encode_v1(("198.51.100.1", 1), ("127.0.0.1", 1)))
        assert await _closed_unanswered(reader)
        assert refused == [UNTRUSTED_SOURCE] and made == []
        # trusted: the header's source is the address counted (one each)
        for source in (("198.51.100.1", 1), ("198.51.100.2", 2), ("198.51.100.1", 3)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writers.append(writer)
            writer.write(encode_v1(source, ("127.0.0.1", port)))
            await writer.drain()
            if source[1] == 3:
                assert await _closed_unanswered(reader)
        while len(made) < 2:
            await asyncio.sleep(0.005)
        assert made == [("198.51.100.1", 1), ("198.51.100.2", 2)]
        assert stats.refused["max_connections_per_ip"] == 1
        assert slots.in_use == 2 and all(slots.of(p) is not None for p in protocols)
    finally:
        for writer in writers:
            writer.close()
        for s in (server, untrusting):
            s.close()
            await s.wait_closed()
