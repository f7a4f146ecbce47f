"""The bootstrap port is no second budget (issue 26, finding 6): a connection to the proxy's
bootstrap port counts against the budgets of the broker it reaches, the same as one to that
broker's own port, as a Kafka broker has one budget whichever of its addresses a client
dialled.

- Two producers share one client-id under a 200 kB/s producer_byte_rate: a librdkafka one,
  bootstrapped as usual (it produces on broker 111's port), and a raw one that produces over
  its bootstrap connection. Together they get the quota over whole throttle cycles (before:
  each port had its own budget, and together they got about twice the quota).
- One address, a connection_creation_rate of 2/s (11 x 1 s window: 20 connections at once):
  10 connections to the bootstrap port and 10 to broker 111's port are all served, the next
  one to either is throttled (before: each port had its own sensor, 20 + 20 passed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, wait_for
from testkit.rates import cycle_rate

pytestmark = pytest.mark.e2e

QUOTA = 200_000  # bytes/s, shared by both producers (one client-id)
CLIENT_ID = "shared-producer"
SAMPLES = 4  # quota windows of 1 s: short throttle cycles (bursts every ~N+1 s)
WARMUP_S = 8.0  # the first burst (a new budget's padded window) paid back
MEASURE_S = 12.0
RUN_S = 26.0
SOURCE = "127.0.0.5"  # a client address of its own (its ip entity: 2/s)


@pytest.fixture
def budget_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: {SAMPLES}, size_seconds: 1}}
  entities:
    - {{client-id: "{CLIENT_ID}", producer_byte_rate: {QUOTA}}}
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


@pytest.fixture
def rate_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  ip_entities:
    - {{ip: "{SOURCE}", connection_creation_rate: 2}}
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _librdkafka(bootstrap: str, topic: str, until: float, events: list[tuple[float, int]],
                errors: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "acks": "1",
                         "linger.ms": 5, "batch.size": 32768,
                         "queue.buffering.max.kbytes": 1024})

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            events.append((time.monotonic(), len(msg.value())))

    while time.monotonic() < until:
        try:
            producer.produce(topic, value=b"p" * 1000, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=True)  # (what is queued would trickle out)
    producer.flush(30)
    errors[:] = [e for e in errors if "Purged" not in e]


def _raw_on_bootstrap(host: str, port: int, topic: str, until: float,
                      events: list[tuple[float, int]], errors: list[str]) -> None:
    """Produce requests of 32 kB, one at a time, over one connection to the bootstrap port
    (the proxy reads the next one once a throttle has passed, KIP-219)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    from kafka_quota_proxy.protocol import apis
    from kafka_quota_proxy.protocol.headers import parse_response_header
    from kafka_quota_proxy.protocol.rewrite import decode_response

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(32):
        builder.append(i, timestamp=None, key=None, value=b"b" * 1000, headers=[])
    batch = bytes(builder.build())
    module = __import__(load_request_schema(0, 9).__module__, fromlist=["TopicProduceData"])
    data = (module.TopicProduceData(
        name=topic, partition_data=(module.PartitionProduceData(index=0, records=batch),)),)
    with KafkaWire(host, port, client_id=CLIENT_ID, timeout=30) as wire:
        while time.monotonic() < until:
            wire.send_raw(wire.encode(0, 9, transactional_id=None, acks=1,
                                      timeout=timedelta(seconds=5), topic_data=data))
            size = int.from_bytes(wire.recv_exactly(4), "big")
            frame = wire.recv_exactly(size)
            header = parse_response_header(frame, 0, size, apis.response_header_version(0, 9))
            response = decode_response(0, 9, frame[header.size:])
            code = response.responses[0].partition_responses[0].error_code
            if int(code) != 0:
                errors.append(f"produce error {code}")
                return
            events.append((time.monotonic(), 32 * 1000))


def test_producers_on_the_bootstrap_and_broker_ports_share_one_budget(
        budget_proxy: ProxyProcess) -> None:
    proxy = budget_proxy
    topic = new_topic(proxy.bootstrap, "budget")
    events: list[tuple[float, int]] = []
    errors: list[str] = []
    start = time.monotonic()
    until = start + RUN_S
    threads = [
        threading.Thread(target=_librdkafka, args=(proxy.bootstrap, topic, until, events,
                                                   errors)),
        threading.Thread(target=_raw_on_bootstrap, args=("127.0.0.1", proxy.bootstrap_port,
                                                         topic, until, events, errors)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 60)
    assert not errors, errors[:3]
    rows = sorted((t - start, n) for t, n in events)
    raw = sum(n for _, n in events if n == 32 * 1000)
    assert raw > 0  # the raw producer did produce over the bootstrap port
    measured = cycle_rate(rows, WARMUP_S, QUOTA, MEASURE_S)
    print(f"combined {measured:.0f} B/s ({measured / QUOTA:.2f} x the quota of {QUOTA}); "
          f"raw producer on the bootstrap port: {raw} bytes")
    assert measured < 1.1 * QUOTA, measured
    assert measured > 0.8 * QUOTA, measured
    metrics = proxy.metrics()
    labels = f'client_id="{CLIENT_ID}",quota="produce",user=""'
    # one budget, broker 111's: none for the bootstrap port
    assert f'kafka_proxy_quota_entity_bytes_per_second{{broker="111",{labels}}}' in metrics
    assert (f'kafka_proxy_quota_entity_bytes_per_second{{broker="bootstrap",{labels}}}'
            not in metrics)


def test_bootstrap_and_broker_ports_share_one_connection_rate_sensor(
        rate_proxy: ProxyProcess) -> None:
    proxy = rate_proxy
    broker_port = proxy.broker_port(111)
    # (the bootstrap listener has learnt broker 111: its connections go to it)
    wait_for(lambda: proxy.metrics().get("kafka_proxy_upstream_brokers", 0) >= 1, 20,
             what="broker 111 known")
    # 2/s, a fresh sensor over 11 x 1 s: 20 at once, whichever port
    opened = [_ask(port, SOURCE) for port in [proxy.bootstrap_port] * 10 + [broker_port] * 10]
    answered = [_answered(wire) for wire in opened]
    assert all(answered), answered
    # the 21st and 22nd, one to each port: held unanswered, then closed
    more = [_ask(port, SOURCE) for port in (proxy.bootstrap_port, broker_port)]
    assert [_answered(wire) for wire in more] == [False, False]
    for wire in opened + more:
        wire.close()
    throttled = proxy.metrics()
    assert sum(v for k, v in throttled.items()
               if k.startswith("kafka_proxy_connections_ip_throttled")) == 2


def _ask(port: int, source: str) -> KafkaWire:
    """A connection from ``source`` that sends a Metadata request at once."""
    wire = KafkaWire("127.0.0.1", port, client_id="rate-probe", timeout=5.0, source=source)
    wire.send_raw(wire.encode(3, 12, topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False))
    return wire


def _answered(wire: KafkaWire) -> bool:
    """Whether the Metadata request is answered (else the proxy closes the connection
    unanswered: throttled)."""
    try:
        size = int.from_bytes(wire.recv_exactly(4), "big")
        wire.recv_exactly(size)
    except (ConnectionError, OSError):
        return False
    return True
