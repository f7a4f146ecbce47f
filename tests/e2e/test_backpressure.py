"""A client that stops reading makes the proxy stop reading the broker (bounded buffering),
and once the client reads again every byte arrives intact."""

from __future__ import annotations

import datetime
import re
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.static.primitive import i32Timedelta

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.protocol.headers import parse_response_header
from kafka_quota_proxy.protocol.rewrite import decode_response
from testkit.e2e import KafkaWire, ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_buffer_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml=(
        "network:\n  write_buffer_high_bytes: 65536\n  write_buffer_low_bytes: 16384\n")).start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def test_slow_client_pauses_upstream_reads_and_loses_nothing(
        small_buffer_proxy: ProxyProcess) -> None:
    proxy = small_buffer_proxy
    topic = f"bp-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 20})
    n = 8000
    for i in range(n):
        producer.produce(topic, value=b"%06d" % i + b"b" * 994)
    assert producer.flush(30) == 0

    with KafkaWire("127.0.0.1", proxy.broker_port(111), timeout=30) as wire:
        wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        wire.send_raw(wire.encode(
            1, 12, max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)),
            min_bytes=1, max_bytes=64 << 20, topics=(FetchTopic(topic=topic, partitions=(
                FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=64 << 20),)),),
            forgotten_topics_data=()))
        # The client reads nothing: the proxy's buffer towards it fills and it stops reading
        # the broker.
        wait_for(lambda: proxy.metrics().get(
            'kafka_proxy_backpressure_pauses_total{slow_side="client_slow"}', 0) >= 1,
            20, what="backpressure towards the slow client")
        # While the client reads nothing, what the proxy holds for it stays near the high-water
        # mark (plus one read from the broker) instead of growing to the whole response.
        buffered = []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            buffered.append(proxy.metrics()["kafka_proxy_client_write_buffer_bytes"])
        assert max(buffered) <= 65536 + 512 * 1024, max(buffered)
        assert max(buffered) > 0
        size = int.from_bytes(wire.recv_exactly(4), "big")
        frame = wire.recv_exactly(size)
    header = parse_response_header(frame, 0, size, 1)
    response = decode_response(1, 12, frame[header.size:])
    records = response.responses[0].partitions[0].records
    assert response.responses[0].partitions[0].error_code == 0
    # The broker caps one response (several MB here); whatever it sent arrives whole: the
    # record batches are consecutive from offset 0.
    assert records is not None and len(records) >= 2_000_000
    returned = [int(i) for i in re.findall(rb"(\d{6})b{994}", bytes(records))]
    assert returned == list(range(len(returned)))
    assert len(returned) >= 2000
