"""The walk that checks a client's request before kio decodes it (protocol/array_counts.py).

kio's native reader reserves memory for an array's count before reading an element; a failed
allocation aborts the process. Without the walk, the mutated frames below abort the test
process itself (a ten-byte AlterClientQuotas asks for 32 GB)."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from kafka_quota_proxy.protocol import array_counts
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.decoded import request_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.primitives import write_uvarint
from testkit.frames import kio_values, minimal

PAIRS = [(key, v) for key, (_, lo, hi, _, _) in sorted(API_TABLE.items())
         for v in range(lo, hi + 1)]


def _encode(value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return buf.getvalue()


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    return encode_request_header(api_key, version, 7, "tenant") + body


def test_a_ten_byte_request_asking_for_32_gb_is_refused_not_allocated() -> None:
    # AlterClientQuotas v1 (flexible): its entries array's count as a 5-byte varint
    frame = _frame(49, 1, write_uvarint(4_000_000_000 + 1) + b"\0" * 5)
    with pytest.raises(MalformedFrame, match="array count 4000000000"):
        request_body(frame, 49, 1)


def test_a_legacy_count_beyond_the_frame_is_refused() -> None:
    # Metadata v1: topics as a legacy array of 2**31 - 1 (17 GB of reservations)
    frame = _frame(3, 1, (2**31 - 1).to_bytes(4, "big") + b"\0" * 8)
    with pytest.raises(MalformedFrame, match="array count 2147483647"):
        request_body(frame, 3, 1)


@pytest.mark.parametrize(("api_key", "version"), PAIRS)
def test_the_smallest_request_of_every_schema_walks_to_its_end(api_key: int, version: int) -> None:
    data = _encode(minimal(load_request_schema(api_key, version)))
    assert array_counts.check(load_request_schema(api_key, version), data) == len(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_walk_ends_where_kio_ends_on_any_request(data: st.DataObject) -> None:
    api_key, version = data.draw(st.sampled_from(PAIRS))
    cls = load_request_schema(api_key, version)
    encoded = _encode(data.draw(kio_values(cls)))
    _, size = entity_reader(cls)(memoryview(encoded), 0)
    assert array_counts.check(cls, encoded) == size == len(encoded)
    # a frame cut short anywhere is refused by the walk, never read past its end
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1)) if encoded else 0
    if encoded:
        with pytest.raises(array_counts.CountOverrun):
            array_counts.check(cls, encoded[:cut])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_huge_count_anywhere_in_any_request_is_refused_or_harmless(data: st.DataObject) -> None:
    """Any byte of a valid request replaced by a huge count (a 5-byte varint or an int32):
    the proxy's decode raises MalformedFrame or decodes; it never hands kio a count larger
    than the frame (which would abort this process)."""
    api_key, version = data.draw(st.sampled_from(PAIRS))
    cls = load_request_schema(api_key, version)
    encoded = _encode(data.draw(kio_values(cls)))
    at = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    huge = data.draw(st.sampled_from([write_uvarint(2**34), write_uvarint(2**32 + 1),
                                      (2**31 - 1).to_bytes(4, "big"), b"\x7f\xff"]))
    mutated = encoded[:at] + huge + encoded[at + 1:]
    with contextlib.suppress(MalformedFrame):
        request_body(_frame(api_key, version, mutated), api_key, version)
