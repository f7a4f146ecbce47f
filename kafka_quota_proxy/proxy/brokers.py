"""Listeners for upstream brokers: the runtime side of ``protocol.addresses``.

The response streams call ``ListeningRewriter``: the protocol's rewriter, which hands out proxy
ports as data, then a listener opened on each port handed out, before the rewritten response
is returned to be written, so a client told about a broker can connect at once. A port that
cannot be bound is refused and the response rewritten again (with the next free port).
"""

from __future__ import annotations

from collections.abc import Callable

from kafka_quota_proxy.protocol.addresses import Broker, BrokerAddresses
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.framing import Buffer
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
from kafka_quota_proxy.proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.brokers")


class ListeningRewriter:
    """``rewriter`` (whole frames) and ``rewrite_tail`` (streamed Fetch tags) for the response
    streams; ``bind(broker)`` must start listening on ``broker.proxy_port`` synchronously
    (raising ``OSError`` when the port cannot be bound)."""

    def __init__(self, rewriter: ResponseRewriter, addresses: BrokerAddresses,
                 bind: Callable[[Broker], None]) -> None:
        self.rewriter = rewriter
        self.addresses = addresses
        self._bind = bind

    def __call__(self, entry: InFlight, frame: Buffer) -> bytes | None:
        while True:
            try:
                new = self.rewriter(entry, frame)
            finally:  # ports handed out before a failure are listened on all the same
                listening = self.listen_new()
            if listening:
                return new

    def rewrite_tail(self, entry: InFlight, tail: bytes) -> bytes:
        while True:
            try:
                new = self.rewriter.rewrite_tail(entry, tail)
            finally:  # ports handed out before a failure are listened on all the same
                listening = self.listen_new()
            if listening:
                return new

    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        """``BrokerAddresses.advertise`` with the broker's listener open when it returns."""
        while True:
            try:
                address = self.addresses.advertise(node_id, host, port, rack)
            finally:  # ports handed out before a failure are listened on all the same
                listening = self.listen_new()
            if listening:
                return address

    def listen_new(self) -> bool:
        """Listen on every port handed out since the last call. False when one could not be
        bound: it is refused, and what named it must be rewritten again."""
        addresses = self.addresses
        for broker, old in addresses.moved:
            log.info("broker_moved", node_id=broker.node_id, old=old,
                     new=f"{broker.host}:{broker.port}", rack=broker.rack)
        addresses.moved.clear()
        for broker, preferred in addresses.displaced:
            log.warning("broker_port_displaced", node_id=broker.node_id, preferred=preferred,
                        proxy_port=broker.proxy_port,
                        detail="another node id took this node's port (node ids equal mod the "
                        "size of broker_ports): its port depends on the order brokers were "
                        "learnt in, so a restart or another worker may give another one; "
                        "make broker_ports cover the node ids")
        addresses.displaced.clear()
        ok = True
        for broker in list(addresses.unbound):
            try:
                self._bind(broker)
            except OSError as exc:
                log.warning("broker_port_unusable", port=broker.proxy_port,
                            node_id=broker.node_id, error=str(exc))
                addresses.refuse(broker)
                ok = False
                continue
            addresses.bound(broker)
            log.info("broker_added", node_id=broker.node_id,
                     upstream=f"{broker.host}:{broker.port}", rack=broker.rack,
                     proxy_port=broker.proxy_port)
        return ok
