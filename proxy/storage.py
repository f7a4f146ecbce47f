"""Storage-aware throttling in the proxy (seed 004): read every broker's volume usage from the
compacted topic the volume agents publish to, decide the cluster's state (``quota.storage``)
and apply it to producers:

- ``OPEN``: nothing changes;
- ``THROTTLE``: every produce quota is scaled by the factor, and producers with no quota get
  ``unquoted_producer_byte_rate`` scaled alike (``QuotaEnforcer.set_storage``);
- ``PAUSE``: no produce request is read or forwarded. Each waits in the proxy, its client read
  no further, until the state changes. Responses to produce requests already on their way carry
  ``throttle_time_ms`` = ``pause_throttle_ms``. Nothing is failed; a client that gives up and
  closes takes its waiting request with it, so nothing reaches the broker twice.

At start the topic is read from the beginning; until it has been read to its end, and
whenever a broker in the metadata has no fresh snapshot, the fail-safe (``on_missing``)
applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from config.schema import HostPort, StorageConfig
from proxy.logs import route_client_logs
from quota.storage import OPEN, ClusterVolumes, Snapshot, SnapshotError, State, Verdict

if TYPE_CHECKING:
    from proxy.connection import ProxiedConnection
    from proxy.quotas import QuotaEnforcer

log = structlog.get_logger("kafka_quota_proxy.storage")


def wall_ms() -> int:
    return int(time.time() * 1000)


class StorageWatch:
    def __init__(self, config: StorageConfig, quotas: QuotaEnforcer,
                 bootstrap: list[HostPort], known_brokers: Callable[[], set[int]],
                 clock: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.cluster = ClusterVolumes(config.policy())
        self.quotas = quotas
        self.bootstrap = [str(b) for b in bootstrap]
        self.known_brokers = known_brokers
        self.clock = clock
        self.pause_ms = config.pause_throttle_ms
        quotas.configure_storage(config.unquoted_producer_byte_rate,
                                 frozenset(config.exempt_users),
                                 frozenset(config.exempt_client_ids))
        self.caught_up = False  # the topic has been read to its end once
        self.connected = False
        self.verdict: Verdict = OPEN
        self.paused = False
        self._parked: set[ProxiedConnection] = set()
        self.snapshots_read = 0
        self.bad_snapshots = 0
        self.read_errors = 0
        self.transitions = 0
        self.evaluate()

    # ------------------------------------------------------------------ state
    def evaluate(self) -> Verdict:
        """Decide the state now and apply it."""
        verdict = self.cluster.evaluate(self.clock(), self.known_brokers(), self.caught_up)
        previous = self.verdict
        self.verdict = verdict
        if verdict.state is State.OPEN:
            self.quotas.set_storage(None)
        elif verdict.state is State.THROTTLE:
            self.quotas.set_storage(verdict.factor)
        else:
            self.quotas.set_storage(0.0)
        if (verdict.state, verdict.fail_safe) != (previous.state, previous.fail_safe):
            self.transitions += 1
            c = verdict.constrained
            log.warning("storage_state", state=verdict.state.value, factor=round(verdict.factor, 4),
                        fail_safe=verdict.fail_safe, stale=list(verdict.stale),
                        missing=list(verdict.missing),
                        volume=f"{c.broker_id}:{c.volume.name}" if c is not None else None)
        self.paused = verdict.state is State.PAUSE
        if not self.paused and self._parked:
            self._resume_parked()
        return verdict

    def exempt(self, user: str, client_id: str | None) -> bool:
        return self.quotas.storage_exempt(user, client_id or "")

    def park(self, conn: ProxiedConnection) -> None:
        """A producer's request waits until producing may resume."""
        self._parked.add(conn)
        conn.client_gate.pause("storage")

    def unpark(self, conn: ProxiedConnection) -> None:
        self._parked.discard(conn)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def _resume_parked(self) -> None:
        parked, self._parked = self._parked, set()
        for conn in parked:
            if not conn.closed:
                conn.client_gate.resume("storage")  # reads the waiting request

    def observe(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic."""
        try:
            broker = int((key or b"").decode())
        except ValueError:
            self.bad_snapshots += 1
            log.warning("storage_bad_snapshot", key=repr(key), error="key is not a broker id")
            return
        if value is None:
            self.cluster.remove(broker)
            return
        try:
            snapshot = Snapshot.from_json(broker, value)
        except SnapshotError as exc:
            self.bad_snapshots += 1
            log.warning("storage_bad_snapshot", broker=broker, error=str(exc))
            return
        self.snapshots_read += 1
        self.cluster.update(snapshot)

    # ------------------------------------------------------------------ tasks
    async def run(self) -> None:
        """Read the topic and re-evaluate, until cancelled."""
        route_client_logs()
        reader = asyncio.get_running_loop().create_task(self._read_forever())
        try:
            while True:
                self.evaluate()
                await asyncio.sleep(self.config.evaluate_seconds)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read_forever(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cluster is away: try again
                self.read_errors += 1
                self.connected = False
                log.warning("storage_read_failed", topic=self.config.topic, error=repr(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _read(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", client_id="kafka-quota-proxy-storage",
            request_timeout_ms=10_000, metadata_max_age_ms=5_000)
        await consumer.start()
        try:
            topic = self.config.topic
            partitions: set[int] | None = None
            while not partitions:
                partitions = consumer.partitions_for_topic(topic)
                if not partitions:
                    await consumer.force_metadata_update()
                    partitions = consumer.partitions_for_topic(topic)
                if not partitions:
                    self.connected = True
                    # No agent has published yet: nothing to wait for.
                    if not self.caught_up:
                        self.caught_up = True
                        self.evaluate()
                    await asyncio.sleep(1.0)
            assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
            consumer.assign(assigned)
            await consumer.seek_to_beginning(*assigned)
            ends = await consumer.end_offsets(assigned)
            self.connected = True
            while True:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        self.observe(record.key, record.value)
                if not self.caught_up and await _at_end(consumer, ends):
                    self.caught_up = True
                    log.info("storage_state_rebuilt", brokers=sorted(self.cluster.snapshots))
                    self.evaluate()
        finally:
            await consumer.stop()

    def describe(self) -> dict[str, Any]:
        v = self.verdict
        return {"state": v.state.value, "factor": v.factor, "fail_safe": v.fail_safe,
                "stale": list(v.stale), "missing": list(v.missing), "parked": self.parked}


async def _at_end(consumer: Any, ends: dict[Any, int]) -> bool:
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return False
    return True
