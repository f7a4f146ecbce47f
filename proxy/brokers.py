"""Upstream brokers and the proxy port each one gets.

Every upstream broker (node id) gets its own proxy port from ``listeners.broker_ports``:
preferably ``first + node_id mod size``, else the next free port of the range (wrapping), so
the same cluster gets the same ports on every start, and a node keeps its port for as long
as the proxy runs. A broker first seen in a response gets its port and listener at once,
before that response reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from config.schema import PortRange
from proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.brokers")


class BrokerPortsExhausted(Exception):
    reason = "broker_ports_exhausted"


@dataclass(slots=True)
class Broker:
    node_id: int
    host: str  # upstream address, as the cluster advertises it
    port: int
    rack: str | None
    proxy_port: int


class BrokerRegistry:
    """Implements ``protocol.rewrite.AddressMap``.

    ``bind(broker)`` is called synchronously for a new broker and must start listening on
    ``broker.proxy_port`` (raising ``OSError`` if the port cannot be bound, in which case the
    next free port is tried).
    """

    def __init__(
        self, advertised_host: str, ports: PortRange, bind: Callable[[Broker], None]
    ) -> None:
        self.advertised_host = advertised_host
        self.ports = ports
        self._bind = bind
        self.by_node: dict[int, Broker] = {}
        self._taken: set[int] = set()  # ports in use or found unusable

    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        broker = self.by_node.get(node_id)
        if broker is None:
            broker = self._add(node_id, host, port, rack)
        elif (broker.host, broker.port) != (host, port) or broker.rack != rack:
            log.info(
                "broker_moved",
                node_id=node_id,
                old=f"{broker.host}:{broker.port}",
                new=f"{host}:{port}",
                rack=rack,
            )
            broker.host, broker.port, broker.rack = host, port, rack
        return self.advertised_host, broker.proxy_port

    def _add(self, node_id: int, host: str, port: int, rack: str | None) -> Broker:
        size = len(self.ports)
        start = node_id % size
        for i in range(size):
            proxy_port = self.ports.first + (start + i) % size
            if proxy_port in self._taken:
                continue
            broker = Broker(node_id, host, port, rack, proxy_port)
            try:
                self._bind(broker)
            except OSError as exc:
                log.warning(
                    "broker_port_unusable", port=proxy_port, node_id=node_id, error=str(exc)
                )
                self._taken.add(proxy_port)
                continue
            self._taken.add(proxy_port)
            self.by_node[node_id] = broker
            log.info(
                "broker_added",
                node_id=node_id,
                upstream=f"{host}:{port}",
                rack=rack,
                proxy_port=proxy_port,
            )
            return broker
        raise BrokerPortsExhausted(f"no free port in broker_ports {self.ports} for node {node_id}")

    def get(self, node_id: int) -> Broker | None:
        return self.by_node.get(node_id)

    def __len__(self) -> int:
        return len(self.by_node)
