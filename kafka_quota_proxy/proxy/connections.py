"""The proxied connections of one process (``ConnectionHost`` of every listener): admission
at accept (``network.max_connections``, ``max_connections_per_ip``), the open and closed
counts, the sweep of stalled connections, and the drain at shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.config.schema import NetworkConfig
from kafka_quota_proxy.proxy.admission import ConnectionSlots
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.connection import ProxiedConnection

log = get_logger("kafka_quota_proxy.server")

BOOTSTRAP = "bootstrap"


def _kind(listener: str) -> str:
    return BOOTSTRAP if listener.endswith(BOOTSTRAP) else "broker"


class Connections:
    def __init__(self, stats: ProxyStats, slots: ConnectionSlots,
                 network: NetworkConfig) -> None:
        self.stats = stats
        self.slots = slots
        self.network = network
        self.live: set[ProxiedConnection] = set()
        self.draining = False
        self._drained = asyncio.Event()

    def __iter__(self) -> Iterator[ProxiedConnection]:
        return iter(self.live)

    def __len__(self) -> int:
        return len(self.live)

    # ------------------------------------------------------------------ ConnectionHost
    def admit(self, conn: ProxiedConnection, transport: Any) -> bool:
        """Whether a client that just connected may stay. Connections that went through steps
        at accept (PROXY header, TLS handshake, connection rates) hold their slot already;
        others take one now: past ``max_connections``, or from an address that holds
        ``max_connections_per_ip`` already, it is refused at once (closed, logged at most once
        a second with the count, counted), so that file descriptors remain for upstream
        connections and the metrics endpoint."""
        slots = self.slots
        if slots.of(conn) is not None:
            return True
        slot = slots.take(conn.listener)
        if slot is None:
            return False
        peer = transport.get_extra_info("peername")
        if not slots.claim(slot, peer[0] if peer else None, conn.listener):
            return False
        slots.assign(slot, conn)
        return True

    def connection_opened(self, conn: ProxiedConnection) -> None:
        self.live.add(conn)
        kind = _kind(conn.listener)
        self.stats.connections_open[kind] += 1
        self.stats.connections_total[kind] += 1
        if self.draining:
            conn.close("shutdown")

    def connection_closed(self, conn: ProxiedConnection, reason: str) -> None:
        self.slots.release_owner(conn)
        if conn in self.live:
            self.live.discard(conn)
            self.stats.connections_open[_kind(conn.listener)] -= 1
        self.stats.closed[reason] += 1
        if self.draining and not self.live:
            self._drained.set()

    # ------------------------------------------------------------------ stalls
    async def sweep(self) -> None:
        """Close connections that stall: a request header not read within
        ``request_header_timeout_seconds`` of the request's first byte, a request not read
        whole within ``request_read_timeout_seconds``, nothing in flight and no bytes either
        way for ``connections_max_idle_seconds`` (Kafka's ``connections.max.idle.ms``)."""
        net = self.network
        header_s, read_s = net.request_header_timeout_seconds, net.request_read_timeout_seconds
        idle_s = net.connections_max_idle_seconds
        interval = min(1.0, header_s / 4, read_s / 4, idle_s / 4 if idle_s else 1.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.live):
                started = conn.frame_started
                if started is not None:
                    if conn.requests.reading_header and now - started >= header_s:
                        conn.close("request_header_timeout", side="client",
                                   detail=f"request header not read within {header_s:g} s")
                    elif now - started >= read_s:
                        conn.close("request_read_timeout", side="client",
                                   detail=f"request not read within {read_s:g} s")
                elif idle_s and conn.idle and now - conn.last_active >= idle_s:
                    conn.close("idle_timeout")

    # ------------------------------------------------------------------ shutdown
    async def drain(self) -> None:
        """Stop reading new requests; idle connections close now, busy ones once answered;
        those left after ``shutdown_timeout_seconds`` are closed."""
        self.draining = True
        for conn in list(self.live):
            conn.client_gate.pause("shutdown")
            if conn.idle:
                conn.finish()
        if not self.live:
            return
        try:
            await asyncio.wait_for(self._drained.wait(), self.network.shutdown_timeout_seconds)
        except TimeoutError:
            log.warning("shutdown_timeout", connections=len(self.live))
            for conn in list(self.live):
                conn.close("shutdown_timeout")
