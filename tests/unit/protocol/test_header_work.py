"""Request-header parsing costs work linear in the bytes received, however they are chunked.

A header that trickles in (a hostile one: ``client_id`` null, then a tagged-field count of
0xFFFFFFFF followed by zero bytes, each pair an empty field) used to be parsed again from its
start on every read: 33 s of CPU for one 69 KB header fed 10 bytes at a time. The work is
counted here, not timed: every byte the header parser examines is a unit (10 for the fixed
fields of each attempt, 5 for each varint read, the length of each client id decoded), and
the total must stay within ``C * bytes fed + K`` for any chunking.

Run as a script for the CPU-time figures: ``.venv/bin/python tests/unit/test_header_work.py``.
"""

from __future__ import annotations

import itertools
import random
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kafka_quota_proxy.protocol.headers as headers_mod
import kafka_quota_proxy.protocol.primitives as primitives_mod
import kafka_quota_proxy.protocol.request_stream as stream_mod
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame, ProtocolError
from kafka_quota_proxy.protocol.headers import (
    HeaderProgress,
    encode_request_header,
    parse_request_header,
)
from kafka_quota_proxy.protocol.request_stream import RequestStream
from testkit.frames import produce_body_prefix, tagged_fields_strategy, texts
from testkit.request_reader import reading_stream

MAX_HEADER = 2 * 32767 + 4096  # stream._MAX_HEADER_BYTES
LIMIT_MESSAGE = f"request header longer than {MAX_HEADER} bytes"
PRODUCE = 0

# Work per byte fed (the parse attempt made on each read, varints of at most 5 bytes, ...).
C = 40
K = 1000

ACCEPTED = [
    (key, version)
    for key, entry in sorted(API_TABLE.items())
    for version in range(0, entry[2] + 1)
    if apis.accepts_request_version(key, version)
]
FLEXIBLE = [(k, v) for k, v in ACCEPTED if apis.request_header_version(k, v) >= 2]

SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.data_too_large])


# --------------------------------------------------------------------------- counting work


class Work:
    def __init__(self, budget: int | None) -> None:
        self.units = 0
        self.budget = budget  # fail as soon as the work exceeds it (quadratic work is slow)
        self._built: dict[int, Any] = {}  # headers built so far (kept: ids stay unique)

    def add(self, units: int) -> None:
        self.units += units
        if self.budget is not None and self.units > self.budget:
            raise AssertionError(f"header parsing took more than {self.budget} units of work")

    def parsed(self, header: Any) -> None:
        self.add(10)
        if id(header) not in self._built:  # built now, not returned from ``progress``
            self._built[id(header)] = header
            self.add(len(header.client_id or ""))


@contextmanager
def counting(naive: bool = False, budget: int | None = None) -> Iterator[Work]:
    """Count the header parser's work. ``naive``: every attempt parses from the start of
    the header (``progress`` ignored), as before the fix."""
    work = Work(budget)
    real_read = primitives_mod.read_uvarint
    real_parse = headers_mod.parse_request_header

    def read_uvarint(buf: Any, pos: int) -> tuple[int, int]:
        work.add(5)
        return real_read(buf, pos)

    def parse(buf: Any, pos: int, limit: int, progress: HeaderProgress | None = None) -> Any:
        if naive or progress is None:
            header = real_parse(buf, pos, limit)
        else:
            header = real_parse(buf, pos, limit, progress)
        work.parsed(header)
        return header

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(primitives_mod, "read_uvarint", read_uvarint))
        stack.enter_context(mock.patch.object(headers_mod, "read_uvarint", read_uvarint))
        stack.enter_context(mock.patch.object(stream_mod, "parse_request_header", parse))
        yield work


def summary(e: InFlight) -> tuple[Any, ...]:
    return (e.api_key, e.api_version, e.correlation_id, e.client_id, e.request_size,
            e.expects_response, e.follower)


def run(chunks: list[bytes], stream: RequestStream | None = None) -> list[Any]:
    """Feed ``chunks``; per feed: (forwarded, events, buffered), or the error that ended it."""
    stream = stream or reading_stream(CorrelationTable())
    trace: list[Any] = []
    for chunk in chunks:
        try:
            out, events = stream.feed(chunk)
        except ProtocolError as exc:
            trace.append((type(exc).__name__, exc.reason, str(exc)))
            break
        trace.append((bytes(out), [summary(e) for e in events], stream.buffered))
    return trace


# --------------------------------------------------------------------------- inputs


def hostile_frame(api_key: int, api_version: int, filler: bytes, size: int = 1 << 20) -> bytes:
    """A frame of ``size`` bytes whose header has a null client id and 0xFFFFFFFF tagged
    fields, of which only ``filler`` arrives."""
    head = struct.pack(">hhih", api_key, api_version, 7, -1) + b"\xff\xff\xff\xff\x0f"
    return struct.pack(">i", size) + head + filler


FILLERS = {
    "zeros": b"\x00",  # tag 0, size 0
    "one-byte fields": b"\x01\x01x",  # tag 1, size 1, payload
    "long varints": b"\xff\xff\xff\x7f\x80\x00",  # 4-byte tag, 2-byte size 0
}


@st.composite
def chunkings(draw: Any, data: bytes) -> list[bytes]:
    """Non-empty chunks of ``data``: a random dribble (chunks of at most 1..1000 bytes) or a
    few random cuts."""
    if draw(st.booleans()):
        rnd = random.Random(draw(st.integers(0, 2**32)))
        most = draw(st.sampled_from([1, 2, 3, 10, 64, 1000]))
        chunks, pos = [], 0
        while pos < len(data):
            step = rnd.randint(1, most)
            chunks.append(data[pos : pos + step])
            pos += step
        return chunks or [data]
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=12))
    points = sorted({*cuts, 0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a] or [data]


@st.composite
def hostile_inputs(draw: Any) -> bytes:
    api_key, version = draw(st.sampled_from(FLEXIBLE))
    unit = draw(st.sampled_from(sorted(FILLERS.values())) | st.binary(min_size=1, max_size=6))
    length = draw(st.integers(0, 25_000))
    filler = (unit * (length // len(unit) + 1))[:length]
    return hostile_frame(api_key, version, filler)


@st.composite
def valid_frames(draw: Any, large: bool = True, correlation_id: int = 1) -> bytes:
    """A whole request frame; with ``large``, client ids (and Produce transactional ids) of
    up to 32767 bytes and tagged fields of up to a few KB."""
    api_key, version = draw(st.sampled_from(ACCEPTED))
    if large and draw(st.booleans()):
        char = draw(st.sampled_from("cé"))
        client_id: str | None = char * draw(st.integers(0, 32767 // len(char.encode())))
    else:
        client_id = draw(st.none() | texts(20))
    tags = None
    if apis.request_header_version(api_key, version) >= 2:
        tags = draw(tagged_fields_strategy())
        if large and draw(st.booleans()):
            # (kept, with a transactional id, within the header limit)
            tags = [(tag, payload * draw(st.integers(1, 150))) for tag, payload in tags]
    header = encode_request_header(api_key, version, correlation_id, client_id, tags)
    body = draw(st.binary(max_size=40))
    if api_key == PRODUCE:
        txn = None
        if version >= 3 and draw(st.booleans()):
            txn = "t" * draw(st.integers(0, 32767 if large else 20))
        body = produce_body_prefix(version, draw(st.sampled_from([-1, 0, 1])), txn) + body
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def check_work_bound(data: bytes, chunks: list[bytes]) -> list[Any]:
    with counting(budget=C * len(data) + K) as work:
        trace = run(chunks)
    fed = sum(len(c) for c in chunks[: len(trace)])
    assert work.units <= C * fed + K, (work.units, fed, len(chunks))
    return trace


# --------------------------------------------------------------------------- the work bound


@SLOW
@given(st.data())
def test_hostile_header_work_is_linear_under_any_chunking(data: Any):
    raw = data.draw(hostile_inputs())
    trace = check_work_bound(raw, data.draw(chunkings(raw)))
    assert all(out == b"" and events == [] for out, events, _ in trace)  # (all under the limit)


@SLOW
@given(st.data())
def test_large_valid_header_work_is_linear_under_any_chunking(data: Any):
    raw = data.draw(valid_frames())
    trace = check_work_bound(raw, data.draw(chunkings(raw)))
    assert b"".join(t[0] for t in trace) == raw
    assert sum(len(t[1]) for t in trace) == 1


@SLOW
@given(st.data())
def test_back_to_back_requests_work_is_linear_under_any_chunking(data: Any):
    n = data.draw(st.integers(1, 8))
    large = data.draw(st.booleans())
    raw = b"".join(data.draw(valid_frames(large, correlation_id=i)) for i in range(n))
    trace = check_work_bound(raw, data.draw(chunkings(raw)))
    assert b"".join(t[0] for t in trace) == raw
    assert [e[2] for t in trace for e in t[1]] == list(range(n))


@pytest.mark.parametrize("filler", sorted(FILLERS))
@pytest.mark.parametrize("chunk", [1, 10])
def test_hostile_header_dribbled_closes_at_the_same_limit(filler: str, chunk: int):
    raw = hostile_frame(18, 3, FILLERS[filler] * (MAX_HEADER // len(FILLERS[filler]) + 10))
    chunks = [raw[i : i + chunk] for i in range(0, len(raw), chunk)]
    trace = check_work_bound(raw, chunks)
    # Nothing forwarded, no request, until the read that takes the frame past the limit.
    assert trace[-1] == ("MalformedFrame", "malformed_frame", LIMIT_MESSAGE)
    fed_when_closed = chunk * len(trace)
    assert fed_when_closed > MAX_HEADER >= fed_when_closed - chunk
    assert trace[:-1] == [(b"", [], chunk * (i + 1)) for i in range(len(trace) - 1)]


def test_hostile_header_at_once_closes_with_the_same_error():
    raw = hostile_frame(18, 3, b"\x00" * MAX_HEADER)
    with pytest.raises(MalformedFrame, match=LIMIT_MESSAGE):
        reading_stream(CorrelationTable()).feed(raw)
    assert run([raw[: MAX_HEADER]]) == [(b"", [], MAX_HEADER)]  # just within the limit


def test_work_bound_catches_parsing_again_from_the_start():
    """The measure is not vacuous: parsing from the header's start on every read (as before
    the fix) exceeds the bound on a 4 KB hostile header dribbled 8 bytes at a time."""
    raw = hostile_frame(18, 3, b"\x00" * 4096)
    chunks = [raw[i : i + 8] for i in range(0, len(raw), 8)]
    with counting(naive=True) as naive:
        naive_trace = run(chunks)
    with counting() as resumed:
        assert run(chunks) == naive_trace
    assert resumed.units <= C * len(raw) + K < naive.units
    assert naive.units > 10 * (C * len(raw) + K)


# --------------------------------------------------------------------------- same behaviour


@st.composite
def any_frames(draw: Any) -> bytes:
    """Frames valid or not: declared sizes that end anywhere, header bytes partly random."""
    parts = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["valid", "garbage tags", "random"]))
        if kind == "valid":
            parts.append(draw(valid_frames(large=False, correlation_id=i)))
            continue
        if kind == "garbage tags":
            api_key, version = draw(st.sampled_from(FLEXIBLE))
            client = draw(st.none() | texts(10))
            head = encode_request_header(api_key, version, i, client)[:-1]  # drop count 0
            payload = head + draw(st.binary(max_size=60))
        else:
            payload = draw(st.binary(max_size=60))
        size = draw(st.sampled_from([len(payload)]) | st.integers(0, MAX_HEADER + 100))
        parts.append(struct.pack(">i", size) + payload)
    return b"".join(parts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_resumed_parsing_matches_parsing_from_the_start(data: Any):
    """Per read: the same bytes forwarded, the same requests, the same bytes buffered, the
    same error (type and message) as parsing each header from its start every time."""
    raw = data.draw(any_frames())
    chunks = data.draw(chunkings(raw))
    with counting(naive=True):
        expected = run(chunks)
    assert run(chunks) == expected


@settings(max_examples=300, deadline=None)
@given(
    key_version=st.sampled_from(ACCEPTED),
    client_id=st.none() | texts(30),
    tags=tagged_fields_strategy(),
    garbage=st.booleans(),
    tail=st.binary(max_size=30),
    limits=st.lists(st.integers(0, 120), max_size=8),
)
def test_header_progress_gives_the_same_result_as_a_fresh_parse(
    key_version: tuple[int, int], client_id: str | None, tags: Any, garbage: bool,
    tail: bytes, limits: list[int],
):
    """Attempts on a growing prefix of one header, resumed, fare as fresh ones would."""
    api_key, version = key_version
    if garbage and apis.request_header_version(api_key, version) >= 2:  # tags: random bytes
        buf = encode_request_header(api_key, version, 5, client_id)[:-1] + tail
    else:
        buf = encode_request_header(api_key, version, 5, client_id, tags) + tail
    progress = HeaderProgress()
    for limit in sorted(min(x, len(buf)) for x in [*limits, len(buf)]):
        try:
            expected: Any = parse_request_header(buf, 0, limit)
        except (IndexError, ValueError, struct.error) as exc:
            expected = (type(exc), str(exc))
        try:
            got: Any = parse_request_header(buf, 0, limit, progress)
        except (IndexError, ValueError, struct.error) as exc:
            got = (type(exc), str(exc))
        assert got == expected


# --------------------------------------------------------------------------- figures


def _cpu(raw: bytes, chunk: int) -> tuple[float, str]:
    stream = reading_stream(CorrelationTable())
    outcome = "waiting"
    start = time.process_time()
    try:
        for i in range(0, len(raw), chunk):
            _out, events = stream.feed(raw[i : i + chunk])
            if events:
                outcome = f"{len(events)} request"
    except ProtocolError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return time.process_time() - start, outcome


if __name__ == "__main__":
    chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    cases = {
        "hostile tagged fields": hostile_frame(18, 3, b"\x00" * 80_000),
        "plain 32 KB client id": struct.pack(">i", 1 << 20)
        + encode_request_header(3, 1, 7, "c" * 32767) + b"\x00" * 64,
    }
    for name, raw in cases.items():
        cpu, outcome = _cpu(raw, chunk)
        print(f"{name}, {chunk}-byte chunks: {cpu:.3f} s CPU -> {outcome}")
