"""The dynamic ACL bindings (CreateAcls, DeleteAcls) kept in a compacted topic every proxy
reads (``docs/acls.md``, "The ACL admin APIs"): the mechanism of the quota overrides
(``proxy.features.quota_admin.admin``).

The topic (``acls.topic``) holds one record per binding (``authorizer.records``): a JSON object
for a binding created, a tombstone for one deleted. Every proxy process reads it from its
beginning with its one ``TopicReader`` and follows it, applying each record to ``Acls``; a
restarted proxy comes back with the bindings. A write is acknowledged by every in-sync replica
(acks=all) before it is applied here and answered. With ``coordination.secret`` set, records
are signed with it (``cluster_topics.mac_headers``) and unsigned ones refused: a client that
could write the topic some other way cannot grant itself rights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.authorizer.acls import AclBinding
from kafka_quota_proxy.authorizer.records import decode_record, encode_record
from kafka_quota_proxy.config.acls import AclsConfig
from kafka_quota_proxy.protocol.acl_frames import ACL_APIS, ANSWERED_VERSIONS
from kafka_quota_proxy.proxy.cluster_topics import (
    Subscription,
    ensure_topic,
    mac_headers,
    stop_quietly,
)
from kafka_quota_proxy.proxy.features.acls.state import Acls
from kafka_quota_proxy.proxy.logs import get_logger

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig
    from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
    from kafka_quota_proxy.proxy.feature import Runtime

log = get_logger("kafka_quota_proxy.acls")

TOPIC_CONFIGS = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
WRITE_TIMEOUT_S = 10.0
CLIENT_ID = "kafka-quota-proxy-acls"
BAD_LOGGED_MAX = 100  # bad records logged one by one, then only counted


class AclWriteFailed(Exception):
    """The bindings could not be written (the cluster did not acknowledge them all)."""


class AclStore:
    """One process's reader and writer of the ACL topic."""

    def __init__(self, acls: Acls, config: Callable[[], ProxyConfig],
                 bootstrap: list[str]) -> None:
        self.acls = acls
        self._config = config
        self.bootstrap = bootstrap
        self.client_options: dict[str, Any] = {}  # aiokafka TLS/SASL options, set at start
        self._producer: Any = None
        self._lock = asyncio.Lock()  # writes one at a time, in the order they were asked
        self._topic_made = False
        self.connected = False
        self.reading = False
        # figures
        self.records_read = 0
        self.bad_records = 0
        self.unsigned_records = 0
        self.creates = {"ok": 0, "refused": 0, "failed": 0}
        self.deletes = {"ok": 0, "refused": 0, "failed": 0}
        self.describes = {"ok": 0, "refused": 0}

    @property
    def config(self) -> AclsConfig:
        acls = self._config().acls
        assert acls is not None  # (the feature exists only with ``acls:``)
        return acls

    @property
    def topic(self) -> str:
        return self.config.topic

    @property
    def secret(self) -> bytes | None:
        secret = self._config().coordination.secret
        return secret.get_secret_value().encode() if secret is not None else None

    # ------------------------------------------------------------------ reading
    def subscriptions(self) -> list[Subscription]:
        """The ACL topic from its beginning; a topic that does not exist is no dynamic
        binding."""
        return [Subscription(self.topic, self.observe, self._state, missing_ok=True,
                             secret=self.secret, on_unsigned=self._unsigned)]

    def _state(self, connected: bool, reading: bool) -> None:
        self.connected, self.reading = connected, reading

    def observe(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        """One record of the ACL topic (here or another proxy wrote it)."""
        try:
            binding, present = decode_record(key, value)
        except ValueError as exc:
            self.bad_records += 1
            if self.bad_records <= BAD_LOGGED_MAX:
                log.warning("acl_bad_record", topic=self.topic, key=repr(key)[:200],
                            error=str(exc)[:300])
            return
        self.records_read += 1
        if present:
            self.acls.add_dynamic(binding)
        else:
            self.acls.remove_dynamic(binding)

    def _unsigned(self, key: bytes | None) -> None:
        self.unsigned_records += 1
        if self.unsigned_records <= BAD_LOGGED_MAX:
            log.warning("acl_unsigned_record", topic=self.topic, key=repr(key)[:200])

    # ------------------------------------------------------------------ writing
    async def write(self, created: list[AclBinding], deleted: list[AclBinding],
                    principal: str) -> None:
        """Write ``created`` and ``deleted`` to the topic, in that order, and apply them here
        once the cluster has them all; ``AclWriteFailed`` when it does not (nothing is applied
        here then; records that did reach the topic are applied by every reader)."""
        if not created and not deleted:
            return
        records = ([encode_record(b, True) for b in created]
                   + [encode_record(b, False) for b in deleted])
        async with self._lock:
            try:
                producer = await self._ready_producer()
                topic, secret = self.topic, self.secret
                sends = [await producer.send(topic, value, key=key,
                                             **mac_headers(secret, topic, key, value))
                         for key, value in records]
                await asyncio.wait_for(asyncio.gather(*sends), WRITE_TIMEOUT_S)
            except Exception as exc:
                log.error("acl_write_failed", principal=principal, created=len(created),
                          deleted=len(deleted), error=repr(exc)[:300])
                await self._discard_producer()
                raise AclWriteFailed(repr(exc)[:300]) from None
        for b in created:
            self.acls.add_dynamic(b)
        for b in deleted:
            self.acls.remove_dynamic(b)
        log.info("acls_changed", principal=principal,
                 created=[str(_describe(b)) for b in created][:50],
                 deleted=[str(_describe(b)) for b in deleted][:50])

    async def ensure_topic(self) -> None:
        """Create the ACL topic (compacted) unless it exists (``create_topic``), once."""
        if self.config.create_topic and not self._topic_made:
            await ensure_topic(self.bootstrap, self.topic, 1, TOPIC_CONFIGS,
                               self.client_options, CLIENT_ID, WRITE_TIMEOUT_S, "acls")
            self._topic_made = True

    def start(self, runtime: Runtime) -> None:
        self.client_options = runtime.client_options

        async def prepare() -> None:
            await self.prepare()
            runtime.topics_made()  # (read from now on, not from the reader's next check)

        runtime.spawn(prepare())

    async def prepare(self) -> None:
        """At start: the topic made now, so that every proxy reads it from the first
        CreateAcls on (a topic made later is found at the readers' next check). A cluster
        that cannot be reached is logged; the first write tries again."""
        try:
            await self.ensure_topic()
        except Exception as exc:
            log.warning("acls_topic_not_created", topic=self.topic, error=repr(exc)[:300])

    async def _ready_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        await self.ensure_topic()
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id=CLIENT_ID, acks="all", linger_ms=0,
            request_timeout_ms=int(WRITE_TIMEOUT_S * 1000), **self.client_options)
        try:
            await asyncio.wait_for(producer.start(), WRITE_TIMEOUT_S)
        except BaseException:
            await stop_quietly(producer)
            raise
        self._producer = producer
        return producer

    async def _discard_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_quietly(producer)

    async def stop(self) -> None:
        await self._discard_producer()

    # ------------------------------------------------------------------ ApiVersions
    def attach(self, rewriter: ResponseRewriter) -> None:
        """DescribeAcls, CreateAcls and DeleteAcls advertised at the versions the proxy
        answers (whatever the broker offers: the proxy answers them, the broker never sees
        them)."""
        for api_key in ACL_APIS:
            rewriter.answered[api_key] = ANSWERED_VERSIONS

    # ------------------------------------------------------------------ metrics
    def metric_families(self) -> Iterator[Any]:
        g = GaugeMetricFamily("kafka_proxy_acls_topic_reading",
                              "1 while the ACL topic is read up to date")
        g.add_metric([], int(self.connected and self.reading))
        yield g
        c = CounterMetricFamily("kafka_proxy_acl_records", "Records read from the ACL topic",
                                labels=["result"])
        c.add_metric(["ok"], self.records_read)
        c.add_metric(["bad"], self.bad_records)
        c.add_metric(["unsigned"], self.unsigned_records)
        yield c
        for name, what, counts in (
                ("kafka_proxy_acl_creates", "CreateAcls requests", self.creates),
                ("kafka_proxy_acl_deletes", "DeleteAcls requests", self.deletes),
                ("kafka_proxy_acl_describes", "DescribeAcls requests", self.describes)):
            c = CounterMetricFamily(name, what, labels=["result"])
            for result, n in counts.items():
                c.add_metric([result], n)
            yield c


def _describe(b: AclBinding) -> str:
    return (f"{b.permission.name} {b.principal}@{b.host} {b.operation.name} "
            f"{b.resource_type.name}:{b.pattern_type.name}:{b.name[:200]}")
