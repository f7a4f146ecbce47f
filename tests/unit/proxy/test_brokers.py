"""Port assignment for upstream brokers, and listeners opened on the fly."""

from __future__ import annotations

import asyncio

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.demo.embedded_broker import free_port, free_port_range
from kafka_quota_proxy.protocol.addresses import Broker, BrokerAddresses, BrokerPortsExhausted
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
from kafka_quota_proxy.proxy.brokers import ListeningRewriter
from testkit.frames import response_frame

FIND_COORDINATOR = 10


def _registry(first: int = 9193, last: int = 9292) -> BrokerAddresses:
    return BrokerAddresses("proxy.example", first, last)


def _listening(first: int, last: int, refuse: set[int]
               ) -> tuple[ListeningRewriter, BrokerAddresses, list[Broker]]:
    """The runtime side over a fake bind that refuses the ports in ``refuse``."""
    addresses = _registry(first, last)
    bound: list[Broker] = []

    def bind(broker: Broker) -> None:
        if broker.proxy_port in refuse:
            raise OSError(98, "Address already in use")
        bound.append(broker)

    return ListeningRewriter(ResponseRewriter(addresses), addresses, bind), addresses, bound


def test_port_is_first_plus_node_id_modulo_size() -> None:
    registry = _registry()
    assert registry.advertise(1, "b1", 9092, None) == ("proxy.example", 9194)
    assert registry.advertise(111, "b111", 9092, "r") == ("proxy.example", 9193 + 11)
    # handed out as data: the runtime listens on them before the response is written
    assert [b.node_id for b in registry.unbound] == [1, 111]


def test_same_cluster_same_ports_whatever_the_discovery_order() -> None:
    a = _registry()
    b = _registry()
    ids = [5, 1001, 3, 2002]
    ports_a = {n: a.advertise(n, f"h{n}", 9092, None)[1] for n in ids}
    ports_b = {n: b.advertise(n, f"h{n}", 9092, None)[1] for n in reversed(ids)}
    assert ports_a == ports_b  # no two of these ids share a slot


def test_clash_probes_the_next_free_port() -> None:
    registry = _registry(9000, 9009)
    assert registry.advertise(3, "a", 1, None)[1] == 9003
    assert registry.advertise(13, "b", 1, None)[1] == 9004
    assert registry.advertise(9, "c", 1, None)[1] == 9009
    assert registry.advertise(19, "d", 1, None)[1] == 9000  # wraps around
    # the displaced ones are noted (their port depends on the discovery order: logged)
    assert [(b.node_id, preferred) for b, preferred in registry.displaced] == [
        (13, 9003), (19, 9009)]


def test_unbindable_port_is_skipped() -> None:
    listening, registry, bound = _listening(9000, 9009, refuse={9003})
    assert listening.advertise(3, "a", 1, None)[1] == 9004
    assert [b.proxy_port for b in bound] == [9004]
    assert not registry.unbound and registry.get(3) == bound[0]


def test_a_response_naming_an_unbindable_port_is_rewritten_again() -> None:
    """The rewrite hands out 9003, which cannot be bound: the response is rewritten again and
    names 9004, the port that listens (never a port the proxy does not serve)."""
    listening, registry, bound = _listening(9000, 9009, refuse={9003})
    entry = InFlight(FIND_COORDINATOR, 0, 1, "c", 0, True)
    body = (b"\x00\x00" + (3).to_bytes(4, "big") + (len(b"up")).to_bytes(2, "big") + b"up"
            + (9092).to_bytes(4, "big"))  # error 0, node 3 at up:9092
    new = listening(entry, response_frame(FIND_COORDINATOR, 0, 1, body)[4:])
    assert new is not None and new.endswith((9004).to_bytes(4, "big"))
    assert b"proxy.example" in new
    assert [b.proxy_port for b in bound] == [9004] and not registry.unbound


def test_port_stays_when_broker_moves() -> None:
    listening, registry, bound = _listening(9193, 9292, refuse=set())
    port = listening.advertise(7, "old-host", 9092, None)[1]
    assert listening.advertise(7, "new-host", 9093, "rack-b")[1] == port
    broker = registry.get(7)
    assert broker is not None and (broker.host, broker.port, broker.rack) == (
        "new-host", 9093, "rack-b")
    assert len(bound) == 1  # no second listener


def test_exhausted_range_raises() -> None:
    registry = _registry(9000, 9001)
    registry.advertise(0, "a", 1, None)
    registry.advertise(1, "b", 1, None)
    with pytest.raises(BrokerPortsExhausted):
        registry.advertise(2, "c", 1, None)


async def test_new_broker_gets_a_listening_port_at_once() -> None:
    from kafka_quota_proxy.proxy.server import Proxy

    base, _ = free_port_range(5)
    config = parse_config(f"""
listeners:
  bootstrap: "127.0.0.1:{free_port()}"
  advertised_host: "127.0.0.1"
  broker_ports: "{base}-{base + 4}"
upstream:
  bootstrap_servers: ["127.0.0.1:1"]
""")
    proxy = Proxy(config)
    host, port = proxy.main.listening.advertise(42, "upstream.example", 9092, None)
    assert (host, port) == ("127.0.0.1", base + 42 % 5)
    # The socket listens before the call returns: a client told about the broker can connect.
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    await proxy.wait_listening()
    assert "broker-42" in proxy.servers
    await proxy.shutdown()
