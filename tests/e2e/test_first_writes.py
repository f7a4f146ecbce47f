"""Every request is gated by its own header, from a connection's first byte (issue 26, finding
5): a producer that writes 100 produce requests of 64 KB as a connection's very first bytes,
and reconnects instead of waiting out its throttle, is held to its quota.

Before, a connection's first read was taken under no client-id at all (the limits keyed on the
last client-id read, unset until then): all of it went upstream at once, ~27 requests a
connection were acknowledged while throttles were already 10-28 s, and the storm got 7.7x its
quota. Now the read stops before a frame of another client-id than the one judged, and a
connection's first request of a budget over its quota waits until the budget is back within
it (``kafka_proxy_quota_held_first_requests_total``).

And a producer that writes and closes without reading its answers is charged, at close, for
what reached the broker (``kafka_proxy_quota_unanswered_produce_recorded_total``)."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, reproduce_capture, wait_for

pytestmark = pytest.mark.e2e

QUOTA = 200_000
RECORD = 64_000
FRAMES = 100
SECONDS = 24.0  # after the first acknowledgement (where the budget's samples start)
SETTLED = 11.0  # Kafka's 11 x 1 s window lets a fresh budget take 10 s of quota at once
LONGEST = 60.0  # (the run stops here whatever happened)
LEAVERS = 12  # the connections of the producer that never reads its answers
LEAVER_FRAMES = 20  # what it writes on each connection (less than a window of its quota)


def _produce_frames(port: int, topic: str, n: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=None, value=b"s" * (RECORD - 100), headers=[])
    batch = bytes(builder.build())
    schema = load_request_schema(0, 7)
    module = __import__(schema.__module__, fromlist=["TopicProduceData"])
    data = (module.TopicProduceData(
        name=topic, partition_data=(module.PartitionProduceData(index=0, records=batch),)),)
    wire = KafkaWire("127.0.0.1", port, client_id="storm")
    try:
        return b"".join(wire.encode(0, 7, transactional_id=None, acks=1,
                                    timeout=timedelta(seconds=30), topic_data=data)
                        for _ in range(n))
    finally:
        wire.close()


def _storm_connection(port: int, frames: bytes, acked: list[tuple[float, int]],
                      start: float) -> None:
    """One connection: as much of ``frames`` as the kernel takes at once, then the responses
    until the first throttled one (or a second of silence), then away."""
    from kafka_quota_proxy.protocol.rewrite import decode_response

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.setblocking(False)
        sent = 0
        try:
            while sent < len(frames):
                sent += sock.send(frames[sent:sent + (1 << 20)])
        except BlockingIOError:
            pass
        sock.settimeout(1.0)
        buf = b""
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                size = int.from_bytes(buf[:4], "big")
                body, buf = buf[8:4 + size], buf[4 + size:]  # (v7: response header v0)
                response = decode_response(0, 7, body)
                ok = all(p.error_code == 0 for t in response.responses
                         for p in t.partition_responses)
                if ok:
                    acked.append((time.monotonic() - start, RECORD))
                if response.throttle_time.total_seconds() > 0:
                    return  # throttled: reconnect instead of waiting
    finally:
        sock.close()


def test_a_reconnect_storm_of_first_writes_is_held_to_the_quota(tansu: TansuBroker) -> None:
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  entities:
    - {{client-id: "storm", producer_byte_rate: {QUOTA}}}
""").start()
    try:
        port = proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "storm")
        frames = _produce_frames(port, topic, FRAMES)
        acked: list[tuple[float, int]] = []
        start = time.monotonic()
        connections = 0
        while True:
            elapsed = time.monotonic() - start
            if elapsed > LONGEST or (acked and elapsed - acked[0][0] >= SECONDS):
                break
            _storm_connection(port, frames, acked, start)
            connections += 1
        end = time.monotonic() - start
        held = proxy.metrics().get("kafka_proxy_quota_held_first_requests_total", 0)
    finally:
        proxy.stop()
    assert acked, "no produce request was acknowledged"
    low, high = _watermarks(tansu.bootstrap, topic)
    written = (high - low) * RECORD
    # What the storm got is what the broker wrote, not what the client saw acknowledged: a
    # connection the client gave up on (after a second of silence) is still held, its first
    # requests unread in the sockets behind the bytes the client could not send, so its close
    # cannot be seen; when the budget is back within its quota, the first held connection to
    # ask again may be such a one, and its requests go to the broker (as a Kafka broker reads a
    # muted connection's requests when it unmutes it) and are charged, their answers lost with
    # their client. (A fresh-clone CI run once saw only the first burst acknowledged in 24 s
    # while the burst 11 s later went to an abandoned connection.)
    #
    # Measured from the first acknowledgement, not from the first connection: the budget's
    # burst allowance runs from its first recorded bytes. Kafka's sampled rate lets a budget
    # that took a window's worth at once (10 s of quota) take another as soon as those
    # samples expire, 11 s later: the storm is served in bursts ~11 s apart, and a span of
    # any length T holds at most T + 11 s of quota.
    span = end - acked[0][0]
    bound = QUOTA * (span + SETTLED)
    print(f"\nstorm: {connections} connections, {high - low} produce requests written "
          f"({written / bound:.2f} of the bound over {span:.1f} s, "
          f"{written / span / QUOTA:.2f} of the quota), {len(acked)} acknowledged (the first "
          f"after {acked[0][0]:.2f} s), first requests held {held}; acknowledged per second "
          f"after the first: {_per_second(acked, acked[0][0])}")
    assert held > 0  # the storm's new connections met a budget over its quota
    assert written <= 1.1 * bound
    assert written >= 0.5 * QUOTA * span  # and the producer is served, not starved


def _per_second(acked: list[tuple[float, int]], first: float) -> list[int]:
    """How many requests were acknowledged in each second after the first acknowledgement."""
    counts = [0] * (int(SECONDS) + 1)
    for t, _ in acked:
        counts[min(int(t - first), int(SECONDS))] += 1
    return counts


def _send_and_leave(port: int, frames: bytes) -> None:
    """One connection of a producer that never reads its answers: as much of ``frames`` as the
    kernel takes at once, then away."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setblocking(False)
        sent = 0
        try:
            while sent < len(frames):
                sent += sock.send(frames[sent:sent + (1 << 20)])
        except OSError:  # (the kernel's buffers full, or the proxy gone)
            pass


def test_a_producer_that_never_reads_its_answers_is_charged_for_what_the_broker_wrote(
        tansu: TansuBroker, tmp_path: Path) -> None:
    """A hostile producer pipelines produce requests and closes each connection at once,
    never reading an answer. The broker writes every request that
    reached it whole; the proxy released them at close without recording them, so each new
    connection found the budget lower than what the broker had written (72 requests written,
    59 charged). Now they are recorded at close (and captured, so a replay reproduces the
    throttles)."""
    capture_dir = tmp_path / "capture"
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  entities:
    - {{client-id: "storm", producer_byte_rate: {QUOTA}}}
capture:
  dir: "{capture_dir}"
  rotate_seconds: 2
""").start()
    try:
        port = proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "leaver")
        frames = _produce_frames(port, topic, LEAVER_FRAMES)
        start = time.monotonic()
        connections = 0
        while connections < LEAVERS:
            _send_and_leave(port, frames)
            connections += 1
        metrics = wait_for(lambda: _all_closed(proxy.metrics()), timeout=LONGEST)
        elapsed = time.monotonic() - start
    finally:
        proxy.stop()
    low, high = _watermarks(tansu.bootstrap, topic)
    written = (high - low) * RECORD
    rows = [r for f in sorted(capture_dir.glob("capture-*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    answered = sum(1 for r in rows if r["api_key"] == 0 and r["response_bytes"] >= 0)
    unanswered = [r for r in rows if r["api_key"] == 0 and r["response_bytes"] < 0]
    at_close = metrics.get("kafka_proxy_quota_unanswered_produce_recorded_total", 0)
    # Kafka's first window lets 10 s of quota through at once; the proxy forwards what the
    # budget has room for with what is in flight counted (at most another window's worth).
    bound = QUOTA * (elapsed + 2 * SETTLED)
    print(f"\nleavers: {connections} connections closed in {elapsed:.1f} s, {high - low} requests "
          f"({written:,} bytes) written ({written / bound:.2f} of the bound); recorded: "
          f"{answered} answered, {at_close:.0f} at close")
    assert connections >= 3
    # every request the broker wrote was charged to the budget (one record per request)
    assert high - low <= answered + at_close
    assert written <= bound
    assert len(unanswered) == at_close  # captured, so that a replay reproduces the throttles
    matched, total = reproduce_capture(capture_dir, rows)
    assert matched == total


def _all_closed(metrics: dict[str, float]) -> dict[str, float] | None:
    """The metrics once every client connection is closed (the closes are all counted)."""
    open_now = [v for k, v in metrics.items() if k.startswith("kafka_proxy_connections{")]
    return metrics if open_now and not any(open_now) else None


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low), int(high)
    finally:
        consumer.close()
