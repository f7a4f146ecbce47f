"""``kafka-quota-proxy volume-agent``: runs beside a Kafka broker and publishes the usage of the
broker's log-dir volumes (seed 004).

At start and then every ``interval_seconds`` it measures each volume holding a log dir and
publishes one JSON snapshot (``quota.storage.Snapshot``), keyed by the broker id, to a compacted
topic that it creates when missing. A broker that is down or slow costs a counted, logged
publish error and a retry on the next tick, with a new producer: the agent never exits for it.

With ``storage.secret`` (opt-in) each snapshot is signed with it (HMAC-SHA256 in the record
header ``proxy.cluster_topics.MAC_HEADER``): proxies with the same secret refuse snapshots
that are not.

Metrics (on ``storage.agent.metrics``): whether the last publish was acknowledged, publish
errors, snapshots published, and each volume's capacity and consumed bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Counter, Gauge

from kafka_quota_proxy.config.schema import (
    AgentFile,
    StorageConfig,
    VolumeAgentConfig,
    VolumeLimitsConfig,
)
from kafka_quota_proxy.proxy.cluster_topics import ensure_topic, mac_headers, stop_quietly
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import serve_metrics
from kafka_quota_proxy.proxy.tls import kafka_client_options
from kafka_quota_proxy.quota.storage import Snapshot, Volume

log = get_logger("kafka_quota_proxy.volume_agent")

TOPIC_CONFIGS = {"cleanup.policy": "compact"}
TOPIC_PARTITIONS = 1
MAX_REPLICATION = 3  # as Kafka's own internal topics, on clusters that have that many brokers


class VolumeError(Exception):
    """A log dir that cannot be measured."""


class AgentError(Exception):
    """The agent cannot start (its metrics address cannot be listened on)."""


def mount_point(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (symbolic links resolved)."""
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def measure_volumes(log_dirs: Iterable[str],
                    limits: Mapping[str, VolumeLimitsConfig] | None = None) -> tuple[Volume, ...]:
    """The volumes holding ``log_dirs``, in their order, each once (log dirs on one filesystem
    share a volume), named by mount point; ``limits`` (by that name) override the broker's.
    Raises ``VolumeError`` naming a log dir that is missing or cannot be read."""
    limits = limits or {}
    seen: set[int] = set()
    volumes: list[Volume] = []
    for log_dir in log_dirs:
        try:
            st = os.stat(log_dir)
            fs = os.statvfs(log_dir)
        except OSError as exc:
            raise VolumeError(f"log dir {log_dir}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise VolumeError(f"log dir {log_dir}: not a directory")
        if not os.access(log_dir, os.R_OK | os.X_OK):
            raise VolumeError(f"log dir {log_dir}: not readable")
        if st.st_dev in seen:
            continue
        seen.add(st.st_dev)
        name = mount_point(log_dir)
        override = limits.get(name)
        volumes.append(Volume(
            name,
            fs.f_blocks * fs.f_frsize,
            (fs.f_blocks - fs.f_bfree) * fs.f_frsize,
            override.soft.limit() if override is not None and override.soft is not None
            else None,
            override.hard.limit() if override is not None and override.hard is not None
            else None,
        ))
    return tuple(volumes)


def snapshot(agent: VolumeAgentConfig, storage: StorageConfig, now_ms: int) -> Snapshot:
    """This broker's volumes at ``now_ms``, with the storage section's limits as its defaults."""
    return Snapshot(
        agent.broker_id,
        now_ms,
        measure_volumes(agent.log_dirs, agent.volume_limits),
        storage.soft.limit() if storage.soft is not None else None,
        storage.hard.limit(),
    )


def request_timeout(interval_seconds: float) -> float:
    """How long one publish may take: the interval, within 5 to 30 seconds."""
    return min(max(interval_seconds, 5.0), 30.0)


class AgentMetrics:
    """The agent's metrics, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.connected = Gauge(
            "kafka_quota_proxy_volume_agent_connected",
            "1 when the last snapshot was acknowledged by the broker, else 0",
            registry=self.registry)
        self.publish_errors = Counter(
            "kafka_quota_proxy_volume_agent_publish_errors_total",
            "Snapshots not published: volumes not measured, or the broker unreachable or "
            "not acknowledging in time", registry=self.registry)
        self.published = Counter(
            "kafka_quota_proxy_volume_agent_published_total",
            "Snapshots acknowledged by the broker", registry=self.registry)
        self.volume_bytes = Gauge(
            "kafka_quota_proxy_volume_agent_volume_bytes",
            "Size of each volume (kind=capacity) and the bytes in use on it (kind=consumed)",
            ["volume", "kind"], registry=self.registry)

    def volumes(self, volumes: Iterable[Volume]) -> None:
        self.volume_bytes.clear()
        for v in volumes:
            self.volume_bytes.labels(v.name, "capacity").set(v.capacity)
            self.volume_bytes.labels(v.name, "consumed").set(v.consumed)


class VolumeAgent:
    """Publishes snapshots, one call of ``publish_once`` each."""

    def __init__(self, file: AgentFile, metrics: AgentMetrics | None = None) -> None:
        assert file.storage.agent is not None  # AgentFile checks it
        self.storage = file.storage
        self.config = file.storage.agent
        servers = self.config.bootstrap_servers
        if servers is None:
            assert file.upstream is not None  # AgentFile checks it
            servers = file.upstream.bootstrap_servers
        self.bootstrap = [str(s) for s in servers]
        # TLS and SASL as ``upstream`` configures them for the proxy's own clients
        self.client_options = (kafka_client_options(file.upstream)
                               if file.upstream is not None else {})
        self.metrics = metrics or AgentMetrics()
        self.timeout = request_timeout(self.config.interval_seconds)
        self.connected = False
        self.published = 0
        self.publish_errors = 0
        self._producer: Any = None  # AIOKafkaProducer, started, with the topic known to exist
        secret = file.storage.secret
        self.secret = secret.get_secret_value().encode() if secret is not None else None

    async def publish_once(self) -> bool:
        """Measure and publish one snapshot; count and log a failure. True when acknowledged."""
        try:
            snap = snapshot(self.config, self.storage, time.time_ns() // 1_000_000)
        except VolumeError as exc:
            self._failed()
            log.error("volume_measure_failed", error=str(exc))
            return False
        self.metrics.volumes(snap.volumes)
        try:
            producer = await self._ready_producer()
            topic, key, value = self.storage.topic, str(snap.broker_id).encode(), snap.to_json()
            meta = await asyncio.wait_for(
                producer.send_and_wait(topic, value, key=key,
                                       **mac_headers(self.secret, topic, key, value)),
                self.timeout + 1.0)
        except Exception as exc:  # any broker failure: retried on the next tick
            self._failed()
            self.metrics.connected.set(0)
            log.warning("volume_publish_failed", topic=self.storage.topic,
                        error=_describe(exc),
                        bootstrap=self.bootstrap)
            if self.connected:
                log.warning("volume_agent_disconnected", bootstrap=self.bootstrap)
            self.connected = False
            await self._discard_producer()
            return False
        self.published += 1
        self.metrics.published.inc()
        self.metrics.connected.set(1)
        if not self.connected:
            log.info("volume_agent_connected", bootstrap=self.bootstrap, topic=self.storage.topic)
        self.connected = True
        log.debug("volume_snapshot_published", topic=self.storage.topic,
                  partition=meta.partition, offset=meta.offset, volumes=len(snap.volumes))
        return True

    def _failed(self) -> None:
        self.publish_errors += 1
        self.metrics.publish_errors.inc()

    async def close(self) -> None:
        await self._discard_producer()

    async def _ready_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        await asyncio.wait_for(self._ensure_topic(), self.timeout + 1.0)
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id=self.config.client_id, acks="all",
            request_timeout_ms=int(self.timeout * 1000), **self.client_options)
        self._producer = producer
        await asyncio.wait_for(producer.start(), self.timeout + 1.0)
        return producer

    async def _discard_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_quietly(producer)

    async def _ensure_topic(self) -> None:
        """Create the topic, compacted, unless it exists; without its configs when the broker
        refuses them. (Each time the producer is created: a broker that restarted empty gets
        it back.)"""
        await ensure_topic(self.bootstrap, self.storage.topic, TOPIC_PARTITIONS, TOPIC_CONFIGS,
                           self.client_options, self.config.client_id, self.timeout, "volume",
                           MAX_REPLICATION)


def _describe(exc: BaseException) -> str:
    name, text = type(exc).__name__, str(exc)
    if not text:
        return name
    return text if text.startswith(name) else f"{name}: {text}"


async def _unless_stopped(stop: asyncio.Event, coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro``, cancelled if ``stop`` is set first."""
    task = asyncio.ensure_future(coro)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, stopped):
            t.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)


async def run_agent(file: AgentFile, stop: asyncio.Event | None = None,
                    metrics: AgentMetrics | None = None) -> None:
    """Publish at start and every interval until ``stop`` is set. Raises ``AgentError`` when
    the metrics address cannot be listened on."""
    stop = stop if stop is not None else asyncio.Event()
    agent = VolumeAgent(file, metrics)
    config = agent.config
    server: asyncio.Server | None = None
    if config.metrics is not None:
        try:
            server = await serve_metrics(agent.metrics.registry, config.metrics.host,
                                         config.metrics.port)
        except OSError as exc:
            raise AgentError(
                f"metrics: cannot listen on {config.metrics}: {exc.strerror or exc}") from None
    log.info("volume_agent_started", broker_id=config.broker_id, log_dirs=config.log_dirs,
             topic=file.storage.topic, bootstrap=agent.bootstrap,
             interval_seconds=config.interval_seconds,
             metrics=str(config.metrics) if config.metrics is not None else None)
    loop = asyncio.get_running_loop()
    try:
        due = loop.time()
        while not stop.is_set():
            await _unless_stopped(stop, agent.publish_once())
            due = max(due + config.interval_seconds, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), due - loop.time())
    finally:
        await agent.close()
        if server is not None:
            server.close()
            await server.wait_closed()
        log.info("volume_agent_stopped", published=agent.published,
                 publish_errors=agent.publish_errors)
