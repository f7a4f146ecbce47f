"""A replay of the capture gives every throttle the proxy gave (100%, not 99%), under ordinary
client settings: an idempotent librdkafka producer with its default batch size near and over
its quota, halved by a reload mid-way; an unquota'd producer; a consumer over its quota with
moderate fetch sizes; and the metrics scraped every 100 ms meanwhile. Reads that are not
records (the pipelining headroom check, the metrics' busiest budgets) must not change a
budget, or the throttles depend on when they happened, which no capture can tell."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit import kafka_reference
from testkit.e2e import ProxyProcess, new_topic, reproduce_capture

pytestmark = pytest.mark.e2e

PRODUCE_QUOTA = 200_000
FETCH_QUOTA = 300_000
SECONDS = 12  # half before the reload, half after


def _produce_paced(producer: Producer, topic: str, rate: float | None, stop: threading.Event,
                   errors: list[KafkaError]) -> int:
    """1 KB messages at ``rate`` bytes/s (as fast as accepted when None) until ``stop``."""
    sent = 0
    start = time.monotonic()
    while not stop.is_set():
        if rate is not None and sent * 1000 > rate * (time.monotonic() - start):
            producer.poll(0.005)
            continue
        try:
            producer.produce(topic, key=b"%08d" % sent, value=b"v" * 1000,
                             on_delivery=lambda e, m: e is not None and errors.append(e))
            sent += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    return sent


def test_replay_reproduces_every_throttle_under_client_defaults(
        tansu: TansuBroker, tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: 5, size_seconds: 1}}
  entities:
    - {{client-id: "exact-limited", producer_byte_rate: {PRODUCE_QUOTA}}}
    - {{client-id: "exact-reader", consumer_byte_rate: {FETCH_QUOTA}}}
  watch_seconds: 1
capture:
  dir: "{capture_dir}"
  rotate_seconds: 4
""").start()
    stop = threading.Event()
    scrapes = 0
    try:
        proxy.wait_broker_listener(111)
        limited_topic = new_topic(proxy.bootstrap, "exact-l")
        free_topic = new_topic(proxy.bootstrap, "exact-f")
        common = {"bootstrap.servers": proxy.bootstrap, "acks": "all",
                  "enable.idempotence": True, "linger.ms": 2}
        limited = Producer({**common, "client.id": "exact-limited", "batch.size": 16384,
                            "queue.buffering.max.kbytes": 1024})
        free = Producer({**common, "client.id": "exact-free"})
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "exact",
                             "client.id": "exact-reader", "fetch.max.bytes": 262144,
                             "max.partition.fetch.bytes": 65536,
                             "message.max.bytes": 262144})
        consumer.assign([TopicPartition(free_topic, 0, 0)])
        errors: list[KafkaError] = []
        counts: dict[str, int] = {}

        def run_limited() -> None:
            counts["limited"] = _produce_paced(limited, limited_topic, None, stop, errors)

        def run_free() -> None:
            counts["free"] = _produce_paced(free, free_topic, 1_600_000, stop, errors)

        def run_consumer() -> None:
            got = 0
            while not stop.is_set():
                got += sum(1 for m in consumer.consume(500, 0.2) if m.error() is None)
            counts["consumed"] = got

        def scrape() -> None:
            nonlocal scrapes
            while not stop.wait(0.1):
                proxy.metrics()
                scrapes += 1

        threads = [threading.Thread(target=f, daemon=True)
                   for f in (run_limited, run_free, run_consumer, scrape)]
        for t in threads:
            t.start()
        time.sleep(SECONDS / 2)  # the run's length: nothing waits on this to pass
        # Halve the limited producer's quota while everything runs.
        proxy.edit_config(f"producer_byte_rate: {PRODUCE_QUOTA}",
                          f"producer_byte_rate: {PRODUCE_QUOTA // 2}")
        time.sleep(SECONDS / 2)
        stop.set()
        for t in threads:
            t.join(60)
        limited.purge(in_queue=True, in_flight=False)  # what is still queued is not needed
        assert limited.flush(60) == 0 and free.flush(60) == 0
        assert not [e for e in errors if e.code() != KafkaError._PURGE_QUEUE], errors[:3]
        consumer.close()
    finally:
        stop.set()
        proxy.stop()
    rows = [r for f in sorted(capture_dir.glob("capture-*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    produce = [r for r in rows if r["api_key"] == 0 and r["client_id"] == "exact-limited"]
    fetch = [r for r in rows if r["api_key"] == 1 and r["client_id"] == "exact-reader"]
    # The run was what it claims: both quota'd clients throttled, both quota generations,
    # the metrics read all along.
    assert scrapes >= 10 * SECONDS * 0.5
    assert sum(1 for r in produce if r["throttle_produce_ms"]) >= 5
    assert sum(1 for r in fetch if r["throttle_fetch_ms"]) >= 5
    assert {r["quota_generation"] for r in produce} == {0, 1}
    assert counts["free"] * 1000 > 1_600_000 * SECONDS * 0.5
    matched, total = reproduce_capture(capture_dir, rows)
    quota_d = len(produce) + len(fetch)
    print(f"\nexact replay: {matched}/{total} requests match ({quota_d} quota'd, "
          f"{scrapes} scrapes, {counts})")
    assert matched == total
    # and an independent model of Kafka's arithmetic (testkit/kafka_reference.py,
    # which shares no code with the quota engine) gives every throttle too, to the ms
    generations = {d["quota_generation"]: d["quotas"] for d in (
        json.loads(f.read_text()) for f in capture_dir.glob("quotas-*.json"))}
    agreed, total, differ = kafka_reference.replay_capture(rows, generations)
    print(f"kafka model: {agreed}/{total} requests agree")
    assert agreed == total, differ
