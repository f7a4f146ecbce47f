"""Rack-aware fetch routing through the proxy, with librdkafka, over a three-rack cluster
simulated in front of one real tansu (``tests.rack_cluster``: brokers 1, 2, 3 in racks a, b,
c; every partition has replicas [1, 2, 3]; leaders alternate between 1 and 3, never in rack
b). What each broker served is counted by the simulated brokers themselves."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, wait_for
from testkit.rack_cluster import RackCluster

pytestmark = pytest.mark.e2e

PARTITIONS = 4
MESSAGES = 8000
VALUE = b"r" * 1000


@pytest.fixture
def cluster(tansu: TansuBroker) -> Iterator[RackCluster]:
    with RackCluster(tansu.bootstrap) as c:
        yield c


def start_proxy(cluster: RackCluster, racks_yaml: str) -> ProxyProcess:
    proxy = ProxyProcess(cluster.bootstrap, extra_yaml=racks_yaml).start()
    for node in (1, 2, 3):
        proxy.wait_broker_listener(node)
    return proxy


@pytest.fixture
def topic(cluster: RackCluster) -> str:
    name = f"racks-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(timeout=30)

    def ready() -> bool:
        md = admin.list_topics(name, timeout=10).topics.get(name)
        return md is not None and md.error is None and len(md.partitions) == PARTITIONS

    wait_for(ready, 20, what=f"metadata of {name}")
    return name


def produce(bootstrap: str, topic: str, count: int = MESSAGES,
            partitions: int = PARTITIONS) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "client.id": "rack-producer"})
    errors: list[Any] = []
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=b"m%07d" % i, value=VALUE, partition=i % partitions,
                                 on_delivery=lambda e, m: e is not None and errors.append(e))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    return [b"m%07d" % i for i in range(count)]


def consumer(bootstrap: str, topic: str, client_id: str, rack: str | None,
             partitions: int = PARTITIONS) -> Consumer:
    config = {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "client.id": client_id, "enable.auto.commit": False,
              "max.partition.fetch.bytes": 65536, "fetch.wait.max.ms": 100}
    if rack is not None:
        config["client.rack"] = rack
    c = Consumer(config)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return c


def consume(c: Consumer, want: int, until: threading.Event | None = None,
            after: int = 0, timeout: float = 90) -> list[bytes]:
    """Keys of ``want`` messages (``after`` of them first, then ``until`` is awaited)."""
    keys: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(keys) < want and time.monotonic() < deadline:
        for m in c.consume(500, 0.5):
            if m.error() is None:
                keys.append(m.key())
            elif m.error().code() != KafkaError._PARTITION_EOF:
                raise AssertionError(m.error())
        if until is not None and len(keys) >= after:
            until.wait(60)
            until = None
    return keys


def share(counts: dict[int, int], node: int) -> float:
    total = sum(counts.values())
    return counts.get(node, 0) / total if total else 0.0


def rack_bytes(proxy: ProxyProcess, client_rack: str) -> dict[str, float]:
    prefix = 'kafka_proxy_fetch_bytes_total{broker_rack="'
    out = {}
    for name, value in proxy.metrics().items():
        if name.startswith(prefix) and f'client_rack="{client_rack}"' in name:
            out[name[len(prefix):].split('"')[0]] = value
    return out


def after_first_fetch(log: list[tuple[int, int]], start: int,
                      leaders: tuple[int, ...] = (1, 3)) -> dict[int, int]:
    """Bytes served per broker from ``log[start:]``, leaving out each leader's first Fetch
    response (the one the proxy answers with the redirect, dropping its records)."""
    seen: set[int] = set()
    served = dict.fromkeys((1, 2, 3), 0)
    for node, size in log[start:]:
        if node in seen or node not in leaders:
            served[node] += size
        seen.add(node)
    return served


def read_all_with_rack(proxy: ProxyProcess, cluster: RackCluster, topic: str, client_id: str,
                       rack: str | None, keys: list[bytes]) -> dict[int, int]:
    """Consume every message once; return the bytes each broker served after its first
    Fetch response."""
    start = len(cluster.fetch_log())
    c = consumer(proxy.bootstrap, topic, client_id, rack)
    try:
        got = consume(c, len(keys))
    finally:
        c.close()
    assert sorted(got) == keys and len(set(got)) == len(got)  # every message, once
    return after_first_fetch(cluster.fetch_log(), start)


def test_consumer_with_client_rack_reads_from_its_rack(cluster: RackCluster, topic: str) -> None:
    proxy = start_proxy(cluster, "racks: {selector: rack-aware}\n")
    try:
        keys = produce(proxy.bootstrap, topic)
        served = read_all_with_rack(proxy, cluster, topic, "rack-b-consumer", "b", keys)
        # The first fetch of each partition went to its leader (1 or 3), which the proxy
        # answered with preferred_read_replica = 2; everything after came from rack b.
        assert share(served, 2) >= 0.95, served
        # What the client received, by rack (the leaders' records were dropped): all rack b.
        by_rack = rack_bytes(proxy, "b")
        delivered = sum(by_rack.values())
        assert by_rack.get("b", 0) / delivered >= 0.95, by_rack
        metrics = proxy.metrics()
        assert metrics['kafka_proxy_replica_selector_decisions_total{decision="preferred_replica"}'
                       ] >= PARTITIONS
        assert metrics["kafka_proxy_fetch_cross_rack_bytes_total"] < 0.05 * delivered
        print(f"\nrack-b consumer: bytes served after the first fetch {served}, rack-b share "
              f"{share(served, 2):.4f}; bytes delivered by broker rack {by_rack}")
    finally:
        proxy.stop()


def test_selector_leader_and_clients_without_rack_fetch_from_leaders(
        cluster: RackCluster, topic: str) -> None:
    keys = produce(cluster.bootstrap, topic, 2000)
    for racks_yaml, rack in (("racks: {selector: leader}\n", "b"),  # routing off
                             ("racks: {selector: rack-aware}\n", None)):  # rack unknown
        proxy = start_proxy(cluster, racks_yaml)
        try:
            before = cluster.fetch_requests
            c = consumer(proxy.bootstrap, topic, "plain-consumer", rack)
            try:
                got = consume(c, len(keys))
            finally:
                c.close()
            assert sorted(got) == keys
            requests = {n: cluster.fetch_requests.get(n, 0) - before.get(n, 0) for n in (1, 2, 3)}
            assert requests[2] == 0 and requests[1] > 0 and requests[3] > 0, (racks_yaml, requests)
        finally:
            proxy.stop()


def test_client_mapped_to_a_rack_by_config(cluster: RackCluster, topic: str) -> None:
    proxy = start_proxy(cluster, """racks:
  clients:
    - {client_id: "^billing-", rack: "b"}
    - {network: "10.99.0.0/16", rack: "c"}
""")
    try:
        keys = produce(proxy.bootstrap, topic, 4000)
        served = read_all_with_rack(proxy, cluster, topic, "billing-7", None, keys)  # no rack
        assert share(served, 2) >= 0.95, served
        assert rack_bytes(proxy, "b").get("b", 0) > 0  # the client counted as rack b
    finally:
        proxy.stop()


def test_replica_going_away_mid_read_loses_and_repeats_nothing(
        cluster: RackCluster, topic: str) -> None:
    proxy = start_proxy(cluster, "racks: {selector: rack-aware}\n")
    try:
        keys = produce(proxy.bootstrap, topic)
        c = consumer(proxy.bootstrap, topic, "rack-b-consumer", "b")
        gone = threading.Event()
        try:
            result: list[bytes] = []
            reader = threading.Thread(target=lambda: result.extend(
                consume(c, len(keys), until=gone, after=len(keys) // 4, timeout=120)))
            reader.start()
            wait_for(lambda: cluster.fetch_requests.get(2, 0) > 3, 60,
                     what="the consumer fetching from rack b")
            served_by_2 = cluster.fetch_response_bytes.get(2, 0)
            cluster.stop_node(2)  # while the reader waits a quarter of the way through
            gone.set()
            reader.join(150)
            assert not reader.is_alive()
        finally:
            c.close()
        counts = Counter(result)
        assert [k for k, n in counts.items() if n > 1] == []  # nothing repeated
        assert sorted(counts) == keys  # nothing lost
        assert served_by_2 > 0
        # The rest came from the leaders.
        assert cluster.fetch_response_bytes.get(1, 0) > 0 and cluster.fetch_response_bytes.get(
            3, 0) > 0
    finally:
        proxy.stop()


def test_leader_is_asked_for_nothing_of_redirected_partitions(cluster: RackCluster) -> None:
    """librdkafka's default fetch sizes (max.partition.fetch.bytes 1 MB, fetch.max.bytes
    50 MB), 30,000 x 1 KB over two partitions led by 1 (rack a) and 3 (rack c), a
    ``client.rack=b`` consumer. The proxy sends both partitions to 2 (rack b), and asks their
    leaders for 0 bytes of them: without that, each leader read its whole partition (6 MB:
    tansu ignores partition_max_bytes) for the one fetch the proxy answered with the redirect,
    and 28% of the bytes the brokers served crossed racks."""
    name = f"racks-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
    proxy = start_proxy(cluster, "racks: {selector: rack-aware}\n")
    try:
        keys = produce(proxy.bootstrap, name, 30_000, partitions=2)
        start, asked_from = len(cluster.fetch_log()), len(cluster.fetch_asks())
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                      "client.id": "rack-b-consumer", "client.rack": "b",
                      "enable.auto.commit": False})  # default fetch sizes
        c.assign([TopicPartition(name, p, 0) for p in range(2)])
        try:
            got = consume(c, len(keys))
        finally:
            c.close()
        assert sorted(got) == keys and len(set(got)) == len(got)  # every message, once
        served = dict.fromkeys((1, 2, 3), 0)
        responses = dict.fromkeys((1, 2, 3), 0)
        for node, size in cluster.fetch_log()[start:]:
            served[node] += size
            responses[node] += 1
        total = sum(served.values())
        cross = (served[1] + served[3]) / total
        assert cross <= 0.05, served
        # The leaders served a redirect each, with no records, and rack b everything else ...
        assert served[1] < 4096 and served[3] < 4096, served
        # ... as they were asked for nothing of the partitions sent to rack b.
        leader_asks = [a for a in cluster.fetch_asks()[asked_from:] if a.node in (1, 3)]
        assert {a.node for a in leader_asks} == {1, 3}, leader_asks
        assert all(a.asks_for_nothing for a in leader_asks), leader_asks
        by_rack = rack_bytes(proxy, "b")
        assert by_rack.get("b", 0) >= 0.95 * sum(by_rack.values()), by_rack
        print(f"\nbytes served per broker {served}, responses {responses}, leader fetches "
              f"{len(leader_asks)}; cross-rack share {cross:.4f}")
    finally:
        proxy.stop()


@pytest.mark.parametrize(("decide", "expected"), [("broker", 3), ("proxy", 2)])
def test_preferred_replica_set_by_the_broker(tansu: TansuBroker, decide: str,
                                             expected: int) -> None:
    """Brokers running a replica selector of their own (here: leader 1 sends rack-b clients
    to 3): the proxy keeps their choice unless ``decide: proxy``."""
    with RackCluster(tansu.bootstrap, leaders=lambda t, p: 1,
                     broker_preferred=lambda rack, t, p: 3 if rack == "b" else None) as cluster:
        name = f"racks-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
        proxy = start_proxy(cluster, f"racks: {{decide: {decide}}}\n")
        try:
            keys = produce(proxy.bootstrap, name, 2000, partitions=2)
            start = len(cluster.fetch_log())
            c = consumer(proxy.bootstrap, name, "rack-b-consumer", "b", partitions=2)
            try:
                got = consume(c, len(keys))
            finally:
                c.close()
            assert sorted(got) == keys
            served = after_first_fetch(cluster.fetch_log(), start, leaders=(1,))
            assert share(served, expected) >= 0.95, served
            kept = proxy.metrics()[
                'kafka_proxy_replica_selector_decisions_total{decision="broker_choice_kept"}']
            assert (kept > 0) == (decide == "broker")
        finally:
            proxy.stop()
