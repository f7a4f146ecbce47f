"""Quotas enforced through the proxy with librdkafka against tansu: the throttled client gets
its quota (±5% over 15 s after warm-up) and sees throttle_time_ms; a client without a quota
keeps its rate; nothing is lost; a hot reload slows a running client; a broken file changes
nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.rates import cycle_rate

pytestmark = pytest.mark.e2e

QUOTA = 1_000_000  # bytes/s
VALUE = b"q" * 1000
# Kafka's sampled rate lets a greedy client burst about (N-1) windows' worth of quota whenever
# the samples of its previous burst age out (every N+1 windows or so), and then trickle: its
# rate is the quota on average over whole cycles, not over any 15 s. So the rate is measured
# from the start of one burst to the start of the first burst at least MEASURE_S later (or over
# MEASURE_S plainly if there are no bursts), after a warm-up that lets the very first burst
# (the padded window of a new client) be paid back.
WARMUP_S = 12.0
RUN_S = 48.0


def _quota_yaml(producer_rate: int = QUOTA, consumer_rate: int = QUOTA) -> str:
    return f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  watch_seconds: 0.5
  entities:
    - {{client-id: "limited-producer", producer_byte_rate: {producer_rate}}}
    - {{client-id: "limited-consumer", consumer_byte_rate: {consumer_rate}}}
"""


@pytest.fixture
def quota_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml=_quota_yaml()).start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


@dataclass
class ProduceRun:
    delivered: list[tuple[float, int, bytes]] = field(default_factory=list)  # (time, bytes, key)
    errors: list[str] = field(default_factory=list)
    throttle_max_ms: int = 0

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n, _ in self.delivered if start <= t < end) / (end - start)


def _produce(bootstrap: str, topic: str, client_id: str, seconds: float, run: ProduceRun,
             stop: threading.Event | None = None) -> None:
    def on_stats(text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            run.throttle_max_ms = max(run.throttle_max_ms, broker.get("throttle", {}).get("max", 0))

    # 64 KB batches: each request is a small part of one second's quota, so 15 s hold many
    # throttle cycles.
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "1",
                         "linger.ms": 5, "batch.size": 65536, "statistics.interval.ms": 1000,
                         "stats_cb": on_stats, "queue.buffering.max.kbytes": 4096})

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            run.errors.append(str(err))
        else:
            m: Any = msg
            run.delivered.append((time.monotonic(), len(m.value()) + len(m.key()), m.key()))

    deadline = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        try:
            producer.produce(topic, key=b"%s-%08d" % (client_id.encode(), seq), value=VALUE,
                             on_delivery=delivered)
            seq += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    if stop is not None and stop.is_set():
        # Asked to stop: drop what is still queued (it would trickle out at the quota).
        producer.purge(in_queue=True, in_flight=True)
        run.errors.clear()
    producer.flush(60)
    if stop is not None:
        run.errors = [e for e in run.errors if "Purged" not in e]


def _topic(bootstrap: str) -> str:
    return new_topic(bootstrap, "quota")


def test_producer_quota_is_enforced_and_reported(quota_proxy: ProxyProcess) -> None:
    topic = _topic(quota_proxy.bootstrap)
    limited, free = ProduceRun(), ProduceRun()
    start = time.monotonic()
    threads = [
        threading.Thread(target=_produce, args=(quota_proxy.bootstrap, topic, "limited-producer",
                                                RUN_S, limited)),
    ]
    for t in threads:
        t.start()
    # While the limited client is being throttled, a client without a quota runs for a while.
    wait_for(lambda: time.monotonic() > start + WARMUP_S, WARMUP_S + 5, interval=0.2,
             what="warm-up")
    threads.append(threading.Thread(target=_produce, args=(
        quota_proxy.bootstrap, topic, "free-producer", 6.0, free)))
    threads[-1].start()
    for t in threads:
        t.join(120)
    assert not limited.errors and not free.errors
    measured = cycle_rate([(t - start, n) for t, n, _ in limited.delivered], WARMUP_S, QUOTA)
    # keys and values; the quota counts whole requests (about 1% of framing on top)
    print(f"measured {measured:.0f} B/s for a quota of {QUOTA}")
    assert measured == pytest.approx(QUOTA, rel=0.05), measured
    assert limited.throttle_max_ms > 0  # librdkafka saw throttle_time_ms
    free_start = free.delivered[0][0]
    assert free.rate(free_start, free_start + 5.0) > 5 * QUOTA
    metrics = quota_proxy.metrics()
    assert metrics['kafka_proxy_quota_throttled_requests_total{quota="produce"}'] > 0
    labels = 'broker="111",client_id="limited-producer",quota="produce",user=""'
    assert metrics[f"kafka_proxy_quota_entity_bytes_per_second_limit{{{labels}}}"] == QUOTA

    # Every acknowledged message is in the topic exactly once.
    keys = [k for _, _, k in limited.delivered] + [k for _, _, k in free.delivered]
    consumer = Consumer({"bootstrap.servers": quota_proxy.bootstrap, "group.id": "check",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 << 20})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 120
        while len(seen) < len(keys) and time.monotonic() < deadline:
            seen += [m.key() for m in consumer.consume(10000, 1.0) if m.error() is None]
    finally:
        consumer.close()
    assert sorted(seen) == sorted(keys)


def test_consumer_quota_is_enforced(quota_proxy: ProxyProcess) -> None:
    topic = _topic(quota_proxy.bootstrap)
    # Small batches and fetches: each response is a small part of one second's quota, so 15 s
    # hold many throttle cycles (a record batch is never split across fetches).
    producer = Producer({"bootstrap.servers": quota_proxy.bootstrap, "linger.ms": 5,
                         "batch.size": 16384})
    total = 90_000  # 90 MB: more than the consumer may read in the test
    for i in range(total):
        while True:
            try:
                producer.produce(topic, key=b"%08d" % i, value=VALUE)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    throttle = {"max": 0}

    def on_stats(text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            throttle["max"] = max(throttle["max"], broker.get("throttle", {}).get("max", 0))

    consumer = Consumer({"bootstrap.servers": quota_proxy.bootstrap, "group.id": "limited",
                         "client.id": "limited-consumer", "enable.auto.commit": False,
                         "fetch.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
                         "message.max.bytes": 65536,
                         "statistics.interval.ms": 1000, "stats_cb": on_stats})
    received: list[tuple[float, int]] = []
    keys: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        start = time.monotonic()
        while time.monotonic() < start + RUN_S:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    received.append((time.monotonic(), len(m.value()) + len(m.key())))
                    keys.append(m.key())
    finally:
        consumer.close()
    measured = cycle_rate([(t - start, n) for t, n in received], WARMUP_S, QUOTA)
    print(f"measured {measured:.0f} B/s for a quota of {QUOTA}")
    assert measured == pytest.approx(QUOTA, rel=0.05), measured
    assert throttle["max"] > 0
    assert keys == [b"%08d" % i for i in range(len(keys))]  # in order, none lost or repeated


def test_hot_reload_lowers_a_running_clients_rate(quota_proxy: ProxyProcess) -> None:
    topic = _topic(quota_proxy.bootstrap)
    run = ProduceRun()
    stop = threading.Event()
    thread = threading.Thread(target=_produce, args=(quota_proxy.bootstrap, topic,
                                                     "limited-producer", 120, run, stop))
    thread.start()
    try:
        labels = 'broker="111",client_id="limited-producer",quota="produce",user=""'

        def rate() -> float:
            return quota_proxy.metrics().get(
                f"kafka_proxy_quota_entity_bytes_per_second{{{labels}}}", 0.0)

        wait_for(lambda: rate() > 0.8 * QUOTA, 30, interval=0.2, what="client at its quota")
        # A broken file: logged, counted, nothing changes.
        good = quota_proxy.config_path.read_text()
        quota_proxy.config_path.write_text(good + "  bogus: [\n")
        wait_for(lambda: quota_proxy.metrics().get(
            'kafka_proxy_config_reloads_total{result="failure"}', 0) >= 1, 20,
            what="failed reload counted")
        limit = f"kafka_proxy_quota_entity_bytes_per_second_limit{{{labels}}}"
        assert quota_proxy.metrics()[limit] == QUOTA
        # Lower the quota to a fifth: the running client is held to it once the samples
        # recorded under the old quota have aged out of the window (11 windows).
        quota_proxy.config_path.write_text(good.replace(f"producer_byte_rate: {QUOTA}",
                                                        f"producer_byte_rate: {QUOTA // 5}"))
        wait_for(lambda: quota_proxy.metrics().get(
            f"kafka_proxy_quota_entity_bytes_per_second_limit{{{labels}}}") == QUOTA // 5, 20,
            what="new limit live")
        changed = time.monotonic()
        wait_for(lambda: time.monotonic() > changed + 13, 20, interval=0.5,
                 what="13 s under the new quota")
        assert rate() < 1.3 * QUOTA / 5, rate()
    finally:
        stop.set()
        thread.join(120)
    assert not run.errors
    assert any(e.get("event") == "config_reload_failed" for e in quota_proxy.events())


def test_sighup_reloads_quotas(tansu: TansuBroker) -> None:
    import signal

    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=_quota_yaml().replace(
        "watch_seconds: 0.5", "watch_seconds: 0")).start()
    try:
        proxy.wait_broker_listener(111)
        text = proxy.config_path.read_text()
        proxy.config_path.write_text(text + '    - {user: "<default>", request_percentage: 80}\n')
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGHUP)
        wait_for(lambda: proxy.metrics().get(
            'kafka_proxy_config_reloads_total{result="success"}', 0) == 1, 20,
            what="reload on SIGHUP")
        reloads = [e for e in proxy.events() if e.get("event") == "config_reloaded"]
        assert reloads and reloads[-1]["quota_entities"] == 3
        assert proxy.alive
    finally:
        proxy.stop()
