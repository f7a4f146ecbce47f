"""Which accepted connections may stay: ``network.max_connections`` and the per-address limits
(``quota.connection_limits``), counted from the moment a socket is accepted, whatever it is
waiting for (a PROXY header, its TLS handshake, its listener's connection rate, its throttle
time) until it closes; and the PROXY protocol's trusted sources
(``listeners.security.proxy_protocol_trusted_sources``).

A refused connection is closed at once (RST), counted in
``kafka_proxy_connections_refused_total{reason}`` (``max_connections``,
``max_connections_per_ip``) and logged at most once a second per reason, with the count of
those left out; a PROXY header from a source outside the trusted networks closes its
connection (``proxy_header_untrusted_source``, counted and logged alike, in
``kafka_proxy_connections_closed_total``)."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from kafka_quota_proxy.proxy.logs import RateLimitedLog, get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.connection_limits import ConnectionLimits, Slot
from kafka_quota_proxy.quota.connection_rate import address_of

MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_IP = "max_connections_per_ip"
UNTRUSTED_SOURCE = "proxy_header_untrusted_source"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
log = get_logger("kafka_quota_proxy.admission")


class _RefusalLog:
    """``connections_refused`` at most once a second per reason, with ``refused``: how many
    since the last line (the rest of a burst is logged a second later)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.logged_at = 0.0
        self.since = 0
        self.fields: dict[str, Any] = {}
        self.flush: asyncio.TimerHandle | None = None

    def __call__(self, **fields: Any) -> None:
        self.since += 1
        self.fields = fields
        if time.monotonic() - self.logged_at >= 1.0:
            self.write()
        elif self.flush is None:
            self.flush = asyncio.get_running_loop().call_later(1.0, self.write)

    def write(self) -> None:
        if self.flush is not None:
            self.flush.cancel()
            self.flush = None
        if self.since:
            log.warning("connections_refused", reason=self.reason, **self.fields,
                        refused=self.since)
        self.logged_at = time.monotonic()
        self.since = 0


class ConnectionSlots:
    """The slots of one proxy process. A slot is taken at accept (``take``), counted against
    the client's address once it is known (``claim``), handed to the proxied connection
    (``assign``) and given back when that closes (``release_owner``) or, when it never got
    there, by whoever holds it (``release``)."""

    def __init__(self, stats: ProxyStats, limits: ConnectionLimits) -> None:
        self.stats = stats
        self.limits = limits
        self._owned: dict[int, Slot] = {}  # id(owner) -> its slot
        self._log = {MAX_CONNECTIONS: _RefusalLog(MAX_CONNECTIONS),
                     MAX_CONNECTIONS_PER_IP: _RefusalLog(MAX_CONNECTIONS_PER_IP)}

    @property
    def in_use(self) -> int:
        return self.limits.total

    def take(self, listener: str) -> Slot | None:
        slot = self.limits.take()
        if slot is None:
            self._refused(MAX_CONNECTIONS, listener=listener,
                          max_connections=self.limits.max_connections)
        return slot

    def claim(self, slot: Slot, ip: str | None, listener: str) -> bool:
        """Whether the connection from ``ip`` may stay; when not, its slot is released and the
        caller closes it."""
        limit = self.limits.claim(slot, ip)
        if limit is None:
            return True
        self._refused(MAX_CONNECTIONS_PER_IP, listener=listener, client=ip,
                      max_connections_per_ip=limit)
        return False

    def _refused(self, reason: str, **fields: Any) -> None:
        self.stats.refused[reason] += 1
        self._log[reason](**fields)

    def assign(self, slot: Slot, owner: object) -> None:
        slot.owner = owner
        self._owned[id(owner)] = slot

    def of(self, owner: object) -> Slot | None:
        slot = self._owned.get(id(owner))
        return slot if slot is not None and slot.owner is owner else None

    def release(self, slot: Slot) -> None:
        if slot.owner is not None and self._owned.get(id(slot.owner)) is slot:
            del self._owned[id(slot.owner)]
        self.limits.release(slot)

    def release_owner(self, owner: object) -> None:
        slot = self.of(owner)
        if slot is not None:
            self.release(slot)

    def metric_families(self) -> Iterator[Any]:
        pending = GaugeMetricFamily(
            "kafka_proxy_connection_slots",
            "Client connections counted against max_connections: proxied, and accepted but "
            "not proxied yet (reading a PROXY header, in the TLS handshake, waiting for a "
            "connection rate, held throttled)")
        pending.add_metric([], self.limits.total)
        yield pending
        ips = GaugeMetricFamily(
            "kafka_proxy_connection_addresses",
            "Client addresses holding connections (counted against max_connections_per_ip)")
        ips.add_metric([], len(self.limits.counts))
        yield ips


class TrustedSources:
    """The networks allowed to send a PROXY protocol header on a listener."""

    def __init__(self, networks: Sequence[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in networks)
        self._log = RateLimitedLog(log, "connection_closed")

    def trusts(self, ip: str | None) -> bool:
        address = address_of(ip)
        return address is not None and any(
            address.version == n.version and address in n for n in self.networks)

    def log_refused(self, listener: str, client: str) -> None:
        self._log(listener=listener, client=client, reason=UNTRUSTED_SOURCE, offender="client",
                  detail="a PROXY protocol header is taken only from "
                  "proxy_protocol_trusted_sources")
