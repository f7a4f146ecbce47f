"""Smoke tests of ``tests.rack_cluster.RackCluster`` itself: three simulated brokers in racks
a, b and c in front of one real tansu broker, driven by real clients (librdkafka)."""

from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import wait_for
from testkit.rack_cluster import RackCluster

pytestmark = pytest.mark.e2e

PARTITIONS = 4
REPLICAS = [1, 2, 3]


@pytest.fixture
def cluster(tansu: TansuBroker) -> Iterator[RackCluster]:
    with RackCluster(tansu.bootstrap) as c:
        yield c


def _topic_layout(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr) as a fresh client sees them."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None:
        return {}
    return {p.id: (p.leader, sorted(p.replicas), sorted(p.isrs)) for p in meta.partitions.values()}


def _create_topic(cluster: RackCluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=10)[topic].result(30)
    wait_for(
        lambda: len(_topic_layout(cluster.bootstrap, topic)) == PARTITIONS,
        20,
        what=f"metadata of {topic}",
    )


def _produce(bootstrap: str, topic: str, keys: range, value_size: int = 100) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "client.id": "rack-p"}
    )
    _produce_with(producer, topic, keys, value_size)


def _produce_with(producer: Producer, topic: str, keys: range, value_size: int = 100) -> None:
    errors: list[KafkaError] = []
    delivered: list[bytes] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.key())  # type: ignore[attr-defined]

    for i in keys:
        producer.produce(topic, key=b"k%06d" % i, value=b"v" * value_size, on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages left unflushed"
    assert not errors, errors[:5]
    assert len(delivered) == len(keys)


def _consumer(bootstrap: str, topic: str, rack: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rack-{uuid.uuid4().hex[:8]}",
            "client.rack": rack,
            "enable.auto.commit": False,
            "client.id": f"rack-c-{rack}",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return consumer


def _consume(consumer: Consumer, keys: list[bytes], expected: int, timeout: float = 30) -> None:
    """Poll into ``keys`` until ``expected`` messages have arrived in all."""
    deadline = time.monotonic() + timeout
    while len(keys) < expected:
        assert time.monotonic() < deadline, f"consumed {len(keys)} of {expected}"
        for msg in consumer.consume(1000, 0.5):
            assert msg.error() is None, msg.error()
            keys.append(msg.key())


def _assert_each_once(keys: list[bytes], wanted: range) -> None:
    counts = Counter(keys)
    duplicates = [k for k, n in counts.items() if n > 1]
    assert not duplicates, duplicates[:5]
    assert set(counts) == {b"k%06d" % i for i in wanted}


def _read_each_once(bootstrap: str, topic: str, rack: str, wanted: range) -> None:
    """A new consumer in ``rack`` reads the topic from the start: ``wanted``, each once."""
    consumer = _consumer(bootstrap, topic, rack=rack)
    keys: list[bytes] = []
    try:
        _consume(consumer, keys, len(wanted))
    finally:
        consumer.close()
    _assert_each_once(keys, wanted)


def test_brokers_racks_and_partition_layout(cluster: RackCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    md = admin.list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
        n: ("127.0.0.1", cluster.port(n)) for n in REPLICAS
    }
    described = admin.describe_cluster(request_timeout=10).result(timeout=20)
    assert {n.id: (n.port, n.rack) for n in described.nodes} == {
        1: (cluster.port(1), "a"),
        2: (cluster.port(2), "b"),
        3: (cluster.port(3), "c"),
    }
    assert described.controller is not None and described.controller.id == 1

    topic = f"rack-layout-{uuid.uuid4().hex[:8]}"
    _create_topic(cluster, topic)
    layout = _topic_layout(cluster.bootstrap, topic)
    assert [layout[p][0] for p in range(PARTITIONS)] == [1, 3, 1, 3]
    assert all(replicas == REPLICAS and isr == REPLICAS for _, replicas, isr in layout.values())


def test_fetches_go_to_leaders_only(cluster: RackCluster) -> None:
    topic = f"rack-fetch-{uuid.uuid4().hex[:8]}"
    _create_topic(cluster, topic)
    _produce(cluster.bootstrap, topic, range(2000))
    _read_each_once(cluster.bootstrap, topic, "b", range(2000))

    fetched = cluster.fetch_response_bytes
    assert fetched[1] > 0 and fetched[3] > 0, fetched
    # Node 2 leads nothing and nobody redirects there: a rack-b consumer never fetches from it.
    assert cluster.fetch_requests[2] == 0 and fetched[2] == 0, (cluster.fetch_requests, fetched)


def test_stop_node_moves_leadership(cluster: RackCluster) -> None:
    topic = f"rack-stop-{uuid.uuid4().hex[:8]}"
    _create_topic(cluster, topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    _produce_with(producer, topic, range(500))
    consumer = _consumer(cluster.bootstrap, topic, rack="c")
    keys: list[bytes] = []
    try:
        _consume(consumer, keys, 500)
        assert cluster.fetch_requests[3] > 0  # the consumer did use node 3

        cluster.stop_node(3)
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", cluster.port(3)), 2):
            pass
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        assert set(admin.list_topics(timeout=10).brokers) == {1, 2}
        described = admin.describe_cluster(request_timeout=10).result(timeout=20)
        assert {n.id for n in described.nodes} == {1, 2}
        layout = _topic_layout(cluster.bootstrap, topic)
        assert {p: leader for p, (leader, _, _) in layout.items()} == {0: 1, 1: 1, 2: 1, 3: 1}
        assert all(r == REPLICAS and isr == [1, 2] for _, r, isr in layout.values()), layout

        # The same clients carry on through the surviving nodes.
        requests_to_3 = cluster.fetch_requests[3]
        _produce_with(producer, topic, range(500, 1000))
        _consume(consumer, keys, 1000)
        assert cluster.fetch_requests[3] == requests_to_3
    finally:
        consumer.close()
    _assert_each_once(keys, range(1000))

    # And new ones too.
    _produce(cluster.bootstrap, topic, range(1000, 1500))
    _read_each_once(cluster.bootstrap, topic, "a", range(1500))


def test_broker_preferred_replica_redirects_to_rack(tansu: TansuBroker) -> None:
    def preferred(rack: str, topic: str, partition: int) -> int | None:
        return 2 if rack == "b" else None

    with RackCluster(tansu.bootstrap, broker_preferred=preferred) as cluster:
        topic = f"rack-prr-{uuid.uuid4().hex[:8]}"
        _create_topic(cluster, topic)
        _produce(cluster.bootstrap, topic, range(2000), value_size=200)
        _read_each_once(cluster.bootstrap, topic, "b", range(2000))
        fetched = cluster.fetch_response_bytes
        # The leaders (1 and 3) answered the first fetches with a redirect and no records.
        assert cluster.redirects[1] > 0 and cluster.redirects[3] > 0, cluster.redirects
        assert fetched[2] > 0.9 * sum(fetched.values()), fetched

        # A consumer in rack a is not redirected: it reads from the leaders.
        before = cluster.fetch_response_bytes
        _read_each_once(cluster.bootstrap, topic, "a", range(2000))
        after = cluster.fetch_response_bytes
        assert after[2] == before[2], (before, after)
        assert after[1] > before[1] and after[3] > before[3], (before, after)
