"""Fakes for the connection-rate guard at accept (``proxy.features.connection_rates``), driven
without sockets: a guard with given ip entities, a transport that records pausing and closing,
the connection it would hand on, and one accept through the guard."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kafka_quota_proxy.config.schema import ListenerKindConfig, QuotasConfig
from kafka_quota_proxy.proxy.features.connection_rates import ConnectionRateGuard, _GatedAccept
from kafka_quota_proxy.proxy.metrics import ProxyStats

WINDOW = {"samples": 2, "size_seconds": 1}  # W = 1 s from the start: small throttle times


def guard(ip_entities: list[dict[str, Any]], listener_rate: int | None = None,
          room: bool = True) -> tuple[ConnectionRateGuard, ProxyStats]:
    stats = ProxyStats()
    g = ConnectionRateGuard(stats, clock=lambda: 0, room=lambda: room)
    kind = ListenerKindConfig.model_validate({
        "bootstrap": "127.0.0.1:1", "broker_ports": "2-3",
        "max_connection_creation_rate": listener_rate})
    g.configure(QuotasConfig.model_validate({"window": WINDOW, "ip_entities": ip_entities}),
                [(None, kind)])
    return g, stats


class Transport:
    def __init__(self, peer: str = "10.0.0.1") -> None:
        self.peer = peer
        self.reading = True
        self.closed_at: float | None = None
        self.protocol: Any = None

    def get_extra_info(self, name: str) -> Any:
        return (self.peer, 40000) if name == "peername" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed_at is not None

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic()

    def abort(self) -> None:
        self.close()

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


class Conn(asyncio.Protocol):
    def __init__(self, scope: int = -1) -> None:
        self.scope = scope  # chosen at accept
        self.transport: Any = None
        self.data: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data.append(data)


def accept(g: ConnectionRateGuard, peer: str = "10.0.0.1"
           ) -> tuple[Transport, _GatedAccept, list[Conn]]:
    made: list[Conn] = []

    def make(scope: int) -> Conn:
        made.append(Conn(scope))
        return made[-1]

    protocol = g.protocol_factory("bootstrap", None, -1, make)()
    assert isinstance(protocol, _GatedAccept)
    transport = Transport(peer)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return transport, protocol, made
