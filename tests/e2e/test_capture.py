"""Traffic capture with a real broker and librdkafka: one record per request, with the
throttles the proxy applied, in complete Parquet files, and the quota config next to them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, reproduce_capture, wait_for

pytestmark = pytest.mark.e2e

QUOTA = 200_000


@dataclass
class Captured:
    directory: Path
    config: Path
    rows: list[dict[str, Any]]
    metrics: dict[str, float]
    events: list[dict[str, Any]]
    topic: str
    sent: int


@pytest.fixture(scope="module")
def captured(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Captured:
    """Two clients pushed past their quotas through a proxy with capture on."""
    capture_dir = tmp_path_factory.mktemp("capture")
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  entities:
    - {{client-id: "captured-limited", producer_byte_rate: {QUOTA}}}
    - {{client-id: "captured-reader", consumer_byte_rate: {QUOTA}}}
    - {{user: "<default>", request_percentage: 20}}
  watch_seconds: 0.2
capture:
  dir: "{capture_dir}"
  rotate_seconds: 2
""").start()
    try:
        proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "capture")
        # One message per request: many requests, so the replay's match rate means something.
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "1",
                             "client.id": "captured-limited", "linger.ms": 0,
                             "batch.num.messages": 1, "queue.buffering.max.kbytes": 256})
        sent = 0

        def produce_for(seconds: float) -> None:  # well past a 200 KB/s quota
            nonlocal sent
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    producer.produce(topic, value=b"c" * 1000)
                    sent += 1
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)

        produce_for(2)
        # Halve the producer's quota while it runs: the capture spans two quota generations.
        proxy.edit_config(f"producer_byte_rate: {QUOTA}", f"producer_byte_rate: {QUOTA // 2}")
        produce_for(2)
        assert producer.flush(60) == 0
        # The reader's quota set from what was written: reading it all is twice what Kafka's
        # window lets through at first (10 s of quota), so the reader is held back, however
        # much the producer got through on a busy machine (about 10 s more).
        proxy.edit_config(f"consumer_byte_rate: {QUOTA}",
                          f"consumer_byte_rate: {max(sent * 1000 // 20, 1024)}")
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "cap",
                             "client.id": "captured-reader",
                             "max.partition.fetch.bytes": 65536})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        while got < sent:
            got += sum(1 for m in consumer.consume(1000, 2.0) if m.error() is None)
        consumer.close()
        metrics = proxy.metrics()
    finally:
        proxy.stop()
    files = sorted(capture_dir.glob("capture-*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return Captured(capture_dir, proxy.config_path, rows, metrics, proxy.events(), topic, sent)


def test_every_request_is_captured_with_its_throttle(captured: Captured) -> None:
    capture_dir, rows, metrics = captured.directory, captured.rows, captured.metrics
    assert captured.events[-1]["event"] == "proxy_stopped"
    assert list(capture_dir.glob("*.inprogress")) == []
    assert len(list(capture_dir.glob("capture-*.parquet"))) >= 2  # rotated by age
    # A request is captured when its response starts (a fetch's when it completes): every
    # request forwarded when the metrics were scraped (one snapshot of the event loop's state)
    # is in the capture, but those still awaiting their response and at most one fetch per
    # connection whose response is still streaming.
    forwarded = sum(v for k, v in metrics.items() if k.startswith("kafka_proxy_requests_total"))
    records = metrics["kafka_proxy_capture_records_total"]
    awaiting = metrics["kafka_proxy_requests_in_flight"]
    connections = sum(v for k, v in metrics.items() if k.startswith("kafka_proxy_connections{"))
    assert 0 <= forwarded - records <= awaiting + connections, (forwarded, records, awaiting)
    assert len(rows) >= records and metrics["kafka_proxy_capture_dropped_records_total"] == 0
    assert len({r["seq"] for r in rows}) == len(rows)
    produce = [r for r in rows if r["api_key"] == 0 and r["client_id"] == "captured-limited"]
    fetch = [r for r in rows if r["api_key"] == 1 and r["client_id"] == "captured-reader"]
    assert produce and fetch
    assert sum(r["request_bytes"] for r in produce) > 4 * QUOTA
    # Per partition: the record batches of each produce request, less than the whole frame.
    assert all(r["partitions"] and r["partitions"][0]["partition"] == 0
               and 0 < sum(p["bytes"] for p in r["partitions"]) < r["request_bytes"]
               for r in produce)
    # And for each fetch, measured as the response streamed through: every message's bytes.
    assert all(r["partitions"] and {p["partition"] for p in r["partitions"]} == {0}
               # the topic's name, or its id (hex) from Fetch v13 on
               and all(p["topic"] == captured.topic or re.fullmatch("[0-9a-f]{32}", p["topic"])
                       for p in r["partitions"])
               and sum(p["bytes"] for p in r["partitions"]) < r["response_bytes"]
               for r in fetch)
    assert sum(p["bytes"] for r in fetch for p in r["partitions"]) >= captured.sent * 1000
    assert sum(1 for r in produce if r["throttle_produce_ms"] > 0) > 0
    assert metrics['kafka_proxy_quota_throttled_requests_total{quota="produce"}'] == sum(
        1 for r in rows if r["throttle_produce_ms"] > 0)
    assert all(r["broker"] == 111 and r["user"] == "ANONYMOUS" for r in produce + fetch)
    assert all(r["duration_us"] >= 0 and r["response_bytes"] > 0 for r in produce + fetch)
    assert Counter(r["api_key"] for r in rows)[18] >= 2  # ApiVersions from each client
    configs_written = sorted(json.loads(f.read_text())["quota_generation"]
                             for f in capture_dir.glob("quotas-*.json"))
    assert configs_written == [0, 1, 2]
    config = json.loads(next(capture_dir.glob("quotas-*-00001.json")).read_text())
    assert config["quotas"]["entities"][0]["producer_byte_rate"] == QUOTA // 2
    assert {r["quota_generation"] for r in produce} == {0, 1}
    assert any(r["throttle_fetch_ms"] > 0 for r in fetch)  # the reader went past its quota

    # Replaying the capture through the quota engine under the config that was live
    # reproduces the throttle the proxy applied, request by request.
    matched, total = reproduce_capture(capture_dir, rows)
    throttled = sum(1 for r in rows if r["throttle_produce_ms"] or r["throttle_fetch_ms"]
                    or r["throttle_request_ms"])
    print(f"\nreplay: {matched}/{total} requests match ({throttled} throttled)")
    assert matched / total >= 0.999


def test_spark_replay_reproduces_profiles_and_tunes(captured: Captured, tmp_path: Path) -> None:
    """``kafka-quota-proxy replay --tune`` on the capture: the reproduction matches the proxy's
    throttles, the recommended config passes check-config, the report holds the plots."""
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", "replay", "--capture", str(captured.directory),
         "--config", str(captured.config), "--out", str(out), "--master", "local[2]",
         "--tune"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == len(captured.rows)
    assert summary["match_rate"] >= 0.999, summary
    print(f"\nspark replay: {summary}")
    check = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "check-config",
                            str(out / "recommended.yaml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    recommended = yaml.safe_load((out / "recommended-quotas.yaml").read_text())["quotas"]
    live = yaml.safe_load(captured.config.read_text())["quotas"]["entities"]

    def keys(entities: list[dict[str, Any]]) -> set[tuple[str | None, str | None]]:
        return {(e.get("user"), e.get("client-id")) for e in entities}

    # the live config's entities, kept as they are: a capture under a minute sets no value
    assert keys(recommended["entities"]) == keys(live)
    report = (out / "report.md").read_text()
    assert "capture too short" in report
    for png in ("rates.png", "throttles.png", "before_after.png"):
        assert f"]({png})" in report
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    profile = (out / "profile.csv").read_text()
    assert "captured-limited" in profile and "captured-reader" in profile


def test_capture_overload_drops_and_counts_and_traffic_is_unaffected(
        tansu: TansuBroker, tmp_path: Path) -> None:
    """A writer that cannot keep up (one record per Parquet write, one batch of queue): the
    proxy drops capture records and counts them; every message still goes through, once."""
    capture_dir = tmp_path / "capture"
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""capture:
  dir: "{capture_dir}"
  batch_records: 1
  queue_batches: 1
""").start()
    try:
        proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "overload")
        # Small requests as fast as librdkafka sends them: one message per request.
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "1",
                             "linger.ms": 0, "batch.num.messages": 1,
                             "max.in.flight.requests.per.connection": 20})
        errors: list[Any] = []
        count = 20_000
        for i in range(count):
            while True:
                try:
                    producer.produce(topic, key=b"%06d" % i, value=b"o" * 10,
                                     on_delivery=lambda e, m: e is not None and errors.append(e))
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        assert producer.flush(60) == 0 and not errors, errors[:3]
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "overload"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        keys: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(keys) < count and time.monotonic() < deadline:
            keys += [m.key() for m in consumer.consume(1000, 1.0) if m.error() is None]
        consumer.close()
        metrics = proxy.metrics()
    finally:
        proxy.stop()
    assert sorted(keys) == [b"%06d" % i for i in range(count)]  # all through, once
    dropped = metrics["kafka_proxy_capture_dropped_records_total"]
    recorded = metrics["kafka_proxy_capture_records_total"]
    assert dropped > 0, metrics  # the writer fell behind...
    assert recorded >= count  # ...but every request was seen
    written = sum(pq.read_metadata(f).num_rows for f in capture_dir.glob("capture-*.parquet"))
    assert 0 < written <= recorded - dropped
    print(f"\noverload: {recorded:.0f} requests, {dropped:.0f} capture records dropped, "
          f"{written} written")


def test_acks0_produce_split_across_reads_keeps_its_partitions(
        tansu: TansuBroker, tmp_path: Path) -> None:
    """An acks=0 produce (no response) is recorded when its header is read; when its frame
    arrives in two reads, its capture record waits for the rest and still gets its
    per-partition bytes. The message is stored once."""
    from datetime import timedelta

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    capture_dir = tmp_path / "capture"
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""capture:
  dir: "{capture_dir}"
""").start()
    try:
        port = proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "acks0")
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=False, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        builder.append(0, timestamp=None, key=b"only", value=b"z" * 5000, headers=[])
        batch = bytes(builder.build())
        schema = load_request_schema(0, 9)
        module = __import__(schema.__module__, fromlist=["TopicProduceData"])
        data = (module.TopicProduceData(
            name=topic, partition_data=(module.PartitionProduceData(index=0, records=batch),)),)
        with KafkaWire("127.0.0.1", port, client_id="acks0-writer") as wire:
            frame = wire.encode(0, 9, transactional_id=None, acks=0,
                                timeout=timedelta(seconds=5), topic_data=data)

            def produce_seen() -> bool:
                return proxy.metrics().get('kafka_proxy_requests_total{api="produce"}', 0) >= 1

            wire.send_raw(frame[:200])  # the header and the start of the records
            wait_for(produce_seen, 20, what="the proxy to read the produce header")
            wire.send_raw(frame[200:])
            consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "acks0"})
            consumer.assign([TopicPartition(topic, 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got += [m.value() for m in consumer.consume(10, 1.0) if m.error() is None]
            consumer.close()
    finally:
        proxy.stop()
    assert got == [b"z" * 5000]
    rows = [r for f in capture_dir.glob("capture-*.parquet") for r in pq.read_table(f).to_pylist()
            if r["client_id"] == "acks0-writer" and r["api_key"] == 0]
    assert len(rows) == 1
    assert rows[0]["response_bytes"] == -1  # no response
    assert rows[0]["partitions"] == [{"topic": topic, "partition": 0, "bytes": len(batch)}]
