"""The part of a request frame that may go upstream without being read
(``RequestStream.passable``, what the proxy splices): the record batches a Produce's walks
skip, short of the frame's last byte. However much of it is passed and however the rest
arrives, what goes upstream, the partitions measured and what the topic guard finds are those
of reading every byte."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from kafka_quota_proxy.protocol.correlation import CorrelationTable
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.incremental import Walker, produce_request_walk
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.protocol.topic_guard import GuardedTopics, ProduceTopics
from testkit.frames import frame
from testkit.request_reader import reading_stream

GUARDED = "__kafka_quota_proxy_quotas"
GUARDED_ID = uuid.UUID(int=0xABCDEF)
VERSIONS = [3, 8, 9, 12, 13]


def _produce(version: int, topics: list[str | uuid.UUID], records: list[bytes],
             correlation: int = 9) -> bytes:
    m = __import__(load_request_schema(0, version).__module__, fromlist=["_"])
    key = "name" if version < 13 else "topic_id"
    data = tuple(m.TopicProduceData(**{key: t}, partition_data=tuple(
        m.PartitionProduceData(index=i, records=r) for i, r in enumerate(records)))
        for t in topics)
    value = m.ProduceRequest(transactional_id=None, acks=1, timeout=timedelta(seconds=5),
                             topic_data=data)
    return frame(encode_request_header(0, version, correlation, "p") + encode(value))


def _stream(copy: bool = False) -> Any:
    guard = GuardedTopics([GUARDED])
    guard.learn(GUARDED, GUARDED_ID)
    return reading_stream(CorrelationTable(), measure_produce=True,
                          copy_frame=(lambda e: True) if copy else None,
                          watch_produce=lambda version: ProduceTopics(version, guard))


def _outcome(stream: Any) -> tuple[Any, ...]:
    return ([e.partitions for e in stream.measured],
            [(w.refused, w.failed, w.done) for _, w in stream.watched])


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_passing_what_passable_allows_changes_nothing(version: int, data: Any) -> None:
    """Two Produce frames back to back, one naming a guarded topic; read in random chunks,
    with random parts of what ``passable`` allows passed instead of read (as a splice moves
    them): the same bytes upstream, in order (the guarded name spoiled as when every byte
    is read), the same partitions measured and the same guard findings."""
    sizes = data.draw(st.lists(st.integers(0, 3000), min_size=1, max_size=3))
    records = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    guarded: str | uuid.UUID = GUARDED if version < 13 else GUARDED_ID
    other: str | uuid.UUID = "orders" if version < 13 else uuid.UUID(int=5)
    original = (_produce(version, [other, guarded], records)
                + _produce(version, [other], records[::-1], correlation=10))

    plain = _stream()
    expected = bytes(plain.feed(original)[0])

    stream = _stream()
    out = bytearray()
    at = passed = 0
    while at < len(original):
        room = stream.passable()
        assert room <= len(original) - at - 1
        if room and data.draw(st.booleans()):
            k = data.draw(st.integers(1, room))
            out += original[at : at + k]  # (moved without being read)
            stream.passed(k)
            at += k
            passed += k
            continue
        k = data.draw(st.integers(1, min(len(original) - at, 4000)))
        out += bytes(stream.feed(original[at : at + k])[0])
        at += k
    assert bytes(out) == expected
    assert _outcome(stream) == _outcome(plain)
    assert not stream.mid_frame and stream.measuring is None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_record_batches_of_a_large_produce_are_passable(version: int) -> None:
    """A librdkafka-sized request (1 MB of records in one partition): once its header and
    the partition's size field are read, every byte of the records is passable but the
    frame's last (v3-v8 end with the records; v9+ with tagged fields after them)."""
    records = b"\x07" * 1_000_000
    topic: str | uuid.UUID = "orders" if version < 13 else uuid.UUID(int=5)
    original = _produce(version, [topic], [records])
    end_of_records = original.index(records) + len(records)
    stream = _stream()
    head = 16 * 1024
    stream.feed(original[:head])
    assert stream.passable() == min(end_of_records, len(original) - 1) - head
    stream.passed(stream.passable())
    stream.feed(original[len(original) - stream.frame_remaining:])
    name = "orders" if version < 13 else uuid.UUID(int=5).bytes
    assert [e.partitions for e in stream.measured] == [[(name, 0, len(records))]]


def test_nothing_is_passable_while_a_frame_is_copied_or_between_frames() -> None:
    original = _produce(9, ["orders"], [b"\x01" * 100_000])
    copying = _stream(copy=True)
    copying.feed(original[:1000])
    assert copying.passable() == 0  # (its filter reads the whole frame)
    stream = _stream()
    assert stream.passable() == 0
    stream.feed(original)
    assert stream.passable() == 0  # (the next frame's header comes first)


def test_a_walk_skipping_passes_over_bytes_it_is_not_given() -> None:
    records = b"\x02" * 5000
    original = _produce(9, ["orders"], [records])[4:]
    parts: list[Any] = []
    walker = Walker(produce_request_walk(9, parts))
    start = original.index(records)
    walker.feed(original, 0, start)
    assert walker.skippable == len(records)
    walker.passed(len(records) - 1)
    assert walker.skippable == 1
    walker.passed(1)
    assert walker.skippable == 0
    walker.feed(original, start + len(records), len(original))
    assert walker.done and parts == [("orders", 0, len(records))]
