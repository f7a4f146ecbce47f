"""Shared parts of the reliability drills (``bench/drill_*.py``).

Each drill attacks the proxy in one way while good clients keep moving keyed messages through
it, then prints its figures. The same ``run`` function serves the long run (``python
bench/drill_X.py``) and a bounded version in the test suite (``tests/e2e/test_drill_X.py``).

Here: a real tansu broker, the proxy as a subprocess (``testkit.ProxyProcess``), good
clients whose every acknowledged message must be consumed exactly once, a watch on the proxy
process (RSS, open file descriptors), and figures from the proxy's metrics.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for

__all__ = ["GoodTraffic", "ProcessWatch", "ProxyProcess", "Tally", "loop_lag", "tansu_broker",
           "traceback_lines", "wait_for"]


@contextlib.contextmanager
def tansu_broker(log_path: str | None = None) -> Iterator[TansuBroker]:
    broker = TansuBroker(log_path=log_path).start()
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class Tally:
    """What the good clients saw: every acknowledged key must be consumed exactly once."""

    sent: int = 0
    acked: int = 0
    consumed: int = 0
    lost: int = 0  # acknowledged, never consumed
    duplicated: int = 0  # consumed more than once
    errors: list[str] = field(default_factory=list)  # delivery errors (not acknowledged)
    produce_latency_p99_ms: float = 0.0  # produce() to delivery report

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


class GoodTraffic:
    """An idempotent librdkafka producer (``acks=all``) sending keyed messages at
    ``rate`` messages per second, and a consumer reading them back: assigned to the partitions
    (no group), or in a consumer group (``group=True``) that commits as it goes."""

    def __init__(self, bootstrap: str, *, rate: float = 500.0, value_size: int = 200,
                 partitions: int = 1, group: bool = False, name: str = "good") -> None:
        self.bootstrap = bootstrap
        self.rate = rate
        self.value = b"g" * value_size
        self.topic = new_topic(bootstrap, f"drill-{name}", partitions)
        self.partitions = partitions
        self.group = group
        self.name = name
        self.acked: list[bytes] = []
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.consumed: Counter[bytes] = Counter()
        self._stop = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]
        self.sent = 0

    def start(self) -> GoodTraffic:
        for t in self._threads:
            t.start()
        return self

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, "client.id": self.name,
                         "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 300_000})

    def delivered(self, sent_at: float, err: Any, msg: Any) -> None:
        """A delivery report: acknowledged (with its produce-to-ack latency) or an error."""
        if err is None:
            self.acked.append(msg.key())
            self.latencies.append(time.monotonic() - sent_at)
        else:
            self.errors.append(str(err))

    def _send_due(self, producer: Any, start: float) -> None:
        """One step of the paced loop: the next message if it is due, else a poll until it is."""
        due = start + self.sent / self.rate
        now = time.monotonic()
        if now < due:
            producer.poll(min(due - now, 0.05))
            return
        key = b"%s-%09d" % (self.name.encode(), self.sent)
        try:
            producer.produce(self.topic, key=key, value=self.value,
                             partition=self.sent % self.partitions,
                             on_delivery=functools.partial(self.delivered, now))
            self.sent += 1
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)

    def _produce(self) -> None:
        producer = self._new_producer()
        start = time.monotonic()
        while not self._stop.is_set():
            self._send_due(producer, start)
        producer.flush(300)

    def _consume(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        config = {"bootstrap.servers": self.bootstrap, "client.id": f"{self.name}-reader",
                  "group.id": f"{self.name}-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True}
        consumer = Consumer(config)
        if self.group:
            consumer.subscribe([self.topic])
        else:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not self._stop_consuming.is_set():
                for m in consumer.consume(500, 0.2):
                    if m.error() is None:
                        self.consumed[m.key()] += 1
        finally:
            consumer.close()

    def stop(self, drain_seconds: float = 120.0) -> Tally:
        """Stop producing, wait until every acknowledged key is consumed (or
        ``drain_seconds``), and tally."""
        self._stop.set()
        self._threads[0].join(drain_seconds + 300)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(k in self.consumed for k in self.acked), drain_seconds,
                     interval=0.2, what="every acknowledged message consumed")
        self._stop_consuming.set()
        self._threads[1].join(60)
        acked = set(self.acked)
        latencies = sorted(self.latencies)
        p99 = latencies[int(len(latencies) * 0.99)] * 1000 if latencies else 0.0
        return Tally(
            sent=self.sent, acked=len(self.acked), consumed=sum(self.consumed.values()),
            lost=sum(1 for k in acked if k not in self.consumed),
            duplicated=sum(n - 1 for n in self.consumed.values() if n > 1),
            errors=self.errors[:20], produce_latency_p99_ms=p99)


class ProcessWatch:
    """Samples a process's RSS and open file descriptors every ``every`` seconds."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.process = psutil.Process(pid)
        self.every = every
        self.rss: list[int] = []
        self.fds: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.rss.append(self.process.memory_info().rss)
            self.fds.append(self.process.num_fds())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def start(self) -> ProcessWatch:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        self._sample()
        mb = 1 << 20
        return {"rss_start_mb": self.rss[0] / mb, "rss_peak_mb": max(self.rss) / mb,
                "rss_end_mb": self.rss[-1] / mb, "fds_start": self.fds[0],
                "fds_peak": max(self.fds), "fds_end": self.fds[-1]}


def loop_lag(metrics: dict[str, float], before: dict[str, float] | None = None
             ) -> dict[str, float]:
    """p50/p99/max bucket bound of ``kafka_proxy_event_loop_lag_seconds`` (in ms), over the
    samples since ``before`` (another scrape) when given."""
    prefix = "kafka_proxy_event_loop_lag_seconds_bucket{le=\""
    bounds, counts = [], []
    for key, value in metrics.items():
        if key.startswith(prefix):
            le = key[len(prefix):-2]
            bounds.append(float("inf") if le == "+Inf" else float(le))
            counts.append(value - (before or {}).get(key, 0.0))
    order = sorted(range(len(bounds)), key=bounds.__getitem__)
    bounds = [bounds[i] for i in order]
    counts = [counts[i] for i in order]
    total = counts[-1] if counts else 0
    if not total:
        return {"loop_lag_p50_ms": 0.0, "loop_lag_p99_ms": 0.0, "loop_lag_samples": 0}

    def quantile(q: float) -> float:
        i = bisect.bisect_left(counts, q * total)
        return bounds[min(i, len(bounds) - 1)] * 1000

    return {"loop_lag_p50_ms": quantile(0.5), "loop_lag_p99_ms": quantile(0.99),
            "loop_lag_samples": total}


def traceback_lines(proxy: ProxyProcess) -> int:
    """Lines of the proxy's log that carry a Python traceback or an unretrieved exception."""
    if not proxy.log_path.exists():
        return 0
    text = proxy.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines()
               if "Traceback (most recent call last)" in line
               or "exception was never retrieved" in line)


def print_figures(title: str, figures: dict[str, Any]) -> None:
    print(f"\n{title}")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        if isinstance(value, bool):
            shown = "yes" if value else "no"
        elif isinstance(value, float):
            shown = f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
        elif isinstance(value, int):
            shown = f"{value:,}"
        else:
            shown = str(value)
        print(f"  {key.ljust(width)}  {shown}")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
