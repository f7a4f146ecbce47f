"""The proxy's topics belong to the proxy (issue 26, findings 1 and 4), against a real tansu
through the proxy: real clients (librdkafka's AdminClient, Producer, Consumer) and raw kio
frames. The overrides, usage and volumes topics exist on the broker (made there directly, as
the proxy's own clients would); through the proxy they are refused with
TOPIC_AUTHORIZATION_FAILED while the rest of each request goes on; a client posing as a
follower (Fetch with a replica id) is answered with that error on every partition and stays
under its consumer quota."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, wait_for

pytestmark = pytest.mark.e2e

OVERRIDES = "__kafka_quota_proxy_quotas"
USAGE = "__kafka_quota_proxy_usage"
VOLUMES = "__kafka_quota_proxy_volumes"
GUARDED = (OVERRIDES, USAGE, VOLUMES)
PRODUCE_QUOTA = 50_000
CONSUMER_QUOTA = 200
DENIED = 29  # TOPIC_AUTHORIZATION_FAILED


@pytest.fixture(scope="module")
def guarded_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (OVERRIDES, USAGE)]).values():
        f.result(timeout=30)
    p = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  admin_principals: [ANONYMOUS]
  describe_principals: [ANONYMOUS]
  entities:
    - {{client-id: "<default>", producer_byte_rate: {PRODUCE_QUOTA}}}
    - {{client-id: "follower-poser", consumer_byte_rate: {CONSUMER_QUOTA}}}
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _code(exc: BaseException) -> int:
    assert isinstance(exc, KafkaException), exc
    return int(exc.args[0].code())


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "guard-probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_admin_requests_on_the_proxys_topics_are_refused(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """CreateTopics / DescribeConfigs / DeleteTopics naming a guarded topic and another: the
    guarded one is refused, the other done, in the same request."""
    admin = AdminClient({"bootstrap.servers": guarded_proxy.bootstrap})
    other = f"guard-{uuid.uuid4().hex[:6]}"
    created = admin.create_topics([NewTopic(VOLUMES, 1, 1), NewTopic(other, 1, 1)])
    created[other].result(timeout=30)
    with pytest.raises(KafkaException) as refused:
        created[VOLUMES].result(timeout=30)
    assert _code(refused.value) == DENIED
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap})
    assert VOLUMES not in direct.list_topics(timeout=10).topics  # never created

    described = admin.describe_configs([ConfigResource("topic", OVERRIDES),
                                        ConfigResource("topic", other)])
    results = {r.name: f for r, f in described.items()}
    results[other].result(timeout=30)
    with pytest.raises(KafkaException) as refused:
        results[OVERRIDES].result(timeout=30)
    assert _code(refused.value) == DENIED

    deleted = admin.delete_topics([OVERRIDES, other])
    deleted[other].result(timeout=30)
    with pytest.raises(KafkaException) as refused:
        deleted[OVERRIDES].result(timeout=30)
    assert _code(refused.value) == DENIED
    assert OVERRIDES in direct.list_topics(timeout=10).topics  # still there


def test_forged_override_is_refused_and_the_quota_holds(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """Finding 1: a producer writes a 1e12 override for itself to the overrides topic.
    librdkafka gets TOPIC_AUTHORIZATION_FAILED, nothing reaches the topic, and the client's
    rate stays at the configured 50 kB/s default."""
    errors: list[Any] = []
    evil = Producer({"bootstrap.servers": guarded_proxy.bootstrap, "client.id": "evil",
                     "linger.ms": 5, "batch.size": 65536, "message.timeout.ms": 10_000})
    evil.produce(OVERRIDES, key=b'{"entity":[["client-id","evil"]],"key":"producer_byte_rate"}',
                 value=b'{"value":1e12}', on_delivery=lambda err, msg: errors.append(err))
    evil.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors
    assert _end_offset(tansu.bootstrap, OVERRIDES) == 0

    topic = new_topic(guarded_proxy.bootstrap, "evil")
    delivered = [0]

    def ok(err: object, msg: Any) -> None:
        if err is None:
            delivered[0] += len(msg.value())

    start = time.monotonic()
    while time.monotonic() - start < 6.0:
        try:
            evil.produce(topic, value=b"x" * 10_000, on_delivery=ok)
        except BufferError:
            evil.poll(0.05)
        evil.poll(0)
    elapsed = time.monotonic() - start
    evil.purge(in_queue=True, in_flight=False)
    evil.flush(30)
    rate = delivered[0] / elapsed
    print(f"\nevil's rate with a forged override refused: {rate:.0f} B/s "
          f"(quota {PRODUCE_QUOTA})")
    # Kafka's padded first window lets about 10 s of quota through at once (~130 kB/s over
    # 6 s); with the forged 1e12 the same client ran at 86 MB/s
    assert rate < 8 * PRODUCE_QUOTA, rate


def _produce_frame(wire: KafkaWire, version: int, topics: list[str]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b'{"value":1e12}', headers=[])
    batch = bytes(builder.build())
    module = __import__(load_request_schema(0, version).__module__,
                        fromlist=["TopicProduceData"])
    data = tuple(module.TopicProduceData(
        name=t, partition_data=(module.PartitionProduceData(index=0, records=batch),))
        for t in topics)
    return wire.encode(0, version, transactional_id=None, acks=1,
                       timeout=timedelta(seconds=5), topic_data=data)


def _read_response(wire: KafkaWire, api_key: int, version: int) -> Any:
    from kafka_quota_proxy.protocol import apis
    from kafka_quota_proxy.protocol.headers import parse_response_header
    from kafka_quota_proxy.protocol.rewrite import decode_response

    size = int.from_bytes(wire.recv_exactly(4), "big")
    frame = wire.recv_exactly(size)
    header = parse_response_header(frame, 0, size, apis.response_header_version(api_key,
                                                                                 version))
    return decode_response(api_key, version, frame[header.size:])


@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte_by_byte"])
def test_raw_produce_to_a_guarded_topic_writes_nothing(
        tansu: TansuBroker, guarded_proxy: ProxyProcess, split: bool) -> None:
    """A Produce naming the overrides topic and another, sent whole or a byte at a time: the
    other is written, the overrides topic answered TOPIC_AUTHORIZATION_FAILED and left
    empty."""
    port = guarded_proxy.broker_port(111)
    other = new_topic(guarded_proxy.bootstrap, "raw")
    with KafkaWire("127.0.0.1", port, client_id="raw-producer") as wire:
        frame = _produce_frame(wire, 9, [OVERRIDES, other])
        if split:
            for i in range(len(frame)):
                wire.send_raw(frame[i:i + 1])
        else:
            wire.send_raw(frame)
        response = _read_response(wire, 0, 9)
    codes = {r.name: [int(p.error_code) for p in r.partition_responses]
             for r in response.responses}
    assert codes == {OVERRIDES: [DENIED], other: [0]}, codes
    assert _end_offset(tansu.bootstrap, OVERRIDES) == 0
    assert _end_offset(tansu.bootstrap, other) == 1


def test_reading_the_usage_topic_is_refused(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """ListOffsets, Fetch by name (v12) and by topic id (v13, the id learnt from the proxy's
    own Metadata requests):
    the usage topic answered TOPIC_AUTHORIZATION_FAILED, the other topic answered."""
    port = guarded_proxy.broker_port(111)
    other = new_topic(guarded_proxy.bootstrap, "reader")
    lo: Any = __import__("kio.schema.list_offsets.v7.request", fromlist=["_"])
    with KafkaWire("127.0.0.1", port, client_id="reader") as wire:
        offsets = wire.request(2, 7, replica_id=-1, isolation_level=0, topics=tuple(
            lo.ListOffsetsTopic(name=t, partitions=(lo.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1),))
            for t in (USAGE, other)))
        codes = {t.name: int(t.partitions[0].error_code) for t in offsets.topics}
        assert codes == {USAGE: DENIED, other: 0}, codes

        fetch = wire.request(1, 12, **_fetch_fields(12, [USAGE, other]))
        codes = {t.topic: int(t.partitions[0].error_code) for t in fetch.responses}
        assert codes == {USAGE: DENIED, other: 0}, codes

        # the id: learnt by the proxy from its own Metadata requests to the brokers
        def learnt() -> bool:
            return any(e.get("event") == "guarded_topic_id_learnt" and e.get("topic") == USAGE
                       for e in guarded_proxy.events())

        wait_for(learnt, 10, what="the proxy to learn the usage topic's id")
        direct = _direct_topic_ids(tansu.bootstrap, [USAGE, other])
        fetch = wire.request(1, 13, **_fetch_fields(13, [direct[USAGE], direct[other]]))
        codes = {t.topic_id: int(t.partitions[0].error_code) for t in fetch.responses}
        assert codes == {direct[USAGE]: DENIED, direct[other]: 0}, codes


def test_a_consumer_of_the_usage_topic_gets_topic_authorization_failed(
        guarded_proxy: ProxyProcess) -> None:
    """librdkafka's consumer subscribed to the usage topic: its metadata answers
    TOPIC_AUTHORIZATION_FAILED, which the consumer reports; it reads nothing."""
    consumer = Consumer({"bootstrap.servers": guarded_proxy.bootstrap, "group.id": "snoop",
                         "enable.auto.commit": False})
    errors: list[int] = []
    records = 0
    try:
        consumer.subscribe([USAGE])
        deadline = time.monotonic() + 15
        while not errors and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.2):
                if m.error() is not None:
                    errors.append(m.error().code())
                else:
                    records += 1
    finally:
        consumer.close()
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, errors
    assert records == 0


def _direct_topic_ids(bootstrap: str, names: list[str]) -> dict[str, uuid.UUID]:
    host, port = bootstrap.rsplit(":", 1)
    md: Any = __import__("kio.schema.metadata.v12.request", fromlist=["_"])
    with KafkaWire(host, int(port)) as wire:
        response = wire.request(3, 12, topics=tuple(
            md.MetadataRequestTopic(topic_id=None, name=n) for n in names),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return {t.name: t.topic_id for t in response.topics}


def _fetch_fields(version: int, topics: list[Any], replica_id: int = -1) -> dict[str, Any]:
    module: Any = __import__(f"kio.schema.fetch.v{version}.request", fromlist=["_"])
    key = "topic" if version < 13 else "topic_id"
    return dict(
        replica_id=replica_id, max_wait=timedelta(milliseconds=10), min_bytes=0,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=tuple(module.FetchTopic(**{key: t}, partitions=(module.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20),)) for t in topics),
        forgotten_topics_data=(), rack_id="")


def test_metadata_omits_the_proxys_topics_and_refuses_them_by_name(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """Metadata for all topics leaves them out; naming them (with auto-creation asked)
    answers TOPIC_AUTHORIZATION_FAILED and creates nothing."""
    port = guarded_proxy.broker_port(111)
    other = new_topic(guarded_proxy.bootstrap, "meta")
    md: Any = __import__("kio.schema.metadata.v12.request", fromlist=["_"])
    with KafkaWire("127.0.0.1", port, client_id="meta") as wire:
        everything = wire.request(3, 12, topics=None, allow_auto_topic_creation=True,
                                  include_topic_authorized_operations=False)
        names = {t.name for t in everything.topics}
        assert other in names and not names & set(GUARDED), names
        named = wire.request(3, 12, topics=tuple(
            md.MetadataRequestTopic(topic_id=None, name=n) for n in (*GUARDED, other)),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False)
        codes = {t.name: int(t.error_code) for t in named.topics}
        assert codes == {**dict.fromkeys(GUARDED, DENIED), other: 0}, codes
    direct = AdminClient({"bootstrap.servers": tansu.bootstrap})
    assert VOLUMES not in direct.list_topics(timeout=10).topics
    consumer = Consumer({"bootstrap.servers": guarded_proxy.bootstrap, "group.id": "g"})
    try:
        listed = consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()
    assert other in listed and not set(listed) & set(GUARDED)


def test_a_client_posing_as_a_follower_is_refused_and_stays_throttled(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """Finding 4: Fetch v12 with replica_id=111 for a topic with data: every partition
    TOPIC_AUTHORIZATION_FAILED, no records, never forwarded; the client's consumer quota
    still throttles it."""
    port = guarded_proxy.broker_port(111)
    topic = new_topic(guarded_proxy.bootstrap, "follow", partitions=2)
    producer = Producer({"bootstrap.servers": guarded_proxy.bootstrap})
    for p in (0, 1):
        producer.produce(topic, value=b"v" * 1000, partition=p)
    assert producer.flush(30) == 0
    fetches_before = guarded_proxy.metrics().get('kafka_proxy_requests_total{api="fetch"}', 0)
    throttled = 0
    module: Any = __import__("kio.schema.fetch.v12.request", fromlist=["_"])
    fields = _fetch_fields(12, [topic], replica_id=111)
    fields["topics"] = (dataclass_replace(fields["topics"][0], partitions=tuple(
        module.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0,
                              last_fetched_epoch=-1, log_start_offset=-1,
                              partition_max_bytes=1 << 20) for p in (0, 1))),)
    with KafkaWire("127.0.0.1", port, client_id="follower-poser") as wire:
        for _ in range(40):
            response = wire.request(1, 12, **fields)
            parts = [p for t in response.responses for p in t.partitions]
            # (empty records, as Kafka's error partitions: librdkafka refuses null ones)
            assert [(int(p.error_code), p.high_watermark, p.records) for p in parts] == [
                (DENIED, -1, b"")] * 2, response
            if response.throttle_time.total_seconds() > 0:
                throttled += 1
                break
        # v15+: the replica id in the ReplicaState tagged field, the topic by id
        m15: Any = __import__("kio.schema.fetch.v15.request", fromlist=["_"])
        topic_id = _direct_topic_ids(tansu.bootstrap, [topic])[topic]
        fields = _fetch_fields(15, [topic_id])
        del fields["replica_id"]
        response = wire.request(1, 15, **fields,
                                replica_state=m15.ReplicaState(replica_id=111))
        assert [(t.topic_id, int(p.error_code), p.records) for t in response.responses
                for p in t.partitions] == [(topic_id, DENIED, b"")], response
    assert throttled, "the consumer quota never throttled the follower poser"
    metrics = guarded_proxy.metrics()
    assert metrics.get("kafka_proxy_replica_fetches_refused_total", 0) >= 1, metrics
    assert metrics.get('kafka_proxy_requests_total{api="fetch"}', 0) > fetches_before


def dataclass_replace(value: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(value, **changes)


def test_the_proxys_own_clients_still_use_their_topics(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """The proxy's own overrides writer and reader connect to the brokers directly: an
    AlterClientQuotas answered by the proxy is written to the overrides topic and read
    back (described)."""
    from testkit.quota_admin import Admin

    admin = Admin(guarded_proxy.bootstrap)
    try:
        before = _end_offset(tansu.bootstrap, OVERRIDES)
        assert admin.alter([((("client-id", "someone"),), [("producer_byte_rate", 7e6, False)])]
                           ) == [(0, None)]
        assert _end_offset(tansu.bootstrap, OVERRIDES) == before + 1

        def described() -> bool:
            response = admin.describe([("client-id", 0, "someone")], strict=True)
            return bool(response.entries)

        wait_for(described, 10, what="the override to be read back")
    finally:
        admin.client.close()


def test_a_refused_request_closes_after_what_came_before_it_is_answered(
        tansu: TansuBroker, guarded_proxy: ProxyProcess) -> None:
    """A request the guard must refuse and cannot answer (a follower fetch whose body does
    not parse) closes the connection, as Kafka closes on a request it cannot read; but, as
    Kafka reads one request at a time, the requests pipelined before it are answered first,
    and nothing after it goes upstream."""
    port = guarded_proxy.broker_port(111)
    topic = new_topic(guarded_proxy.bootstrap, "refused")
    md: Any = __import__("kio.schema.metadata.v12.request", fromlist=["_"])
    with KafkaWire("127.0.0.1", port, client_id="pipeliner") as wire:
        before = wire.encode(3, 12, topics=(md.MetadataRequestTopic(topic_id=None, name=topic),),
                             allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False)
        follower = wire.encode(1, 12, **_fetch_fields(12, [topic], replica_id=111))
        # the body cut short within its topics array (the frame's own size still right)
        spoiled = follower[4:-30]
        spoiled = len(spoiled).to_bytes(4, "big") + spoiled
        after = wire.encode(18, 0)
        wire.send_raw(before + spoiled + after)
        answered = _read_response(wire, 3, 12)
        assert [t.name for t in answered.topics] == [topic], answered
        assert wire.is_closed_by_peer(15), "the connection stayed open after the refusal"
    closed = guarded_proxy.metrics()
    assert closed.get(
        'kafka_proxy_guarded_topic_connections_closed_total{reason="replica_fetch_unread"}',
        0) >= 1, {k: v for k, v in closed.items() if "guarded" in k}


@pytest.mark.parametrize("kind", ["unparsed", "guarded_v2"])
def test_a_refused_produce_closes_after_what_came_before_it_is_answered(
        tansu: TansuBroker, guarded_proxy: ProxyProcess, kind: str) -> None:
    """A Produce the guard cannot follow (cut short within its topics, its size right), or a
    Produce v2 naming a guarded topic (no schema to answer it with), is refused as Kafka
    closes on a request it cannot handle: the requests pipelined before it are answered, then
    the connection closes; nothing of it nor after it goes upstream (a good Produce sent after
    it writes nothing)."""
    import struct

    from kafka_quota_proxy.protocol.headers import encode_request_header

    port = guarded_proxy.broker_port(111)
    topic = new_topic(guarded_proxy.bootstrap, "before-produce")
    reason = "produce_unparsed" if kind == "unparsed" else "produce_version"
    counted = f'kafka_proxy_guarded_topic_connections_closed_total{{reason="{reason}"}}'
    closed_before = guarded_proxy.metrics().get(counted, 0)
    md: Any = __import__("kio.schema.metadata.v12.request", fromlist=["_"])
    with KafkaWire("127.0.0.1", port, client_id="pipeliner") as wire:
        before = wire.encode(3, 12, topics=(md.MetadataRequestTopic(topic_id=None, name=topic),),
                             allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False)
        if kind == "unparsed":
            body = _produce_frame(wire, 9, [topic])[4:-20]
        else:  # (v0-2 have no kio schema: acks, timeout, one topic of one partition)
            name, batch = OVERRIDES.encode(), b"\x00" * 61
            body = (encode_request_header(0, 2, 1000, "pipeliner")
                    + struct.pack(">hii", 1, 5000, 1) + struct.pack(">h", len(name)) + name
                    + struct.pack(">iii", 1, 0, len(batch)) + batch)
        refused = len(body).to_bytes(4, "big") + body
        after = _produce_frame(wire, 9, [topic])
        wire.send_raw(before + refused + after)
        answered = _read_response(wire, 3, 12)
        assert [t.name for t in answered.topics] == [topic], answered
        assert wire.is_closed_by_peer(15), "the connection stayed open after the refusal"
    assert _end_offset(tansu.bootstrap, topic) == 0
    assert guarded_proxy.metrics().get(counted, 0) == closed_before + 1
