"""Soak drill: a long run with quotas, capture and rack routing on, watching for drift.

The proxy forwards a steady load for ``--minutes`` (default 60): a paced bulk producer and a
consumer reading its topic through rack-aware routing (``client.rack`` set), the keyed good
clients of ``drill_common`` (every acknowledged message consumed exactly once), and a greedy
producer held to its ``producer_byte_rate``; capture writes every request's metadata. Every
``--sample-seconds`` the drill records the proxy's RSS, open file descriptors, event-loop lag
and the quota'd producer's achieved rate, and it compares the first minutes (after a warm-up)
with the last: memory or descriptors that grow, lag that rises, or a quota that drifts show up
as a difference. At the end the capture is replayed through Kafka's maths (``quota.replay``, no
Spark): every recorded throttle must come out the same, and the greedy producer's rate is set
beside what that maths gives a greedy client of its request sizes.

    python bench/drill_soak.py                  # one hour
    python bench/drill_soak.py --minutes 3      # the suite's version (tests/e2e/test_drill_soak.py)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_common import (
    GoodTraffic,
    ProcessWatch,
    ProxyProcess,
    loop_lag,
    print_figures,
    tansu_broker,
    traceback_lines,
)
from testkit.e2e import new_topic

# producer_byte_rate of the greedy producer (bytes/s): larger than its requests (librdkafka's
# 1 MB batches), so Kafka's sampled rate holds it at the quota (a 300 KB/s quota lets 1 MB
# requests through at about 1.25x: README, "Bursts"); kafka_greedy_rate says what it gives.
QUOTA = 1_000_000
WINDOW = "{samples: 5, size_seconds: 1}"


@dataclass
class Sample:
    at: float  # seconds since the start
    rss_mb: float
    fds: int
    lag_p99_ms: float  # over the samples since the previous one
    limited_bytes: int  # the greedy producer's acknowledged bytes so far
    bulk_bytes: int  # the bulk producer's acknowledged bytes so far
    read_bytes: int  # bytes the rack-aware consumer read so far


@dataclass
class Counters:
    limited: int = 0
    bulk: int = 0
    read: int = 0
    errors: list[str] = field(default_factory=list)


def _greedy(bootstrap: str, topic: str, counters: Counters, stop: threading.Event) -> None:
    """As fast as the quota lets it: 1 KB messages, librdkafka's defaults otherwise."""
    from confluent_kafka import KafkaError, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "soak-limited",
                         "acks": "all", "linger.ms": 5, "queue.buffering.max.kbytes": 1024})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            counters.limited += len(msg.value())
        elif err.code() != KafkaError._PURGE_QUEUE:
            counters.errors.append(str(err))

    value = b"q" * 1000
    while not stop.is_set():
        try:
            producer.produce(topic, value=value, on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(60)


def _bulk(bootstrap: str, topic: str, rate: float, counters: Counters,
          stop: threading.Event) -> None:
    """``rate`` bytes/s of 1 KB messages, paced."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "soak-bulk",
                         "acks": "1", "linger.ms": 5})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            counters.bulk += len(msg.value())
        else:
            counters.errors.append(str(err))

    value = b"b" * 1000
    sent = 0
    start = time.monotonic()
    while not stop.is_set():
        if sent * 1000 > rate * (time.monotonic() - start):
            producer.poll(0.005)
            continue
        try:
            producer.produce(topic, value=value, on_delivery=delivered)
            sent += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)


def _reader(bootstrap: str, topic: str, counters: Counters, stop: threading.Event) -> None:
    """Reads the bulk topic from its own rack (rack-aware routing on, one broker: the leader
    is the replica of the consumer's rack)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-reader",
                         "client.id": "soak-reader", "client.rack": "a"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    counters.read += len(m.value() or b"")
    finally:
        consumer.close()


def _rate(samples: list[Sample], attr: str, start: float, end: float) -> float:
    """Bytes/s of ``attr`` between the samples nearest ``start`` and ``end`` (seconds)."""
    a = min(samples, key=lambda s: abs(s.at - start))
    b = min(samples, key=lambda s: abs(s.at - end))
    return (getattr(b, attr) - getattr(a, attr)) / max(b.at - a.at, 1e-9)


def replay_capture(capture_dir: Path) -> tuple[int, int, list[int]]:
    """Kafka's maths over the capture, without Spark (``quota.replay``, the engine the replay
    job runs): requests whose three recorded throttles it reproduces, requests in all, and the
    sizes of the greedy producer's produce requests, in order."""
    import pandas as pd
    import pyarrow.parquet as pq

    from kafka_quota_proxy.quota.replay import replay_rows, settings_from_section

    frame = pd.concat(pq.read_table(f).to_pandas()
                      for f in sorted(capture_dir.glob("capture-*.parquet")))
    live = {}
    for path in capture_dir.glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        live[(doc["run"], doc["quota_generation"])] = settings_from_section(doc["quotas"])
    matched = 0
    for (run_id, _broker), group in frame.groupby(["run", "broker"]):
        group = group.sort_values(["quota_ms", "seq"], kind="stable")
        columns = [group[c].tolist() for c in (
            "quota_ms", "user", "client_id", "api_key", "request_bytes", "response_bytes",
            "duration_us", "request_time_ms", "follower", "quota_generation")]
        rows = zip(*columns, [None] * len(group), strict=True)
        produce, fetch, request = replay_rows(
            rows, lambda gen, r=run_id: live[(r, gen)])  # type: ignore[misc]
        matched += int(((group["throttle_produce_ms"].to_numpy() == produce)
                        & (group["throttle_fetch_ms"].to_numpy() == fetch)
                        & (group["throttle_request_ms"].to_numpy() == request)).sum())
    greedy = frame[(frame.client_id == "soak-limited") & (frame.api_key == 0)]
    greedy = greedy.sort_values(["quota_ms", "seq"], kind="stable")
    return matched, len(frame), [int(n) for n in greedy["request_bytes"]]


def kafka_greedy_rate(request_bytes: list[int], samples: int = 5,
                      minutes: float = 10.0) -> float:
    """The rate, as a multiple of the quota, that Kafka's sampled rate gives a producer that
    sends requests of these sizes (over and over) back to back and waits out each throttle.
    A request worth seconds of the quota (librdkafka's 1 MB batches under a small quota) is
    forgotten with its samples, so a greedy client gets above its quota: Kafka's own maths,
    which the proxy follows (the capture's replay says it did, request by request)."""
    from kafka_quota_proxy.quota.entities import EntityKey, QuotaType
    from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings

    produce = QuotaType.PRODUCE
    m = QuotaManager(QuotaSettings(samples=samples, window_ms=1000, entities={
        EntityKey(None, "c"): {produce: float(QUOTA)}}))
    t, sent, start = 0.0, 0, minutes * 60_000 / 10
    begun = None
    sizes = itertools.cycle(request_bytes)
    while t < minutes * 60_000:
        if begun is None and t >= start:
            begun, sent = t, 0
        size = next(sizes)
        throttle = m.record(produce, "u", "c", size, int(t))
        sent += size
        t += max(throttle, 1.0)
    assert begun is not None
    return sent / ((t - begun) / 1000) / QUOTA


def run(minutes: float = 60.0, sample_seconds: float = 10.0, bulk_rate: float = 10e6,
        warmup_seconds: float = 30.0, compare_seconds: float = 60.0,
        workdir: Path | None = None) -> dict[str, Any]:
    """The soak; returns its figures (``samples`` has the time series)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="drill-soak-"))
    capture_dir = workdir / "capture"
    with tansu_broker(str(workdir / "tansu.log")) as broker:
        proxy = ProxyProcess(broker.bootstrap, workdir=workdir, extra_yaml=f"""quotas:
  window: {WINDOW}
  entities:
    - {{client-id: "soak-limited", producer_byte_rate: {QUOTA}}}
capture:
  dir: "{capture_dir}"
  rotate_seconds: 60
racks:
  brokers: {{111: a}}
""")
        proxy.start()
        stop = threading.Event()
        counters = Counters()
        threads: list[threading.Thread] = []
        try:
            proxy.wait_broker_listener(111)
            assert proxy.process is not None
            watch = ProcessWatch(proxy.process.pid, every=sample_seconds).start()
            cpu_start = watch.process.cpu_times()
            limited_topic = new_topic(proxy.bootstrap, "soak-limited")
            bulk_topic = new_topic(proxy.bootstrap, "soak-bulk")
            good = GoodTraffic(proxy.bootstrap, rate=200, name="soak-good").start()
            threads = [
                threading.Thread(target=_greedy, args=(proxy.bootstrap, limited_topic,
                                                       counters, stop), daemon=True),
                threading.Thread(target=_bulk, args=(proxy.bootstrap, bulk_topic, bulk_rate,
                                                     counters, stop), daemon=True),
                threading.Thread(target=_reader, args=(proxy.bootstrap, bulk_topic, counters,
                                                       stop), daemon=True),
            ]
            for t in threads:
                t.start()
            samples: list[Sample] = []
            start = time.monotonic()
            before = proxy.metrics()
            while time.monotonic() - start < minutes * 60:
                stop.wait(sample_seconds)  # the sampling period, not a wait for a condition
                metrics = proxy.metrics()
                lag = loop_lag(metrics, before)
                before = metrics
                rss = watch.process.memory_info().rss / (1 << 20)
                samples.append(Sample(time.monotonic() - start, rss, watch.process.num_fds(),
                                      lag["loop_lag_p99_ms"], counters.limited, counters.bulk,
                                      counters.read))
            cpu_end = watch.process.cpu_times()
            elapsed = time.monotonic() - start
            stop.set()
            for t in threads:
                t.join(120)
            tally = good.stop()
            metrics = proxy.metrics()
            watch.stop()
            alive = proxy.alive
        finally:
            stop.set()
            proxy.stop()
    matched, replayed, greedy_bytes = replay_capture(capture_dir)
    end = samples[-1].at
    first = (warmup_seconds, warmup_seconds + compare_seconds)
    last = (end - compare_seconds, end)
    early = [s for s in samples if first[0] <= s.at <= first[1]]
    late = [s for s in samples if last[0] <= s.at <= last[1]]
    cpu = (cpu_end.user + cpu_end.system - cpu_start.user - cpu_start.system) / elapsed
    figures: dict[str, Any] = {
        "minutes": round(elapsed / 60, 1),
        "proxy_alive": alive,
        "tracebacks": traceback_lines(proxy),
        "proxy_cpu_share_of_a_core": round(cpu, 2),
        "bulk_produce_mb_s": round(samples[-1].bulk_bytes / end / 1e6, 2),
        "rack_reader_mb_s": round(samples[-1].read_bytes / end / 1e6, 2),
        "good_acked": tally.acked,
        "good_lost": tally.lost,
        "good_duplicated": tally.duplicated,
        "good_produce_p99_ms": round(tally.produce_latency_p99_ms, 1),
        "rss_after_warmup_mb": round(early[0].rss_mb, 1),
        "rss_end_mb": round(samples[-1].rss_mb, 1),
        "rss_growth_mb": round(samples[-1].rss_mb - early[0].rss_mb, 1),
        "fds_after_warmup": early[0].fds,
        "fds_end": samples[-1].fds,
        "loop_lag_p99_ms_first": max(s.lag_p99_ms for s in early),
        "loop_lag_p99_ms_last": max(s.lag_p99_ms for s in late),
        "quota_rate_first": round(_rate(samples, "limited_bytes", *first) / QUOTA, 3),
        "quota_rate_last": round(_rate(samples, "limited_bytes", *last) / QUOTA, 3),
        "quota_throttled_requests": metrics.get(
            'kafka_proxy_quota_throttled_requests_total{quota="produce"}', 0),
        "capture_records": metrics.get("kafka_proxy_capture_records_total", 0),
        "capture_dropped": metrics.get("kafka_proxy_capture_dropped_records_total", 0),
        "routing_fetch_bytes": sum(v for k, v in metrics.items()
                                   if k.startswith("kafka_proxy_fetch_bytes_total")),
        "client_errors": len(counters.errors) + len(tally.errors),
        "replay_matched": matched,
        "replay_requests": replayed,
        "greedy_request_kb_median": round(statistics.median(greedy_bytes) / 1000, 1),
        "kafka_greedy_rate": round(kafka_greedy_rate(greedy_bytes), 3),
        "samples": samples,
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    # tansu's memory storage keeps every byte produced: an hour at 2 MB/s of bulk plus the
    # greedy producer's 1 MB/s is about 11 GB (10 MB/s filled 23 GB in 33 minutes and the
    # broker stopped answering).
    parser.add_argument("--bulk-mb", type=float, default=2.0,
                        help="the bulk producer's rate (MB/s)")
    args = parser.parse_args()
    figures = run(args.minutes, args.sample_seconds, args.bulk_mb * 1e6)
    samples = figures.pop("samples")
    print_figures(f"soak ({args.minutes:g} min)", figures)
    print("\n  at_s  rss_mb  fds  lag_p99_ms  quota_rate")
    prev = None
    for s in samples:
        rate = ((s.limited_bytes - prev.limited_bytes) / (s.at - prev.at) / QUOTA
                if prev else 0.0)
        print(f"  {s.at:5.0f}  {s.rss_mb:6.1f}  {s.fds:3d}  {s.lag_p99_ms:10.1f}  {rate:.2f}")
        prev = s


if __name__ == "__main__":
    main()
