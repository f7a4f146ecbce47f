"""Requests the proxy answers itself (``Interest.ANSWERED``): read whole before any byte goes
upstream, whatever reads they arrive in, and their response replaced by the proxy's answer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.client_quota_frames import describe_response
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import FrameTooLarge
from kafka_quota_proxy.protocol.interests import Interest, InterestTable
from kafka_quota_proxy.protocol.request_stream import WHOLE_FRAME_MAX, RequestStream
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
from testkit.frames import request_frame, split
from testkit.request_reader import reading_stream


def _stream() -> RequestStream:
    return reading_stream(CorrelationTable(), copy_frame=lambda e: e.api_key == 48,
                         whole=lambda key, version: key == 48)


def _feed(stream: RequestStream, chunks: list[bytes]) -> tuple[list[bytes], list[InFlight]]:
    forwarded: list[bytes] = []
    events: list[InFlight] = []
    for chunk in chunks:
        out, got = stream.feed(chunk)
        if out:
            forwarded.append(bytes(out))
        events += got
    return forwarded, events


DESCRIBE = request_frame(48, 1, 5, "admin", b"\x01\x00\x00" + b"\x00" * 300)
METADATA = request_frame(3, 12, 6, "admin", b"\x01\x00\x00")
PRODUCE_LIKE = request_frame(18, 3, 7, "admin", b"\x01\x01\x00" + b"\x00" * 200)


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(DESCRIBE) * 3), max_size=30))
def test_an_answered_request_goes_upstream_in_one_piece(cuts: list[int]) -> None:
    data = PRODUCE_LIKE + DESCRIBE + METADATA
    stream = _stream()
    forwarded, events = _feed(stream, split(data, cuts))
    assert b"".join(forwarded) == data  # nothing lost, nothing reordered
    assert [e.api_key for e in events] == [18, 48, 3]
    start = len(PRODUCE_LIKE)
    # the describe frame is within one forwarded piece, and copied whole from it
    offset = 0
    for piece in forwarded:
        if offset <= start < offset + len(piece):
            assert start + len(DESCRIBE) <= offset + len(piece)
        offset += len(piece)
    assert [(e.api_key, frame) for e, frame in stream.copied] == [(48, DESCRIBE[4:])]


def test_nothing_of_it_is_forwarded_until_it_is_whole() -> None:
    stream = _stream()
    forwarded, events = _feed(stream, [DESCRIBE[i:i + 1] for i in range(len(DESCRIBE) - 1)])
    assert forwarded == [] and events == []
    assert stream.mid_frame
    out, got = stream.feed(DESCRIBE[-1:])
    assert bytes(out) == DESCRIBE and [e.correlation_id for e in got] == [5]


def test_other_requests_still_pass_cut_through() -> None:
    stream = _stream()
    out, events = stream.feed(PRODUCE_LIKE[:50])
    assert bytes(out) == PRODUCE_LIKE[:50] and [e.api_key for e in events] == [18]


def test_an_answered_request_over_the_bound_closes_the_connection() -> None:
    frame = struct.pack(">i", WHOLE_FRAME_MAX + 1) + DESCRIBE[4:100]
    with pytest.raises(FrameTooLarge, match="answers it itself"):
        _stream().feed(frame)


def test_answered_implies_the_request_and_the_response_whole() -> None:
    table = InterestTable([lambda key, version: Interest.ANSWERED if key == 48 else
                           Interest.NONE])
    assert table.answered(48, 1) and not table.answered(49, 1)
    assert table.request_frame(48, 0) and (48, 1) in table.response_frames
    assert table.wants_answered and table.wants_request_frames


class _NoAddresses:
    def advertise(self, node_id: int, host: str, port: int, rack: str | None
                  ) -> tuple[str, int]:
        raise AssertionError("no address in an answer")


def test_the_answer_goes_with_the_throttle_set() -> None:
    entry = InFlight(48, 1, 5, "admin", len(DESCRIBE), True)
    entry.answer = describe_response(1, 5, 0, 0, None, [])
    rewriter = ResponseRewriter(_NoAddresses())  # type: ignore[arg-type]
    assert rewriter(entry, b"") == entry.answer
    assert entry.response_size == len(entry.answer) + 4
    entry.throttle_ms = 250
    throttled = rewriter(entry, b"")
    assert throttled is not None and throttled != entry.answer
    assert describe_response(1, 5, 250, 0, None, []) == throttled


def test_a_frame_of_an_api_the_broker_answers_over_the_bound_goes_through_cut_through() -> None:
    """(CreateTopics, read whole for the controller mutation quota): too large to read whole,
    it is forwarded as it comes, and copied unpatchable, instead of closing the
    connection."""
    stream = reading_stream(CorrelationTable(), copy_frame=lambda e: e.api_key in (48, 19),
                           whole=lambda key, version: key in (48, 19))
    big = request_frame(19, 7, 8, "admin", b"\x00" * (WHOLE_FRAME_MAX + 10))
    out, events = stream.feed(big[:1000])
    assert bytes(out) == big[:1000] and [e.api_key for e in events] == [19]
    rest, _ = stream.feed(big[1000:])
    assert bytes(rest) == big[1000:]
    assert [(e.api_key, len(f)) for e, f in stream.copied] == [(19, len(big) - 4)]
