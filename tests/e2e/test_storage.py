"""Storage-aware throttling end to end: volume snapshots published to the topic (as the volume
agent does) steer a librdkafka producer through the proxy: unaffected below the soft limit,
slowed by the expected factor between soft and hard, held back (not failed) past hard,
recovered below soft, held back again when the broker's data goes stale; every message that
was produced is in the topic exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, reproduce_capture, wait_for
from testkit.rates import cycle_rate
from testkit.volumes import BASE, GB, NODE, Publisher

pytestmark = pytest.mark.e2e

@pytest.fixture
def storage_proxy(tansu: TansuBroker, tmp_path: Path
                  ) -> Iterator[tuple[ProxyProcess, Publisher, Path]]:
    topic = f"volumes-{uuid.uuid4().hex[:6]}"
    publisher = Publisher(tansu.bootstrap, topic)
    capture_dir = tmp_path / "capture"
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""capture:
  dir: "{capture_dir}"
quotas:
  window: {{samples: 3, size_seconds: 1}}
storage:
  topic: "{topic}"
  stale_after_seconds: 3
  on_missing: PAUSE
  soft: {{type: MinFreePercentage, level: 20}}
  hard: {{type: MinFreePercentage, level: 5}}
  unquoted_producer_byte_rate: {BASE}
  pause_throttle_ms: 300
  evaluate_seconds: 0.2
""").start()
    try:
        proxy.wait_broker_listener(NODE)
        yield proxy, publisher, capture_dir
    finally:
        proxy.stop()
        publisher.close()


def test_producer_follows_the_cluster_storage_state(
        storage_proxy: tuple[ProxyProcess, Publisher, Path]) -> None:
    proxy, publisher, capture_dir = storage_proxy
    data_topic = new_topic(proxy.bootstrap, "stored")
    delivered: list[tuple[float, int, bytes]] = []
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "unquoted",
                             "acks": "all", "linger.ms": 5, "batch.size": 16384,
                             "queue.buffering.max.kbytes": 2048, "message.timeout.ms": 120000})

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered.append((time.monotonic(), len(msg.value()) + len(msg.key()),
                                  msg.key()))

        seq = 0
        while not stop.is_set():
            try:
                producer.produce(data_topic, key=b"%09d" % seq, value=b"s" * 1000,
                                 on_delivery=on_delivery)
                seq += 1
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
        assert producer.flush(90) == 0

    def metric(name: str) -> float:
        return proxy.metrics().get(name, -1)

    def state_is(level: int, fail_safe: int = 0) -> bool:
        m = proxy.metrics()
        return (m.get("kafka_proxy_storage_state") == level
                and m.get("kafka_proxy_storage_fail_safe") == fail_safe)

    def rate(seconds: float) -> float:
        start = time.monotonic()
        first = len(delivered)
        time.sleep(seconds)  # measuring over a fixed span, not waiting for anything
        return sum(n for _, n, _ in delivered[first:]) / (time.monotonic() - start)

    def deliveries_stop() -> bool:
        before = len(delivered)
        time.sleep(1.0)  # (a span to watch, not a wait for a condition)
        return len(delivered) == before

    wait_for(lambda: state_is(0), 30, what="OPEN with fresh data")
    worker = threading.Thread(target=produce)
    worker.start()
    try:
        # Below soft: unaffected (well above the base rate that storage throttling would use).
        wait_for(lambda: len(delivered) > 100, 30, what="first deliveries")
        open_rate = rate(2.0)
        assert open_rate > 3 * BASE, open_rate

        # Between soft (80 GB used) and hard (95 GB): 87.5 GB gives a factor of 0.5.
        publisher.consumed = int(87.5 * GB)
        wait_for(lambda: metric("kafka_proxy_storage_factor") == pytest.approx(0.5), 20,
                 what="THROTTLE at 0.5")
        assert state_is(1)
        t0 = time.monotonic()

        def measured() -> float | None:
            events = [(t - t0, n) for t, n, _ in delivered if t >= t0]
            try:  # whole burst cycles after the samples from before have aged out
                return cycle_rate(events, 4.0, 0.5 * BASE, measure_s=14.0) if events else None
            except AssertionError:
                return None

        throttled = wait_for(measured, 40, interval=0.5, what="a measured throttled rate")
        print(f"\nopen {open_rate:.0f} B/s; throttled {throttled:.0f} B/s "
              f"(expected {0.5 * BASE:.0f})")
        assert throttled == pytest.approx(0.5 * BASE, rel=0.10)

        # Past hard: nothing is admitted; the producer is held back, not failed.
        publisher.consumed = 96 * GB
        wait_for(lambda: state_is(2), 20, what="PAUSE")
        wait_for(lambda: metric("kafka_proxy_storage_held_connections") >= 1, 20,
                 what="the producer's request held")
        wait_for(deliveries_stop, 20, what="deliveries to stop")
        count = len(delivered)
        assert deliveries_stop() and len(delivered) == count and not errors

        # Back below soft: it recovers.
        publisher.consumed = 50 * GB
        wait_for(lambda: state_is(0), 20, what="OPEN again")
        wait_for(lambda: len(delivered) > count + 1000, 30, what="deliveries to resume")
        assert metric("kafka_proxy_storage_held_connections") == 0

        # The broker's data goes stale: the fail-safe (PAUSE) applies.
        publisher.publishing.clear()
        wait_for(lambda: state_is(2, fail_safe=1), 20, what="the fail-safe")
        assert metric('kafka_proxy_storage_broker_stale{broker="111"}') == 1
        wait_for(deliveries_stop, 20, what="deliveries to stop (stale)")
        publisher.publishing.set()
        wait_for(lambda: state_is(0), 20, what="OPEN with fresh data again")
        resumed = len(delivered)
        wait_for(lambda: len(delivered) > resumed + 100, 30, what="deliveries after stale")
    finally:
        stop.set()
        worker.join(120)
    assert not errors, errors[:3]

    # Every message the producer had acknowledged is in the topic exactly once.
    keys = sorted(k for _, _, k in delivered)
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "storage-check",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 << 20})
    consumer.assign([TopicPartition(data_topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(keys) and time.monotonic() < deadline:
        got += [m.key() for m in consumer.consume(5000, 1.0) if m.error() is None]
    consumer.close()
    assert sorted(got) == keys
    assert len(set(keys)) == len(keys)

    # The capture holds the storage factor of each request: replaying it through the quota
    # engine reproduces the throttles storage caused.
    proxy.stop()
    rows = [r for f in capture_dir.glob("capture-*.parquet") for r in pq.read_table(f).to_pylist()]
    produce = [r for r in rows if r["api_key"] == 0]
    # (the factor when each was read: none is read while paused, they wait unread)
    assert {r["storage_scale"] for r in produce} == {None, 0.5}
    matched, total = reproduce_capture(capture_dir, rows)
    throttled = sum(1 for r in produce if r["throttle_produce_ms"] > 0)
    print(f"replay: {matched}/{total} match ({throttled} produce requests throttled)")
    assert throttled > 0 and matched / total >= 0.999
