"""The topic guard's sans-IO parts: the Produce walk that spoils a guarded name before it is
forwarded (whatever reads the frame arrives in), the Produce response put back under the
client's name, Metadata without the guarded topics, the answer to a client posing as a
follower."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.headers import encode_request_header, encode_response_header
from kafka_quota_proxy.protocol.interests import Interest, InterestTable
from kafka_quota_proxy.protocol.request_stream import RequestStream
from kafka_quota_proxy.protocol.topic_fields import (
    TOPIC_AUTHORIZATION_FAILED,
    blank,
    encode,
    metadata_amended,
    read_topics,
    refused_response,
)
from kafka_quota_proxy.protocol.topic_guard import (
    SPOILED,
    GuardedTopics,
    ProduceTopics,
    produce_with_refused,
)
from testkit.frames import frame, split
from testkit.request_reader import reading_stream

GUARDED = "__kafka_quota_proxy_quotas"
OTHER = "orders"
GUARDED_ID = uuid.UUID(int=0xABCDEF)
OTHER_ID = uuid.UUID(int=0x123456)
BATCH = b"\x00" * 61 + b'{"value":1e12}'  # opaque to the walk: skipped by its length


def _module(api_key: int, version: int, kind: str = "request") -> Any:
    cls = (load_request_schema if kind == "request" else load_response_schema)(api_key, version)
    return __import__(cls.__module__, fromlist=["_"])


def _produce(version: int, topics: list[str | uuid.UUID], acks: int = 1) -> bytes:
    m = _module(0, version)
    key = "name" if version < 13 else "topic_id"
    data = tuple(m.TopicProduceData(**{key: t}, partition_data=tuple(
        m.PartitionProduceData(index=i, records=BATCH) for i in (0, 3))) for t in topics)
    value = m.ProduceRequest(transactional_id=None, acks=acks, timeout=timedelta(seconds=5),
                             topic_data=data)
    return frame(encode_request_header(0, version, 9, "p") + encode(value))


def _guard() -> GuardedTopics:
    topics = GuardedTopics([GUARDED, "__kafka_quota_proxy_usage"])
    topics.learn(GUARDED, GUARDED_ID)
    return topics


def _run(data: bytes, chunks: list[bytes]) -> tuple[bytes, RequestStream, list[InFlight]]:
    topics = _guard()
    stream = reading_stream(CorrelationTable(),
                           watch_produce=lambda version: ProduceTopics(version, topics))
    out = b""
    events: list[InFlight] = []
    for chunk in chunks:
        forward, got = stream.feed(chunk)
        out += bytes(forward)
        events += got
    return out, stream, events


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from([3, 8, 9, 12, 13]), data=st.data())
def test_a_guarded_topic_is_spoiled_before_it_is_forwarded(version: int, data: Any) -> None:
    """However the frame is split (down to a byte at a time), what goes upstream is the
    frame with only the guarded name's (or id's) last byte changed, and the walk names the
    guarded topic with its partitions."""
    guarded: str | uuid.UUID = GUARDED if version < 13 else GUARDED_ID
    other: str | uuid.UUID = OTHER if version < 13 else OTHER_ID
    original = _produce(version, [other, guarded])
    cuts = data.draw(st.lists(st.integers(1, len(original) - 1), max_size=12, unique=True))
    if data.draw(st.booleans()):
        cuts = list(range(1, len(original)))
    out, stream, events = _run(original, split(original, sorted(cuts)))
    raw = guarded.encode() if isinstance(guarded, str) else guarded.bytes
    at = original.index(raw) + len(raw) - 1
    assert out == original[:at] + bytes([SPOILED]) + original[at + 1:]
    assert len(events) == 1
    [(entry, watch)] = stream.watched
    assert entry is events[0] and watch.done and not watch.failed
    expected = (GUARDED, None, [0, 3]) if version < 13 else (None, GUARDED_ID, [0, 3])
    assert watch.refused == [expected]


class _Prefixed:
    """A question per topic (``RefusedTopics``), as an ACL check is: names starting with
    ``secret-``, and one id."""

    def refuses_name(self, raw: bytes) -> bool:
        return raw.startswith(b"secret-")

    def refuses_id(self, raw: bytes) -> bool:
        return raw == OTHER_ID.bytes


@settings(max_examples=30, deadline=None)
@given(version=st.sampled_from([3, 9, 13]), data=st.data())
def test_the_walk_asks_any_question_per_topic(version: int, data: Any) -> None:
    refused: str | uuid.UUID = "secret-plans" if version < 13 else OTHER_ID
    kept: str | uuid.UUID = "public" if version < 13 else GUARDED_ID
    original = _produce(version, [kept, refused, kept])
    cuts = sorted(data.draw(st.lists(st.integers(1, len(original) - 1), max_size=8,
                                     unique=True)))
    stream = reading_stream(CorrelationTable(),
                            watch_produce=lambda v: ProduceTopics(v, _Prefixed()))
    out = b"".join(bytes(stream.feed(chunk)[0]) for chunk in split(original, cuts))
    raw = refused.encode() if isinstance(refused, str) else refused.bytes
    at = original.index(raw) + len(raw) - 1
    assert out == original[:at] + bytes([SPOILED]) + original[at + 1:]
    [(_, watch)] = stream.watched
    expected = ("secret-plans", None, [0, 3]) if version < 13 else (None, OTHER_ID, [0, 3])
    assert watch.refused == [expected]


def test_frames_without_a_guarded_topic_pass_unchanged() -> None:
    original = _produce(9, [OTHER]) + _produce(9, [OTHER + "-2"], acks=0)
    # a record that holds the guarded name is not a topic: left alone
    tricky = _produce(9, [OTHER]).replace(b'{"value":1e12}', GUARDED.encode()[:14])
    for data in (original, tricky):
        out, stream, events = _run(data, [data[:50], data[50:]])
        assert out == data and not stream.watched and len(events) == 2 - (data is tricky)


def test_a_produce_the_walk_cannot_follow_is_reported_at_once() -> None:
    good = _produce(9, [OTHER])
    head = 4 + 8 + 2 + 1 + 1  # size, api key/version/correlation, client id "p", header tags
    # after the null transactional_id, acks and timeout: a topic count that never ends
    at = head + 1 + 2 + 4
    broken = good[:at] + b"\xff" * 6 + good[at + 6:]
    topics = _guard()
    stream = reading_stream(CorrelationTable(),
                           watch_produce=lambda version: ProduceTopics(version, topics))
    stream.feed(broken[: at + 7])  # the frame goes on: the failure is known before the rest
    [(_, watch)] = stream.watched
    assert watch.failed


def test_the_produce_response_is_put_back_under_the_clients_name() -> None:
    for version, key, guarded, spoiled in (
            (9, "name", GUARDED, GUARDED[:-1] + "!"),
            (13, "topic_id", GUARDED_ID,
             uuid.UUID(bytes=GUARDED_ID.bytes[:-1] + bytes([SPOILED])))):
        m = _module(0, version, "response")
        part = blank(m.PartitionProduceResponse, index=0)
        value = m.ProduceResponse(responses=(
            m.TopicProduceResponse(**{key: OTHER if version < 13 else OTHER_ID},
                                   partition_responses=(part,)),
            m.TopicProduceResponse(**{key: spoiled}, partition_responses=(
                dataclasses.replace(part, error_code=ErrorCode(3)),))), throttle_time=timedelta(0))
        response = encode_response_header(9, 1) + encode(value)
        refused = [(GUARDED, None, [0, 3])] if version < 13 else [(None, GUARDED_ID, [0, 3])]
        got = response_body(produce_with_refused(response, version, refused), 0, version)
        results = {getattr(r, key): [(p.index, int(p.error_code), p.base_offset)
                                     for p in r.partition_responses] for r in got.responses}
        assert results == {
            OTHER if version < 13 else OTHER_ID: [(0, 0, -1)],
            guarded: [(0, TOPIC_AUTHORIZATION_FAILED, -1), (3, TOPIC_AUTHORIZATION_FAILED, -1)]}


def test_metadata_leaves_the_guarded_topics_out() -> None:
    topics = _guard()
    m = _module(3, 12, "response")
    value = blank(load_response_schema(3, 12), topics=tuple(
        blank(m.MetadataResponseTopic, name=n, topic_id=i)
        for n, i in ((OTHER, OTHER_ID), (GUARDED, GUARDED_ID),
                     ("__kafka_quota_proxy_usage", uuid.uuid4()))))
    everything = metadata_amended(value, 12, (), topics.guarded, False)
    assert [t.name for t in everything.topics] == [OTHER]
    # named: an error for the guarded one (by name; by id the name is null)
    request_m = _module(3, 12)
    request = request_m.MetadataRequest(topics=(
        request_m.MetadataRequestTopic(topic_id=None, name=GUARDED),
        request_m.MetadataRequestTopic(topic_id=GUARDED_ID, name=None)),
        allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    decoded = read_topics(encode_request_header(3, 12, 1, "c") + encode(request), 3, 12)
    named = metadata_amended(value, 12, decoded.refs, topics.guarded, False)
    assert [(t.name, t.topic_id, int(t.error_code)) for t in named.topics] == [
        (OTHER, OTHER_ID, 0), (GUARDED, uuid.UUID(int=0), TOPIC_AUTHORIZATION_FAILED),
        (None, GUARDED_ID, TOPIC_AUTHORIZATION_FAILED)]
    only = metadata_amended(value, 12, decoded.refs[:1], topics.guarded, True)
    assert [t.name for t in only.topics] == [GUARDED]


def test_a_follower_fetch_is_answered_with_every_partition_refused() -> None:
    m = _module(1, 12)
    request = m.FetchRequest(
        replica_id=111, max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, topics=(m.FetchTopic(
            topic=OTHER, partitions=tuple(m.FetchPartition(
                partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20) for p in (0, 1))),),
        forgotten_topics_data=(), rack_id="")
    decoded = read_topics(encode_request_header(1, 12, 4, "c") + encode(request), 1, 12)
    answer = response_body(refused_response(decoded, list(decoded.refs)), 1, 12)
    assert answer.error_code == 0 and answer.session_id == 0
    assert [(t.topic, p.partition_index, int(p.error_code), p.high_watermark,
             p.last_stable_offset, p.log_start_offset, p.records, p.preferred_read_replica)
            for t in answer.responses for p in t.partitions] == [
        (OTHER, p, TOPIC_AUTHORIZATION_FAILED, -1, -1, -1, b"", -1) for p in (0, 1)]


def test_the_replica_state_tag_names_a_follower_from_v15() -> None:
    from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter

    m = _module(1, 15)
    base = dict(max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1, topics=(),
                forgotten_topics_data=(), rack_id="")
    consumer = m.FetchRequest(**base)
    follower = m.FetchRequest(**base, replica_state=m.ReplicaState(replica_id=111))
    for value, expected in ((consumer, False), (follower, True)):
        data = encode_request_header(1, 15, 1, "c") + encode(value)
        entry = InFlight(1, 15, 1, "c", len(data) + 4, True)
        assert TopicGuardFilter._follower(entry, data) is expected


def test_interests_whole_and_produce_topics() -> None:
    table = InterestTable([lambda k, v: Interest.WHOLE_REQUEST if k == 1 else (
        Interest.PRODUCE_TOPICS if k == 0 else Interest.NONE)])
    assert table.whole(1, 12) and not table.whole(0, 9) and not table.answered(1, 12)
    assert table.wants_whole and table.produce_topics
    assert not table.request_frame(1, 12)


def test_guarded_topics_learn_ids_and_search_frames() -> None:
    topics = GuardedTopics([GUARDED])
    assert not topics.learn(OTHER, OTHER_ID) and not topics.learn(GUARDED, uuid.UUID(int=0))
    assert topics.learn(GUARDED, GUARDED_ID) and not topics.learn(GUARDED, GUARDED_ID)
    assert topics.guarded(None, GUARDED_ID) and topics.guarded(GUARDED)
    assert not topics.guarded(OTHER, OTHER_ID)
    assert topics.in_frame(b"xx" + GUARDED_ID.bytes) and topics.in_frame(GUARDED.encode())
    assert not topics.in_frame(OTHER.encode() + OTHER_ID.bytes)


def test_a_response_listing_guarded_topics_unasked_leaves_them_out() -> None:
    """DescribeLogDirs for all topics lists every topic of every directory: the guarded
    ones are taken out."""
    from kafka_quota_proxy.protocol.topic_fields import response_without

    topics = _guard()
    m = _module(35, 4, "response")
    value = blank(load_response_schema(35, 4), results=(blank(
        m.DescribeLogDirsResult, log_dir="/data", topics=tuple(
            blank(m.DescribeLogDirsTopic, name=n) for n in (OTHER, GUARDED))),))
    response = encode_response_header(3, 1) + encode(value)
    got = response_body(response_without(response, 35, 4, topics.ref_guarded) or b"", 35, 4)
    assert [t.name for r in got.results for t in r.topics] == [OTHER]
    assert response_without(encode_response_header(3, 1) + encode(blank(
        load_response_schema(35, 4))), 35, 4, topics.ref_guarded) is None


def test_where_a_reported_frame_starts_is_kept_for_the_read_it_began_in() -> None:
    """``watched_at``: where a Produce frame reported in ``watched`` starts (after its size
    prefix) in the bytes ``feed`` returned, when it began in that read (it can be cut out
    there); none for a frame begun in an earlier read (its first bytes are upstream)."""
    topics = _guard()
    before = frame(encode_request_header(18, 0, 1, "c"))
    produce = _produce(9, [GUARDED])
    stream = reading_stream(CorrelationTable(),
                           watch_produce=lambda version: ProduceTopics(version, topics))
    forward, _ = stream.feed(before + produce)
    [(entry, _)] = stream.watched
    at = stream.watched_at[id(entry)]
    assert at == len(before) + 4 and bytes(forward[at - 4:]) != produce  # (spoiled)
    stream.feed(frame(encode_request_header(18, 0, 2, "c")))  # the next read
    assert not stream.watched_at  # (what it said of the last one is gone)
    stream = reading_stream(CorrelationTable(),
                           watch_produce=lambda version: ProduceTopics(version, topics))
    stream.feed(before + produce[:30])
    assert not stream.watched
    stream.feed(produce[30:])
    [(entry, _)] = stream.watched
    assert entry.api_key == 0 and not stream.watched_at
