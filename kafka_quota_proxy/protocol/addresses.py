"""Proxy ports for upstream brokers, allocated as data (no socket is touched here).

Every upstream broker (node id) gets its own proxy port from ``listeners.broker_ports``:
preferably ``first + node_id mod size``, else the next free port of the range (wrapping), so
the same cluster gets the same ports on every start, and a node keeps its port for as long
as the proxy runs. The rewriter asks ``advertise`` while it rewrites a response; a port handed
out for a new broker is listed in ``unbound`` until the runtime listens on it (``bound``) or
finds it unusable (``refuse``: the port is never offered again and the rewrite is run again,
so a client is only ever told about a port the proxy listens on).
"""

from __future__ import annotations

from dataclasses import dataclass


class BrokerPortsExhausted(Exception):
    reason = "broker_ports_exhausted"


@dataclass(slots=True)
class Broker:
    node_id: int
    host: str  # upstream address, as the cluster advertises it
    port: int
    rack: str | None
    proxy_port: int


class BrokerAddresses:
    """Implements ``protocol.rewrite.AddressMap`` over the port range ``[first, last]``."""

    def __init__(self, advertised_host: str, first: int, last: int) -> None:
        self.advertised_host = advertised_host
        self.first = first
        self.size = last - first + 1
        self.by_node: dict[int, Broker] = {}
        self._taken: set[int] = set()  # ports handed out or found unusable
        self.unbound: list[Broker] = []  # handed out, not listened on yet
        self.moved: list[tuple[Broker, str]] = []  # (broker, its old upstream address)
        # brokers whose preferred port (``first + node_id mod size``) was taken: their port
        # depends on the order brokers were learnt in (so may differ between processes)
        self.displaced: list[tuple[Broker, int]] = []  # (broker, preferred port)

    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        broker = self.by_node.get(node_id)
        if broker is None:
            broker = self._add(node_id, host, port, rack)
        elif (broker.host, broker.port) != (host, port) or broker.rack != rack:
            self.moved.append((broker, f"{broker.host}:{broker.port}"))
            broker.host, broker.port, broker.rack = host, port, rack
        return self.advertised_host, broker.proxy_port

    def _add(self, node_id: int, host: str, port: int, rack: str | None) -> Broker:
        start = node_id % self.size
        for i in range(self.size):
            proxy_port = self.first + (start + i) % self.size
            if proxy_port not in self._taken:
                self._taken.add(proxy_port)
                broker = self.by_node[node_id] = Broker(node_id, host, port, rack, proxy_port)
                self.unbound.append(broker)
                if i:
                    self.displaced.append((broker, self.first + start))
                return broker
        raise BrokerPortsExhausted(
            f"no free port in broker_ports {self.first}-{self.first + self.size - 1} "
            f"for node {node_id}")

    def bound(self, broker: Broker) -> None:
        """The runtime listens on ``broker.proxy_port``."""
        self.unbound.remove(broker)

    def refuse(self, broker: Broker) -> None:
        """``broker.proxy_port`` cannot be listened on: never offered again; the broker gets
        another port the next time it is advertised."""
        self.unbound.remove(broker)
        if self.by_node.get(broker.node_id) is broker:
            del self.by_node[broker.node_id]

    def get(self, node_id: int) -> Broker | None:
        return self.by_node.get(node_id)

    def __len__(self) -> int:
        return len(self.by_node)
