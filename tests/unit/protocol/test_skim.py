"""skim.py against kio: offsets of throttle_time_ms and the top-level tagged fields.

Truncation behaviour (documented by ``test_truncated_*``): a body cut short anywhere raises
``IndexError`` for flexible versions (every length there is a varint, read by indexing, and
the final bounds check raises ``IndexError``); non-flexible versions raise either
``struct.error`` (an int16/int32 length read past the end) or ``IndexError`` (the final
bounds check). Nothing else is ever raised and nothing is returned for a truncated body.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.primitives import encode_tagged_fields, skip_tagged_fields
from kafka_quota_proxy.protocol.skim import Layout, fetch_response_layout, produce_response_layout
from testkit.frames import kio_decode, kio_encode, kio_values, ms, response_class

PRODUCE, FETCH = 0, 1
PRODUCE_VERSIONS = list(range(API_TABLE[PRODUCE][1], API_TABLE[PRODUCE][2] + 1))
FETCH_VERSIONS = list(range(API_TABLE[FETCH][1], API_TABLE[FETCH][2] + 1))
CASES = [(PRODUCE, v) for v in PRODUCE_VERSIONS] + [(FETCH, v) for v in FETCH_VERSIONS]
LAYOUT = {PRODUCE: produce_response_layout, FETCH: fetch_response_layout}
FLEXIBLE_FROM = {PRODUCE: 9, FETCH: 12}

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)


def test_kio_versions_are_the_ones_skim_is_written_for():
    assert list(range(3, 14)) == PRODUCE_VERSIONS
    assert list(range(4, 19)) == FETCH_VERSIONS


def _throttle_ms(value: Any) -> int:
    return value.throttle_time // datetime.timedelta(milliseconds=1)


def _without_top_level_tags(value: Any) -> Any:
    if hasattr(value, "node_endpoints"):
        return dataclasses.replace(value, node_endpoints=())
    return value


def _check_layout(api_key: int, version: int, value: Any, body: bytes, layout: Layout) -> None:
    assert layout.end == len(body)
    assert struct.unpack_from(">i", body, layout.throttle_offset)[0] == _throttle_ms(value)
    if version < FLEXIBLE_FROM[api_key]:
        assert layout.tags_offset == -1
    else:
        # Independent check: the same message without top-level tagged fields encodes as
        # everything before tags_offset followed by an empty tagged-field section.
        bare = kio_encode(_without_top_level_tags(value))
        assert bare[-1:] == b"\x00"
        assert layout.tags_offset == len(bare) - 1
        assert body[: layout.tags_offset] == bare[:-1]
        assert skip_tagged_fields(body, layout.tags_offset) == len(body)


@pytest.mark.parametrize(("api_key", "version"), CASES)
@SETTINGS
@given(data=st.data())
def test_layout_matches_kio(api_key: int, version: int, data: Any):
    cls = response_class(api_key, version)
    value = data.draw(kio_values(cls))
    body = kio_encode(value)
    assert kio_decode(cls, body) == value  # the generated value survives kio round trip
    layout = LAYOUT[api_key](body, 0, version)
    _check_layout(api_key, version, value, body, layout)

    # Same result from a memoryview and from an offset inside a larger buffer.
    assert LAYOUT[api_key](memoryview(body), 0, version) == layout
    junk = data.draw(st.binary(min_size=1, max_size=9))
    shifted = LAYOUT[api_key](junk + body, len(junk), version)
    assert shifted == Layout(
        layout.throttle_offset + len(junk),
        layout.tags_offset + len(junk) if layout.tags_offset >= 0 else -1,
        layout.end + len(junk),
    )


@pytest.mark.parametrize(
    ("api_key", "version"), [c for c in CASES if c[1] >= FLEXIBLE_FROM[c[0]]]
)
@SETTINGS
@given(
    data=st.data(),
    extra=st.lists(
        st.tuples(st.integers(1, 500), st.binary(max_size=20)), max_size=3, unique_by=lambda t: t[0]
    ),
)
def test_layout_with_unknown_top_level_tags(
    api_key: int, version: int, data: Any, extra: list[tuple[int, bytes]]
):
    """Tagged fields kio does not know (future KIPs) are skipped by length."""
    value = data.draw(kio_values(response_class(api_key, version)))
    body = kio_encode(value)
    tags_offset = LAYOUT[api_key](body, 0, version).tags_offset
    fields = [(0, b"\x01")] if hasattr(value, "node_endpoints") else []  # empty node_endpoints
    new_body = body[:tags_offset] + encode_tagged_fields(fields + extra)
    layout = LAYOUT[api_key](new_body, 0, version)
    assert layout.tags_offset == tags_offset
    assert layout.end == len(new_body)


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_truncated_body_raises(api_key: int, version: int, data: Any):
    body = kio_encode(data.draw(kio_values(response_class(api_key, version))))
    flexible = version >= FLEXIBLE_FROM[api_key]
    expected: tuple[type[Exception], ...] = (
        (IndexError,) if flexible else (IndexError, struct.error)
    )
    cuts = range(len(body)) if len(body) <= 300 else data.draw(
        st.lists(st.integers(0, len(body) - 1), min_size=1, max_size=20)
    )
    for cut in cuts:
        with pytest.raises(expected):
            LAYOUT[api_key](body[:cut], 0, version)


@pytest.mark.parametrize("throttle", [0, 1, 1234, 2**31 - 1])
def test_kio_encodes_i32_timedelta_as_int32_milliseconds(throttle: int):
    from kio.schema.fetch.v4.response import FetchResponse

    body = kio_encode(FetchResponse(throttle_time=ms(throttle), responses=()))
    assert body == struct.pack(">ii", throttle, 0)
    assert fetch_response_layout(body, 0, 4) == Layout(0, -1, 8)


def test_fetch_v12_minimal_layout_by_hand():
    # throttle 7, error 0, session 9, responses [] (compact: 1), tags {} -> exact offsets.
    body = struct.pack(">ihi", 7, 0, 9) + b"\x01" + b"\x00"
    assert fetch_response_layout(body, 0, 12) == Layout(0, 11, 12)


def test_produce_v9_minimal_layout_by_hand():
    # responses [] (compact: 1), throttle 5, tags {}.
    body = b"\x01" + struct.pack(">i", 5) + b"\x00"
    assert produce_response_layout(body, 0, 9) == Layout(1, 5, 6)


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    [
        # Produce v3: one topic "t", then a partition count of 2**31-1 (v3-v7 partitions are
        # fixed-size: the walk reads nothing per partition).
        (PRODUCE, 3, struct.pack(">ih", 1, 1) + b"t" + struct.pack(">i", 2**31 - 1)),
        # Fetch v4: one topic, one partition, then 2**31-1 aborted transactions (16 fixed
        # bytes each, nothing read per entry).
        (
            FETCH,
            4,
            struct.pack(">iih", 0, 1, 1) + b"t" + struct.pack(">i", 1) + b"\x00" * 22
            + struct.pack(">i", 2**31 - 1),
        ),
        # Flexible: a 5-byte varint count.
        (FETCH, 12, struct.pack(">ihi", 0, 0, 0) + b"\xff\xff\xff\xff\x0f"),
        (PRODUCE, 9, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_garbage_array_count_raises_at_once(api_key: int, version: int, body: bytes):
    """A count larger than the bytes left is garbage (every element takes at least one byte):
    it raises IndexError instead of spinning through billions of iterations."""
    with pytest.raises(IndexError):
        LAYOUT[api_key](body, 0, version)
