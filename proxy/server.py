"""The proxy: startup -> serve -> graceful shutdown.

- a bootstrap listener whose connections each go to one upstream broker, chosen at accept
  in turn among the known ones (``proxy.bootstrap``: its budgets are that broker's), or to
  any upstream bootstrap server while none is known;
- one listener per upstream broker (node id), each connection going to that broker;
- the broker list is learnt from the cluster at start, refreshed periodically, and extended
  by every response the proxy rewrites;
- shutdown: stop accepting, stop reading new requests, let in-flight requests finish (up to
  ``network.shutdown_timeout_seconds``), then close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import ssl
import time
from functools import partial
from typing import Any

from config.errors import ConfigError
from config.loading import load_config
from config.schema import HostPort, ProxyConfig
from proxy.admission import ConnectionSlots
from proxy.bootstrap import BootstrapRoutes
from proxy.capture_writer import Capture
from proxy.clock import now_ms
from proxy.cluster import OwnIdentity, fetch_brokers
from proxy.cluster_topics import TopicReader
from proxy.connection import ProxiedConnection
from proxy.connection_rate import ConnectionRateGuard, listeners_without_rates
from proxy.controller_mutation import ControllerMutations
from proxy.coordination import Coordination, own_process_id
from proxy.filters.base import Filter, FilterFactory
from proxy.filters.capture import CaptureFilter
from proxy.filters.controller_mutation import ControllerMutationFilter
from proxy.filters.fetch_routing import FetchRouting, FetchRoutingFilter
from proxy.filters.quota_admin import QuotaAdminFilter
from proxy.filters.quotas import QuotaFilter
from proxy.filters.storage import StorageFilter
from proxy.filters.topic_guard import TopicGuardFilter
from proxy.listeners import BOOTSTRAP, ListenerKind, Server, StartupError
from proxy.logs import get_logger
from proxy.memory import TRIM_AFTER_EXPIRED, trim_heap
from proxy.metrics import EntityRow, ProxyStats, make_registry, serve_metrics
from proxy.quota_admin import ClientQuotaAdmin
from proxy.storage_watch import StorageWatch
from proxy.tls import (
    TlsFileError,
    client_context,
    kafka_client_options,
    read_secret,
)
from proxy.topic_guard import TopicGuard, guarded_names
from quota.connection_limits import ConnectionLimits
from quota.enforcer import BOOTSTRAP_SCOPE, QuotaEnforcer

__all__ = ["Proxy", "StartupError", "run_proxy"]

log = get_logger("kafka_quota_proxy.server")



# File descriptors kept beyond two per client connection (client and upstream): listeners,
# the metrics endpoint and its scrapers, metadata refreshes, the storage reader, capture
# files, logs.
FD_RESERVE = 64


def fd_limit() -> int:
    """The soft limit on open file descriptors."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit(ceiling: int = 1 << 20) -> tuple[int, int]:
    """Raise the soft limit on open file descriptors to the hard limit (at most
    ``ceiling``) where allowed; return (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, fd_limit()


class Proxy:
    def __init__(self, config: ProxyConfig, config_path: str | None = None,
                 worker: int | None = None) -> None:
        """``worker``: this process is worker ``worker`` of several sharing the listeners
        (``proxy.workers``)."""
        self.config = config
        self.config_path = config_path
        self.worker = worker
        self.reuse_port = worker is not None
        self.stats = ProxyStats()
        self.quotas = QuotaEnforcer(config.quotas.settings(),
                                    int(config.quotas.sensor_idle_expiry_seconds * 1000))
        self.stats.quota_entities = self._quota_entity_rows
        self.stats.state_entries = self._client_state_entries
        self.routing = FetchRouting(config.racks)
        self.capture: Capture | None = None
        if self.routing.enabled:
            self.stats.feature_families.append(self.routing.metric_families)
        # the kinds of client listeners (Kafka's listener map), each with its broker addresses
        self.kinds = [ListenerKind(self, name, kind) for name, kind in config.listeners.kinds()]
        self.main = self.kinds[0]
        self.registry = self.main.registry
        rewritten: dict[int, int] = {}
        # controller mutation quotas (KIP-599), which learn topics' partitions from Metadata
        self.mutations = ControllerMutations(config.quotas)
        self.stats.feature_families.append(self.mutations.metric_families)
        # the proxy's own topics, kept from its clients (``proxy.topic_guard``)
        self.topic_guard = TopicGuard(guarded_names(config))
        self.stats.feature_families.append(self.topic_guard.metric_families)
        for kind in self.kinds:
            kind.rewriter.rewritten = rewritten  # counted together
            kind.rewriter.on_metadata = self._observe_metadata
            kind.rewriter.metadata_filter = self.topic_guard.filter_metadata
            kind.rewriter.amend = self.topic_guard.amend
        self.stats.brokers_known = lambda: len(self.registry)
        self.stats.rewritten = rewritten
        self.stats.node_endpoints_dropped = lambda: sum(
            k.rewriter.node_endpoints_dropped for k in self.kinds)
        self.stats.client_write_buffered = lambda: sum(
            c.transport.get_write_buffer_size() for c in self.connections if c.transport
        )
        self.stats.client_unread = lambda: sum(c.unread_bytes for c in self.connections)
        self.connections: set[ProxiedConnection] = set()
        self.servers: dict[str, Server] = {}
        self.fd_limit = fd_limit()
        self.max_connections = config.network.max_connections or max(
            (self.fd_limit - FD_RESERVE) // 2, 1)
        self.stats.max_connections = self.max_connections
        self.stats.in_flight = lambda: sum(len(c.table) for c in self.connections)
        self.stats.fd_limit = self.fd_limit
        # every accepted socket counts against max_connections (and, once its address is
        # known, max_connections_per_ip) until it closes, whatever stage it is at
        net = config.network
        self.slots = ConnectionSlots(self.stats, ConnectionLimits(
            self.max_connections, net.max_connections_per_ip,
            net.max_connections_per_ip_overrides))
        self.stats.feature_families.append(self.slots.metric_families)
        self.draining = False
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reload_lock = asyncio.Lock()
        self._metrics_server: asyncio.Server | None = None
        self._bootstrap_rr = 0
        self.cluster_reachable = asyncio.Event()
        self.live_brokers: set[int] = set()  # node ids in the latest metadata
        # the broker each bootstrap connection goes to, whose budgets it uses
        self.bootstrap_routes = BootstrapRoutes(
            self.registry, [(s.host, s.port) for s in config.upstream.bootstrap_servers],
            lambda: self.live_brokers)
        self.storage: StorageWatch | None = None
        if config.storage is not None:
            self.storage = StorageWatch(config.storage, self.quotas,
                                        config.upstream.bootstrap_servers,
                                        lambda: self.live_brokers)
            self.stats.feature_families.append(self.storage.metric_families)
        # budgets shared with the other processes and instances (``proxy.coordination``)
        c = config.coordination
        self.process = own_process_id(c.instance, worker)
        self.coordination: Coordination | None = None
        if c.enabled is True or (c.enabled == "auto" and worker is not None):
            from proxy.workers import worker_count

            self.coordination = Coordination(
                c, self.quotas, [str(b) for b in config.upstream.bootstrap_servers],
                self.process, c.expected_processes or worker_count(config))
            self.stats.feature_families.append(self.coordination.metric_families)
        # client quotas altered with AlterClientQuotas (``proxy.quota_admin``)
        self.quota_admin = ClientQuotaAdmin(
            lambda: self.config.quotas, [str(b) for b in config.upstream.bootstrap_servers],
            self._overrides_changed)
        self.stats.feature_families.append(self.quota_admin.metric_families)
        # connection creation rates (KIP-612): per listener and per client address; held
        # throttled connections keep their place in max_connections (a file descriptor each)
        self.connection_rates = ConnectionRateGuard(self.stats)
        self.connection_rates.slots = self.slots
        self.connection_rates.configure(config.quotas, config.listeners.kinds())
        self.stats.feature_families.append(self.connection_rates.metric_families)
        # one reader for the proxy's own topics (the volume, usage and quota-overrides topics)
        self.topics: TopicReader | None = None
        if (self.storage is not None or self.coordination is not None
                or config.quotas.overrides.enabled):
            self.topics = TopicReader([str(b) for b in config.upstream.bootstrap_servers])
            for feature in (self.storage, self.coordination):
                if feature is not None:
                    self.topics.subscribe(feature.subscription())
            if config.quotas.overrides.enabled:
                self.topics.subscribe(self.quota_admin.subscription())
        self._coordinating: list[asyncio.Task[Any]] = []  # stopped after the drain
        self.upstream_tls: ssl.SSLContext | None = None  # made at start (files read then)
        self.own_identity: OwnIdentity | None = None  # toward brokers requiring SASL

    # ------------------------------------------------------------------ the request path
    def _observe_metadata(self, response: Any) -> None:
        """A decoded MetadataResponse on its way to a client."""
        if self.routing.enabled:
            self.routing.observe_metadata(response)
        self.mutations.observe_metadata(response)

    def feature_filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        """The shared features' filters, in chain order: quotas, storage throttling, fetch
        routing (brokers' ports), capture (each kind puts its identity filter first)."""
        made: list[tuple[type[Filter], FilterFactory]] = [
            (TopicGuardFilter, partial(TopicGuardFilter, guard=self.topic_guard)),
            (QuotaFilter, partial(QuotaFilter, quotas=self.quotas, stats=self.stats)),
            (QuotaAdminFilter, partial(QuotaAdminFilter, admin=self.quota_admin)),
            (ControllerMutationFilter,
             partial(ControllerMutationFilter, mutations=self.mutations))]
        if self.storage is not None:
            made.append((StorageFilter, partial(StorageFilter, storage=self.storage)))
        # (not on the bootstrap listener: clients fetch from the leader's port; a bootstrap
        # connection's broker is chosen per connection and may change if it is unreachable)
        if self.routing.enabled and scope != BOOTSTRAP_SCOPE:
            made.append((FetchRoutingFilter, partial(FetchRoutingFilter, routing=self.routing)))
        if self.capture is not None:
            made.append((CaptureFilter,
                         partial(CaptureFilter, capture=self.capture, quotas=self.quotas)))
        return made

    # ------------------------------------------------------------------ startup
    def _load_security(self) -> None:
        """TLS contexts and SASL identities, from their files (a file that cannot be used
        stops the start, naming its field)."""
        try:
            upstream = self.config.upstream.tls
            if upstream is not None:
                self.upstream_tls = client_context(upstream)
                if not upstream.check_hostname:
                    log.warning("upstream_hostname_not_verified",
                                detail="upstream.tls.check_hostname is false: any certificate "
                                "from the configured CAs is accepted for every broker")
            own = self.config.upstream.sasl
            if own is not None:
                password = read_secret(own.password_file, "upstream.sasl.password_file")
                self.own_identity = OwnIdentity(own.mechanism, own.username, password)
            options = kafka_client_options(self.config.upstream)
            if self.topics is not None:
                self.topics.client_options = options
            if self.coordination is not None:
                self.coordination.client_options = options
            self.quota_admin.client_options = options
        except TlsFileError as exc:
            raise StartupError(str(exc)) from None
        for kind in self.kinds:
            kind.load_security()

    async def start(self) -> None:
        self._load_security()
        try:
            for kind in self.kinds:
                await kind.start()
        except StartupError:
            for server in self.servers.values():
                server.close()
            raise
        if self.config.metrics.listen is not None:
            m = self.config.metrics.listen
            try:
                self._metrics_server = await serve_metrics(
                    make_registry(self.stats), m.host, m.port
                )
            except OSError as exc:
                for server in self.servers.values():
                    server.close()
                raise StartupError(
                    f"cannot listen on metrics.listen {m}: {exc.strerror or exc}"
                ) from None
        if self.config.capture is not None:
            c = self.config.capture
            try:
                self.capture = Capture(c.dir, c.rotate_mb, c.rotate_seconds,
                                       queue_batches=c.queue_batches, batch=c.batch_records,
                                       instance=self.process.split("/", 1)[0],
                                       process=self.process)
            except OSError as exc:
                for server in self.servers.values():
                    server.close()
                raise StartupError(f"cannot write capture.dir {c.dir}: {exc}") from None
            self.stats.feature_families.append(self.capture.metric_families)
            for kind in self.kinds:
                kind.forget_contexts()  # connections from now on capture
            self._write_quota_config()
            self.spawn(self._flush_capture())
        self.spawn(self._refresh_loop())
        self.spawn(self._expire_loop())
        self.spawn(self._sweep())
        self.spawn(self._watch_loop_lag())
        for kind in self.kinds:
            for watch in kind.watches():
                self.spawn(watch)
        if self.storage is not None:
            self.spawn(self.storage.run())
        self.spawn(self.quota_admin.prepare())
        if self.coordination is not None:
            loop = asyncio.get_running_loop()
            self._coordinating.append(loop.create_task(self._coordinate(self.coordination)))
        if self.topics is not None:
            self._coordinating.append(asyncio.get_running_loop().create_task(self.topics.run()))
        if self.config_path is not None and self.config.quotas.watch_seconds > 0:
            self.spawn(self._watch_config())
        log.info(
            "proxy_started",
            bootstrap=str(self.config.listeners.bootstrap),
            broker_ports=str(self.config.listeners.broker_ports),
            listeners=[kind.summary() for kind in self.kinds],
            upstream=[str(s) for s in self.config.upstream.bootstrap_servers],
            metrics=str(self.config.metrics.listen) if self.config.metrics.listen else None,
        )

    async def _coordinate(self, coordination: Coordination) -> None:
        await coordination.ensure_topic()
        await coordination.run()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def bootstrap_targets(self) -> list[tuple[str, int]]:
        """The bootstrap servers, beginning with the next in turn (metadata refreshes)."""
        servers = [(s.host, s.port) for s in self.config.upstream.bootstrap_servers]
        i = self._bootstrap_rr % len(servers)
        self._bootstrap_rr += 1
        return servers[i:] + servers[:i]

    async def refresh_brokers(self) -> bool:
        timeout = self.config.upstream.connect_timeout_seconds
        for target in self.bootstrap_targets():
            try:
                brokers = await fetch_brokers(target[0], target[1], timeout, self.upstream_tls,
                                              self.own_identity,
                                              sorted(self.topic_guard.topics.names),
                                              self.topic_guard.learn)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                    ValueError) as exc:
                log.debug(
                    "metadata_refresh_failed", upstream=f"{target[0]}:{target[1]}", error=repr(exc)
                )
                continue
            for kind in self.kinds:
                for b in brokers:
                    kind.listening.advertise(b.node_id, b.host, b.port, b.rack)
            self.live_brokers = {b.node_id for b in brokers}
            if self.routing.enabled:
                self.routing.topology.observe_brokers((b.node_id, b.rack) for b in brokers)
            self.cluster_reachable.set()
            return True
        self.cluster_reachable.clear()
        return False

    async def _refresh_loop(self) -> None:
        delay = 0.25
        while not self.draining:
            ok = await self.refresh_brokers()
            if ok:
                delay = self.config.upstream.metadata_refresh_seconds
            else:
                log.warning(
                    "cluster_unreachable",
                    upstream=[str(s) for s in self.config.upstream.bootstrap_servers],
                )
                delay = min(max(delay * 2, 0.25), self.config.upstream.metadata_refresh_seconds)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ quotas
    async def _expire_loop(self) -> None:
        """Drop quota budgets idle for ``quotas.sensor_idle_expiry_seconds`` (Kafka's inactive
        sensor expiry, an hour), and controller mutation budgets back at a full bucket (the
        same as a new one): every minute, or every half of the expiry when shorter."""
        while True:
            expiry_s = self.config.quotas.sensor_idle_expiry_seconds
            await asyncio.sleep(min(60.0, expiry_s / 2))
            now = now_ms()
            expired = self.quotas.expire(
                now, int(self.config.quotas.sensor_idle_expiry_seconds * 1000))
            self.connection_rates.expire()
            self.mutations.quotas.expire(now)
            if expired >= TRIM_AFTER_EXPIRED:  # a churn of client-ids or users gone
                trim_heap()

    def _client_state_entries(self) -> dict[str, int]:
        """Entries of the structures keyed by client-chosen names (client-id, user, address):
        each bounded or expiring (docs/security.md, "Bounded per-client state")."""
        budgets, cached = self.quotas.entries()
        return {"quota_budgets": budgets, "quota_caches": cached,
                "mutation_budgets": len(self.mutations.quotas.budgets()),
                "ip_rate_sensors": len(self.connection_rates.rates.ips),
                "fetch_redirects": self.routing.redirect_entries(),
                "fetch_rack_pairs": len(self.routing.fetch_bytes)}

    def _quota_entity_rows(self) -> list[EntityRow]:
        rows: list[EntityRow] = []
        for view in self.quotas.top_sensors(self.config.quotas.metrics_top_entities, now_ms()):
            s = view.sensor
            broker = "bootstrap" if view.broker == BOOTSTRAP_SCOPE else str(view.broker)
            rows.append((broker, s.quota_type.short, s.tags[0], s.tags[1], view.rate, s.bound,
                         s.throttled_requests, s.throttle_ms_total))
        return rows

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics endpoint listens on (None: no endpoint)."""
        server = self._metrics_server
        if server is None or not server.sockets:
            return None
        return int(server.sockets[0].getsockname()[1])

    def reload(self) -> None:
        """SIGHUP: reload in the background (see ``reload_config``)."""
        self.spawn(self.reload_config())

    async def reload_config(self) -> bool:
        """Re-read the config file; apply its quotas to live budgets. The file is read and
        parsed off the event loop, within the loader's bounds (size, nesting, aliases), so a
        broken or hostile file costs clients nothing. Whatever goes wrong changes nothing, and
        is logged and counted as a failed reload. Other sections need a restart to take
        effect. Reloads run one at a time."""
        if self.config_path is None:
            return False
        async with self._reload_lock:
            try:
                new = await asyncio.to_thread(load_config, self.config_path)
                self._apply_reload(new)
            except ConfigError as exc:
                self.stats.reloads["failure"] += 1
                log.error("config_reload_failed", file=self.config_path, errors=exc.errors)
                return False
            except Exception as exc:  # any failure is a failed reload
                self.stats.reloads["failure"] += 1
                log.error("config_reload_failed", file=self.config_path,
                          errors=[f"{type(exc).__name__}: {exc}"[:500]])
                return False
        return True

    def _apply_reload(self, new: ProxyConfig) -> None:
        ignored = [name for name in ProxyConfig.model_fields
                   if name != "quotas" and getattr(new, name) != getattr(self.config, name)]
        if "listeners" in ignored and (listeners_without_rates(new.listeners)
                                       == listeners_without_rates(self.config.listeners)):
            ignored.remove("listeners")  # only max_connection_creation_rate: applied live
        merged = new.quotas.with_overrides(self.quota_admin.overrides)
        self.connection_rates.configure(merged, new.listeners.kinds())
        changed = new.quotas != self.config.quotas
        if changed:
            self.quotas.update(merged.settings())
            self.mutations.configure(merged, now_ms())
        self.config = self.config.model_copy(update={"quotas": new.quotas})
        if changed:
            self._write_quota_config()
        self.stats.reloads["success"] += 1
        log.info("config_reloaded", file=self.config_path,
                 quota_entities=len(new.quotas.entities),
                 **({"restart_needed_for": ignored} if ignored else {}))

    def _overrides_changed(self) -> None:
        """Quotas altered (through this proxy or another): the YAML's with them over it."""
        merged = self.config.quotas.with_overrides(self.quota_admin.overrides)
        self.quotas.update(merged.settings())
        self.connection_rates.configure(merged)
        self.mutations.configure(merged, now_ms())
        self._write_quota_config()
        log.info("quota_overrides_applied",
                 overrides=sum(len(v) for v in self.quota_admin.overrides.values()),
                 quota_generation=self.quotas.generation)

    # ------------------------------------------------------------------ capture
    def _write_quota_config(self) -> None:
        """Next to the capture: the quota config of each generation, so a replay can use the
        configuration that was live when each request was recorded."""
        if self.capture is None:
            return
        q = self.config.quotas.with_overrides(self.quota_admin.overrides)
        doc = {
            "run": self.capture.run,
            "quota_generation": self.quotas.generation,
            "since_ms": int(time.time() * 1000),
            "quotas": q.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        if self.config.storage is not None:  # what a replay needs besides storage_scale
            st = self.config.storage
            doc["storage"] = {"unquoted_producer_byte_rate": st.unquoted_producer_byte_rate,
                              "exempt_users": st.exempt_users}
        path = (self.capture.directory
                / f"quotas-{self.capture.run}-{self.quotas.generation:05d}.json")
        try:
            path.write_text(json.dumps(doc, indent=1))
        except OSError as exc:
            log.error("capture_config_write_failed", path=str(path), error=str(exc))

    async def _flush_capture(self) -> None:
        while self.capture is not None:
            await asyncio.sleep(1.0)
            self.capture.flush()

    async def _watch_config(self) -> None:
        """Reload when the config file changes (polled; SIGHUP also reloads)."""
        assert self.config_path is not None

        def signature() -> tuple[int, int] | None:
            try:
                st = os.stat(self.config_path)  # type: ignore[arg-type]
            except OSError:
                return None
            return st.st_mtime_ns, st.st_size

        seen = signature()
        while True:
            await asyncio.sleep(self.config.quotas.watch_seconds or 2.0)
            current = signature()
            if current is not None and current != seen:
                seen = current
                await self.reload_config()  # never raises: every failure is counted

    async def wait_listening(self) -> None:
        """Wait until every known broker's listener is serving."""
        while not all(kind.listening_on_all() for kind in self.kinds):
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ connections
    def admit(self, conn: ProxiedConnection, transport: asyncio.BaseTransport) -> bool:
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

    async def _watch_loop_lag(self, every: float = 0.1) -> None:
        """``kafka_proxy_event_loop_lag_seconds``: how late a timer due every ``every``
        seconds fires, which is how long anything ready waits for the loop."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + every
            await asyncio.sleep(every)
            self.stats.observe_loop_lag(max(loop.time() - due, 0.0))

    async def _sweep(self) -> None:
        """Close connections that stall: a request header not read within
        ``request_header_timeout_seconds`` of the request's first byte, a request not read
        whole within ``request_read_timeout_seconds``, nothing in flight and no bytes either
        way for ``connections_max_idle_seconds`` (Kafka's ``connections.max.idle.ms``)."""
        net = self.config.network
        header_s, read_s = net.request_header_timeout_seconds, net.request_read_timeout_seconds
        idle_s = net.connections_max_idle_seconds
        interval = min(1.0, header_s / 4, read_s / 4, idle_s / 4 if idle_s else 1.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
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

    def connection_opened(self, conn: ProxiedConnection) -> None:
        self.connections.add(conn)
        kind = BOOTSTRAP if conn.listener.endswith(BOOTSTRAP) else "broker"
        self.stats.connections_open[kind] += 1
        self.stats.connections_total[kind] += 1
        if self.draining:
            conn.close("shutdown")

    def connection_closed(self, conn: ProxiedConnection, reason: str) -> None:
        self.slots.release_owner(conn)
        if conn in self.connections:
            self.connections.discard(conn)
            kind = BOOTSTRAP if conn.listener.endswith(BOOTSTRAP) else "broker"
            self.stats.connections_open[kind] -= 1
        self.stats.closed[reason] += 1
        if self.draining:
            self._check_drained()

    def _check_drained(self) -> None:
        if not self.connections:
            self._drained.set()

    # ------------------------------------------------------------------ shutdown
    async def shutdown(self) -> None:
        if self.draining:
            return
        self.draining = True
        log.info("proxy_stopping", connections=len(self.connections))
        for server in self.servers.values():
            server.close()
        self.connection_rates.close_all()
        if self._metrics_server is not None:
            self._metrics_server.close()
        for task in list(self._tasks):
            task.cancel()
        # Stop reading new requests; idle connections close now, busy ones when answered.
        for conn in list(self.connections):
            conn.client_gate.pause("shutdown")
            if conn.idle:
                conn.finish()
        self._check_drained()
        timeout = self.config.network.shutdown_timeout_seconds
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            log.warning("shutdown_timeout", connections=len(self.connections))
            for conn in list(self.connections):
                conn.close("shutdown_timeout")
        for server in self.servers.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        for task in self._coordinating:  # reported and read until the last request was done
            task.cancel()
        await asyncio.gather(*self._coordinating, return_exceptions=True)
        if self.coordination is not None:
            await self.coordination.stop()
        await self.quota_admin.stop()
        if self.capture is not None:
            capture, self.capture = self.capture, None
            await asyncio.get_running_loop().run_in_executor(None, capture.close)
            log.info("capture_closed", records=capture.records, dropped=capture.dropped,
                     files=capture.writer.files_written)
        log.info("proxy_stopped")


async def run_proxy(config: ProxyConfig, stop: asyncio.Event,
                    config_path: str | None = None,
                    worker: tuple[int, int] | None = None) -> None:
    """Serve until ``stop``. ``worker``: (index, readiness fd) of a worker process
    (``proxy.workers``): its listeners are shared, its metrics on a port of its own that it
    reports on the fd once serving."""
    before, after = raise_fd_limit()
    if worker is not None:
        metrics = config.metrics.model_copy(update={"listen": HostPort("127.0.0.1", 0)})
        config = config.model_copy(update={"metrics": metrics})
    proxy = Proxy(config, config_path, worker=worker[0] if worker else None)
    log.info("fd_limit", soft_before=before, soft=after, max_connections=proxy.max_connections)
    await proxy.start()
    if worker is not None:
        from proxy.workers import report_ready

        # Listen on the brokers' ports before saying ready: a worker that has not learnt the
        # brokers yet does not listen on their ports, so the kernel would hand every client
        # connection to the workers that have (SO_REUSEPORT spreads over the listening ones).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proxy.cluster_reachable.wait(),
                                   config.upstream.connect_timeout_seconds)

        report_ready(worker[1], proxy.metrics_port)
    if config_path is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, proxy.reload)
    await stop.wait()
    await proxy.shutdown()
