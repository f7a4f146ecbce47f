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
import gc
import resource
import signal
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kafka_quota_proxy.config.schema import HostPort, ProxyConfig, QuotasConfig
from kafka_quota_proxy.proxy.admission import ConnectionSlots
from kafka_quota_proxy.proxy.bootstrap import BootstrapRoutes
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.cluster import OwnIdentity, fetch_brokers
from kafka_quota_proxy.proxy.cluster_topics import TopicReader
from kafka_quota_proxy.proxy.connections import Connections
from kafka_quota_proxy.proxy.feature import Feature
from kafka_quota_proxy.proxy.features import make_features
from kafka_quota_proxy.proxy.features.acls.state import Acls
from kafka_quota_proxy.proxy.features.capture import CaptureError
from kafka_quota_proxy.proxy.features.connection_rates import ConnectionRateGuard
from kafka_quota_proxy.proxy.features.coordination import own_process_id
from kafka_quota_proxy.proxy.features.quota_admin import QuotaAdminFeature
from kafka_quota_proxy.proxy.features.topic_guard import TopicGuardFeature
from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory
from kafka_quota_proxy.proxy.listeners import ListenerKind, Server, StartupError
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.memory import TRIM_AFTER_EXPIRED, trim_heap
from kafka_quota_proxy.proxy.metrics import ProxyStats, make_registry, serve_metrics
from kafka_quota_proxy.proxy.reload import ConfigReload
from kafka_quota_proxy.proxy.tls import (
    TlsFileError,
    client_context,
    kafka_client_options,
    read_secret,
)
from kafka_quota_proxy.quota.connection_limits import ConnectionLimits
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer

__all__ = ["Proxy", "StartupError", "run_proxy"]

log = get_logger("kafka_quota_proxy.server")

F = TypeVar("F", bound=Feature)



# File descriptors kept beyond two per client connection (client and upstream): listeners,
# the metrics endpoint and its scrapers, metadata refreshes, the storage reader, capture
# files, logs.
FD_RESERVE = 64
REFRESH_SOON_MIN_S = 1.0


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
    """The runtime (``proxy.feature.Runtime``): listeners, admission and reload of its own,
    and the features (``proxy.features``), each run through one interface."""

    def __init__(self, config: ProxyConfig, config_path: str | None = None,
                 worker: int | None = None) -> None:
        """``worker``: this process is worker ``worker`` of several sharing the listeners
        (``proxy.workers``)."""
        from kafka_quota_proxy.proxy.workers import worker_count

        self.config = config
        self.config_path = config_path
        self.worker = worker
        self.processes = worker_count(config)
        self.reuse_port = worker is not None
        self.process = own_process_id(config.coordination.instance, worker)
        self.stats = ProxyStats()
        self.stats.state_entries = self._client_state_entries
        # the budgets every feature shares (quotas, storage, coordination, capture)
        self.quotas = QuotaEnforcer(config.quotas.settings(),
                                    int(config.quotas.sensor_idle_expiry_seconds * 1000))
        # the ACLs (the topic guard asks them per topic, the ACL feature per request)
        self.acls = Acls(config.acls) if config.acls is not None else None
        self._refresh_now = asyncio.Event()  # ``refresh_soon``
        if self.acls is not None:
            self.acls.on_unknown_id = self.refresh_soon
        self.servers: dict[str, Server] = {}
        self.fd_limit = fd_limit()
        self.max_connections = config.network.max_connections or max(
            (self.fd_limit - FD_RESERVE) // 2, 1)
        # every accepted socket counts against max_connections (and, once its address is
        # known, max_connections_per_ip) until it closes, whatever stage it is at
        net = config.network
        self.slots = ConnectionSlots(self.stats, ConnectionLimits(
            self.max_connections, net.max_connections_per_ip,
            net.max_connections_per_ip_overrides))
        self.connections = Connections(self.stats, self.slots, net)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._past_drain: list[asyncio.Task[Any]] = []  # stopped after the drain
        self.reloads = ConfigReload(self, config_path)
        self._metrics_server: asyncio.Server | None = None
        self._bootstrap_rr = 0
        self.cluster_reachable = asyncio.Event()
        self.live_brokers: set[int] = set()  # node ids in the latest metadata
        self.upstream_tls: ssl.SSLContext | None = None  # made at start (files read then)
        self.own_identity: OwnIdentity | None = None  # toward brokers requiring SASL
        self.client_options: dict[str, Any] = {}  # aiokafka's, toward the brokers (at start)
        self.features = make_features(self)
        self.topic_guard = self.feature(TopicGuardFeature).guard  # (metadata refreshes)
        self.quota_admin = self.feature(QuotaAdminFeature)  # (the quotas in force)
        self.connection_rates = self.feature(ConnectionRateGuard)  # (at accept)
        # the kinds of client listeners (Kafka's listener map), each with its broker addresses
        self.kinds = [ListenerKind(self, name, kind) for name, kind in config.listeners.kinds()]
        self.main = self.kinds[0]
        self.registry = self.main.registry
        rewritten: dict[int, int] = {}
        for kind in self.kinds:
            kind.rewriter.rewritten = rewritten  # counted together
            kind.rewriter.on_metadata = self._observe_metadata
            for feature in self.features:
                feature.attach(kind.rewriter)
        # the broker each bootstrap connection goes to, whose budgets it uses
        self.bootstrap_routes = BootstrapRoutes(
            self.registry, [(s.host, s.port) for s in config.upstream.bootstrap_servers],
            lambda: self.live_brokers)
        # one reader for the proxy's own topics (the volume, usage and quota-overrides topics)
        subscriptions = [sub for f in self.features for sub in f.subscriptions()]
        self.topics: TopicReader | None = None
        if subscriptions:
            self.topics = TopicReader([str(b) for b in config.upstream.bootstrap_servers])
            for sub in subscriptions:
                self.topics.subscribe(sub)
        self._metadata_observers = [f for f in self.features if f.wants_metadata]
        self._wire_stats(rewritten)

    def _wire_stats(self, rewritten: dict[int, int]) -> None:
        stats = self.stats
        stats.max_connections = self.max_connections
        stats.fd_limit = self.fd_limit
        stats.brokers_known = lambda: len(self.registry)
        stats.rewritten = rewritten
        stats.node_endpoints_dropped = lambda: sum(
            k.rewriter.node_endpoints_dropped for k in self.kinds)
        stats.client_write_buffered = lambda: sum(c.client_buffered for c in self.connections)
        stats.client_unread = lambda: sum(c.unread_bytes for c in self.connections)
        stats.in_flight = lambda: sum(len(c.table) for c in self.connections)
        stats.feature_families.append(self.slots.metric_families)
        stats.feature_families += [f.metric_families for f in self.features]

    def feature(self, kind: type[F]) -> F:
        """The feature of this class (one the proxy always has)."""
        return next(f for f in self.features if isinstance(f, kind))

    # ------------------------------------------------------------------ the request path
    def _observe_metadata(self, response: Any) -> None:
        """A decoded MetadataResponse on its way to a client."""
        for feature in self._metadata_observers:
            feature.observe_metadata(response)

    def feature_filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        """The features' filters, in chain order (each kind puts its identity filter
        first)."""
        return [made for f in self.features for made in f.filters(scope)]

    def effective_quotas(self) -> QuotasConfig:
        return self.config.quotas.with_overrides(self.quota_admin.overrides)

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
            self.client_options = kafka_client_options(self.config.upstream)
            if self.topics is not None:
                self.topics.client_options = self.client_options
        except TlsFileError as exc:
            raise StartupError(str(exc)) from None
        for kind in self.kinds:
            kind.load_security()

    async def start(self) -> None:
        """Security files read, features started (their files opened, their tasks running),
        then the listeners and the metrics endpoint; anything that cannot start stops the
        start, naming its field, with what was opened closed again."""
        self._load_security()
        started: list[Feature] = []
        try:
            for feature in self.features:
                feature.start(self)
                started.append(feature)
            for kind in self.kinds:
                await kind.start()
            await self._serve_metrics()
        except (StartupError, CaptureError) as exc:
            for server in self.servers.values():
                server.close()
            for task in list(self._tasks) + self._past_drain:
                task.cancel()
            for feature in reversed(started):
                with contextlib.suppress(Exception):
                    await feature.stop()
            raise StartupError(str(exc)) from None
        self.spawn(self._refresh_loop())
        self.spawn(self._expire_loop())
        self.spawn(self.connections.sweep())
        self.spawn(self._watch_loop_lag())
        for kind in self.kinds:
            for watch in kind.watches():
                self.spawn(watch)
        if self.topics is not None:
            self.spawn_past_drain(self.topics.run())
        if self.config_path is not None and self.config.quotas.watch_seconds > 0:
            self.spawn(self.reloads.watch())
        settle_heap()
        log.info(
            "proxy_started",
            bootstrap=str(self.config.listeners.bootstrap),
            broker_ports=str(self.config.listeners.broker_ports),
            listeners=[kind.summary() for kind in self.kinds],
            upstream=[str(s) for s in self.config.upstream.bootstrap_servers],
            metrics=str(self.config.metrics.listen) if self.config.metrics.listen else None,
            features=[f.name for f in self.features],
        )

    async def _serve_metrics(self) -> None:
        m = self.config.metrics.listen
        if m is None:
            return
        try:
            self._metrics_server = await serve_metrics(make_registry(self.stats), m.host, m.port)
        except OSError as exc:
            raise StartupError(
                f"cannot listen on metrics.listen {m}: {exc.strerror or exc}") from None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def spawn_past_drain(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._past_drain.append(asyncio.get_running_loop().create_task(coro))

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
                                              self.own_identity, *self._topics_asked())
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
            for feature in self.features:
                feature.observe_brokers(brokers)
            self.cluster_reachable.set()
            return True
        self.cluster_reachable.clear()
        return False

    def _topics_asked(self) -> tuple[list[str] | None, Callable[[str, Any], None]]:
        """What the metadata refresh asks of the topics: the proxy's own (the topic guard
        learns their ids), or with ACLs every topic (requests naming topics by id are
        authorized by their names)."""
        guard, acls = self.topic_guard, self.acls
        if acls is None:
            return sorted(guard.topics.names), guard.learn

        def learn(name: str, topic_id: Any) -> None:
            guard.learn(name, topic_id)
            acls.learn_topic(name, topic_id)

        return None, learn

    def refresh_soon(self) -> None:
        """Refresh the metadata now (a request named a topic id this process has not
        learnt), at most once a second."""
        self._refresh_now.set()

    async def _refresh_loop(self) -> None:
        delay = 0.25
        loop = asyncio.get_running_loop()
        while not self.connections.draining:
            refreshed_at = loop.time()
            ok = await self.refresh_brokers()
            if ok:
                delay = self.config.upstream.metadata_refresh_seconds
            else:
                log.warning(
                    "cluster_unreachable",
                    upstream=[str(s) for s in self.config.upstream.bootstrap_servers],
                )
                delay = min(max(delay * 2, 0.25), self.config.upstream.metadata_refresh_seconds)
            self._refresh_now.clear()
            try:
                await asyncio.wait_for(self._refresh_now.wait(), delay)
            except TimeoutError:
                continue
            # asked (``refresh_soon``): at once, but at most one refresh a second
            await asyncio.sleep(max(0.0, refreshed_at + REFRESH_SOON_MIN_S - loop.time()))

    # ------------------------------------------------------------------ features' state
    async def _expire_loop(self) -> None:
        """Each feature drops its idle state (quota budgets idle for
        ``quotas.sensor_idle_expiry_seconds``, Kafka's inactive sensor expiry; mutation
        budgets back at a full bucket; address sensors idle for an hour): every minute, or
        every half of the expiry when shorter."""
        while True:
            await asyncio.sleep(min(60.0, self.config.quotas.sensor_idle_expiry_seconds / 2))
            now = now_ms()
            expired = sum(feature.expire(now) for feature in self.features)
            if expired >= TRIM_AFTER_EXPIRED:  # a churn of client-ids or users gone
                trim_heap()

    def _client_state_entries(self) -> dict[str, int]:
        """Entries of the structures keyed by client-chosen names (client-id, user, address):
        each bounded or expiring (docs/security.md, "Bounded per-client state")."""
        return {k: v for f in self.features for k, v in f.state_entries().items()}

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics endpoint listens on (None: no endpoint)."""
        server = self._metrics_server
        if server is None or not server.sockets:
            return None
        return int(server.sockets[0].getsockname()[1])

    def as_run(self, config: ProxyConfig) -> ProxyConfig:
        """A config read from the file, as this process runs it (``as_worker``)."""
        return config if self.worker is None else as_worker(config)

    def topics_made(self) -> None:
        if self.topics is not None:
            self.topics.check_soon()

    def quotas_changed(self) -> None:
        """Quotas altered (through this proxy or another): the YAML's with them over it."""
        self.reconfigure()
        log.info("quota_overrides_applied",
                 overrides=sum(len(v) for v in self.quota_admin.overrides.values()),
                 quota_generation=self.quotas.generation)

    def reconfigure(self) -> None:
        """The quotas in force changed (a reload, or altered ones): every feature takes
        them."""
        merged, now = self.effective_quotas(), now_ms()
        for feature in self.features:
            feature.reconfigure(merged, now)

    async def wait_listening(self) -> None:
        """Wait until every known broker's listener is serving."""
        while not all(kind.listening_on_all() for kind in self.kinds):
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ connections
    async def _watch_loop_lag(self, every: float = 0.1) -> None:
        """``kafka_proxy_event_loop_lag_seconds``: how late a timer due every ``every``
        seconds fires, which is how long anything ready waits for the loop."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + every
            await asyncio.sleep(every)
            self.stats.observe_loop_lag(max(loop.time() - due, 0.0))

    # ------------------------------------------------------------------ shutdown
    async def shutdown(self) -> None:
        if self.connections.draining:
            return
        self.connections.draining = True  # (a second call returns at once)
        log.info("proxy_stopping", connections=len(self.connections))
        for server in self.servers.values():
            server.close()
        for feature in self.features:
            feature.draining()
        if self._metrics_server is not None:
            self._metrics_server.close()
        for task in list(self._tasks):
            task.cancel()
        await self.connections.drain()
        for server in self.servers.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        for task in self._past_drain:  # reported and read until the last request was done
            task.cancel()
        await asyncio.gather(*self._past_drain, return_exceptions=True)
        for feature in self.features:
            await feature.stop()
        log.info("proxy_stopped")


def as_worker(config: ProxyConfig) -> ProxyConfig:
    """The config as a worker process runs it: its metrics on a port of its own (the
    supervisor serves ``metrics.listen``, scraping each worker's)."""
    metrics = config.metrics.model_copy(update={"listen": HostPort("127.0.0.1", 0)})
    return config.model_copy(update={"metrics": metrics})


def settle_heap() -> None:
    """Once started: what starting left behind is collected, and every object alive then
    (modules, schemas, config: a few hundred thousand) is moved out of the garbage
    collector's sight (``gc.freeze``). Its full collections, which the requests' own
    objects set off every few seconds under load (a capture's rows waiting for the writer),
    then go over what serving made instead of over all of it: a few ms instead of 30-70 ms
    of the event loop stopped, which every request waiting on it paid in its latency."""
    gc.collect()
    gc.freeze()


async def run_proxy(config: ProxyConfig, stop: asyncio.Event,
                    config_path: str | None = None,
                    worker: tuple[int, int] | None = None) -> None:
    """Serve until ``stop``. ``worker``: (index, readiness fd) of a worker process
    (``proxy.workers``): its listeners are shared, its metrics on a port of its own that it
    reports on the fd once serving."""
    before, after = raise_fd_limit()
    if worker is not None:
        config = as_worker(config)
    proxy = Proxy(config, config_path, worker=worker[0] if worker else None)
    log.info("fd_limit", soft_before=before, soft=after, max_connections=proxy.max_connections)
    await proxy.start()
    if worker is not None:
        from kafka_quota_proxy.proxy.workers import report_ready

        # Listen on the brokers' ports before saying ready: a worker that has not learnt the
        # brokers yet does not listen on their ports, so the kernel would hand every client
        # connection to the workers that have (SO_REUSEPORT spreads over the listening ones).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proxy.cluster_reachable.wait(),
                                   config.upstream.connect_timeout_seconds)

        report_ready(worker[1], proxy.metrics_port)
    if config_path is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP,
                                                          proxy.reloads.reload)
    await stop.wait()
    await proxy.shutdown()
