"""Port assignment for upstream brokers, and listeners opened on the fly."""

from __future__ import annotations

import asyncio

import pytest

from config.loading import parse_config
from config.schema import PortRange
from demo.embedded_broker import free_port, free_port_range
from proxy.brokers import Broker, BrokerPortsExhausted, BrokerRegistry


def _registry(first: int = 9193, last: int = 9292, refuse: set[int] | None = None
              ) -> tuple[BrokerRegistry, list[Broker]]:
    bound: list[Broker] = []

    def bind(broker: Broker) -> None:
        if refuse and broker.proxy_port in refuse:
            raise OSError(98, "Address already in use")
        bound.append(broker)

    return BrokerRegistry("proxy.example", PortRange(first, last), bind), bound


def test_port_is_first_plus_node_id_modulo_size() -> None:
    registry, bound = _registry()
    assert registry.advertise(1, "b1", 9092, None) == ("proxy.example", 9194)
    assert registry.advertise(111, "b111", 9092, "r") == ("proxy.example", 9193 + 11)
    assert [b.node_id for b in bound] == [1, 111]


def test_same_cluster_same_ports_whatever_the_discovery_order() -> None:
    a, _ = _registry()
    b, _ = _registry()
    ids = [5, 1001, 3, 2002]
    ports_a = {n: a.advertise(n, f"h{n}", 9092, None)[1] for n in ids}
    ports_b = {n: b.advertise(n, f"h{n}", 9092, None)[1] for n in reversed(ids)}
    assert ports_a == ports_b  # no two of these ids share a slot


def test_clash_probes_the_next_free_port() -> None:
    registry, _ = _registry(9000, 9009)
    assert registry.advertise(3, "a", 1, None)[1] == 9003
    assert registry.advertise(13, "b", 1, None)[1] == 9004
    assert registry.advertise(9, "c", 1, None)[1] == 9009
    assert registry.advertise(19, "d", 1, None)[1] == 9000  # wraps around


def test_unbindable_port_is_skipped() -> None:
    registry, bound = _registry(9000, 9009, refuse={9003})
    assert registry.advertise(3, "a", 1, None)[1] == 9004
    assert [b.proxy_port for b in bound] == [9004]


def test_port_stays_when_broker_moves() -> None:
    registry, bound = _registry()
    port = registry.advertise(7, "old-host", 9092, None)[1]
    assert registry.advertise(7, "new-host", 9093, "rack-b")[1] == port
    broker = registry.get(7)
    assert broker is not None and (broker.host, broker.port, broker.rack) == (
        "new-host", 9093, "rack-b")
    assert len(bound) == 1  # no second listener


def test_exhausted_range_raises() -> None:
    registry, _ = _registry(9000, 9001)
    registry.advertise(0, "a", 1, None)
    registry.advertise(1, "b", 1, None)
    with pytest.raises(BrokerPortsExhausted):
        registry.advertise(2, "c", 1, None)


async def test_new_broker_gets_a_listening_port_at_once() -> None:
    from proxy.server import Proxy

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
    host, port = proxy.registry.advertise(42, "upstream.example", 9092, None)
    assert (host, port) == ("127.0.0.1", base + 42 % 5)
    # The socket listens before the call returns: a client told about the broker can connect.
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    await proxy.wait_listening()
    assert "broker-42" in proxy.servers
    await proxy.shutdown()
