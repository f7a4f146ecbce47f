"""A Fetch response whose first read holds all of it up to its last partition's records is
skimmed there (``skim_fetch_prefix``) and only the rest followed (``fetch_tail``), instead of
being walked field by field (``fetch_response_walk``): what they find is what the walk finds
(the partitions measured, where the top-level tagged fields start, a frame that does not
parse), for every version, any first read and any damage a broker's bytes may carry. Where
the skim cannot tell, it says so (None) and the walk follows the frame."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.incremental import (
    PartitionBytes,
    RecordsTail,
    Walk,
    Walker,
    _skip,
    _skip_tagged_fields,
    fetch_response_walk,
    fetch_tail,
)
from kafka_quota_proxy.protocol.interests import Interest, InterestTable, addresses
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.response_stream import ResponseStarted, ResponseStream
from kafka_quota_proxy.protocol.skim import skim_fetch_prefix
from testkit.frames import (
    damaged_tagged_sections,
    follow_in_pieces,
    kio_encode,
    kio_values,
    ms,
    response_class,
    response_frame,
)

FETCH = 1
LOW, HIGH = apis.kio_version_range(FETCH)
VERSIONS = list(range(LOW, HIGH + 1))

Found = tuple[PartitionBytes | None, int | None] | str


def _walked(frame: bytes, version: int) -> Found:
    """What the walk finds in a whole frame (without its size prefix): the partitions and
    where it stops (None, None: not done at the frame's end), or "failed"."""
    parts: PartitionBytes = []
    walker = Walker(fetch_response_walk(version, parts))
    try:
        upto = walker.feed(frame, 0, len(frame))
    except ValueError:
        return "failed"
    return (parts, upto) if walker.done else (None, None)


def _skimmed(frame: bytes, n: int, version: int) -> Found | None:
    """The same, when only ``frame[:n]`` had arrived at its start: the prefix skimmed, then
    the tail followed over the rest (None where the prefix cannot be skimmed)."""
    prefix = skim_fetch_prefix(memoryview(frame), 0, n, version)
    if prefix is None:
        return None
    assert prefix.records_at <= n
    tail = fetch_tail(prefix.records, version >= 12)
    try:
        upto = tail.feed(frame, prefix.records_at, len(frame))
    except ValueError:
        return "failed"
    return (prefix.parts, upto) if tail.done else (None, None)


def _frame(data: Any, version: int) -> bytes:
    value = data.draw(kio_values(response_class(FETCH, version)))
    return response_frame(FETCH, version, 7, kio_encode(value))[4:]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_skimmed_first_read_finds_what_the_walk_finds(version: int, data: Any) -> None:
    frame = _frame(data, version)
    walked = _walked(frame, version)
    assert walked != "failed" and walked[0] is not None
    for n in sorted({len(frame), *data.draw(st.lists(st.integers(0, len(frame)), max_size=6))}):
        skimmed = _skimmed(frame, n, version)
        if skimmed is not None:
            assert skimmed == walked


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_damaged_response_is_skimmed_as_walked_or_left_to_the_walk(version: int,
                                                                     data: Any) -> None:
    frame = bytearray(_frame(data, version))
    for _ in range(data.draw(st.integers(1, 3))):
        if not frame:
            break
        at = data.draw(st.integers(0, len(frame) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if action == "flip":
            frame[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del frame[at:]
        else:
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    damaged = bytes(frame)
    walked = _walked(damaged, version)
    n = data.draw(st.integers(0, len(damaged)))
    skimmed = _skimmed(damaged, n, version)
    assert skimmed is None or skimmed == walked


def test_the_skim_reads_nothing_past_the_first_read() -> None:
    """Bytes after what has arrived (another response, or garbage) are not looked at: a
    prefix cut short of its last records' size is left to the walk."""
    version = 12
    frame = _one_partition(version, b"r" * 5000)
    prefix = skim_fetch_prefix(memoryview(frame + b"\xff" * 64), 0, 100, version)
    assert prefix is not None and prefix.records == 5000 and prefix.records_at < 100
    records_at = prefix.records_at
    assert skim_fetch_prefix(memoryview(frame), 0, records_at - 1, version) is None


def fetch_tail_walk(records: int, flexible: bool) -> Walk:
    """What ``fetch_response_walk`` does from the start of the last partition's records on:
    the reference ``fetch_tail`` is held to."""
    yield from _skip(records)
    if flexible:
        yield from _skip_tagged_fields()  # the partition's
        yield from _skip_tagged_fields()  # the topic's


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_tail_follower_stops_where_the_walk_stops(data: Any) -> None:
    """``fetch_tail`` against the walk's own steps over the same bytes, records passed
    unseen or fed, in any pieces: the same offsets reached by every feed, done at the same
    place, or both failing."""
    flexible = data.draw(st.booleans())
    records = data.draw(st.integers(0, 50))
    buf = b"r" * records + damaged_tagged_sections(data.draw)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(buf)), max_size=4)))
    pieces = list(zip([0, *cuts], [*cuts, len(buf)], strict=True))
    results = [follow_in_pieces(follower, buf, pieces)
               for follower in (Walker(fetch_tail_walk(records, flexible)),
                                fetch_tail(records, flexible))]
    assert results[0] == results[1]


def _one_partition(version: int, records: bytes) -> bytes:
    """A Fetch response frame (without size prefix) of one topic and one partition."""
    cls = response_class(FETCH, version)
    module = __import__(cls.__module__, fromlist=["PartitionData"])
    partition = module.PartitionData(partition_index=3, error_code=ErrorCode.none,
                                     high_watermark=10, aborted_transactions=(),
                                     records=records)
    key = {"topic_id": uuid.UUID(int=9)} if version >= 13 else {"topic": "t"}
    topic = module.FetchableTopicResponse(**key, partitions=(partition,))
    top: dict[str, Any] = {"throttle_time": ms(0), "responses": (topic,)}
    if "error_code" in {f.name for f in dataclasses.fields(cls)}:
        top["error_code"] = ErrorCode.none
    return response_frame(FETCH, version, 7, kio_encode(cls(**top)))[4:]


def _fetch_partitions(api_key: int, api_version: int) -> Interest:
    return Interest.FETCH_PARTITIONS if api_key == FETCH else Interest.NONE


MEASURED = InterestTable([addresses, _fetch_partitions])


def _through_stream(version: int, frame: bytes, read: int) -> tuple[bytes, InFlight, Any]:
    """``frame`` from the broker in reads of ``read`` bytes, what ``passable`` allows passed
    unread as the proxy splices it: the bytes the client gets, the request's entry, and the
    stream's follower after the first read."""
    table = CorrelationTable()
    entry = InFlight(FETCH, version, 7, "c", 10, True)
    table.add(entry)
    stream = ResponseStream(table, lambda e, f: None, tail_rewriter=lambda e, tail: tail,
                            interests=MEASURED)
    out: list[bytes] = []
    follower = None
    i = 0
    while i < len(frame):
        k = stream.passable()
        if k:
            stream.passed(k)
            out.append(frame[i:i + k])
            i += k
            continue
        stream.receive_data(frame[i:i + read])
        i += read
        event = stream.next_event()
        while isinstance(event, ResponseStarted):
            event = stream.next_event()
        out.extend(bytes(s) for s in event.segments)
        if follower is None:
            follower = stream._walker
    return b"".join(out), entry, follower


@pytest.mark.parametrize("version", VERSIONS)
def test_a_large_response_is_skimmed_at_its_first_read_and_only_its_tail_followed(
        version: int) -> None:
    """A 200 KB response of one partition, in 16 KiB reads: skimmed at the first, its
    records passed unread, only what follows them read; the client gets the same bytes and
    the partition is measured, as when the walk follows it (a first read of 20 bytes)."""
    body = _one_partition(version, b"r" * 200_000)
    frame = INT32.pack(len(body)) + body
    topic: str | bytes = uuid.UUID(int=9).bytes if version >= 13 else "t"
    for read, follows in ((16384, RecordsTail), (20, Walker)):
        out, entry, follower = _through_stream(version, frame, read)
        assert isinstance(follower, follows)
        if follows is RecordsTail:
            assert follower._walker is None  # (its sections read straight, not walked)
        assert out == frame
        assert entry.partitions == [(topic, 3, 200_000)]
