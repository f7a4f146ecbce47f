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

At start the topic is read from the beginning (by the process's ``TopicReader``); until it
has been read to its end, and whenever a broker in the metadata has no fresh snapshot, the
fail-safe (``on_missing``) applies.

Every record is judged before it is trusted (``quota.storage``'s rules): a snapshot stamped
more than ``max_clock_skew_seconds`` ahead of this proxy's clock is refused, counted
(``kafka_proxy_storage_refused_snapshots_total{reason}``) and logged (at most one line every
``REFUSED_LOG_EVERY_S`` seconds, with the count since the last); a tombstone is counted and
leaves the broker's last snapshot to go stale in its time. With ``secret`` (opt-in), records
not signed with it by the agents (``proxy.cluster_topics.signed``) are refused
(``reason="unsigned"``), tombstones included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.config.schema import HostPort, StorageConfig
from kafka_quota_proxy.proxy.clock import wall_ms
from kafka_quota_proxy.proxy.cluster_topics import Subscription
from kafka_quota_proxy.proxy.flow import ReadGate
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.storage import (
    OPEN,
    ClusterVolumes,
    Judgement,
    Snapshot,
    SnapshotError,
    State,
    Verdict,
)

log = structlog.get_logger("kafka_quota_proxy.storage")

REFUSED_LOG_EVERY_S = 10.0

class StorageWatch:
    def __init__(self, config: StorageConfig, quotas: QuotaEnforcer,
                 bootstrap: list[HostPort], known_brokers: Callable[[], set[int]],
                 clock: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.cluster = ClusterVolumes(config.policy(),
                                      max_skew_ms=int(config.max_clock_skew_seconds * 1000))
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
        self._parked: set[ReadGate] = set()  # producers' reading, stopped while paused
        self.snapshots_read = 0
        self.bad_snapshots = 0
        self.read_errors = 0
        self.transitions = 0
        self.refused: dict[str, int] = {j.value: 0 for j in Judgement if j.refused}
        self.refused["unsigned"] = 0
        self.secret = (config.secret.get_secret_value().encode()
                       if config.secret is not None else None)
        self._refused_logged_at: float | None = None
        self._refused_since_log = 0
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

    def park(self, gate: ReadGate) -> None:
        """A producer's request waits until producing may resume: its client's reading stops."""
        self._parked.add(gate)
        gate.pause("storage")

    def unpark(self, gate: ReadGate) -> None:
        self._parked.discard(gate)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def _resume_parked(self) -> None:
        parked, self._parked = self._parked, set()
        for gate in parked:
            gate.resume("storage")  # reads the waiting request (closed ones were unparked)

    def observe(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic."""
        try:
            broker = int((key or b"").decode())
        except ValueError:
            self.bad_snapshots += 1
            log.warning("storage_bad_snapshot", key=repr(key), error="key is not a broker id")
            return
        if value is None:  # no data, not a verdict: the last snapshot goes stale in its time
            self.cluster.tombstone(broker)
            log.info("storage_tombstone", broker=broker)
            return
        try:
            snapshot = Snapshot.from_json(broker, value)
        except SnapshotError as exc:
            self.bad_snapshots += 1
            log.warning("storage_bad_snapshot", broker=broker, error=str(exc))
            return
        self.snapshots_read += 1
        now = self.clock()
        judged = self.cluster.update(snapshot, now)
        if judged.refused:
            self._refuse(judged.value, now, broker=snapshot.broker_id,
                         snapshot_at=snapshot.snapshot_at_ms,
                         ahead_ms=snapshot.snapshot_at_ms - now)

    def _unsigned(self, key: bytes | None) -> None:
        """A record not signed with the secret."""
        self._refuse("unsigned", self.clock(), key=repr(key)[:100])

    def _refuse(self, reason: str, now_ms: int, **detail: Any) -> None:
        """Count a refused record; log it, at most once every ``REFUSED_LOG_EVERY_S``."""
        self.refused[reason] += 1
        self._refused_since_log += 1
        t = now_ms / 1000.0
        if self._refused_logged_at is None or t - self._refused_logged_at >= REFUSED_LOG_EVERY_S:
            log.warning("storage_snapshot_refused", reason=reason,
                        refused_since_last_log=self._refused_since_log, **detail)
            self._refused_logged_at = t
            self._refused_since_log = 0

    # ------------------------------------------------------------------ tasks
    def subscription(self) -> Subscription:
        """What the process's ``TopicReader`` reads for this feature: the volume topic from
        its beginning; a topic no agent has made yet counts as read."""
        return Subscription(self.config.topic, lambda key, value, _ts: self.observe(key, value),
                            self._reader_state, missing_ok=True, secret=self.secret,
                            on_unsigned=self._unsigned)

    def _reader_state(self, connected: bool, reading: bool) -> None:
        if self.connected and not connected:
            self.read_errors += 1
        self.connected = connected
        if reading and not self.caught_up:
            self.caught_up = True
            log.info("storage_state_rebuilt", brokers=sorted(self.cluster.snapshots))
            self.evaluate()

    async def run(self) -> None:
        """Re-evaluate every ``evaluate_seconds``, until cancelled (the records come from the
        process's ``TopicReader``)."""
        while True:
            self.evaluate()
            await asyncio.sleep(self.config.evaluate_seconds)

    def describe(self) -> dict[str, Any]:
        v = self.verdict
        return {"state": v.state.value, "factor": v.factor, "fail_safe": v.fail_safe,
                "stale": list(v.stale), "missing": list(v.missing), "parked": self.parked}

    def metric_families(self) -> Iterator[Any]:
        """This feature's metric families (``ProxyStats.feature_families``)."""
        v = self.verdict
        for name, doc, value in (
            ("kafka_proxy_storage_state", "Storage state: 0 OPEN, 1 THROTTLE, 2 PAUSE",
             v.state.level),
            ("kafka_proxy_storage_factor", "Factor produce quotas are scaled by (0: paused)",
             v.factor),
            ("kafka_proxy_storage_fail_safe",
             "1 while the state comes from the fail-safe, for lack of fresh data",
             int(v.fail_safe)),
            ("kafka_proxy_storage_stale_brokers",
             "Brokers in the metadata with no fresh volume snapshot",
             len(v.stale) + len(v.missing)),
            ("kafka_proxy_storage_held_connections",
             "Producer connections whose produce request waits while paused", self.parked),
            ("kafka_proxy_storage_reader_connected", "1 while the volume topic is being read",
             int(self.connected)),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, value in (
            ("kafka_proxy_storage_snapshots", "Volume snapshots read", self.snapshots_read),
            ("kafka_proxy_storage_bad_snapshots", "Volume messages that do not parse (see the log)",
             self.bad_snapshots),
            ("kafka_proxy_storage_read_errors", "Failures reading the volume topic",
             self.read_errors),
            ("kafka_proxy_storage_transitions", "Storage state changes", self.transitions),
            ("kafka_proxy_storage_tombstones",
             "Tombstones read (the broker's last snapshot then goes stale in its time)",
             self.cluster.tombstones),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        refused = CounterMetricFamily(
            "kafka_proxy_storage_refused_snapshots",
            "Volume records refused: stamped beyond the clock skew allowed (future), of a new "
            "broker id past the number held (too_many_brokers), or not signed with "
            "storage.secret (unsigned)", labels=["reason"])
        for reason, n in self.refused.items():
            refused.add_metric([reason], n)
        yield refused
        usage = GaugeMetricFamily("kafka_proxy_storage_volume_bytes",
                                  "Volume capacity and consumed bytes, per broker and volume",
                                  labels=["broker", "volume", "kind"])
        level = GaugeMetricFamily("kafka_proxy_storage_volume_factor",
                                  "Each volume's own factor (1 below soft, 0 at hard)",
                                  labels=["broker", "volume"])
        for vv in v.volumes:
            b, name = str(vv.broker_id), vv.volume.name
            usage.add_metric([b, name, "capacity"], vv.volume.capacity)
            usage.add_metric([b, name, "consumed"], vv.volume.consumed)
            level.add_metric([b, name], vv.factor)
        stale = GaugeMetricFamily("kafka_proxy_storage_broker_stale",
                                  "1 for each broker with no fresh volume snapshot",
                                  labels=["broker"])
        for broker in (*v.stale, *v.missing):
            stale.add_metric([str(broker)], 1)
        yield from (usage, level, stale)


