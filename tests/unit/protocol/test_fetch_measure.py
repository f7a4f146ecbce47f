"""The capture's per-partition bytes of Fetch responses and Produce requests: the incremental
walkers read them for every version under any chunking, and the streams measure them on each of
their paths (pass-through, streamed, rewritten whole) without changing a byte."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.incremental import (
    PartitionBytes,
    Walker,
    fetch_response_walk,
    produce_request_walk,
)
from kafka_quota_proxy.protocol.interests import ADDRESSES, Interest, InterestTable, addresses
from kafka_quota_proxy.protocol.response_stream import ResponseStarted, ResponseStream
from testkit.frames import chunked, kio_encode, kio_values, ms, response_class, response_frame
from testkit.request_reader import reading_stream

FETCH = 1
LOW, HIGH = apis.kio_version_range(FETCH)
VERSIONS = list(range(LOW, HIGH + 1))
SETTINGS = settings(max_examples=30, deadline=None)


def expected_parts(value: Any, version: int) -> PartitionBytes:
    out: PartitionBytes = []
    for topic in value.responses:
        if version >= 13:
            key: str | bytes = (topic.topic_id or uuid.UUID(int=0)).bytes
        else:
            key = topic.topic
        for p in topic.partitions:
            out.append((key, p.partition_index, len(p.records) if p.records else 0))
    return out


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_walker_measures_every_partition_under_any_chunking(version: int, data: Any) -> None:
    value = data.draw(kio_values(response_class(FETCH, version)))
    frame = response_frame(FETCH, version, 1, kio_encode(value))[4:]
    parts: PartitionBytes = []
    walker = Walker(fetch_response_walk(version, parts))
    for chunk in chunked(frame, data.draw):
        walker.feed(chunk, 0, len(chunk))
    assert walker.done
    assert parts == expected_parts(value, version)


def _fetch_partitions(api_key: int, api_version: int) -> Interest:
    return Interest.FETCH_PARTITIONS if api_key == FETCH else Interest.NONE


MEASURED = InterestTable([addresses, _fetch_partitions])


def _stream(version: int, body: bytes, chunks: list[bytes], *, rewrite: bool = False,
            measure: bool = True) -> tuple[bytes, InFlight]:
    table = CorrelationTable()
    entry = InFlight(FETCH, version, 7, "c", 10, True)
    table.add(entry)
    rewritten: list[bool] = []

    def rewriter(e: InFlight, frame: Any) -> bytes | None:
        rewritten.append(True)
        return None

    stream = ResponseStream(table, rewriter, tail_rewriter=lambda e, tail: tail,
                            interests=MEASURED if measure else ADDRESSES, announce=True)
    out: list[bytes] = []
    done: list[InFlight] = []
    for chunk in chunks:
        stream.receive_data(chunk)
        event = stream.next_event()
        while isinstance(event, ResponseStarted):
            assert event.entry is entry
            if rewrite:
                stream.rewrite_whole()
            event = stream.next_event()
        out.extend(bytes(s) for s in event.segments)
        done.extend(event.completed)
    assert done == [entry]
    assert stream.in_progress is None
    assert rewritten == ([True] if rewrite else [])
    return b"".join(out), entry


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rewrite", [False, True], ids=["streamed", "rewritten-whole"])
@SETTINGS
@given(data=st.data())
def test_stream_measures_fetch_and_forwards_the_same_bytes(version: int, rewrite: bool,
                                                           data: Any) -> None:
    value = data.draw(kio_values(response_class(FETCH, version)))
    body = kio_encode(value)
    frame = response_frame(FETCH, version, 7, body)
    out, entry = _stream(version, body, chunked(frame, data.draw), rewrite=rewrite)
    assert out == frame
    assert entry.partitions == expected_parts(value, version)


def test_without_measuring_a_fetch_has_no_partitions() -> None:
    version = 12
    body = _one_partition_body(version, b"x" * 50)
    frame = response_frame(FETCH, version, 7, body)
    out, entry = _stream(version, body, [frame], measure=False)
    assert out == frame
    assert entry.partitions is None
    out, entry = _stream(version, body, [frame])
    assert entry.partitions == [("t", 3, 50)]


def _one_partition_body(version: int, records: bytes) -> bytes:
    cls = response_class(FETCH, version)
    module = __import__(cls.__module__, fromlist=["x"])
    partition = module.PartitionData(
        partition_index=3, error_code=ErrorCode.none, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, diverging_epoch=module.EpochEndOffset(),
        current_leader=module.LeaderIdAndEpoch(), snapshot_id=module.SnapshotId(),
        aborted_transactions=(), preferred_read_replica=-1, records=records)
    topic = module.FetchableTopicResponse(topic="t", partitions=(partition,))
    return kio_encode(cls(throttle_time=ms(0), error_code=ErrorCode.none, session_id=0,
                          responses=(topic,)))


@pytest.mark.parametrize("cut", [1, 9, 20])
def test_a_response_that_does_not_parse_passes_unchanged_unmeasured(cut: int) -> None:
    """A Fetch v12 response whose array counts lie is forwarded as it is; only the
    measurement is lost."""
    version = 12
    body = _one_partition_body(version, b"y" * 40)
    # Claim a huge record size: the walk runs past the frame's end.
    bad = bytearray(body)
    at = bad.index(b"y" * 40) - 1  # the compact records length (41 -> 0x29)
    assert bad[at] == 41
    bad[at] = 0x7F  # 126 bytes of records, beyond the frame
    frame = response_frame(FETCH, version, 7, bytes(bad))
    chunks = [frame[:cut], frame[cut:]]
    out, entry = _stream(version, bytes(bad), chunks)
    assert out == frame
    assert entry.partitions is None


PRODUCE = 0
PRODUCE_VERSIONS = list(range(3, apis.kio_version_range(PRODUCE)[1] + 1))


def produce_frame(value: Any, version: int, client_id: str | None, correlation: int = 7
                  ) -> bytes:
    """A whole Produce request frame, size prefix included."""
    payload = encode_request_header(PRODUCE, version, correlation, client_id) + kio_encode(
        value)
    return len(payload).to_bytes(4, "big") + payload


def expected_produce(value: Any, version: int) -> PartitionBytes:
    return [((t.topic_id or uuid.UUID(int=0)).bytes if version >= 13 else t.name, p.index,
             len(p.records or b"")) for t in value.topic_data for p in t.partition_data]


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@SETTINGS
@given(data=st.data(), client_id=st.one_of(st.none(), st.text(max_size=8)))
def test_produce_requests_are_measured_as_they_pass(version: int, data: Any,
                                                   client_id: str | None) -> None:
    """The capture's per-partition bytes of a produce request, read off its size fields
    under any chunking, with the frame forwarded unchanged and nothing copied whole."""
    value = data.draw(kio_values(load_request_schema(PRODUCE, version)))
    frame = produce_frame(value, version, client_id)
    second = produce_frame(value, version, client_id, 8)
    parts: PartitionBytes = []
    walker = Walker(produce_request_walk(version, parts))
    walker.feed(frame, 4, len(frame))
    assert walker.done and parts == expected_produce(value, version)

    stream = reading_stream(CorrelationTable(), measure_produce=True)
    out = b""
    for chunk in chunked(frame + second, data.draw):  # two requests back to back
        forwarded, _ = stream.feed(chunk)
        out += bytes(forwarded)
    assert out == frame + second
    assert [e.partitions for e in stream.measured] == [expected_produce(value, version)] * 2
    assert stream.measuring is None


def test_a_produce_request_that_does_not_parse_passes_unmeasured() -> None:
    # A Produce v3 request claiming 5 topics and carrying none: forwarded all the same (the
    # broker judges it), with no partitions.
    payload = (encode_request_header(PRODUCE, 3, 5, "c") + (-1).to_bytes(2, "big", signed=True)
               + (1).to_bytes(2, "big") + (1000).to_bytes(4, "big") + (5).to_bytes(4, "big"))
    frame = len(payload).to_bytes(4, "big") + payload
    stream = reading_stream(CorrelationTable(), measure_produce=True)
    forwarded, events = stream.feed(frame)
    assert bytes(forwarded) == frame
    assert stream.measured == events and events[0].partitions is None
