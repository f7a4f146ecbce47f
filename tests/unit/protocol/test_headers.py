"""Request/response headers: round trips, byte-equality with kio, header version choice."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioRequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as KioResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as KioResponseHeaderV1
from kio.static.primitive import i16, i32

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    produce_acks,
)
from kafka_quota_proxy.protocol.primitives import encode_tagged_fields
from testkit.frames import kio_encode, produce_body_prefix, tagged_fields_strategy, texts

INT32_VALUES = st.integers(min_value=-(2**31), max_value=2**31 - 1)
FLEXIBLE = [(k, v) for k, e in API_TABLE.items() for v in range(e[1], e[2] + 1) if 0 <= e[3] <= v]
NON_FLEXIBLE = [
    (k, v) for k, e in API_TABLE.items() for v in range(e[1], e[2] + 1) if not 0 <= e[3] <= v
]
SETTINGS = settings(max_examples=100, deadline=None)


@SETTINGS
@given(
    key_version=st.sampled_from(NON_FLEXIBLE),
    correlation_id=INT32_VALUES,
    client_id=st.none() | texts(40),
    trailing=st.binary(max_size=10),
)
def test_request_header_v1_round_trip_and_matches_kio(
    key_version: tuple[int, int], correlation_id: int, client_id: str | None, trailing: bytes
):
    api_key, version = key_version
    raw = encode_request_header(api_key, version, correlation_id, client_id)
    kio_raw = kio_encode(
        KioRequestHeaderV1(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
    )
    assert raw == kio_raw
    # Parsing stops at the end of the header even with body bytes after it.
    buf = b"\xaa" * 3 + raw + trailing
    header = parse_request_header(buf, 3, len(buf))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        api_key, version, correlation_id, client_id
    )
    assert header.header_version == 1
    assert header.size == len(raw)


@SETTINGS
@given(
    key_version=st.sampled_from(FLEXIBLE),
    correlation_id=INT32_VALUES,
    client_id=st.none() | texts(40),
    tags=tagged_fields_strategy(),
    trailing=st.binary(max_size=10),
)
def test_request_header_v2_round_trip_and_matches_kio(
    key_version: tuple[int, int],
    correlation_id: int,
    client_id: str | None,
    tags: list[tuple[int, bytes]],
    trailing: bytes,
):
    api_key, version = key_version
    plain = encode_request_header(api_key, version, correlation_id, client_id)
    kio_raw = kio_encode(
        KioRequestHeaderV2(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
    )
    # v2 keeps the legacy (int16-length) client id and adds an (empty) tagged-field section.
    assert plain == kio_raw
    assert plain.endswith(b"\x00")
    raw = encode_request_header(api_key, version, correlation_id, client_id, tags)
    assert raw == plain[:-1] + encode_tagged_fields(tags)
    buf = raw + trailing
    header = parse_request_header(buf, 0, len(buf))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        api_key, version, correlation_id, client_id
    )
    assert header.header_version == 2
    assert header.size == len(raw)


@SETTINGS
@given(data=st.data(), key_version=st.sampled_from(FLEXIBLE + NON_FLEXIBLE))
def test_request_header_prefix_raises_index_error(data: Any, key_version: tuple[int, int]):
    api_key, version = key_version
    tags = data.draw(tagged_fields_strategy()) if apis.request_is_flexible(*key_version) else None
    raw = encode_request_header(api_key, version, 1, data.draw(texts(20)), tags)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    # limit before the end of the header; the buffer itself may be longer (next bytes).
    with pytest.raises(IndexError):
        parse_request_header(raw + b"\x00" * 8, 0, cut)


def test_request_header_invalid_utf8_client_id_is_replaced_not_raised():
    raw = struct.pack(">hhih", 3, 1, 1, 2) + b"\xff\xfe"
    header = parse_request_header(raw, 0, len(raw))
    assert header.client_id == "\ufffd\ufffd"


@SETTINGS
@given(correlation_id=INT32_VALUES, trailing=st.binary(max_size=10))
def test_response_header_v0_round_trip_and_matches_kio(correlation_id: int, trailing: bytes):
    raw = encode_response_header(correlation_id, 0)
    assert raw == kio_encode(KioResponseHeaderV0(correlation_id=i32(correlation_id)))
    header = parse_response_header(raw + trailing, 0, len(raw) + len(trailing), 0)
    assert (header.correlation_id, header.header_version, header.size) == (correlation_id, 0, 4)


@SETTINGS
@given(correlation_id=INT32_VALUES, tags=tagged_fields_strategy(), trailing=st.binary(max_size=10))
def test_response_header_v1_round_trip_and_matches_kio(
    correlation_id: int, tags: list[tuple[int, bytes]], trailing: bytes
):
    plain = encode_response_header(correlation_id, 1)
    assert plain == kio_encode(KioResponseHeaderV1(correlation_id=i32(correlation_id)))
    raw = encode_response_header(correlation_id, 1, tags)
    assert raw == plain[:-1] + encode_tagged_fields(tags)
    buf = b"\x01\x02" + raw + trailing
    header = parse_response_header(buf, 2, len(buf), 1)
    assert (header.correlation_id, header.header_version, header.size) == (
        correlation_id, 1, len(raw)
    )


def test_response_header_v1_truncated_tags():
    raw = encode_response_header(5, 1, [(1, b"abcdef")])
    with pytest.raises(IndexError):
        parse_response_header(raw, 0, len(raw) - 1, 1)


# --------------------------------------------------------------------------- header versions


ALL_VERSIONS = [(k, v) for k, e in sorted(API_TABLE.items()) for v in range(e[1], e[2] + 1)]


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_header_versions_match_table_and_kio(api_key: int, version: int):
    _name, _lo, _hi, req_flex, resp_flex = API_TABLE[api_key]
    expected_request = 2 if 0 <= req_flex <= version else 1
    expected_response = 1 if 0 <= resp_flex <= version else 0
    if api_key == apis.ApiKey.API_VERSIONS:
        expected_response = 0  # always v0, so any client can read it
    assert apis.request_header_version(api_key, version) == expected_request
    assert apis.response_header_version(api_key, version) == expected_response
    # ...and kio, which follows Kafka's JSON specs, agrees.
    assert load_request_schema(api_key, version).__header_schema__.__version__ == expected_request
    assert (
        load_response_schema(api_key, version).__header_schema__.__version__ == expected_response
    )


@pytest.mark.parametrize("api_key", sorted(API_TABLE))
def test_header_versions_below_and_above_kio_range(api_key: int):
    _name, lo, hi, req_flex, _resp_flex = API_TABLE[api_key]
    # Versions kio does not know still get a header version from the thresholds.
    for version in (0, lo - 1, hi + 1, hi + 5):
        if version < 0:
            continue
        assert apis.request_header_version(api_key, version) == (
            2 if 0 <= req_flex <= version else 1
        )


def test_unknown_api_key_header_versions():
    assert apis.request_header_version(9999, 3) == 1
    assert apis.response_header_version(9999, 3) == 0


@pytest.mark.parametrize("version", range(0, 6))
def test_api_versions_response_header_is_always_v0(version: int):
    assert apis.response_header_version(apis.ApiKey.API_VERSIONS, version) == 0
    assert apis.request_header_version(apis.ApiKey.API_VERSIONS, version) == (
        2 if version >= 3 else 1
    )


# --------------------------------------------------------------------------- produce acks


@pytest.mark.parametrize(
    ("version", "txn"),
    [(0, None), (2, None), (3, None), (3, "t"), (8, "txn-ü"), (9, None), (9, ""), (13, "x" * 200)],
)
@pytest.mark.parametrize("acks", [-1, 0, 1])
def test_produce_acks(version: int, txn: str | None, acks: int):
    body = b"\x07" * 5 + produce_body_prefix(version, acks, txn) + b"rest"
    assert produce_acks(body, 5, len(body), version) == acks


@pytest.mark.parametrize(("version", "txn"), [(0, None), (3, "abc"), (9, "abc"), (9, None)])
def test_produce_acks_truncated(version: int, txn: str | None):
    body = produce_body_prefix(version, 1, txn)
    acks_end = len(body) - 4  # timeout_ms follows acks
    for limit in range(acks_end):
        with pytest.raises((IndexError, struct.error)):
            produce_acks(body[:limit], 0, limit, version)
    assert produce_acks(body[:acks_end], 0, acks_end, version) == 1
