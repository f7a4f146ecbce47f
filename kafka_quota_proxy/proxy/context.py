"""What a connection may use of the proxy that accepted it (in the manner of uvicorn's
``ServerState``): a small frozen context per listener, and the callbacks it makes."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_quota_proxy.config.schema import NetworkConfig
from kafka_quota_proxy.protocol.interests import InterestTable
from kafka_quota_proxy.proxy.brokers import ListeningRewriter
from kafka_quota_proxy.proxy.cluster import OwnIdentity
from kafka_quota_proxy.proxy.filters.base import FilterFactory
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.proxy.tls import ServerTls
from kafka_quota_proxy.security.principal_mapping import PrincipalMapper


class ConnectionHost(Protocol):
    """The callbacks a connection makes to the proxy that accepted it."""

    @property
    def draining(self) -> bool:
        """Shutting down: connections end once they have nothing in flight."""

    def admit(self, conn: Any, transport: Any) -> bool:
        """Whether a connection just accepted may stay (``network.max_connections`` and
        ``max_connections_per_ip``, unless it was admitted before its header or handshake)."""

    def connection_opened(self, conn: Any) -> None: ...

    def connection_closed(self, conn: Any, reason: str) -> None: ...


# How a connection reaches a broker: ``connect(host, port, protocol_factory)`` gives the
# transport and the protocol made by ``protocol_factory`` once connected (and authenticated).
UpstreamConnector = Callable[[str, int, Callable[[], Any]],
                             Awaitable[tuple[asyncio.Transport, Any]]]


@dataclass(frozen=True, slots=True)
class ConnectionContext:
    """Everything a connection of one listener uses, fixed when the listener is made."""

    host: ConnectionHost
    listener: str  # "bootstrap" or "broker-<node id>"
    # whose quotas apply: the upstream node id; the bootstrap scope on a bootstrap listener,
    # whose connections each get theirs at accept (``proxy.bootstrap``)
    scope: int
    network: NetworkConfig
    connect_timeout_seconds: float
    stats: ProxyStats
    rewriter: ListeningRewriter  # the response rewriter, listening on new brokers' ports
    interests: InterestTable  # of the filters below
    filters: tuple[FilterFactory, ...]  # one filter of each, per connection, in chain order
    # the (api_key, api_version) responses the filters (not the address rewriter) hold whole
    filter_response_frames: frozenset[tuple[int, int]] = frozenset()
    tls: ServerTls | None = None  # TLS toward clients
    # an mTLS client's principal from its certificate (SSL listeners; SASL ones read SASL)
    principal_mapper: PrincipalMapper | None = None
    upstream_tls: ssl.SSLContext | None = None  # TLS toward the brokers
    # SASL termination: each upstream connection authenticates as the proxy first
    upstream_identity: OwnIdentity | None = None
    # How the connections reach their broker; None: a socket, with ``upstream_tls`` and
    # ``upstream_identity`` (the connection core itself never opens one: a unit test gives it
    # a connector to fake transports, ``testkit.connection``)
    connect_upstream: UpstreamConnector | None = None
