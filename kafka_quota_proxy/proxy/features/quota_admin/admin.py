"""Client quotas managed with Kafka's own admin APIs (KIP-546; ``docs/quota-admin.md``): the
runtime of ``quota.client_quotas``.

The YAML's ``quotas.entities`` are the static base; quotas altered with AlterClientQuotas are
dynamic overrides (per entity and quota key) kept in a compacted topic on the cluster, one
record per entity and key, a tombstone for a removal. Every proxy process reads the topic from
its beginning (``TopicReader``) and follows it, so every instance applies an alter made
through any of them, and a restarted proxy comes back with them. An alter is answered once its
records are acknowledged by the cluster (acks=all), and applied here at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.proxy.cluster_topics import Subscription, ensure_topic, stop_quietly
from kafka_quota_proxy.quota.client_quotas import (
    Change,
    Entity,
    apply,
    decode_record,
    encode_record,
)

log = structlog.get_logger("kafka_quota_proxy.quota_admin")

TOPIC_CONFIGS = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
WRITE_TIMEOUT_S = 10.0
# What became of each entity of an AlterClientQuotas request: its change stored and in force,
# nothing to change, valid (validate_only), refused by Kafka's validation, not allowed, its
# write not acknowledged by the cluster
ALTER_OUTCOMES = ("applied", "unchanged", "validated", "invalid", "unauthorized", "failed")


class AlterFailed(Exception):
    """The overrides could not be written (the cluster did not acknowledge them)."""


class ClientQuotaAdmin:
    """One process's view of the altered quotas, and the writer of alters made through it.
    ``on_change()`` is called (soon, once per burst of records) when the overrides change."""

    def __init__(self, quotas: Callable[[], QuotasConfig], bootstrap: list[str],
                 on_change: Callable[[], None]) -> None:
        self._quotas = quotas
        self.bootstrap = bootstrap
        self.on_change = on_change
        self.overrides: dict[Entity, dict[str, float]] = {}
        self.client_options: dict[str, Any] = {}  # aiokafka TLS/SASL options, set at start
        self._producer: Any = None
        self._lock = asyncio.Lock()  # alters are written one at a time
        self._change_soon: asyncio.Handle | None = None
        self._topic_made = False
        self.connected = False
        self.reading = False
        self.records_read = 0
        self.bad_records = 0
        # AlterClientQuotas entries (one per entity) by outcome
        self.alters = dict.fromkeys(ALTER_OUTCOMES, 0)
        self.describes = {"answered": 0, "refused": 0}

    @property
    def config(self) -> QuotasConfig:
        return self._quotas()

    def view(self) -> dict[Entity, dict[str, float]]:
        """What DescribeClientQuotas shows: the YAML's entities with the overrides over them."""
        merged = self.config.static_quotas()
        for entity, values in self.overrides.items():
            merged.setdefault(entity, {}).update(values)
        return merged

    # ------------------------------------------------------------------ reading
    def subscription(self) -> Subscription:
        """The overrides topic from its beginning; a topic that does not exist is no
        overrides."""
        return Subscription(self.config.overrides.topic, self.observe, self._state,
                            missing_ok=True)

    def _state(self, connected: bool, reading: bool) -> None:
        self.connected, self.reading = connected, reading

    def observe(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        if key is None:
            self.bad_records += 1
            return
        try:
            change = decode_record(key, value)
        except ValueError as exc:
            self.bad_records += 1
            log.warning("quota_override_bad_record", key=repr(key)[:200], error=str(exc)[:300])
            return
        self.records_read += 1
        self._apply([change])

    def _apply(self, changes: list[Change]) -> None:
        before = self.overrides
        after = apply(before, changes)
        if after == before:
            return
        self.overrides = after
        if self._change_soon is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (no loop: tests driving it directly)
                self.on_change()
                return
            self._change_soon = loop.call_soon(self._changed)

    def _changed(self) -> None:
        self._change_soon = None
        self.on_change()

    # ------------------------------------------------------------------ writing
    async def write(self, changes: list[Change], principal: str) -> None:
        """Write ``changes`` to the topic and apply them here once the cluster has them all;
        ``AlterFailed`` when it does not (nothing is applied here then; records that did
        reach the topic are applied by every reader, as Kafka's own partial failures)."""
        if not changes:
            return
        records = [encode_record(c) for c in changes]
        async with self._lock:
            try:
                producer = await self._ready_producer()
                topic = self.config.overrides.topic
                sends = [await producer.send(topic, value, key=key) for key, value in records]
                await asyncio.wait_for(asyncio.gather(*sends), WRITE_TIMEOUT_S)
            except Exception as exc:
                log.error("quota_alter_failed", principal=principal, error=repr(exc)[:300])
                await self._discard_producer()
                raise AlterFailed(repr(exc)[:300]) from None
        self._apply(changes)
        soon = self._change_soon
        if soon is not None:  # in force here before the alter is answered
            soon.cancel()
            self._changed()
        log.info("quota_altered", principal=principal,
                 changes=[{"entity": dict(c.entity), "key": c.key, "value": c.value}
                          for c in changes][:50])

    async def ensure_topic(self) -> None:
        """Create the overrides topic unless it exists (``create_topic``), once."""
        overrides = self.config.overrides
        if overrides.create_topic and not self._topic_made:
            await ensure_topic(self.bootstrap, overrides.topic, 1, TOPIC_CONFIGS,
                               self.client_options, "kafka-quota-proxy-quotas", WRITE_TIMEOUT_S,
                               "quota_overrides")
            self._topic_made = True

    async def prepare(self, with_acls: bool = False) -> None:
        """At start, for a proxy that admins may alter through (``admin_principals``, or
        anyone the ACLs allow ALTER_CONFIGS on the cluster: ``with_acls``): the topic made
        now, so that every proxy reads it from the first alter on (a topic made later is
        found at the readers' next check). A cluster that cannot be reached is logged; the
        first alter tries again."""
        if not ((with_acls or self.config.admin_principals) and self.config.overrides.enabled):
            return
        try:
            await self.ensure_topic()
        except Exception as exc:
            log.warning("quota_overrides_topic_not_created", topic=self.config.overrides.topic,
                        error=repr(exc)[:300])

    async def _ready_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        await self.ensure_topic()
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id="kafka-quota-proxy-quotas", acks="all",
            linger_ms=0, request_timeout_ms=int(WRITE_TIMEOUT_S * 1000), **self.client_options)
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

    # ------------------------------------------------------------------ metrics
    def metric_families(self) -> Iterator[Any]:
        g = GaugeMetricFamily("kafka_proxy_quota_overrides",
                              "Client quota keys set by AlterClientQuotas (the overrides topic)")
        g.add_metric([], sum(len(v) for v in self.overrides.values()))
        yield g
        g = GaugeMetricFamily("kafka_proxy_quota_overrides_reading",
                              "1 while the overrides topic is read up to date")
        g.add_metric([], int(self.connected and self.reading))
        yield g
        c = CounterMetricFamily("kafka_proxy_quota_alters",
                                "AlterClientQuotas entries (one per entity), by outcome",
                                labels=["result"])
        for result, n in self.alters.items():
            c.add_metric([result], n)
        yield c
        c = CounterMetricFamily("kafka_proxy_quota_describes", "DescribeClientQuotas requests",
                                labels=["result"])
        for result, n in self.describes.items():
            c.add_metric([result], n)
        yield c
        c = CounterMetricFamily("kafka_proxy_quota_override_records",
                                "Records read from the overrides topic", labels=["result"])
        c.add_metric(["ok"], self.records_read)
        c.add_metric(["bad"], self.bad_records)
        yield c


async def read_overrides(bootstrap: list[str], topic: str, client_options: dict[str, Any],
                         timeout_s: float = 10.0) -> dict[Entity, dict[str, float]]:
    """The overrides the topic holds now, read from its beginning to its end (``quotas
    resolve --cluster``); no topic: none. Records that do not decode are skipped."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id="kafka-quota-proxy-cli",
                                enable_auto_commit=False, request_timeout_ms=int(timeout_s * 1000),
                                **client_options)
    overrides: dict[Entity, dict[str, float]] = {}
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        partitions = await asyncio.wait_for(consumer._client.fetch_all_metadata(), timeout_s)
        if topic not in partitions.topics():
            return overrides
        assigned = [TopicPartition(topic, p) for p in partitions.partitions_for_topic(topic)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            behind = [tp for tp, end in ends.items() if await consumer.position(tp) < end]
            if not behind:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s} s")
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for r in records:
                    if r.key is None:
                        continue
                    try:
                        overrides = apply(overrides, [decode_record(r.key, r.value)])
                    except ValueError:
                        continue
    finally:
        await stop_quietly(consumer)
    return overrides
