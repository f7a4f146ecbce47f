"""Fetch v11+ for rack-aware routing: the request walk, the same-size patch that asks a leader
for nothing of redirected partitions, and the preferred_read_replica splice, checked against
kio for every version."""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from kafka_quota_proxy.protocol.fetch import (
    FINAL_EPOCH,
    FIRST_VERSION,
    ask_for_nothing,
    parse_fetch_request,
    set_preferred_read_replicas,
)
from testkit.frames import kio_decode, kio_encode, kio_values, ms, response_class

FETCH = 1
VERSIONS = list(range(FIRST_VERSION, 19))
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)


def _topic_key(version: int, topic: Any) -> Any:
    if version >= 13:
        return topic.topic_id.bytes if topic.topic_id is not None else bytes(16)
    return topic.topic


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_request_walk_matches_kio(version: int, data: Any) -> None:
    cls = load_request_schema(FETCH, version)
    value = data.draw(kio_values(cls))
    body = kio_encode(value)
    junk = data.draw(st.binary(max_size=7))
    summary = parse_fetch_request(junk + body, len(junk), version)
    assert summary.session_id == value.session_id
    assert summary.session_epoch == value.session_epoch
    assert summary.rack_id == value.rack_id
    replica = value.replica_id if version < 15 else value.replica_state.replica_id
    assert summary.replica_id == replica
    assert summary.topics == tuple(
        (_topic_key(version, t), tuple(p.partition for p in t.partitions)) for t in value.topics
    )
    assert summary.forgotten == tuple(
        (_topic_key(version, t), tuple(t.partitions)) for t in value.forgotten_topics_data
    )


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_truncated_request_raises(version: int, data: Any) -> None:
    body = kio_encode(data.draw(kio_values(load_request_schema(FETCH, version))))
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises((IndexError, ValueError, struct.error)):
        parse_fetch_request(body[:cut], 0, version)


def _listed(value: Any, version: int) -> list[tuple[Any, int]]:
    return [(_topic_key(version, t), p.partition) for t in value.topics for p in t.partitions]


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_asking_for_nothing_keeps_the_frame_and_changes_only_what_it_says(
    version: int, data: Any
) -> None:
    cls = load_request_schema(FETCH, version)
    value = data.draw(kio_values(cls))
    body = kio_encode(value)
    junk = data.draw(st.binary(max_size=7))
    buf = junk + body
    summary = parse_fetch_request(buf, len(junk), version)
    listed = _listed(value, version)
    assert list(summary.listed) == listed
    # max_bytes_at: where each listed partition's partition_max_bytes is
    assert [struct.unpack_from(">i", buf, at)[0] for at in summary.max_bytes_at] == [
        p.partition_max_bytes for t in value.topics for p in t.partitions]
    chosen = data.draw(st.sets(st.sampled_from(listed))) if listed else set()
    # partitions the request does not list are no concern of the patch
    absent = {("absent", 7), (b"\xff" * 16, 3)} - set(listed)
    idle, close = data.draw(st.booleans()), data.draw(st.booleans())
    out = ask_for_nothing(buf, summary, version, chosen | absent, idle=idle, close_session=close)
    assert len(out) == len(buf) and out[: len(junk)] == junk
    topics = tuple(
        dataclasses.replace(t, partitions=tuple(
            dataclasses.replace(p, partition_max_bytes=0)
            if (_topic_key(version, t), p.partition) in chosen else p
            for p in t.partitions))
        for t in value.topics)
    expected = dataclasses.replace(value, topics=topics)
    if idle:
        expected = dataclasses.replace(expected, min_bytes=0, max_bytes=0)
    if close:
        expected = dataclasses.replace(expected, session_epoch=FINAL_EPOCH)
    assert kio_decode(cls, out[len(junk):]) == expected
    changed = [i for i in range(len(buf)) if out[i] != buf[i]]
    if not chosen and not idle and not close:
        assert changed == []
    # every byte changed is in one of the INT32 fields the patch may write
    fields = set(summary.max_bytes_at)
    start = len(junk) + (8 if version < 15 else 4)  # min_bytes
    fields |= {start, start + 4, start + 13}  # min_bytes, max_bytes, session_epoch
    assert all(any(at <= i < at + 4 for at in fields) for i in changed)


def test_asking_a_v15_request_for_nothing() -> None:
    """What librdkafka 2.x sends a leader (Fetch v15, no session, 1 MB per partition, 50 MB
    in all), asked for nothing of partition 0 of two, then of both."""
    cls = load_request_schema(FETCH, 15)
    mod = __import__(cls.__module__, fromlist=["FetchTopic", "FetchPartition"])
    tid = uuid.uuid4()
    value = cls(
        max_wait=datetime.timedelta(milliseconds=500), min_bytes=1, max_bytes=52428800,
        session_id=0, session_epoch=-1,
        topics=(mod.FetchTopic(topic_id=tid, partitions=tuple(
            mod.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1048576)
            for p in (0, 1))),),
        forgotten_topics_data=(), rack_id="b")
    body = kio_encode(value)
    summary = parse_fetch_request(body, 0, 15)
    one = kio_decode(cls, ask_for_nothing(body, summary, 15, {(tid.bytes, 0)}))
    assert [p.partition_max_bytes for p in one.topics[0].partitions] == [0, 1048576]
    assert (one.min_bytes, one.max_bytes, one.session_epoch) == (1, 52428800, -1)
    both = kio_decode(cls, ask_for_nothing(body, summary, 15, {(tid.bytes, 0), (tid.bytes, 1)},
                                           idle=True))
    assert [p.partition_max_bytes for p in both.topics[0].partitions] == [0, 0]
    assert (both.min_bytes, both.max_bytes) == (0, 0)
    assert both.max_wait == value.max_wait and both.rack_id == "b"


def _partitions(value: Any, version: int) -> list[tuple[Any, Any]]:
    return [(_topic_key(version, t), p) for t in value.responses for p in t.partitions]


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_splice_sets_the_replica_and_empties_records_of_chosen_partitions(
    version: int, data: Any
) -> None:
    cls = response_class(FETCH, version)
    value = data.draw(kio_values(cls))
    body = kio_encode(value)
    parts = _partitions(value, version)
    chosen = data.draw(st.sets(st.integers(0, max(len(parts) - 1, 0))))
    seen: list[tuple[Any, int, int]] = []
    order = iter(range(len(parts)))

    def pick(i: int, current: int) -> int:
        """A replica id for partition ``i`` that differs from the broker's own choice."""
        return 1000 + i if current != 1000 + i else 100_000 + i

    def choose(topic: Any, partition: int, current: int) -> int | None:
        i = next(order)
        seen.append((topic, partition, current))
        return pick(i, current) if i in chosen else None

    junk = data.draw(st.binary(max_size=5))
    new, redirects = set_preferred_read_replicas(junk + body, len(junk), version, choose)
    # Every partition was offered to the chooser, in order, with the broker's own choice.
    assert seen == [(k, p.partition_index, p.preferred_read_replica) for k, p in parts]
    picked = [i for i in range(len(parts)) if i in chosen]
    if not picked:
        assert new is None and redirects == []
        return
    assert new is not None and new[: len(junk)] == junk
    out = kio_decode(cls, new[len(junk) :])
    assert [(r.topic, r.partition, r.replica) for r in redirects] == [
        (parts[i][0], parts[i][1].partition_index, pick(i, parts[i][1].preferred_read_replica))
        for i in picked
    ]
    expected = value
    index = 0
    topics = []
    for t in value.responses:
        new_parts = []
        for p in t.partitions:
            if index in chosen:
                p = dataclasses.replace(
                    p, preferred_read_replica=pick(index, p.preferred_read_replica), records=b"")
            new_parts.append(p)
            index += 1
        topics.append(dataclasses.replace(t, partitions=tuple(new_parts)))
    expected = dataclasses.replace(value, responses=tuple(topics))
    assert out == expected


def test_splice_keeps_a_choice_equal_to_the_brokers() -> None:
    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v12.response import FetchableTopicResponse, FetchResponse, PartitionData
    from kio.static.primitive import i32, i64

    part = PartitionData(
        partition_index=i32(0),
        error_code=ErrorCode.none,
        high_watermark=i64(10),
        last_stable_offset=i64(10),
        log_start_offset=i64(0),
        aborted_transactions=None,
        preferred_read_replica=i32(2),
        records=b"abc",
    )
    value = FetchResponse(
        throttle_time=ms(0),
        error_code=ErrorCode.none,
        session_id=i32(0),
        responses=(FetchableTopicResponse(topic="t", partitions=(part,)),),
    )
    body = kio_encode(value)
    assert set_preferred_read_replicas(body, 0, 12, lambda t, p, c: 2) == (None, [])
    new, redirects = set_preferred_read_replicas(body, 0, 12, lambda t, p, c: 3)
    assert new is not None and redirects[0].records_dropped == 4  # varint + 3 bytes
    got = kio_decode(FetchResponse, new)
    assert got.responses[0].partitions[0].preferred_read_replica == 3
    assert got.responses[0].partitions[0].records == b""


def test_old_versions_are_left_alone() -> None:
    assert set_preferred_read_replicas(b"", 0, 10, lambda t, p, c: 1) == (None, [])
    with pytest.raises(ValueError):
        parse_fetch_request(b"", 0, 10)


def test_topic_ids_are_raw_bytes() -> None:
    cls = load_request_schema(FETCH, 13)
    mod = __import__(cls.__module__, fromlist=["FetchTopic", "FetchPartition"])
    tid = uuid.uuid4()
    value = cls(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        topics=(
            mod.FetchTopic(
                topic_id=tid,
                partitions=(
                    mod.FetchPartition(partition=3, fetch_offset=7, partition_max_bytes=100),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="b",
    )
    summary = parse_fetch_request(kio_encode(value), 0, 13)
    assert summary.topics == ((tid.bytes, (3,)),) and summary.rack_id == "b"
    assert summary.from_consumer
