"""RequestStream / ResponseStream: cut-through framing under arbitrary chunking."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import (
    CorrelationError,
    FrameTooLarge,
    MalformedFrame,
    NegativeFrameSize,
    ProtocolError,
    UnknownApiKey,
    UnsupportedVersion,
)
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.response_stream import Forward, ResponseStarted, ResponseStream
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
from testkit.frames import (
    chunked,
    frame,
    produce_body_prefix,
    request_frame,
    response_frame,
    split,
    tagged_fields_strategy,
    texts,
)
from testkit.request_reader import reading_stream

PRODUCE = 0
METADATA = 3
OFFSET_FETCH = 9

# (api_key, version) pairs the proxy accepts, Produce excluded (it has its own strategy).
ACCEPTED = [
    (key, version)
    for key, entry in sorted(API_TABLE.items())
    for version in range(0, entry[2] + 1)
    if key != PRODUCE and apis.accepts_request_version(key, version)
]
# Responses the stream forwards without holding (no rewrite needed).
PASS_THROUGH = [(k, v) for k, v in ACCEPTED if not apis.needs_response_rewrite(k, v)] + [
    (PRODUCE, v) for v in range(0, 10)
]

INT32_VALUES = st.integers(min_value=-(2**31), max_value=2**31 - 1)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def none_rewriter(entry: InFlight, frame_bytes: bytes) -> bytes | None:
    return None


# --------------------------------------------------------------------------- strategies


@dataclass
class Req:
    data: bytes
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    expects_response: bool
    needed: int  # bytes from the frame start the stream must see before forwarding any


@st.composite
def request_specs(draw: Any, correlation_id: int) -> Req:
    client_id = draw(st.none() | texts(16))
    if draw(st.integers(0, 3)) == 0:
        version = draw(st.integers(min_value=0, max_value=API_TABLE[PRODUCE][2]))
        acks = draw(st.sampled_from([-1, 0, 1]))
        txn = draw(st.none() | texts(10)) if version >= 3 else None
        prefix = produce_body_prefix(version, acks, txn)
        body = prefix + draw(st.binary(max_size=40))
        flexible = apis.request_is_flexible(PRODUCE, version)
        tags = draw(tagged_fields_strategy()) if flexible else None
        header = encode_request_header(PRODUCE, version, correlation_id, client_id, tags)
        data = frame(header + body)
        # acks ends 4 bytes (timeout_ms) before the end of the prefix.
        return Req(data, PRODUCE, version, correlation_id, client_id, acks != 0,
                   4 + len(header) + len(prefix) - 4)
    key, version = draw(st.sampled_from(ACCEPTED))
    tags = draw(tagged_fields_strategy()) if apis.request_is_flexible(key, version) else None
    header = encode_request_header(key, version, correlation_id, client_id, tags)
    data = frame(header + draw(st.binary(max_size=40)))
    return Req(data, key, version, correlation_id, client_id, True, 4 + len(header))


@st.composite
def request_batches(draw: Any, max_size: int = 6) -> list[Req]:
    ids = draw(st.lists(INT32_VALUES, max_size=max_size, unique=True))
    return [draw(request_specs(cid)) for cid in ids]


def expected_request_buffered(reqs: list[Req], fed: int) -> int:
    """Bytes a cut-through request stream may hold after ``fed`` bytes: only the start of a
    frame whose header (and, for Produce, acks) is not complete yet."""
    start = 0
    for r in reqs:
        end = start + len(r.data)
        if start <= fed < end:
            return fed - start if fed < start + r.needed else 0
        start = end
    return 0


# --------------------------------------------------------------------------- requests


@settings(max_examples=120, deadline=None)
@given(data=st.data(), reqs=request_batches())
def test_request_stream_forwards_input_exactly_under_any_chunking(data: Any, reqs: list[Req]):
    payload = b"".join(r.data for r in reqs)
    chunks = chunked(payload, data.draw)
    table = CorrelationTable()
    stream = reading_stream(table)
    forwarded = bytearray()
    events: list[InFlight] = []
    fed = 0
    for chunk in chunks:
        out, evs = stream.feed(chunk)
        forwarded += out
        events += evs
        fed += len(chunk)
        # Cut-through: the stream holds only an incomplete header, never more.
        assert stream.buffered == expected_request_buffered(reqs, fed)
        assert bytes(forwarded) == payload[: fed - stream.buffered]
    assert bytes(forwarded) == payload
    assert stream.buffered == 0

    assert [
        (e.api_key, e.api_version, e.correlation_id, e.client_id, e.request_size,
         e.expects_response)
        for e in events
    ] == [
        (r.api_key, r.api_version, r.correlation_id, r.client_id, len(r.data), r.expects_response)
        for r in reqs
    ]
    assert all(e.response_size == 0 and e.forwarded_at == 0.0 for e in events)
    expected_ids = {r.correlation_id for r in reqs if r.expects_response}
    assert len(table) == len(expected_ids)
    for r in reqs:
        assert (r.correlation_id in table) == r.expects_response


@settings(max_examples=120, deadline=None)
@given(data=st.data(), reqs=request_batches(), stop=st.booleans())
def test_copied_frames_are_whole_and_forwarding_is_unchanged(data: Any, reqs: list[Req],
                                                               stop: bool):
    payload = b"".join(r.data for r in reqs)
    wanted = data.draw(st.sets(st.sampled_from([r.api_key for r in reqs]))) if reqs else set()
    stream = reading_stream(CorrelationTable(), copy_frame=lambda e: e.api_key in wanted)
    forwarded = bytearray()
    for chunk in chunked(payload, data.draw):
        out, _ = stream.feed(chunk, stop_after_frame=stop)
        forwarded += out
        while stream.held:
            out, _ = stream.feed(b"", stop_after_frame=stop)
            forwarded += out
    assert bytes(forwarded) == payload
    assert [(e.correlation_id, bytes(f)) for e, f in stream.copied] == [
        (r.correlation_id, r.data[4:]) for r in reqs if r.api_key in wanted]


PRODUCE_CASES = [
    (version, txn, acks)
    for version in (0, 1, 2, 3, 8, 9, 10, 13)
    for txn in ([None] if version < 3 else [None, "", "my-transactional-id"])  # v3+ only
    for acks in (0, 1, -1)
]


@pytest.mark.parametrize(("version", "txn", "acks"), PRODUCE_CASES)
def test_produce_acks_decides_correlation_entry(version: int, txn: str | None, acks: int):
    body = produce_body_prefix(version, acks, txn) + b"\x00\x00\x00\x00"
    data = request_frame(PRODUCE, version, 42, "producer", body)
    table = CorrelationTable()
    out, events = reading_stream(table).feed(data)
    assert bytes(out) == data
    assert len(events) == 1
    assert events[0].expects_response is (acks != 0)
    assert (42 in table) is (acks != 0)


def test_produce_acks0_v0_acks_is_first_field():
    # v0-v2 have no transactional_id: acks is the first body field. A body starting with
    # 0x0000 must read as acks=0 (if the stream skipped a string here, it would misread).
    body = struct.pack(">hi", 0, 1000) + struct.pack(">i", 0)
    for version in (0, 1, 2):
        table = CorrelationTable()
        _out, events = reading_stream(table).feed(request_frame(PRODUCE, version, 1, "p", body))
        assert events[0].expects_response is False
        assert len(table) == 0
    # ...whereas at v3 the same leading 0x0000 is an empty transactional_id, acks follows.
    body3 = struct.pack(">hhi", 0, 1, 1000)
    table = CorrelationTable()
    _out, events = reading_stream(table).feed(request_frame(PRODUCE, 3, 1, "p", body3))
    assert events[0].expects_response is True
    assert 1 in table


def test_produce_acks_byte_by_byte_waits_for_acks():
    body = produce_body_prefix(9, 0, "txn-id") + b"records"
    data = request_frame(PRODUCE, 9, 7, "p", body)
    table = CorrelationTable()
    stream = reading_stream(table)
    events: list[InFlight] = []
    for i in range(len(data)):
        _out, evs = stream.feed(data[i : i + 1])
        events += evs
    assert len(events) == 1 and events[0].expects_response is False
    assert len(table) == 0


# --------------------------------------------------------------------------- request errors


def test_negative_request_size():
    with pytest.raises(NegativeFrameSize):
        reading_stream(CorrelationTable()).feed(struct.pack(">i", -1))


def test_negative_size_after_a_valid_frame_in_the_same_chunk():
    good = request_frame(METADATA, 1, 1, "c", b"\x00\x00\x00\x00")
    with pytest.raises(NegativeFrameSize):
        reading_stream(CorrelationTable()).feed(good + struct.pack(">i", -5))


@pytest.mark.parametrize("max_bytes", [64, DEFAULT_MAX_FRAME_BYTES])
def test_request_frame_too_large_raised_on_size_bytes_alone(max_bytes: int):
    stream = reading_stream(CorrelationTable(), max_frame_bytes=max_bytes)
    stream.feed(struct.pack(">i", max_bytes + 1)[:3])  # 3 bytes: cannot know yet
    with pytest.raises(FrameTooLarge):
        stream.feed(struct.pack(">i", max_bytes + 1)[3:])  # 4th byte: no body needed


def test_request_frame_at_max_size_is_accepted_and_cut_through():
    header = encode_request_header(METADATA, 1, 5, "c")
    size = 64
    stream = reading_stream(CorrelationTable(), max_frame_bytes=size)
    data = struct.pack(">i", size) + header
    out, events = stream.feed(data)  # header complete, body not: forwarded at once
    assert bytes(out) == data and len(events) == 1
    assert events[0].request_size == size + 4
    rest = b"\x00" * (size - len(header))
    out, events = stream.feed(rest)
    assert bytes(out) == rest and events == []


@pytest.mark.parametrize("api_key", [7, 4, 5, 6, 9999, -1, 32767])
def test_unknown_api_key(api_key: int):
    data = frame(struct.pack(">hhih", api_key, 0, 1, -1) + b"body")
    with pytest.raises(UnknownApiKey):
        reading_stream(CorrelationTable()).feed(data)


def test_unknown_api_key_raised_before_body_arrives():
    data = frame(struct.pack(">hhih", 9999, 0, 1, -1) + b"x" * 1000)
    with pytest.raises(UnknownApiKey):
        reading_stream(CorrelationTable()).feed(data[:20])


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (METADATA, API_TABLE[METADATA][2] + 1),  # address-bearing above kio max
        (PRODUCE, API_TABLE[PRODUCE][2] + 1),
        (1, API_TABLE[1][2] + 1),  # Fetch
        (55, 2),  # DescribeQuorum v2 carries controller endpoints
        (17, 0),  # SaslHandshake v0: raw SASL tokens follow
        (OFFSET_FETCH, -1),
    ],
)
def test_unsupported_request_version(api_key: int, version: int):
    data = frame(struct.pack(">hhih", api_key, version, 1, -1) + b"\x00" * 16)
    with pytest.raises(UnsupportedVersion):
        reading_stream(CorrelationTable()).feed(data)


@pytest.mark.parametrize("size", [0, 1, 3, 9])
def test_complete_frame_with_truncated_header_is_malformed(size: int):
    data = struct.pack(">i", size) + struct.pack(">hhih", METADATA, 1, 1, -1)[:size]
    with pytest.raises(MalformedFrame):
        reading_stream(CorrelationTable()).feed(data)


def test_truncated_header_followed_by_next_frame_is_malformed():
    # size 3 but more bytes (a following frame) already arrived: still malformed.
    data = struct.pack(">i", 3) + b"\x00\x03\x00" + request_frame(METADATA, 1, 1, "c")
    with pytest.raises(MalformedFrame):
        reading_stream(CorrelationTable()).feed(data)


def test_client_id_longer_than_frame_is_malformed():
    data = frame(struct.pack(">hhih", METADATA, 1, 1, 50) + b"short")
    with pytest.raises(MalformedFrame):
        reading_stream(CorrelationTable()).feed(data)


def test_produce_frame_ending_before_acks_is_malformed():
    data = frame(encode_request_header(PRODUCE, 3, 1, "c") + b"\xff\xff\x00")
    with pytest.raises(MalformedFrame):
        reading_stream(CorrelationTable()).feed(data)


def test_incomplete_header_is_held_not_forwarded():
    data = request_frame(METADATA, 1, 9, "a-client-id", b"\x00\x00\x00\x00")
    stream = reading_stream(CorrelationTable())
    out, events = stream.feed(data[:12])
    assert bytes(out) == b"" and events == []
    assert stream.buffered == 12
    out, events = stream.feed(data[12:])
    assert bytes(out) == data and len(events) == 1


def test_duplicate_in_flight_correlation_id():
    table = CorrelationTable()
    stream = reading_stream(table)
    stream.feed(request_frame(METADATA, 1, 77, "c"))
    with pytest.raises(CorrelationError):
        stream.feed(request_frame(OFFSET_FETCH, 1, 77, "c"))


def test_correlation_id_reusable_after_response():
    table = CorrelationTable()
    requests = reading_stream(table)
    responses = ResponseStream(table, none_rewriter)
    requests.feed(request_frame(OFFSET_FETCH, 1, 77, "c"))
    _out, done = responses.feed(response_frame(OFFSET_FETCH, 1, 77, b"body"))
    assert [d.correlation_id for d in done] == [77]
    _out, events = requests.feed(request_frame(OFFSET_FETCH, 1, 77, "c"))
    assert len(events) == 1 and 77 in table


def test_produce_acks0_does_not_occupy_correlation_id():
    table = CorrelationTable()
    stream = reading_stream(table)
    body = produce_body_prefix(9, 0, None)
    stream.feed(request_frame(PRODUCE, 9, 5, "p", body))
    stream.feed(request_frame(PRODUCE, 9, 5, "p", body))  # no duplicate error
    _out, events = stream.feed(request_frame(METADATA, 1, 5, "c"))
    assert events[0].expects_response and 5 in table


# --------------------------------------------------------------------------- responses


@dataclass
class Resp:
    data: bytes
    entry: InFlight
    rewrite: bool


@st.composite
def pass_through_responses(draw: Any, max_size: int = 6) -> list[Resp]:
    ids = draw(st.lists(INT32_VALUES, max_size=max_size, unique=True))
    out = []
    for cid in ids:
        key, version = draw(st.sampled_from(PASS_THROUGH))
        entry = InFlight(key, version, cid, "c", 10, True)
        body = draw(st.binary(max_size=40))
        out.append(Resp(response_frame(key, version, cid, body), entry, False))
    return out


def expected_response_buffered(resps: list[Resp], fed: int) -> int:
    start = 0
    for r in resps:
        end = start + len(r.data)
        if start <= fed < end:
            return fed - start if fed < start + 8 else 0
        start = end
    return 0


@settings(max_examples=120, deadline=None)
@given(data=st.data(), resps=pass_through_responses())
def test_response_stream_pass_through_under_any_chunking(data: Any, resps: list[Resp]):
    table = CorrelationTable()
    for r in resps:
        table.add(r.entry)
    calls: list[Any] = []
    stream = ResponseStream(table, lambda e, f: calls.append(e))  # type: ignore[func-returns-value]
    payload = b"".join(r.data for r in resps)
    out = bytearray()
    done: list[InFlight] = []
    fed = 0
    for chunk in chunked(payload, data.draw):
        segments, finished = stream.feed(chunk)
        for s in segments:
            out += s
        done += finished
        fed += len(chunk)
        assert stream.buffered == expected_response_buffered(resps, fed)
        assert bytes(out) == payload[: fed - stream.buffered]
    assert bytes(out) == payload
    assert calls == []  # pass-through frames never reach the rewriter
    assert [d.correlation_id for d in done] == [r.entry.correlation_id for r in resps]
    assert all(d is r.entry for d, r in zip(done, resps, strict=True))
    assert [d.response_size for d in done] == [len(r.data) for r in resps]
    assert len(table) == 0


@settings(max_examples=120, deadline=None)
@given(data=st.data(), resps=pass_through_responses())
def test_each_response_start_is_an_event_and_the_caller_picks_whole_frames(
        data: Any, resps: list[Resp]):
    """With ``announce``, every response's start is a point where the stream returns, in
    order, under any chunking, before any byte of it is forwarded; the frames the caller asks
    for whole (here: every other one) reach the rewriter whole, the others pass untouched."""
    table = CorrelationTable()
    for r in resps:
        table.add(r.entry)
    rewritten: list[tuple[InFlight, bytes]] = []

    def rewriter(e: InFlight, frame: Any) -> bytes:
        rewritten.append((e, bytes(frame)))
        return b"X" + bytes(frame)

    stream = ResponseStream(table, rewriter, announce=True)
    payload = b"".join(r.data for r in resps)
    expected = b""
    for i, r in enumerate(resps):
        if i % 2 == 0:
            body = b"X" + r.data[4:]
            expected += struct.pack(">i", len(body)) + body
        else:
            expected += r.data
    out = bytearray()
    started: list[InFlight] = []
    done: list[InFlight] = []
    for chunk in chunked(payload, data.draw):
        stream.receive_data(chunk)
        with pytest.raises(RuntimeError):
            stream.receive_data(b"")  # the events of the last data come first
        event = stream.next_event()
        while isinstance(event, ResponseStarted):
            assert event.entry.response_size == len(resps[len(started)].data)
            if len(started) % 2 == 0:
                stream.rewrite_whole()
            started.append(event.entry)
            event = stream.next_event()
        assert isinstance(event, Forward)
        for seg in event.segments:
            out += seg
        done += event.completed
        assert expected.startswith(bytes(out))
    with pytest.raises(RuntimeError):
        stream.rewrite_whole()  # only as the answer to ResponseStarted
    assert started == done == [r.entry for r in resps]
    assert [e for e, _ in rewritten] == [r.entry for r in resps[::2]]
    assert bytes(out) == expected


@st.composite
def mixed_responses(draw: Any) -> list[Resp]:
    n = draw(st.integers(min_value=0, max_value=6))
    ids = draw(st.lists(INT32_VALUES, min_size=n, max_size=n, unique=True))
    out = []
    for cid in ids:
        if draw(st.booleans()):
            version = draw(st.integers(0, API_TABLE[METADATA][2]))
            entry = InFlight(METADATA, version, cid, "c", 10, True)
            body = draw(st.binary(max_size=40))
            out.append(Resp(response_frame(METADATA, version, cid, body), entry, True))
        else:
            version = draw(st.integers(1, API_TABLE[OFFSET_FETCH][2]))
            entry = InFlight(OFFSET_FETCH, version, cid, "c", 10, True)
            body = draw(st.binary(max_size=40))
            out.append(Resp(response_frame(OFFSET_FETCH, version, cid, body), entry, False))
    return out


def fake_rewrite(entry: InFlight, frame_bytes: bytes) -> bytes | None:
    """Deterministic stand-in: even correlation ids are left alone (None); odd ones grow or
    shrink so the size prefix must change."""
    if entry.correlation_id % 2 == 0:
        return None
    if entry.correlation_id % 4 == 1:
        return b"<rewritten>" + frame_bytes[::-1] + b"!" * (entry.correlation_id % 7)
    return frame_bytes[:4]  # correlation id only: a shorter frame


def expected_output_prefix(resps: list[Resp], fed: int) -> bytes:
    """What the response stream must have written after ``fed`` input bytes."""
    out = bytearray()
    start = 0
    for r in resps:
        end = start + len(r.data)
        if r.rewrite:
            if fed < end:
                break
            new = fake_rewrite(r.entry, r.data[4:])
            new = r.data[4:] if new is None else new
            out += frame(new)
        else:
            if fed < start + 8:
                break
            out += r.data[: min(fed, end) - start]
            if fed < end:
                break
        start = end
    return bytes(out)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), resps=mixed_responses())
def test_response_stream_rewrites_only_address_bearing_frames(data: Any, resps: list[Resp]):
    table = CorrelationTable()
    for r in resps:
        table.add(r.entry)
    seen: list[tuple[InFlight, bytes]] = []

    def rewriter(entry: InFlight, frame_view: bytes | memoryview) -> bytes | None:
        assert isinstance(frame_view, (bytes, memoryview))
        frame_bytes = bytes(frame_view)  # a memoryview is only valid during the call
        seen.append((entry, frame_bytes))
        return fake_rewrite(entry, frame_bytes)

    stream = ResponseStream(table, rewriter)
    payload = b"".join(r.data for r in resps)
    out = bytearray()
    done: list[InFlight] = []
    fed = 0
    for chunk in chunked(payload, data.draw):
        segments, finished = stream.feed(chunk)
        for s in segments:
            out += s
        done += finished
        fed += len(chunk)
        assert bytes(out) == expected_output_prefix(resps, fed)
    assert bytes(out) == expected_output_prefix(resps, len(payload))
    # The rewriter saw exactly the Metadata frames, whole, without size prefix, in order.
    assert [(e, f) for e, f in seen] == [(r.entry, r.data[4:]) for r in resps if r.rewrite]
    assert done == [r.entry for r in resps]
    assert [d.response_size for d in done] == [len(r.data) for r in resps]
    assert stream.buffered == 0 and len(table) == 0


def test_rewritten_frame_gets_new_size_prefix():
    table = CorrelationTable()
    table.add(InFlight(METADATA, 1, 3, "c", 10, True))
    stream = ResponseStream(table, lambda e, f: bytes(f) + b"extra-bytes")
    data = response_frame(METADATA, 1, 3, b"abc")
    segments, done = stream.feed(data)
    out = b"".join(bytes(s) for s in segments)
    assert out == frame(data[4:] + b"extra-bytes")
    assert struct.unpack(">i", out[:4])[0] == len(out) - 4
    assert done[0].response_size == len(data)


# --------------------------------------------------------------------------- response errors


def _table_with(*ids: int, api_key: int = OFFSET_FETCH, version: int = 1) -> CorrelationTable:
    table = CorrelationTable()
    for cid in ids:
        table.add(InFlight(api_key, version, cid, "c", 10, True))
    return table


def test_response_with_unknown_correlation_id():
    stream = ResponseStream(_table_with(1), none_rewriter)
    with pytest.raises(CorrelationError):
        stream.feed(response_frame(OFFSET_FETCH, 1, 2, b"body"))


def test_response_correlation_id_answered_twice():
    stream = ResponseStream(_table_with(1), none_rewriter)
    data = response_frame(OFFSET_FETCH, 1, 1, b"body")
    stream.feed(data)
    with pytest.raises(CorrelationError):
        stream.feed(data)


def test_negative_response_size():
    stream = ResponseStream(_table_with(1), none_rewriter)
    with pytest.raises(NegativeFrameSize):
        stream.feed(struct.pack(">ii", -1, 1))


def test_response_frame_too_large_before_body():
    # The 4 size bytes alone are enough: neither the correlation id nor the body is needed.
    stream = ResponseStream(_table_with(1), none_rewriter, max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        stream.feed(struct.pack(">i", 101))


@pytest.mark.parametrize("size", [0, 1, 3])
def test_response_without_room_for_correlation_id(size: int):
    stream = ResponseStream(_table_with(1), none_rewriter)
    with pytest.raises(MalformedFrame):
        stream.feed(struct.pack(">i", size) + b"\x00\x00\x00\x01")


# --------------------------------------------------------------------------- fuzzing


@st.composite
def mutated(draw: Any, data: bytes) -> bytes:
    if not data or draw(st.booleans()):
        return data
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] = draw(st.integers(0, 255))
    return bytes(buf)


@st.composite
def request_fuzz(draw: Any) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            parts.append(draw(st.binary(max_size=24)))
        elif kind == 1:
            parts.append(frame(draw(st.binary(max_size=40))))
        else:
            spec = draw(request_specs(draw(st.integers(0, 5))))
            parts.append(draw(mutated(spec.data)))
    return b"".join(parts)


@FUZZ
@given(data=st.data(), payload=request_fuzz(), max_bytes=st.sampled_from([48, 4096]))
def test_request_stream_fuzz_raises_only_protocol_errors(data: Any, payload: bytes, max_bytes: int):
    stream = reading_stream(CorrelationTable(), max_frame_bytes=max_bytes)
    forwarded = 0
    try:
        for chunk in chunked(payload, data.draw):
            out, _events = stream.feed(chunk)
            forwarded += len(out)
    except ProtocolError:
        return
    assert forwarded + stream.buffered == len(payload)


@FUZZ
@given(payload=st.binary(max_size=64), cuts=st.lists(st.integers(0, 64), max_size=6))
def test_request_stream_raw_bytes_fuzz(payload: bytes, cuts: list[int]):
    stream = reading_stream(CorrelationTable(), max_frame_bytes=1024)
    try:
        for chunk in split(payload, cuts):
            stream.feed(chunk)
    except ProtocolError:
        pass


def _prepopulated(pairs: list[tuple[int, int]]) -> CorrelationTable:
    table = CorrelationTable()
    for cid, (key, version) in enumerate(pairs):
        table.add(InFlight(key, version, cid, "c", 10, True))
    return table


ALL_ACCEPTED = ACCEPTED + [(PRODUCE, v) for v in range(0, API_TABLE[PRODUCE][2] + 1)]


@st.composite
def response_fuzz(draw: Any, pairs: list[tuple[int, int]]) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            parts.append(draw(st.binary(max_size=24)))
        elif kind == 1:
            parts.append(frame(draw(st.binary(max_size=40))))
        else:
            cid = draw(st.integers(0, len(pairs) + 1))
            key, version = pairs[cid] if cid < len(pairs) else (OFFSET_FETCH, 1)
            body = draw(st.binary(max_size=40))
            parts.append(draw(mutated(response_frame(key, version, cid, body))))
    return b"".join(parts)


@FUZZ
@given(data=st.data(), pairs=st.lists(st.sampled_from(ALL_ACCEPTED), max_size=8))
def test_response_stream_fuzz_raises_only_protocol_errors(data: Any, pairs: list[tuple[int, int]]):
    payload = data.draw(response_fuzz(pairs))
    stream = ResponseStream(_prepopulated(pairs), none_rewriter, max_frame_bytes=4096)
    try:
        for chunk in chunked(payload, data.draw):
            stream.feed(chunk)
    except ProtocolError:
        pass


class _Addresses:
    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        return "proxy.example", 20000 + (node_id % 1000)


ADDRESS_BEARING_ACCEPTED = [
    (key, version)
    for key in apis.ADDRESS_BEARING
    for version in range(0, API_TABLE[key][2] + 1)
    if apis.needs_response_rewrite(key, version) and apis.accepts_request_version(key, version)
]


@FUZZ
@given(
    data=st.data(),
    pairs=st.lists(st.sampled_from(ADDRESS_BEARING_ACCEPTED), min_size=1, max_size=8),
)
def test_response_stream_with_real_rewriter_fuzz_raises_only_protocol_errors(
    data: Any, pairs: list[tuple[int, int]]
):
    """Garbage in address-bearing responses must surface as ProtocolError (never as a
    struct.error, IndexError, AttributeError or a kio exception)."""
    payload = data.draw(response_fuzz(pairs))
    stream = ResponseStream(_prepopulated(pairs), ResponseRewriter(_Addresses()))
    try:
        for chunk in chunked(payload, data.draw):
            stream.feed(chunk)
    except ProtocolError:
        pass


def test_long_client_id_accepted_whatever_the_chunking():
    data = request_frame(METADATA, 1, 1, "c" * 5000, b"\x00\x00\x00\x00")
    _out, events = reading_stream(CorrelationTable()).feed(data)  # one chunk: accepted
    assert len(events) == 1
    stream = reading_stream(CorrelationTable())
    stream.feed(data[:4200])  # the header straddles the cut
    _out, events = stream.feed(data[4200:])
    assert len(events) == 1


@settings(max_examples=100, deadline=None)
@given(count=st.integers(1, 40), max_frames=st.integers(1, 12), cut=st.integers(0, 400))
def test_max_frames_reads_at_most_that_many_and_holds_the_rest(count: int, max_frames: int,
                                                               cut: int) -> None:
    """A bound on requests in flight holds whatever one read brings: each feed completes at
    most ``max_frames`` frames, holds the rest unread, and the bytes forwarded over all feeds
    are the input, in order."""
    frames = [struct.pack(">ihhih", 10, 18, 0, i, 0) for i in range(count)]
    data = b"".join(frames)
    stream = reading_stream(CorrelationTable())
    forwarded = bytearray()
    seen: list[int] = []
    for chunk in (data[:cut], data[cut:]):
        out, events = stream.feed(chunk, max_frames=max_frames)
        while True:
            forwarded += out
            assert len(events) <= max_frames
            seen += [e.correlation_id for e in events]
            if not stream.held:
                break
            out, events = stream.feed(b"", max_frames=max_frames)
    assert bytes(forwarded) == data
    assert seen == list(range(count))
