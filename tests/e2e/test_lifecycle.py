"""Broker restarts and graceful shutdown."""

from __future__ import annotations

import datetime
import signal
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.static.primitive import i32Timedelta

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
from testkit.e2e import KafkaWire, ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    broker = TansuBroker(
        port=free_port(), log_path=str(tmp_path_factory.mktemp("tansu") / "t.log")
    ).start()
    yield broker
    broker.stop()


@pytest.fixture
def own_proxy(own_tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(own_tansu.bootstrap).start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def created() -> bool:
        try:
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=10)
        except Exception as exc:  # the broker may still be starting
            return "TOPIC_ALREADY_EXISTS" in str(exc)
        return True

    wait_for(created, 30, interval=0.5, what=f"topic {name} created")


def test_proxy_survives_broker_restart_and_clients_finish(
    own_proxy: ProxyProcess, own_tansu: TansuBroker
) -> None:
    topic = f"restart-{uuid.uuid4().hex[:6]}"
    _create_topic(own_proxy.bootstrap, topic)
    errors: list[KafkaError] = []
    delivered: list[bytes] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(msg.value())  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": own_proxy.bootstrap,
            "acks": "all",
            "message.timeout.ms": 120_000,
            "linger.ms": 5,
            "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": own_proxy.bootstrap,
            "group.id": "restart",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "reconnect.backoff.max.ms": 500,
        }
    )
    try:
        for i in range(1000):
            producer.produce(topic, value=b"before-%05d" % i, on_delivery=on_delivery)
        assert producer.flush(30) == 0 and len(delivered) == 1000 and not errors
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < 1000 and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
        assert got == 1000

        own_tansu.stop()
        wait_for(
            lambda: any(
                e["reason"] in ("upstream_closed", "upstream_error")
                for e in own_proxy.closed_connections()
            ),
            20,
            what="client connections closed after the broker went away",
        )
        assert own_proxy.alive
        # While the broker is down, a new connection to its port is refused cleanly.
        with KafkaWire("127.0.0.1", own_proxy.broker_port(111)) as wire:
            assert wire.is_closed_by_peer(15)
        assert any(e["reason"] == "upstream_unreachable" for e in own_proxy.closed_connections())

        own_tansu.start()  # same port; memory storage starts empty
        _create_topic(own_proxy.bootstrap, topic)
        delivered.clear()
        for i in range(5000):
            producer.produce(topic, value=b"after-%05d" % i, on_delivery=on_delivery)
        assert producer.flush(120) == 0
        assert not errors, errors[:3]
        assert sorted(delivered) == [b"after-%05d" % i for i in range(5000)]

        # tansu's memory storage restarted empty, so the log starts again at offset 0 (a
        # broker with durable storage would keep it); the same consumer re-reads from there.
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(seen) < 5000 and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is None:
                    seen.append(m.value())
        assert sorted(seen) == [b"after-%05d" % i for i in range(5000)]
        assert own_proxy.alive
    finally:
        consumer.close()


def test_sigterm_lets_in_flight_requests_finish(
    own_proxy: ProxyProcess, own_tansu: TansuBroker
) -> None:
    topic = f"drain-{uuid.uuid4().hex[:6]}"
    _create_topic(own_proxy.bootstrap, topic)
    with KafkaWire("127.0.0.1", own_proxy.broker_port(111)) as wire:
        # A long-poll Fetch on an empty partition: the broker holds it for max_wait.
        frame = wire.encode(
            1,
            12,
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=2000)),
            min_bytes=1,
            topics=(
                FetchTopic(
                    topic=topic,
                    partitions=(
                        FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
        sent = time.monotonic()
        wire.send_raw(frame)
        wait_for(
            lambda: own_proxy.metrics().get('kafka_proxy_requests_total{api="fetch"}', 0) >= 1,
            10,
            what="fetch forwarded",
        )
        own_proxy.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]

        # New connections are refused once shutdown has begun.
        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", own_proxy.bootstrap_port), 1).close()
            except OSError:
                return True
            return False

        wait_for(refused, 10, what="listeners closed")
        size = int.from_bytes(wire.recv_exactly(4), "big")
        response = wire.recv_exactly(size)
        assert int.from_bytes(response[:4], "big") == wire._correlation
        assert wire.is_closed_by_peer(10)
    assert own_proxy.process is not None
    assert own_proxy.process.wait(20) == 0
    events = [e["event"] for e in own_proxy.events()]
    assert "proxy_stopping" in events and "proxy_stopped" in events
    assert "shutdown_timeout" not in events
    assert time.monotonic() - sent < 20


def test_sigterm_ends_a_drained_connection_with_fin_not_rst(
    own_proxy: ProxyProcess, own_tansu: TansuBroker
) -> None:
    """A request that arrives after draining began is not answered, but the connection still
    ends cleanly: the answer of the request in flight, then FIN. (Closing with that request
    unread sent RST, which may also destroy the answer on its way.)"""
    topic = f"fin-{uuid.uuid4().hex[:6]}"
    _create_topic(own_proxy.bootstrap, topic)
    with KafkaWire("127.0.0.1", own_proxy.broker_port(111)) as wire:
        me = f"127.0.0.1:{wire.sock.getsockname()[1]}"
        fetch = wire.encode(
            1, 12, max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=1500)),
            min_bytes=1, topics=(FetchTopic(topic=topic, partitions=(
                FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
            forgotten_topics_data=())
        wire.send_raw(fetch)
        fetch_correlation = wire._correlation
        wait_for(lambda: own_proxy.metrics().get('kafka_proxy_requests_total{api="fetch"}', 0)
                 >= 1, 10, what="fetch forwarded")
        own_proxy.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        wait_for(lambda: any(e.get("event") == "proxy_stopping" for e in own_proxy.events()),
                 10, what="draining to begin")
        wire.send_raw(wire.encode(18, 0))  # ApiVersions, after draining began
        size = int.from_bytes(wire.recv_exactly(4), "big")
        response = wire.recv_exactly(size)
        assert int.from_bytes(response[:4], "big") == fetch_correlation
        wire.sock.settimeout(10)
        try:
            rest = wire.sock.recv(65536)
        except ConnectionResetError:
            rest = None
        assert rest == b"", "the drained connection must end with FIN after the last answer"
    assert own_proxy.process is not None
    assert own_proxy.process.wait(20) == 0
    events = own_proxy.events()
    assert [e["reason"] for e in events if e.get("event") == "connection_closed"
            and e.get("client") == me] in ([], ["shutdown"])


def test_a_client_that_resets_is_an_ordinary_close(proxy: ProxyProcess) -> None:
    """A client hanging up with RST (broken pipe, reset) is logged as client_closed at debug,
    not as an error."""
    import struct

    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
        assert int(wire.request(18, 0).error_code) == 0
        port = wire.sock.getsockname()[1]
        wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    mine = f"127.0.0.1:{port}"

    def closed() -> list[dict[str, object]]:
        return [e for e in proxy.closed_connections() if e.get("client") == mine]

    events = wait_for(closed, 10, what="the close logged")
    assert [(e["reason"], e["level"]) for e in events] == [("client_closed", "debug")], events
