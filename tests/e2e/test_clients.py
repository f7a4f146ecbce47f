"""Real clients through the proxy against a real tansu broker: nothing lost, nothing
duplicated, and no client ever learns the upstream broker's address."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
    futures[name].result(timeout=30)
    wait_for(lambda: name in admin.list_topics(timeout=10).topics, 20, what=f"topic {name}")


def _assert_proxy_addresses(
    brokers: dict[int, tuple[str, int]], proxy: ProxyProcess, tansu: TansuBroker
) -> None:
    assert brokers, "no brokers in metadata"
    for node_id, (host, port) in brokers.items():
        assert (host, port) == ("127.0.0.1", proxy.broker_port(node_id))
        assert port != tansu.port


def test_admin_creates_topic_and_sees_only_proxy_addresses(
    proxy: ProxyProcess, tansu: TansuBroker
) -> None:
    name = f"admin-{uuid.uuid4().hex[:8]}"
    _create_topic(proxy.bootstrap, name, 4)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    md = admin.list_topics(timeout=10)
    assert len(md.topics[name].partitions) == 4
    _assert_proxy_addresses({b.id: (b.host, b.port) for b in md.brokers.values()}, proxy, tansu)
    cluster = admin.describe_cluster(request_timeout=10).result(timeout=20)
    _assert_proxy_addresses({n.id: (n.host, n.port) for n in cluster.nodes}, proxy, tansu)
    assert cluster.controller is None or cluster.controller.port != tansu.port


def test_confluent_idempotent_producer_and_consumer_group(
    proxy: ProxyProcess, tansu: TansuBroker
) -> None:
    topic = f"cf-{uuid.uuid4().hex[:8]}"
    _create_topic(proxy.bootstrap, topic, 3)
    n = 60_000
    producer = Producer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "client.id": "e2e-confluent-producer",
            "linger.ms": 5,
        }
    )
    delivered: list[bytes] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.value())  # type: ignore[attr-defined]

    for i in range(n):
        while True:
            try:
                producer.produce(
                    topic, key=str(i % 97).encode(), value=b"cf-%08d" % i, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    assert len(delivered) == n

    consumer = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "client.id": "e2e-confluent-consumer",
            "enable.auto.commit": True,
        }
    )
    try:
        consumer.subscribe([topic])
        seen: list[bytes] = []
        deadline = time.monotonic() + 120
        while len(seen) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=5000, timeout=1.0):
                assert msg.error() is None, msg.error()
                seen.append(msg.value())
        assert len(seen) == n, f"consumed {len(seen)} of {n}"
        assert len(set(seen)) == n, "duplicates consumed"
        assert set(seen) == {b"cf-%08d" % i for i in range(n)}
        assignment = consumer.assignment()
        assert {tp.partition for tp in assignment} == {0, 1, 2}
        md = consumer.list_topics(topic, timeout=10)
        _assert_proxy_addresses({b.id: (b.host, b.port) for b in md.brokers.values()}, proxy, tansu)
    finally:
        consumer.close()


async def test_aiokafka_produce_and_consume(proxy: ProxyProcess, tansu: TansuBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTP

    topic = f"aio-{uuid.uuid4().hex[:8]}"
    _create_topic(proxy.bootstrap, topic, 2)
    n = 20_000
    producer = AIOKafkaProducer(
        bootstrap_servers=proxy.bootstrap,
        acks="all",
        client_id="e2e-aiokafka-producer",
        linger_ms=5,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value=b"aio-%08d" % i, partition=i % 2) for i in range(n)
        ]
        results = await asyncio.gather(*futures)
        assert len(results) == n
        brokers = {b.nodeId: (b.host, b.port) for b in producer.client.cluster.brokers()}
        _assert_proxy_addresses(brokers, proxy, tansu)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        bootstrap_servers=proxy.bootstrap,
        client_id="e2e-aio-consumer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([AioTP(topic, 0), AioTP(topic, 1)])
        seen: list[bytes] = []
        async with asyncio.timeout(120):
            while len(seen) < n:
                batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
                for records in batch.values():
                    seen.extend(r.value for r in records)
        assert len(seen) == n and set(seen) == {b"aio-%08d" % i for i in range(n)}
        brokers = {b.nodeId: (b.host, b.port) for b in consumer._client.cluster.brokers()}
        _assert_proxy_addresses(brokers, proxy, tansu)
    finally:
        await consumer.stop()


def test_kafka_python_produce_and_consume(proxy: ProxyProcess, tansu: TansuBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KPTP
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="e2e-kp-admin")
    try:
        admin.create_topics([KPNewTopic(topic, 2, 1)])
        wait_for(lambda: topic in admin.list_topics(), 20, what="kafka-python topic")
    finally:
        admin.close()
    n = 20_000
    producer = KafkaProducer(
        bootstrap_servers=proxy.bootstrap, acks="all", client_id="e2e-kp-producer", linger_ms=5
    )
    try:
        futures = [producer.send(topic, value=b"kp-%08d" % i, partition=i % 2) for i in range(n)]
        producer.flush(60)
        assert all(f.succeeded() for f in futures)
        meta = producer._metadata  # the client's own view of the cluster
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers()}
        _assert_proxy_addresses(brokers, proxy, tansu)
    finally:
        producer.close()

    consumer = KafkaConsumer(
        bootstrap_servers=proxy.bootstrap,
        client_id="e2e-kp-consumer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=120_000,
    )
    try:
        consumer.assign([KPTP(topic, 0), KPTP(topic, 1)])
        consumer.seek_to_beginning()
        seen: list[bytes] = []
        deadline = time.monotonic() + 120
        while len(seen) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000, max_records=5000).values():
                seen.extend(r.value for r in records)
        assert len(seen) == n and set(seen) == {b"kp-%08d" % i for i in range(n)}
    finally:
        consumer.close()


def test_confluent_assigned_consumer_reads_every_partition(proxy: ProxyProcess) -> None:
    """A plain assign() consumer (no group) reading what another client produced."""
    topic = f"as-{uuid.uuid4().hex[:8]}"
    _create_topic(proxy.bootstrap, topic, 3)
    n = 5_000
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "1", "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, value=b"as-%06d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": proxy.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=5000, timeout=1.0):
                assert msg.error() is None, msg.error()
                assert msg.value() not in seen
                seen.add(msg.value())
        assert len(seen) == n
    finally:
        consumer.close()
