"""Fetch v16+ responses stream through the proxy: the walker finds the top-level tagged fields
under any chunking, and node_endpoints are rewritten in exactly the same number of bytes (or
dropped when the proxy's address does not fit), so the size prefix sent first stays right."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.incremental import Walker, fetch_response_walk
from kafka_quota_proxy.protocol.primitives import encode_tagged_fields, read_tagged_fields
from kafka_quota_proxy.protocol.response_stream import ResponseStream
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter, fit_tagged_fields
from kafka_quota_proxy.protocol.skim import fetch_response_layout
from testkit.frames import (
    PROXY_HOST,
    RecordingAddressMap,
    chunked,
    kio_decode,
    kio_encode,
    kio_values,
    nested_class,
    response_class,
    response_frame,
)

FETCH = 1
KIO_MAX = apis.kio_version_range(FETCH)[1]
STREAMED = list(range(16, KIO_MAX + 1))
SETTINGS = settings(max_examples=40, deadline=None)


def _without_filler(body: bytes, version: int) -> bytes:
    """The body with any padding tag (unknown to kio, zero-filled) removed from the top-level
    tagged fields, so kio can decode it."""
    tags = fetch_response_layout(body, 0, version).tags_offset
    fields, end = read_tagged_fields(body, tags)
    kept = []
    for tag, a, b in fields:
        if tag == 0:
            kept.append((tag, body[a:b]))
        else:
            assert set(body[a:b]) <= {0}, "only zero-filled padding may be added"
    assert end == len(body)
    return body[:tags] + encode_tagged_fields(kept)


def _no_rewrite(entry: InFlight, frame: Any) -> None:
    raise AssertionError("a streamed Fetch response must not go to the whole-frame rewriter")


def _run_stream(version: int, body: bytes, chunks_of: Any) -> tuple[bytes, ResponseRewriter]:
    table = CorrelationTable()
    table.add(InFlight(FETCH, version, 7, "c", 10, True))
    rewriter = ResponseRewriter(RecordingAddressMap())
    stream = ResponseStream(table, _no_rewrite, tail_rewriter=rewriter.rewrite_tail)
    data = response_frame(FETCH, version, 7, body)
    out: list[bytes] = []
    done = []
    for chunk in chunks_of(data):
        segments, finished = stream.feed(chunk)
        out.extend(bytes(s) for s in segments)
        done.extend(finished)
    assert [e.correlation_id for e in done] == [7]
    assert len(table) == 0
    return b"".join(out), rewriter


@pytest.mark.parametrize("version", [12, 13, 15, *STREAMED])
@SETTINGS
@given(data=st.data())
def test_walker_stops_at_top_level_tags_under_any_chunking(version: int, data: Any) -> None:
    value = data.draw(kio_values(response_class(FETCH, version)))
    frame = response_frame(FETCH, version, 1, kio_encode(value))[4:]  # without size prefix
    header_size = 5  # correlation id + empty header tagged fields
    expected = fetch_response_layout(frame, header_size, version).tags_offset
    walker = Walker(fetch_response_walk(version))
    reached = 0
    for chunk in chunked(frame, data.draw):
        offset = walker.feed(chunk, 0, len(chunk))
        if walker.done and offset < len(chunk):
            reached += offset
            break
        reached += len(chunk)
    assert walker.done
    assert reached == expected


@pytest.mark.parametrize("version", STREAMED)
@SETTINGS
@given(data=st.data())
def test_streamed_fetch_without_node_endpoints_is_byte_identical(version: int, data: Any) -> None:
    value = data.draw(kio_values(response_class(FETCH, version)))
    value = dataclasses.replace(value, node_endpoints=())
    body = kio_encode(value)
    out, _ = _run_stream(version, body, lambda d: chunked(d, data.draw))
    assert out == response_frame(FETCH, version, 7, body)


@pytest.mark.parametrize("version", STREAMED)
@SETTINGS
@given(data=st.data(), host_len=st.integers(min_value=0, max_value=40))
def test_streamed_fetch_node_endpoints_rewritten_in_place(version: int, data: Any,
                                                          host_len: int) -> None:
    cls = response_class(FETCH, version)
    node_cls = nested_class(FETCH, version, "NodeEndpoint")
    value = data.draw(kio_values(cls))
    nodes = tuple(
        node_cls(node_id=i, host="u" * host_len, port=9092 + i, rack=None)
        for i in range(data.draw(st.integers(min_value=1, max_value=3)))
    )
    value = dataclasses.replace(value, node_endpoints=nodes)
    body = kio_encode(value)
    out, rewriter = _run_stream(version, body, lambda d: chunked(d, data.draw))
    original = response_frame(FETCH, version, 7, body)
    assert len(out) == len(original)
    assert out[:4] == original[:4]  # the size prefix that went first is still right
    decoded = kio_decode(cls, _without_filler(out[4 + 5:], version))
    assert dataclasses.replace(decoded, node_endpoints=()) == dataclasses.replace(
        value, node_endpoints=())
    if len(PROXY_HOST) <= host_len:
        # fits: every endpoint now names the proxy
        assert [(n.node_id, n.host, n.port) for n in decoded.node_endpoints] == [
            (n.node_id, PROXY_HOST, 20000 + n.node_id) for n in nodes]
        assert rewriter.node_endpoints_dropped == 0
    else:
        # does not fit: dropped (clients refresh metadata), never leaked
        assert decoded.node_endpoints == ()
        assert rewriter.node_endpoints_dropped == 1
    if host_len >= 4:
        assert b"u" * host_len not in out  # the upstream host is gone either way


@given(
    fields=st.lists(st.tuples(st.integers(0, 120), st.binary(max_size=40)), max_size=4,
                    unique_by=lambda f: f[0]),
    extra=st.integers(min_value=0, max_value=300),
)
def test_fit_tagged_fields_exact_length(fields: list[tuple[int, bytes]], extra: int) -> None:
    length = len(encode_tagged_fields(fields)) + extra
    fitted = fit_tagged_fields(fields, length)
    assert fitted is not None and len(fitted) == length
    parsed, end = read_tagged_fields(fitted, 0)
    assert end == length
    got = {t: fitted[a:b] for t, a, b in parsed}
    for tag, payload in fields:
        assert got.pop(tag) == payload
    assert all(set(p) <= {0} for p in got.values())  # only a zero-filled filler is added
    assert len(got) <= 1


def test_fit_tagged_fields_too_short_is_none() -> None:
    assert fit_tagged_fields([(0, b"abcdef")], 3) is None
