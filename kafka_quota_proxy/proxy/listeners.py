"""One kind of client listener (``listeners``, and each of ``listeners.extra``): Kafka's
listener map in the proxy.

A kind has its own bootstrap port, its own port per upstream broker, and its own security:
TLS (``proxy.tls``), how principals are read (mTLS mapping rules, SASL inspection or
termination) and PROXY protocol. It has its own broker addresses too (``BrokerAddresses``,
rewriter, listeners), because a client is told about the brokers' ports of the kind it
connected to, as a Kafka broker answers with the endpoints of the listener a request came in
on. Quotas, storage, routing and capture are the proxy's, shared by every kind (a broker's
quotas do not depend on the listener).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from kafka_quota_proxy.config.schema import ListenerKindConfig, ProxyConfig
from kafka_quota_proxy.protocol.addresses import Broker, BrokerAddresses
from kafka_quota_proxy.protocol.interests import InterestTable, addresses
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
from kafka_quota_proxy.proxy.accept import SecuredServer
from kafka_quota_proxy.proxy.admission import ConnectionSlots, TrustedSources
from kafka_quota_proxy.proxy.bootstrap import BootstrapRoutes, Target
from kafka_quota_proxy.proxy.brokers import ListeningRewriter
from kafka_quota_proxy.proxy.cluster import OwnIdentity
from kafka_quota_proxy.proxy.connection import ProxiedConnection, TlsProxiedConnection
from kafka_quota_proxy.proxy.context import ConnectionContext, ConnectionHost
from kafka_quota_proxy.proxy.features.connection_rates import ConnectionRateGuard
from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory
from kafka_quota_proxy.proxy.filters.sasl_inspection import SaslInspection, SaslSettings
from kafka_quota_proxy.proxy.filters.sasl_termination import SaslServerSettings, SaslTermination
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.proxy.tls import ServerTls, TlsFileError
from kafka_quota_proxy.quota.enforcer import BOOTSTRAP_SCOPE
from kafka_quota_proxy.security.credentials import Credentials, fingerprint
from kafka_quota_proxy.security.sasl import Jwks

log = get_logger("kafka_quota_proxy.listeners")

BOOTSTRAP = "bootstrap"
Server = asyncio.AbstractServer | SecuredServer


class StartupError(Exception):
    """The proxy cannot start (for instance a listen address is in use)."""


class ListenerHost(Protocol):
    """What a kind of listener uses of the proxy."""

    @property
    def connections(self) -> ConnectionHost:
        """Admission, counts and drain of the connections."""

    config: ProxyConfig
    stats: ProxyStats
    servers: dict[str, Server]
    upstream_tls: Any  # ssl.SSLContext | None
    own_identity: OwnIdentity | None
    reuse_port: bool  # one of several worker processes sharing the listeners
    connection_rates: ConnectionRateGuard  # KIP-612, checked at accept
    slots: ConnectionSlots  # max_connections and max_connections_per_ip, from accept on

    def feature_filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        """The shared features' filters for a listener of ``scope``, in chain order."""

    bootstrap_routes: BootstrapRoutes  # where each bootstrap connection goes (its scope)

    def spawn(self, coro: Any) -> None: ...


def listen_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket, bound now (synchronously: a client told about the port can connect
    at once, early connections waiting in the listen backlog). ``reuse_port``: shared with the
    other worker processes (SO_REUSEPORT: the kernel spreads connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ListenerKind:
    def __init__(self, host: ListenerHost, name: str | None, kind: ListenerKindConfig) -> None:
        self.host = host
        self.name = name  # None: the main kind (listeners' names unprefixed)
        self.kind = kind
        self.security = kind.security
        self.at = "listeners" if name is None else f"listeners.extra[{name}]"
        ports = kind.broker_ports
        self.registry = BrokerAddresses(host.config.listeners.advertised(kind), ports.first,
                                        ports.last)
        self.rewriter = ResponseRewriter(self.registry)
        # what the response streams call: the rewrite, then listeners on the ports it handed out
        self.listening = ListeningRewriter(self.rewriter, self.registry, self._bind_broker)
        self.tls: ServerTls | None = None  # made at start (files are read then)
        self.sasl: SaslSettings | None = None  # SASL inspection
        self.sasl_server: SaslServerSettings | None = None  # SASL termination
        self._credentials_seen: tuple[int, int, int] | None = None
        self._contexts: dict[str, ConnectionContext] = {}
        # who may send PROXY protocol headers (listeners that take them)
        self.trusted = (TrustedSources(self.security.proxy_protocol_trusted_sources)
                        if self.security.proxy_protocol != "none" else None)

    def listener(self, base: str) -> str:
        """A listener's name in logs and the proxy's server table."""
        return base if self.name is None else f"{self.name}:{base}"

    # ------------------------------------------------------------------ security
    def load_security(self) -> None:
        """TLS and SASL settings from their files (a file that cannot be used stops the start,
        naming its field)."""
        security = self.security
        try:
            if security.tls is not None:
                self.tls = ServerTls(security.tls, self._tls_reloaded)
        except TlsFileError as exc:
            raise StartupError(f"{self.at}: {exc}") from None
        if security.terminates_sasl:
            self.sasl_server = SaslServerSettings(
                tuple(security.sasl.mechanisms), self._read_credentials(),
                self.host.config.network.max_frame_bytes)
        elif security.uses_sasl:
            sasl = security.sasl
            jwks = None
            if sasl.oauthbearer_jwks_file is not None:
                try:
                    with open(sasl.oauthbearer_jwks_file) as f:
                        jwks = Jwks.from_json(f.read())
                except (OSError, ValueError) as exc:
                    raise StartupError(f"{self.at}.security.sasl.oauthbearer_jwks_file "
                                       f"{sasl.oauthbearer_jwks_file}: {exc}") from None
            self.sasl = SaslSettings(sasl.fallback_principal, sasl.oauthbearer_principal_claim,
                                     jwks)
        self._contexts.clear()

    def _tls_reloaded(self, result: str) -> None:
        self.host.stats.tls_reloads[result] += 1

    def _read_credentials(self) -> Credentials:
        path = self.security.sasl.credentials_file
        assert path is not None
        try:
            st = os.stat(path)
            with open(path) as f:
                text = f.read()
            credentials = Credentials.parse(text)
        except (OSError, ValueError) as exc:
            raise StartupError(f"{self.at}.security.sasl.credentials_file {path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        self._credentials_seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        log.info("credentials_loaded", listener=self.name, file=path,
                 users=len(credentials.users), fingerprint=fingerprint(text))
        return credentials

    async def _watch_credentials(self) -> None:
        """Reload the credentials file when it changes; a file that does not parse keeps the
        users as they were (logged, ``kafka_proxy_credentials_reloads_total``)."""
        interval = self.security.sasl.credentials_reload_seconds
        path = self.security.sasl.credentials_file
        stats = self.host.stats
        if interval <= 0 or path is None or self.sasl_server is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._credentials_seen:
                continue
            try:
                self.sasl_server.credentials = self._read_credentials()
            except StartupError as exc:
                self._credentials_seen = seen
                stats.credentials_reloads["failure"] += 1
                log.error("credentials_reload_failed", file=path, error=str(exc))
            else:
                stats.credentials_reloads["success"] += 1

    def watches(self) -> list[Any]:
        """The coroutines that keep this kind's files current."""
        out: list[Any] = []
        if self.tls is not None:
            out.append(self.tls.watch())
        if self.sasl_server is not None:
            out.append(self._watch_credentials())
        return out

    # ------------------------------------------------------------------ connections' context
    def context(self, listener: str, scope: int) -> ConnectionContext:
        """What the connections of one listener use (made at first use)."""
        ctx = self._contexts.get(listener)
        if ctx is None:
            ctx = self._contexts[listener] = self._make_context(listener, scope)
        return ctx

    def _make_context(self, listener: str, scope: int) -> ConnectionContext:
        """The filters in chain order: identities (this kind's), then the shared features."""
        made: list[tuple[type[Filter], FilterFactory]] = []
        if self.sasl_server is not None:
            made.append((SaslTermination, partial(SaslTermination, settings=self.sasl_server)))
        elif self.sasl is not None:
            made.append((SaslInspection, partial(SaslInspection, settings=self.sasl)))
        made += self.host.feature_filters(scope)
        host = self.host
        config = host.config
        return ConnectionContext(
            host=host.connections, listener=listener, scope=scope, network=config.network,
            connect_timeout_seconds=config.upstream.connect_timeout_seconds,
            stats=host.stats, rewriter=self.listening,
            interests=InterestTable([addresses, *(cls.interests for cls, _ in made)]),
            filters=tuple(make for _, make in made),
            filter_response_frames=InterestTable(cls.interests for cls, _ in made
                                                 ).response_frames,
            tls=self.tls,
            principal_mapper=(self.security.principal_mapper()
                              if self.tls is not None and not self.security.uses_sasl else None),
            upstream_tls=host.upstream_tls,
            # clients that do not carry their own SASL exchange reach the brokers as the proxy
            upstream_identity=None if self.sasl is not None else host.own_identity)

    # ------------------------------------------------------------------ listeners
    @property
    def secured(self) -> bool:
        """Connections begin with a PROXY header or a TLS handshake (``SecuredServer``)."""
        return self.tls is not None or self.security.proxy_protocol != "none"

    async def start(self) -> None:
        """Listen on the bootstrap port."""
        listen = self.kind.bootstrap
        name = self.listener(BOOTSTRAP)
        routes = self.host.bootstrap_routes

        def ctx() -> ConnectionContext:  # (made at the first connection)
            # (the listener's filters: fetch routing stays off; each connection's scope is the
            # broker chosen for it at accept, ``proxy.bootstrap``)
            return self.context(name, BOOTSTRAP_SCOPE)

        def targets(scope: int) -> Callable[[], list[Target]]:
            return partial(routes.targets, scope)

        try:
            sock = listen_socket(listen.host, listen.port, self.host.reuse_port)
            if self.secured:
                server: Server = self._secured_server(name, sock, ctx, targets, routes.choose)
            else:
                server = await asyncio.get_running_loop().create_server(
                    self.host.connection_rates.protocol_factory(
                        name, self.name, routes.choose,
                        lambda scope: ProxiedConnection(ctx(), targets(scope), scope=scope)),
                    sock=sock, backlog=1024)
        except OSError as exc:
            raise StartupError(f"cannot listen on {self.at}.bootstrap {listen}: "
                               f"{exc.strerror or exc}") from None
        self.host.servers[name] = server

    def _bind_broker(self, broker: Broker) -> None:
        """Bind the broker's proxy port now (synchronously, so a client told about it can
        connect at once: early connections wait in the listen backlog) and serve it."""
        sock = listen_socket(self.kind.broker_host, broker.proxy_port, self.host.reuse_port)
        name = self.listener(f"broker-{broker.node_id}")
        node_id = broker.node_id

        def resolve() -> list[Target]:
            b = self.registry.get(node_id)
            return [(b.host, b.port, node_id)] if b else []

        def targets(scope: int) -> Callable[[], list[Target]]:
            return resolve

        def ctx() -> ConnectionContext:  # (made at the first connection)
            return self.context(name, node_id)

        servers = self.host.servers
        if self.secured:
            servers[name] = self._secured_server(name, sock, ctx, targets, node_id)
            return
        factory = self.host.connection_rates.protocol_factory(
            name, self.name, node_id, lambda scope: ProxiedConnection(ctx(), resolve))

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            servers[name] = await loop.create_server(factory, sock=sock, backlog=1024)

        self.host.spawn(serve())

    def _secured_server(self, name: str, sock: socket.socket,
                        ctx: Callable[[], ConnectionContext],
                        targets: Callable[[int], Callable[[], list[Target]]],
                        scope: int | Callable[[], int]) -> SecuredServer:
        """``targets(scope)``: what a connection accepted with ``scope`` dials."""
        stats = self.host.stats

        def refused(reason: str) -> None:
            stats.closed[reason] += 1

        proxy_protocol = self.security.proxy_protocol
        connection = ProxiedConnection if self.tls is None else TlsProxiedConnection
        return SecuredServer(
            sock, None if proxy_protocol == "none" else proxy_protocol,
            self.tls.front if self.tls is not None else None,
            lambda source, chosen: connection(ctx(), targets(chosen), source, scope=chosen),
            self.host.config.network.request_header_timeout_seconds, refused, name,
            self.host.connection_rates, self.name, scope, self.host.slots, self.trusted)

    def listening_on_all(self) -> bool:
        """Every known broker's listener of this kind is serving."""
        servers = self.host.servers
        return all(self.listener(f"broker-{n}") in servers for n in self.registry.by_node)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "bootstrap": str(self.kind.bootstrap),
                "broker_ports": str(self.kind.broker_ports),
                "protocol": self.security.protocol,
                **({"sasl": self.security.sasl.mode} if self.security.uses_sasl else {}),
                **({"proxy_protocol": self.security.proxy_protocol}
                   if self.security.proxy_protocol != "none" else {})}
