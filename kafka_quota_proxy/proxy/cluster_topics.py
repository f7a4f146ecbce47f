"""The proxy's own topics on the cluster: one reader per process for all of them.

Storage throttling reads the volume topic (``proxy.features.storage.watch``), shared
budgets read the usage topic (``proxy.features.coordination``), quota admin the overrides
topic (``proxy.features.quota_admin.admin``). One
``TopicReader`` serves them all: one consumer (no group, manual assignment), each record
dispatched to its topic's ``Subscription``. Every ``check_seconds`` it asks the cluster for
its topics' partitions and end offsets, so that it notices a topic created, deleted or
re-created (a position past the end: read again from where the subscription starts) while
it runs, and tells each subscription whether it is reading: connected, the topic there, and
read up to the end offsets it had when it was assigned.

aiokafka asks for metadata with ``allow_auto_topic_creation`` on and has no option to turn it
off: a deleted topic would come back at once with the cluster's defaults (not compacted,
several partitions). ``no_topic_auto_creation`` makes this process's aiokafka clients ask
without it; the proxy's own clients are its only ones.

Signed records (opt-in: ``coordination.secret``, ``storage.secret``): the writer puts
``record_mac`` (HMAC-SHA256 with the shared secret over the topic, the key and the value, a
tombstone included) in the record header ``MAC_HEADER``; a subscription with a ``secret``
gets only the records that carry the right one, the others are counted (``unsigned``) and
passed to ``on_unsigned``, never to ``on_record``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from kafka_quota_proxy.proxy.logs import route_client_logs

log = structlog.get_logger("kafka_quota_proxy.topics")

TOPIC_ALREADY_EXISTS = 36
_CLOSE_TIMEOUT_S = 5.0
LEADERLESS_CHECK_S = 0.25
# After ``check_soon``, a subscribed topic not in the metadata yet is looked for again every
# LEADERLESS_CHECK_S for this long, not only at the next check: a topic another proxy is
# creating at the same moment (this one was told it exists) may reach the metadata a moment
# later, and what is written there is to be read within a second.
SOON_S = 5.0


def no_topic_auto_creation() -> None:
    """Make every aiokafka client of this process ask for metadata without creating topics."""
    import aiokafka.client
    from aiokafka.protocol.metadata import MetadataRequest

    if getattr(aiokafka.client.MetadataRequest, "no_auto_create", False):
        return

    class _NoAutoCreate(MetadataRequest):  # type: ignore[misc]
        no_auto_create = True

        def __init__(self, topics: list[str] | None = None,
                     allow_auto_topic_creation: bool | None = False) -> None:
            super().__init__(topics, allow_auto_topic_creation)

    aiokafka.client.MetadataRequest = _NoAutoCreate


MAC_HEADER = "kafka-quota-proxy-mac"


def record_mac(secret: bytes, topic: str, key: bytes | None, value: bytes | None) -> bytes:
    """HMAC-SHA256 with ``secret`` over the topic, the key and the value, each length-prefixed
    (a missing key or value, a tombstone's, as length 0xffffffff)."""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (topic.encode(), key, value):
        if part is None:
            mac.update(b"\xff\xff\xff\xff")
        else:
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
    return mac.digest()


def mac_headers(secret: bytes | None, topic: str, key: bytes | None, value: bytes | None
                ) -> dict[str, Any]:
    """The keyword arguments of ``send_and_wait`` that sign a record with ``secret`` (none
    without one)."""
    if secret is None:
        return {}
    return {"headers": [(MAC_HEADER, record_mac(secret, topic, key, value))]}


def signed(secret: bytes, topic: str, key: bytes | None, value: bytes | None,
           headers: Iterable[tuple[str, bytes]] | None) -> bool:
    """Whether a record carries exactly one ``MAC_HEADER``, the right one."""
    macs = [v for k, v in headers or () if k == MAC_HEADER]
    return len(macs) == 1 and hmac.compare_digest(bytes(macs[0]),
                                                  record_mac(secret, topic, key, value))


async def stop_quietly(client: Any) -> None:
    """Stop an aiokafka client, within ``_CLOSE_TIMEOUT_S``, whatever goes wrong."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.stop(), _CLOSE_TIMEOUT_S)


class TopicError(RuntimeError):
    """A topic that cannot be created."""


async def ensure_topic(bootstrap: list[str], topic: str, partitions: int, configs: dict[str, str],
                       client_options: dict[str, Any], client_id: str, timeout_s: float,
                       what: str, max_replication: int = 3) -> bool:
    """Create ``topic`` with ``configs`` unless it exists (without them when the cluster
    refuses them); replication ``min(max_replication, brokers)``. True when it was created.
    Log events are named after ``what`` (``<what>_topic_created``, ...)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id,
                                request_timeout_ms=int(timeout_s * 1000), **client_options)

    async def create(replicas: int, with_configs: dict[str, str]) -> tuple[int, str | None]:
        response = await admin.create_topics(
            [NewTopic(topic, partitions, replicas, topic_configs=with_configs)])
        for entry in response.topic_errors:
            if entry[0] == topic:
                return int(entry[1]), entry[2] if len(entry) > 2 else None
        return 0, None

    try:
        await admin.start()
        brokers = (await admin.describe_cluster()).get("brokers") or []
        replicas = max(1, min(max_replication, len(brokers)))
        code, message = await create(replicas, configs)
        if code not in (0, TOPIC_ALREADY_EXISTS):
            log.warning(f"{what}_topic_configs_rejected", topic=topic, configs=configs,
                        error_code=code, error=message)
            code, message = await create(replicas, {})
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise TopicError(f"cannot create topic {topic}: error {code} {message or ''}"
                                 .rstrip())
            log.warning(f"{what}_topic_created_without_configs", topic=topic,
                        replication_factor=replicas)
            return True
        if code == 0:
            log.info(f"{what}_topic_created", topic=topic, configs=configs,
                     partitions=partitions, replication_factor=replicas)
            return True
        return False
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(admin.close(), _CLOSE_TIMEOUT_S)


@dataclass
class Subscription:
    """One topic read by a ``TopicReader``.

    ``on_record(key, value, timestamp ms)``; ``on_state(connected, reading)``: ``reading`` is
    the topic there and read up to the end it had when assigned (with ``missing_ok``, a topic
    that does not exist counts as read: nothing to wait for). ``start()``: the wall-clock ms
    to start reading at (``offsets_for_times``), or None: from the beginning."""

    topic: str
    on_record: Callable[[bytes | None, bytes | None, int], None]
    on_state: Callable[[bool, bool], None]
    start: Callable[[], int | None] = lambda: None
    missing_ok: bool = False
    secret: bytes | None = None  # records must be signed with it (``signed``)
    on_unsigned: Callable[[bytes | None], None] | None = None  # (key) of one that is not
    unsigned: int = 0
    partitions: frozenset[int] = frozenset()
    present: bool = False
    connected: bool = False
    reading: bool = False
    pending: dict[Any, int] = field(default_factory=dict)  # partition -> end to reach
    records: int = 0
    resets: int = 0  # positions past the end (the topic re-created) read again

    def deliver(self, key: bytes | None, value: bytes | None, timestamp_ms: int,
                headers: Iterable[tuple[str, bytes]] | None) -> None:
        """One record of the topic: to ``on_record``, unless a ``secret`` is set and the
        record is not signed with it."""
        if self.secret is not None and not signed(self.secret, self.topic, key, value,
                                                  headers):
            self.unsigned += 1
            if self.on_unsigned is not None:
                self.on_unsigned(key)
            return
        self.on_record(key, value, timestamp_ms)

    def state(self, connected: bool, reading: bool) -> None:
        if (connected, reading) != (self.connected, self.reading):
            self.connected, self.reading = connected, reading
            self.on_state(connected, reading)


class TopicReader:
    """One consumer for the proxy's own topics (see the module's doc). ``run()`` until
    cancelled; subscriptions are added before."""

    def __init__(self, bootstrap: list[str], client_id: str = "kafka-quota-proxy",
                 check_seconds: float = 5.0, fetch_max_wait_ms: int = 200) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.check_seconds = check_seconds
        self.fetch_max_wait_ms = fetch_max_wait_ms
        # aiokafka's TLS and SASL options (``proxy.tls.kafka_client_options``), set at start
        self.client_options: dict[str, Any] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.read_errors = 0
        self.connected = False
        self._check_now = asyncio.Event()  # ``check_soon``

    def check_soon(self) -> None:
        """Ask the cluster for the topics now, not at the next check: a feature has just made
        (or found) one of them, and what is written there is to be read within a second."""
        self._check_now.set()

    def subscribe(self, sub: Subscription) -> None:
        self.subscriptions[sub.topic] = sub

    async def run(self) -> None:
        route_client_logs()
        no_topic_auto_creation()
        delay = 0.5
        while True:
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cluster is away: try again
                self.read_errors += 1
                self._disconnected()
                log.warning("topics_read_failed", topics=sorted(self.subscriptions),
                            error=repr(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _disconnected(self) -> None:
        self.connected = False
        for sub in self.subscriptions.values():
            sub.partitions = frozenset()
            sub.pending.clear()
            sub.state(False, False)

    async def _read(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", client_id=self.client_id,
            request_timeout_ms=10_000, metadata_max_age_ms=5_000,
            fetch_max_wait_ms=self.fetch_max_wait_ms, **self.client_options)
        await consumer.start()
        try:
            loop = asyncio.get_running_loop()
            next_check = 0.0
            soon_until = 0.0  # (``SOON_S`` after the last ``check_soon``)
            while True:
                if loop.time() >= next_check or self._check_now.is_set():
                    if self._check_now.is_set():
                        soon_until = loop.time() + SOON_S
                    self._check_now.clear()
                    await self._check(consumer)
                    # a partition whose leader is not known yet (a topic just created) is
                    # not fetched until the metadata says it: asked again soon; so is a
                    # topic not there yet, shortly after a feature said it was made
                    leaderless = any(consumer._client.cluster.leader_for_partition(tp)
                                     in (None, -1) for tp in consumer.assignment())
                    absent = loop.time() < soon_until and not all(
                        sub.present for sub in self.subscriptions.values())
                    next_check = loop.time() + (LEADERLESS_CHECK_S if leaderless or absent
                                                else self.check_seconds)
                if not consumer.assignment():  # (getmany waits for an assignment)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._check_now.wait(),
                                               max(0.0, next_check - loop.time()))
                    continue
                batches = await consumer.getmany(timeout_ms=self.fetch_max_wait_ms)
                for tp, records in batches.items():
                    sub = self.subscriptions[tp.topic]
                    sub.records += len(records)
                    for record in records:
                        sub.deliver(record.key, record.value, record.timestamp,
                                    record.headers)
                for sub in self.subscriptions.values():
                    if sub.pending:
                        await self._caught_up(consumer, sub)
        finally:
            await stop_quietly(consumer)

    async def _check(self, consumer: Any) -> None:
        """The topics' partitions now: assign what appeared, drop what went; read again a
        partition whose end is before the position (re-created)."""
        from aiokafka import TopicPartition

        client = consumer._client  # the topics asked about: ours, assigned or not
        client.set_topics(list(self.subscriptions))
        await client.force_metadata_update()
        self.connected = True
        changed = False
        for sub in self.subscriptions.values():
            parts = frozenset(client.cluster.partitions_for_topic(sub.topic) or ())
            if parts != sub.partitions:
                changed = True
        if changed:
            kept: dict[Any, int] = {}
            for tp in consumer.assignment():
                sub = self.subscriptions[tp.topic]
                parts = frozenset(client.cluster.partitions_for_topic(sub.topic) or ())
                if tp.partition in parts:
                    kept[tp] = await consumer.position(tp)
            wanted = [TopicPartition(sub.topic, p) for sub in self.subscriptions.values()
                      for p in sorted(client.cluster.partitions_for_topic(sub.topic) or ())]
            consumer.assign(wanted)
            client.set_topics(list(self.subscriptions))
            fresh = [tp for tp in wanted if tp not in kept]
            for tp, position in kept.items():
                consumer.seek(tp, position)
            await self._start_at(consumer, fresh)
            ends = await consumer.end_offsets(fresh) if fresh else {}
            for sub in self.subscriptions.values():
                parts = frozenset(client.cluster.partitions_for_topic(sub.topic) or ())
                if parts != sub.partitions:
                    if sub.partitions and not parts:
                        log.warning("topic_missing", topic=sub.topic)
                    elif parts and not sub.partitions:
                        log.info("topic_assigned", topic=sub.topic, partitions=sorted(parts))
                    sub.partitions = parts
                    sub.present = bool(parts)
                    sub.pending = {tp: end for tp, end in ends.items() if tp.topic == sub.topic}
        assigned = list(consumer.assignment())
        if assigned:
            ends = await consumer.end_offsets(assigned)
            for tp, end in ends.items():
                if await consumer.position(tp) > end:  # the topic was deleted and re-created
                    sub = self.subscriptions[tp.topic]
                    sub.resets += 1
                    log.warning("topic_reset", topic=tp.topic, partition=tp.partition,
                                end=end)
                    await self._start_at(consumer, [tp])
                    sub.pending[tp] = end
        for sub in self.subscriptions.values():
            if not sub.present:
                sub.state(True, sub.missing_ok)
            elif not sub.pending:
                sub.state(True, True)
            else:
                await self._caught_up(consumer, sub)

    async def _start_at(self, consumer: Any, partitions: list[Any]) -> None:
        by_time: dict[Any, int] = {}
        for tp in partitions:
            start = self.subscriptions[tp.topic].start()
            if start is None:
                await consumer.seek_to_beginning(tp)
            else:
                by_time[tp] = start
        if by_time:
            found = await consumer.offsets_for_times(by_time)
            late = [tp for tp, at in found.items() if at is None]
            for tp, at in found.items():
                if at is not None:
                    consumer.seek(tp, at.offset)
            if late:
                await consumer.seek_to_end(*late)

    async def _caught_up(self, consumer: Any, sub: Subscription) -> None:
        for tp, end in list(sub.pending.items()):
            if await consumer.position(tp) >= end:
                del sub.pending[tp]
        sub.state(True, not sub.pending)
