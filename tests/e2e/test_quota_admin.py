"""Client quotas managed through the proxy with Kafka's own admin APIs (KIP-546, issue 17):
kafka-python's DescribeClientQuotas / AlterClientQuotas requests (negotiated by ApiVersions,
which the proxy extends: tansu offers neither) answered by two proxy instances in front of one
tansu. An alter through instance a is enforced by instance b within a second or two (the
overrides topic); a live librdkafka producer's rate follows it; b, which lists no admin,
refuses alters; a restarted b comes back with the overrides."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.quota_admin import Admin
from testkit.rates import Cycles

pytestmark = pytest.mark.e2e

QUOTA = 1_000_000
CYCLES_FROM_S = 5.0
RUN_AFTER_ALTER_S = 37.0
APP = (("client-id", "app"),)


def _instance(tansu: TansuBroker, admins: str) -> ProxyProcess:
    return ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  admin_principals: {admins}
  describe_principals: [ANONYMOUS]
  entities:
    - {{user: alice, producer_byte_rate: 2000000}}
    - {{client-id: app, producer_byte_rate: {QUOTA // 2}}}
""")


@pytest.fixture
def instances(tansu: TansuBroker) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    a = _instance(tansu, "[ANONYMOUS]").start()
    b = _instance(tansu, "[]").start()
    try:
        for proxy in (a, b):
            proxy.wait_broker_listener(111)
        yield a, b
    finally:
        a.stop()
        b.stop()


def _resolve(proxy: ProxyProcess, *flags: str) -> int:
    """``kafka-quota-proxy quotas resolve`` for client-id app: its producer_byte_rate."""
    out = subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", "quotas", "resolve", "--config",
         str(proxy.config_path), "--client-id", "app", *flags],
        capture_output=True, text=True, timeout=60, check=True)
    return int(json.loads(out.stdout)["limits"]["producer_byte_rate"])


def _produce(bootstrap: str, topic: str, stop: threading.Event,
             delivered: list[tuple[float, int]], throttles: list[int]) -> None:
    def stats(text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            throttles.append(int(broker.get("throttle", {}).get("max", 0)))

    # 64 KB batches, as tests/e2e/test_quotas.py measures rates (each request a small part of
    # a second's quota)
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "app", "acks": "1",
                         "linger.ms": 5, "batch.size": 65536,
                         "statistics.interval.ms": 1000, "stats_cb": stats,
                         "queue.buffering.max.kbytes": 2048})

    def done(err: object, msg: Any) -> None:
        if err is None:
            delivered.append((time.monotonic(), len(msg.value())))

    while not stop.is_set():
        try:
            producer.produce(topic, value=b"q" * 1000, on_delivery=done)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(30)


# kafka-python leaves the sockets of connections a proxy restart dropped to the collector
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_quotas_altered_through_one_instance_hold_on_every_instance(
        tansu: TansuBroker, instances: tuple[ProxyProcess, ProxyProcess]) -> None:
    a, b = instances
    admin_a, admin_b = Admin(a.bootstrap), Admin(b.bootstrap)
    try:
        # The YAML's entities, described through either instance.
        yaml_view = {(("user", "alice"),): {"producer_byte_rate": 2_000_000.0},
                     APP: {"producer_byte_rate": QUOTA // 2}}
        assert admin_a.quotas() == admin_b.quotas() == yaml_view
        # Kafka's validation, answered by the proxy (the broker never sees these requests).
        assert admin_a.alter([((("user", ""),), [("producer_byte_rate", 1.0, False)])]) == [
            (42, "Empty user not supported")]
        bad = admin_a.describe([("user", 0, None)])
        assert (bad.error_code, bad.error_message) == (
            42, "Request specified MATCH_TYPE_EXACT, but set match string to null.")
        assert admin_a.alter([(APP, [("producer_byte_rate", QUOTA, False)])],
                             validate_only=True) == [(0, None)]
        assert admin_a.quotas() == yaml_view
        # b lists no admin principal: alters are refused there, per entry.
        assert admin_b.alter([(APP, [("producer_byte_rate", QUOTA, False)])]) == [
            (31, "Cluster authorization failed.")]

        # A producer of client-id app through b, held to the YAML's quota ...
        topic = new_topic(tansu.bootstrap, "admin")
        stop = threading.Event()
        delivered: list[tuple[float, int]] = []
        throttles: list[int] = []
        producer = threading.Thread(target=_produce,
                                    args=(b.bootstrap, topic, stop, delivered, throttles))
        producer.start()
        try:
            wait_for(lambda: max(throttles, default=0) > 0, 30, what="the YAML's quota")
            # ... then twice that quota, altered through a: the override over the YAML's.
            altered = time.monotonic()
            assert admin_a.alter([(APP, [("producer_byte_rate", QUOTA, False)])]) == [(0, None)]
            wait_for(lambda: admin_b.quotas().get(APP) == {"producer_byte_rate": QUOTA}, 5,
                     interval=0.02, what="b applying the alter made through a")
            seen = time.monotonic() - altered
            print(f"alter through a described by b after {seen:.3f} s")
            assert seen < 2.0
            wait_for(lambda: time.monotonic() > altered + RUN_AFTER_ALTER_S, 60,
                     interval=0.2, what="the quota's throttle cycles")
        finally:
            stop.set()
            producer.join(60)
        events = [(t - altered, n) for t, n in delivered]
        # over every whole throttle cycle from the first begun 5 s after the alter (the
        # burst the padded first window gave first, and requests already in flight, before)
        cycles = Cycles(sorted(events), QUOTA)
        rate = cycles.whole(CYCLES_FROM_S)[0]
        starts = [s for s in cycles.starts if s >= CYCLES_FROM_S]
        print(f"client-id app after the alter: {rate:.3f} of its quota over the cycles begun "
              f"at {starts} s after the alter")
        assert len(starts) >= 2, cycles.starts
        assert rate == pytest.approx(1.0, abs=0.05), rate
        labels = 'broker="111",client_id="app",quota="produce",user=""'
        assert b.metrics()[f"kafka_proxy_quota_entity_bytes_per_second_limit{{{labels}}}"] == QUOTA

        # `quotas resolve --cluster` sees the merged view (the file alone: the YAML's).
        assert _resolve(a, "--cluster") == QUOTA
        assert _resolve(a) == QUOTA // 2

        # A restarted b comes back with the override (read from the topic).
        admin_b.close()
        b.stop()
        b.start()
        b.wait_broker_listener(111)
        admin_b = Admin(b.bootstrap)
        wait_for(lambda: admin_b.quotas().get(APP) == {"producer_byte_rate": QUOTA}, 10,
                 what="the override after a restart")
        # Removed through a: the YAML's quota again, everywhere.
        assert admin_a.alter([(APP, [("producer_byte_rate", 0.0, True)])]) == [(0, None)]
        wait_for(lambda: admin_b.quotas() == yaml_view, 5, interval=0.02,
                 what="the removal on b")
        assert a.metrics()['kafka_proxy_quota_alters_total{result="applied"}'] >= 2
    finally:
        admin_a.close()
        admin_b.close()
        gc.collect()  # (here, where their ResourceWarnings are ignored)


@pytest.fixture
def admin_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    proxy = _instance(tansu, "[ANONYMOUS]").start()
    try:
        proxy.wait_broker_listener(111)
        yield proxy
    finally:
        proxy.stop()


def _entity(version: int, components: list[tuple[str, str | None]]) -> Any:
    from kio.index import load_request_schema

    cls = load_request_schema(49, version)
    mod = __import__(cls.__module__, fromlist=["EntityData"])
    return tuple(mod.EntityData(entity_type=t, entity_name=n) for t, n in components)


def _alter_raw(wire: Any, version: int, components: list[tuple[str, str | None]],
               ops: list[tuple[str, float, bool]], validate_only: bool = False
               ) -> list[tuple[int, str | None]]:
    from kio.index import load_request_schema

    mod = __import__(load_request_schema(49, version).__module__,
                     fromlist=["EntryData", "OpData"])
    entries = (mod.EntryData(entity=_entity(version, components),
                             ops=tuple(mod.OpData(key=k, value=v, remove=r) for k, v, r in ops)),)
    response = wire.request(49, version, entries=entries, validate_only=validate_only)
    return [(int(e.error_code), e.error_message) for e in response.entries]


def _describe_raw(wire: Any, version: int, components: list[tuple[str, int, str | None]],
                  strict: bool = False) -> Any:
    from kio.index import load_request_schema

    mod = __import__(load_request_schema(48, version).__module__, fromlist=["ComponentData"])
    return wire.request(48, version, components=tuple(
        mod.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components),
        strict=strict)


@pytest.mark.parametrize("version", [0, 1])
def test_error_cases_in_raw_frames_of_each_version(admin_proxy: ProxyProcess,
                                                   version: int) -> None:
    """kio-encoded requests of each version: Kafka's errors, answered by the proxy."""
    from testkit.e2e import KafkaWire

    with KafkaWire("127.0.0.1", admin_proxy.bootstrap_port) as wire:
        r = _describe_raw(wire, version, [("foo", 2, None)])
        assert (r.error_code, r.error_message, r.entries) == (
            35, "Unsupported entity type foo", None)
        r = _describe_raw(wire, version, [("user", 3, None)])
        assert (r.error_code, r.error_message) == (42, "Unknown match type 3")
        r = _describe_raw(wire, version, [("user", 0, "alice")], strict=True)
        assert r.error_code == 0 and [[(c.entity_type, c.entity_name) for c in e.entity]
                                      for e in r.entries] == [[("user", "alice")]]
        assert _describe_raw(wire, version, [], strict=True).entries == ()
        assert _alter_raw(wire, version, [("user", "x")],
                          [("connection_creation_rate", 5.0, False)]) == [
            (42, "Invalid configuration key connection_creation_rate")]
        assert _alter_raw(wire, version, [("user", "x")], [("producer_byte_rate", -1.0, False)]
                          ) == [(42, "Quota producer_byte_rate must be greater than 0")]
        assert _alter_raw(wire, version, [("user", None)], [("request_percentage", 1.5, False)],
                          validate_only=True) == [(0, None)]
        assert _alter_raw(wire, version, [("user", "x")], [("producer_byte_rate", 5.0, True)]
                          ) == [(0, None)]  # removing an unset key


def test_answers_keep_their_place_among_pipelined_responses(admin_proxy: ProxyProcess) -> None:
    """Metadata, DescribeClientQuotas, Metadata in one write: three responses in order, the
    middle one the proxy's; a DescribeClientQuotas that does not decode closes the connection
    with its reason."""
    from testkit.e2e import KafkaWire

    with KafkaWire("127.0.0.1", admin_proxy.bootstrap_port) as wire:
        frames = (wire.encode(3, 12, topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
                  + wire.encode(48, 1, components=(), strict=False)
                  + wire.encode(3, 12, topics=None, allow_auto_topic_creation=False,
                                include_topic_authorized_operations=False))
        wire.send_raw(frames)
        ids = []
        for _ in range(3):
            size = int.from_bytes(wire.recv_exactly(4), "big")
            ids.append(int.from_bytes(wire.recv_exactly(size)[:4], "big"))
        assert ids == sorted(ids) and len(set(ids)) == 3
    with KafkaWire("127.0.0.1", admin_proxy.bootstrap_port) as wire:
        from kafka_quota_proxy.protocol.headers import encode_request_header

        frame = encode_request_header(48, 1, 1, "c") + b"\x05"
        wire.send_raw(len(frame).to_bytes(4, "big") + frame)
        assert wire.is_closed_by_peer()
    wait_for(lambda: any(e.get("reason") == "malformed_frame" for e in
                         admin_proxy.closed_connections()), 10, what="the reason logged")


def test_the_proxys_answers_need_no_broker(tansu: TansuBroker,
                                           admin_proxy: ProxyProcess) -> None:
    """DescribeClientQuotas and AlterClientQuotas (validate_only) never go upstream: with the
    broker stopped (SIGSTOP: its sockets stay open and nothing is answered) both are answered
    all the same, and the response bytes counted are the answers' own."""
    import os
    import signal

    from kafka_quota_proxy.protocol.headers import parse_response_header
    from testkit.e2e import KafkaWire

    counted = 'kafka_proxy_response_bytes_total{api="describe_client_quotas"}'
    with KafkaWire("127.0.0.1", admin_proxy.broker_port(111), timeout=10) as wire:
        wire.request(3, 12, topics=None, allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False)  # the broker connection made
        before = admin_proxy.metrics().get(counted, 0)
        assert tansu.process is not None
        os.kill(tansu.process.pid, signal.SIGSTOP)
        try:
            wire.send_raw(wire.encode(48, 1, components=(), strict=False))
            size = int.from_bytes(wire.recv_exactly(4), "big")
            answer = wire.recv_exactly(size)
            assert parse_response_header(answer, 0, size, 1).correlation_id == 2
            validated = wire.request(49, 1, entries=(), validate_only=True)
            assert validated.entries == ()
        finally:
            os.kill(tansu.process.pid, signal.SIGCONT)
    assert admin_proxy.metrics().get(counted, 0) - before == size + 4
