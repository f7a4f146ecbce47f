"""Budgets shared by every process of every instance (issue 16, ``docs/scale-out.md``): the
runtime of ``quota.shared``.

Every ``report_ms`` this process makes a ``UsageReport`` of its limited budgets and writes it
to the usage topic (key: the process id); the process's ``TopicReader`` reads every report,
its own included, into a ``RemoteUsage``; each broker's ``QuotaManager`` checks its budgets
against the sum (``SharedBudgets``, design A+: Kafka's maths on its own samples and the
others' as reported, with the lag compensated). While reports cannot be read, or this
process's own do not come back, each budget is enforced as ``quota / processes live`` (the
fallback), logged and in the metrics. On a clean stop the process writes a tombstone, so that
the others stop counting it as live at once.

Every report read is judged before it is trusted (``quota.shared.RemoteUsage``'s rules:
future stamps beyond ``max_clock_skew_ms``, another writer under this process's own id,
lines of reports under one id, tombstones, bounded memory; ``SharedBudgets``' cap on what the
others can charge to a budget). Refusals are counted
(``kafka_proxy_shared_quota_reports_refused_total{reason}``) and logged, at most one line
every ``REFUSED_LOG_EVERY_S`` seconds with the count since the last.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.config.schema import CoordinationConfig
from kafka_quota_proxy.proxy.clock import now_ms, wall_ms
from kafka_quota_proxy.proxy.cluster_topics import (
    Subscription,
    ensure_topic,
    mac_headers,
    stop_quietly,
)
from kafka_quota_proxy.proxy.feature import Feature
from kafka_quota_proxy.quota.capture_schema import process_id
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.manager import STRICT
from kafka_quota_proxy.quota.shared import (
    Refusal,
    RemoteUsage,
    ReportError,
    SharedBudgets,
    UsageReport,
    usage_report,
)

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.feature import Runtime

log = structlog.get_logger("kafka_quota_proxy.coordination")

# compacted, and what is left of processes long gone disappears within the hour
TOPIC_CONFIGS = {"cleanup.policy": "compact,delete", "retention.ms": "3600000",
                 "segment.ms": "600000", "min.compaction.lag.ms": "0"}
# a topic missing this long (seconds) is created again (by every process that may create it)
RECREATE_AFTER_S = 10.0
_FAILURES_BEFORE_NEW_PRODUCER = 3
EARLY_REPORT_MS = 20  # at least this long between an early report and the one before
REFUSED_LOG_EVERY_S = 10.0  # at most one log line of refused reports this often


def own_process_id(instance: str | None, worker: int | None) -> str:
    """This process's id (``quota.capture_schema.process_id``): a restarted worker is a new
    process."""
    return process_id(instance or socket.gethostname(), worker or 0, int(time.time() * 1000),
                      os.getpid())


class Coordination(Feature):
    """Reports this process's usage, reads everyone's, and shares the budgets."""

    name = "coordination"

    @classmethod
    def make(cls, runtime: Runtime) -> Coordination | None:
        """On with ``coordination.enabled: true``, or ``auto`` in a worker process."""
        config = runtime.config
        c = config.coordination
        if not (c.enabled is True or (c.enabled == "auto" and runtime.worker is not None)):
            return None
        return cls(c, runtime.quotas, [str(b) for b in config.upstream.bootstrap_servers],
                   runtime.process, c.expected_processes or runtime.processes)

    def subscriptions(self) -> list[Subscription]:
        return [self.subscription()]

    client_options: dict[str, Any]

    def start(self, runtime: Runtime) -> None:
        """Reports go on while the last requests are answered."""
        self.client_options = runtime.client_options
        runtime.spawn_past_drain(self._coordinate())

    async def _coordinate(self) -> None:
        await self.ensure_topic()
        await self.run()

    def __init__(self, config: CoordinationConfig, quotas: QuotaEnforcer, bootstrap: list[str],
                 process: str, initial_processes: int,
                 clock: Callable[[], int] = now_ms, wall: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.quotas = quotas
        self.bootstrap = bootstrap
        self.process = process
        self.instance = process.split("/", 1)[0]
        self.clock = clock
        self.wall = wall
        settings = quotas.settings
        self.remote = RemoteUsage(process, settings.samples, settings.window_ms,
                                  config.staleness_ms, initial_processes,
                                  max_skew_ms=config.max_clock_skew_ms)
        self.shared = SharedBudgets(
            self.remote, bound_of=lambda key: quotas.bound(key[1], (key[2], key[3])))
        self.shared.on_first_use = self._report_soon
        quotas.share(self.shared.hooks)
        self._soon: asyncio.Handle | None = None  # an early report, scheduled
        self.last_report_ms = 0
        self.early_reports = 0
        self._last_empty = False  # the last report written held no budget
        self._last_written_ms = 0
        # aiokafka's TLS and SASL options (``proxy.tls.kafka_client_options``), set at start
        self.client_options = {}
        self._producer: Any = None
        self._failures = 0  # writes failed in a row
        self._in_flight = 0
        self._writes: set[asyncio.Task[None]] = set()
        self.seq = 0
        self.in_fallback: bool | None = None
        self.missing_since: float | None = None
        self.reports_written = 0
        self.reports_read = 0
        self.bad_reports = 0
        self.write_errors = 0
        self.writes_skipped = 0  # the previous report still on its way: this one dropped
        self.report_bytes = 0
        self.report_age_ms_total = 0  # sent -> read, over every report read
        self.report_age_ms_max = 0
        self.connected = False
        self._subscription: Subscription | None = None
        self._refused_seen = 0  # refusals counted when the last line was logged
        self._refused_logged_at: int | None = None
        # opt-in: reports signed with the shared secret, those without it refused
        self.secret = (config.secret.get_secret_value().encode()
                       if config.secret is not None else None)
        self.unsigned = 0

    # ------------------------------------------------------------------ reading
    def subscription(self) -> Subscription:
        """The usage topic, for the process's ``TopicReader``: from ``staleness_ms`` ago."""
        self._subscription = Subscription(
            self.config.topic, self.observe, self._reader_state,
            start=lambda: self.wall() - self.config.staleness_ms, secret=self.secret,
            on_unsigned=self._unsigned)
        return self._subscription

    def _unsigned(self, key: bytes | None) -> None:
        """A record not signed with the secret: refused, counted, logged (rate-limited)."""
        self.unsigned += 1
        wall = self.wall()
        last = self._refused_logged_at
        if last is None or wall - last >= REFUSED_LOG_EVERY_S * 1000:
            log.warning("shared_quota_report_refused", reason="unsigned",
                        key=repr(key)[:200], unsigned=self.unsigned)
            self._refused_logged_at = wall

    @property
    def topic_present(self) -> bool:
        """The usage topic was in the cluster's metadata at the reader's last check."""
        sub = self._subscription
        return sub is not None and sub.present

    def observe(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        """One record of the usage topic."""
        if value is None:  # a process stopped: no longer live (its usage counts till stale)
            if key:
                self.remote.stopped(key.decode(errors="replace"))
            return
        try:
            report = UsageReport.decode(value)
        except ReportError as exc:
            self.bad_reports += 1
            log.warning("shared_quota_bad_report", key=repr(key)[:100], error=str(exc)[:200])
            return
        self.reports_read += 1
        wall = self.wall()
        age = min(max(wall - report.sent_ms, 0), self.config.staleness_ms)
        self.report_age_ms_total += age
        self.report_age_ms_max = max(self.report_age_ms_max, age)
        refused = sum(self.remote.refused.values())
        taken = self.remote.observe(report, self.clock() - age, wall)
        if not taken and sum(self.remote.refused.values()) > refused:
            self._log_refused(report, wall)

    def _log_refused(self, report: UsageReport, wall_ms: int) -> None:
        """A report refused: one log line every ``REFUSED_LOG_EVERY_S`` at most."""
        last = self._refused_logged_at
        if last is not None and wall_ms - last < REFUSED_LOG_EVERY_S * 1000:
            return
        total = sum(self.remote.refused.values())
        log.warning("shared_quota_report_refused", process=report.process[:200],
                    seq=report.seq, ahead_ms=report.sent_ms - wall_ms,
                    budgets=len(report.budgets),
                    refused={r.value: n for r, n in self.remote.refused.items() if n},
                    refused_since_last_log=total - self._refused_seen)
        self._refused_logged_at = wall_ms
        self._refused_seen = total

    def _reader_state(self, connected: bool, reading: bool) -> None:
        self.connected = connected
        self.remote.set_reading(reading, self.clock())
        self._note_fallback()

    def _note_fallback(self) -> None:
        now = self.clock()
        fallback = self.remote.fallback(now)
        if fallback == self.in_fallback:
            return
        first, self.in_fallback = self.in_fallback is None, fallback
        if first:  # starting: until its own first report comes back
            log.info("shared_quota_starting", process=self.process, fallback=fallback,
                     processes=self.remote.fallback_processes)
        elif fallback:
            reason = ("usage topic not read" if not self.remote.reading
                      else "own reports not read back")
            log.warning("shared_quota_fallback", state="on", reason=reason,
                        processes=self.remote.fallback_processes)
        else:
            log.info("shared_quota_fallback", state="off",
                     live_processes=self.remote.live(now))

    # ------------------------------------------------------------------ writing
    async def run(self) -> None:
        """Report every ``report_ms`` until cancelled."""
        every = self.config.report_ms / 1000.0
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += every
            delay = next_at - loop.time()
            if delay < 0:  # late (a busy loop): skip, never catch up in a burst
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)
            self.tick()
            if self.remote.reading:
                self.missing_since = None
            elif self.connected and self.config.create_topic:
                await self._recreate_if_missing(loop.time())

    def _report_soon(self) -> None:
        """A budget used for the first time: report now (after the request being recorded),
        at most one early report per ``EARLY_REPORT_MS``."""
        if self._soon is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (no loop: tests driving the hooks directly)
            return
        wait = max(0, EARLY_REPORT_MS - (self.clock() - self.last_report_ms)) / 1000.0
        self._soon = loop.call_later(wait, self._early)

    def _early(self) -> None:
        if self._in_flight:  # the report before is still being written: right after it
            self._soon = asyncio.get_running_loop().call_later(EARLY_REPORT_MS / 1000.0,
                                                               self._early)
            return
        self._soon = None
        self.early_reports += 1
        self.tick()

    def tick(self) -> None:
        """Make this process's report, start writing it, forget stale processes."""
        now = self.clock()
        self.last_report_ms = now
        self.seq += 1
        settings = self.quotas.settings
        report = usage_report(self.process, self.seq, self.wall(), self.quotas.managers, now,
                              settings=settings,
                              totals=self.shared.totals() if settings.pacing == STRICT else None)
        self.shared.reported(now)
        self.remote.expire(now)
        self._note_fallback()
        if not report.budgets:
            # nothing limited in use: an empty report says only "alive", which every half
            # staleness is enough for (the others keep counting this process)
            if self._last_empty and now - self._last_written_ms < self.config.staleness_ms // 2:
                return
            self._last_empty = True
        else:
            self._last_empty = False
        if self._in_flight:
            self.writes_skipped += 1
            return
        self._last_written_ms = now
        self.remote.wrote(report)  # its own when read back; no other writer's under its id
        data = report.encode()
        self.report_bytes = len(data)
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._write(report.key, data))
        self._writes.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, key: bytes, value: bytes | None) -> None:
        try:
            producer = await self._ready_producer()
            timeout = max(1.0, 4 * self.config.report_ms / 1000.0)
            topic = self.config.topic
            await asyncio.wait_for(producer.send_and_wait(
                topic, value, key=key, **mac_headers(self.secret, topic, key, value)),
                timeout)
            self.reports_written += 1
            self._failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.write_errors += 1
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("shared_quota_write_failed", topic=self.config.topic,
                            failures=self._failures, error=repr(exc)[:300])
            if self._failures % _FAILURES_BEFORE_NEW_PRODUCER == 0:
                await self._discard_producer()
        finally:
            self._in_flight -= 1

    async def _ready_producer(self) -> Any:
        if self._producer is not None:
            return self._producer
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id="kafka-quota-proxy-usage", acks=1,
            linger_ms=0, request_timeout_ms=max(1000, 4 * self.config.report_ms),
            **self.client_options)
        self._producer = producer
        try:
            await asyncio.wait_for(producer.start(), 10.0)
        except BaseException:
            self._producer = None
            await stop_quietly(producer)
            raise
        return producer

    async def _discard_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_quietly(producer)

    async def ensure_topic(self, timeout_s: float = 10.0) -> None:
        """Create the usage topic unless it exists (``create_topic``); a cluster that cannot
        be reached now is logged, the reader and writer keep trying."""
        if not self.config.create_topic:
            return
        try:
            await ensure_topic(self.bootstrap, self.config.topic, 1, TOPIC_CONFIGS,
                               self.client_options, "kafka-quota-proxy-usage", timeout_s,
                               "usage")
        except Exception as exc:  # (TopicError included)
            log.warning("usage_topic_not_created", topic=self.config.topic,
                        error=repr(exc)[:300])

    async def _recreate_if_missing(self, now: float) -> None:
        if self.topic_present or not self.connected:
            return
        if self.missing_since is None:
            self.missing_since = now
            return
        if now - self.missing_since >= RECREATE_AFTER_S:
            self.missing_since = now
            await self.ensure_topic()

    async def stop(self) -> None:
        """A clean stop: a tombstone, so that the others stop counting this process now."""
        try:
            if self._producer is not None:
                producer = self._producer
                key, topic = self.process.encode(), self.config.topic
                await asyncio.wait_for(producer.send_and_wait(
                    topic, None, key=key, **mac_headers(self.secret, topic, key, None)),
                    2.0)
        except Exception as exc:
            log.warning("shared_quota_tombstone_failed", error=repr(exc)[:300])
        await self._discard_producer()

    # ------------------------------------------------------------------ metrics
    def describe(self) -> dict[str, Any]:
        now = self.clock()
        return {"process": self.process, "fallback": self.remote.fallback(now),
                "live_processes": self.remote.live(now), "peers": self.remote.peers(now)}

    def metric_families(self) -> Iterator[Any]:
        """This feature's metric families (``ProxyStats.feature_families``)."""
        now = self.clock()
        remote = self.remote
        fallback = remote.fallback(now)
        for name, doc, value in (
            ("kafka_proxy_shared_quota_fallback",
             "1 while budgets are enforced as quota / processes (reports not read)",
             int(fallback)),
            ("kafka_proxy_shared_quota_live_processes",
             "Processes with a fresh usage report, this one included", remote.live(now)),
            ("kafka_proxy_shared_quota_fallback_processes",
             "The divisor of the fallback: processes live when reports were last read",
             remote.fallback_processes),
            ("kafka_proxy_shared_quota_reader_connected",
             "1 while the usage topic is being read", int(self.connected and remote.reading)),
            ("kafka_proxy_shared_quota_report_bytes", "Size of this process's last report",
             self.report_bytes),
            ("kafka_proxy_shared_quota_report_age_max_seconds",
             "The oldest a report was when read (sent -> read), since start",
             self.report_age_ms_max / 1000.0),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, value in (
            ("kafka_proxy_shared_quota_reports_written", "Usage reports written",
             self.reports_written),
            ("kafka_proxy_shared_quota_reports_read", "Usage reports read (own included)",
             self.reports_read),
            ("kafka_proxy_shared_quota_report_age_seconds",
             "Sum of the reports' ages when read (sent -> read; / reports read = mean)",
             self.report_age_ms_total / 1000.0),
            ("kafka_proxy_shared_quota_reports_ignored",
             "Reports ignored: made with another quota window, or one already held",
             remote.ignored),
            ("kafka_proxy_shared_quota_bad_reports", "Usage records that do not parse",
             self.bad_reports),
            ("kafka_proxy_shared_quota_stale_processes",
             "Processes forgotten because their reports stopped", remote.dropped),
            ("kafka_proxy_shared_quota_report_write_errors", "Reports that could not be written",
             self.write_errors),
            ("kafka_proxy_shared_quota_early_reports",
             "Reports made at once because a budget was used for the first time",
             self.early_reports),
            ("kafka_proxy_shared_quota_reports_skipped",
             "Reports not written because the previous one was still on its way",
             self.writes_skipped),
            ("kafka_proxy_shared_quota_fallback_checks",
             "Quota checks made under the fallback", self.shared.fallback_checks),
            ("kafka_proxy_shared_quota_conflicting_reports",
             "Reports that do not follow the reports held under their process id (a second "
             "writer under it, or a clock set back): held as a line of their own",
             remote.conflicts),
            ("kafka_proxy_shared_quota_capped_checks",
             "Quota checks where the others' usage of the budget was capped at "
             "charge_cap_windows windows of its quota", self.shared.capped_checks),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        refused = CounterMetricFamily(
            "kafka_proxy_shared_quota_reports_refused",
            "Usage reports refused: stamped beyond the clock skew allowed (future), under this "
            "process's id but not written by it (own_id), too many budgets (oversized), no "
            "room for a new process (full), or not signed with coordination.secret (unsigned)",
            labels=["reason"])
        for reason in Refusal:
            refused.add_metric([reason.value], remote.refused[reason])
        refused.add_metric(["unsigned"], self.unsigned)
        yield refused
