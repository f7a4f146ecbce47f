"""ResponseRewriter against kio, for every version kio knows of each address-bearing API."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.apis import ANSWERED_BY_PROXY
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame, ProtocolError
from kafka_quota_proxy.protocol.headers import encode_response_header
from kafka_quota_proxy.protocol.primitives import encode_tagged_fields
from kafka_quota_proxy.protocol.response_stream import ResponseStream
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter, UndecodableResponse
from kafka_quota_proxy.protocol.skim import fetch_response_layout, produce_response_layout
from testkit.frames import (
    PROXY_HOST,
    PROXY_PORT_BASE,
    RecordingAddressMap,
    frame,
    kio_decode,
    kio_encode,
    kio_values,
    minimal,
    ms,
    nested_class,
    proxied,
    response_class,
)

PRODUCE, FETCH, METADATA, FIND_COORDINATOR = 0, 1, 3, 10
SASL_HANDSHAKE, API_VERSIONS, DESCRIBE_QUORUM, DESCRIBE_CLUSTER = 17, 18, 55, 60
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
CORRELATION_ID = 4711


def versions(api_key: int, lowest: int | None = None) -> list[int]:
    lo, hi = API_TABLE[api_key][1], API_TABLE[api_key][2]
    return list(range(lo if lowest is None else lowest, hi + 1))


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header_for(api_key: int, version: int, tags: list[tuple[int, bytes]] | None = None) -> bytes:
    return encode_response_header(
        CORRELATION_ID, apis.response_header_version(api_key, version), tags
    )


def rewrite(
    api_key: int, version: int, body: bytes, head: bytes | None = None
) -> tuple[bytes | None, RecordingAddressMap, bytes]:
    head = header_for(api_key, version) if head is None else head
    addresses = RecordingAddressMap()
    entry = InFlight(api_key, version, CORRELATION_ID, "client", 10, True)
    result = ResponseRewriter(addresses)(entry, head + body)
    return result, addresses, head


def _check_list_rewrite(api_key: int, version: int, value: Any, field: str,
                        id_field: str = "node_id") -> Any:
    """Rewrite ``value``: every entity of ``value.<field>`` gets the proxy address (the rest is
    untouched), the AddressMap saw each one, and an unchanged response is not re-encoded.
    Returns the decoded result (or ``value`` when nothing changed)."""
    entities = getattr(value, field)
    expected = dataclasses.replace(
        value, **{field: tuple(proxied(e, id_field) for e in entities)}
    )
    result, addresses, head = rewrite(api_key, version, kio_encode(value))
    assert addresses.calls == _advertised(entities, id_field)
    if expected == value:
        assert result is None
        return value
    assert result is not None and result.startswith(head)
    decoded = kio_decode(response_class(api_key, version), result[len(head) :])
    assert decoded == expected
    return decoded


def _advertised(entities: tuple[Any, ...], id_field: str = "node_id") -> list[tuple[Any, ...]]:
    return [
        (getattr(e, id_field), e.host, e.port, getattr(e, "rack", None))
        for e in entities
        if getattr(e, id_field) >= 0
    ]


# --------------------------------------------------------------------------- Metadata etc.


@pytest.mark.parametrize("version", versions(METADATA))
@SETTINGS
@given(data=st.data())
def test_metadata(version: int, data: Any):
    value = data.draw(kio_values(response_class(METADATA, version)))
    decoded = _check_list_rewrite(METADATA, version, value, "brokers")
    assert all(
        (b.host, b.port) == (PROXY_HOST, PROXY_PORT_BASE + b.node_id)
        for b in decoded.brokers
        if b.node_id >= 0
    )


@pytest.mark.parametrize("version", versions(DESCRIBE_CLUSTER))
@SETTINGS
@given(data=st.data())
def test_describe_cluster(version: int, data: Any):
    value = data.draw(kio_values(response_class(DESCRIBE_CLUSTER, version)))
    _check_list_rewrite(DESCRIBE_CLUSTER, version, value, "brokers", "broker_id")


def test_describe_cluster_by_hand():
    cls = response_class(DESCRIBE_CLUSTER, 0)
    broker_cls = nested_class(DESCRIBE_CLUSTER, 0, "DescribeClusterBroker")
    value = cls(
        throttle_time=ms(0),
        error_code=ErrorCode(0),
        cluster_id="cluster",
        controller_id=1,
        brokers=(
            broker_cls(broker_id=1, host="kafka-1.internal", port=9092, rack="r1"),
            broker_cls(broker_id=2, host="kafka-2.internal", port=9093, rack=None),
        ),
    )
    result, addresses, head = rewrite(DESCRIBE_CLUSTER, 0, kio_encode(value))
    assert result is not None
    decoded = kio_decode(cls, result[len(head) :])
    assert [(b.broker_id, b.host, b.port, b.rack) for b in decoded.brokers] == [
        (1, PROXY_HOST, 20001, "r1"),
        (2, PROXY_HOST, 20002, None),
    ]
    assert addresses.calls == [
        (1, "kafka-1.internal", 9092, "r1"),
        (2, "kafka-2.internal", 9093, None),
    ]
    assert decoded.cluster_id == "cluster" and decoded.controller_id == 1


@pytest.mark.parametrize("version", versions(FIND_COORDINATOR, lowest=0)[:4])
@SETTINGS
@given(data=st.data())
def test_find_coordinator_single(version: int, data: Any):
    value = data.draw(kio_values(response_class(FIND_COORDINATOR, version)))
    unchanged = value.error_code != 0 or value.node_id < 0
    expected = value if unchanged else proxied(value)
    result, addresses, head = rewrite(FIND_COORDINATOR, version, kio_encode(value))
    assert addresses.calls == ([] if unchanged else _advertised((value,)))
    if expected == value:
        assert result is None
    else:
        assert result is not None and result.startswith(head)
        decoded = kio_decode(response_class(FIND_COORDINATOR, version), result[len(head) :])
        assert decoded == expected


@pytest.mark.parametrize("version", versions(FIND_COORDINATOR, lowest=4))
@SETTINGS
@given(data=st.data())
def test_find_coordinator_batched(version: int, data: Any):
    value = data.draw(kio_values(response_class(FIND_COORDINATOR, version)))
    _check_list_rewrite(FIND_COORDINATOR, version, value, "coordinators")


def test_find_coordinator_forms_cover_all_kio_versions():
    assert versions(FIND_COORDINATOR) == list(range(0, 7))
    for v in range(0, 4):
        assert "coordinators" not in response_class(FIND_COORDINATOR, v).__dataclass_fields__
    for v in range(4, 7):
        assert "coordinators" in response_class(FIND_COORDINATOR, v).__dataclass_fields__


@pytest.mark.parametrize("version", range(0, 4))
def test_find_coordinator_error_untouched(version: int):
    cls = response_class(FIND_COORDINATOR, version)
    fields = cls.__dataclass_fields__
    kwargs: dict[str, Any] = {"error_code": ErrorCode(15), "node_id": -1, "host": "", "port": -1}
    if "throttle_time" in fields:
        kwargs["throttle_time"] = ms(0)
    if "error_message" in fields:
        kwargs["error_message"] = "The coordinator is not available."
    result, addresses, _head = rewrite(FIND_COORDINATOR, version, kio_encode(cls(**kwargs)))
    assert result is None
    assert addresses.calls == []


@pytest.mark.parametrize("version", range(4, 7))
def test_find_coordinator_batched_error_entry_untouched(version: int):
    cls = response_class(FIND_COORDINATOR, version)
    coordinator = nested_class(FIND_COORDINATOR, version, "Coordinator")
    bad = coordinator(key="g1", node_id=-1, host="", port=-1, error_code=ErrorCode(15),
                      error_message="not available")
    good = coordinator(key="g2", node_id=3, host="b3", port=9092, error_code=ErrorCode(0),
                       error_message=None)
    value = cls(throttle_time=ms(5), coordinators=(bad, good))
    result, addresses, head = rewrite(FIND_COORDINATOR, version, kio_encode(value))
    assert result is not None
    decoded = kio_decode(cls, result[len(head) :])
    assert decoded.coordinators == (bad, dataclasses.replace(good, host=PROXY_HOST, port=20003))
    assert addresses.calls == [(3, "b3", 9092, None)]


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(SHARE_FETCH, v) for v in versions(SHARE_FETCH)]
    + [(SHARE_ACKNOWLEDGE, v) for v in versions(SHARE_ACKNOWLEDGE)],
)
@SETTINGS
@given(data=st.data())
def test_share_fetch_and_acknowledge(api_key: int, version: int, data: Any):
    value = data.draw(kio_values(response_class(api_key, version)))
    _check_list_rewrite(api_key, version, value, "node_endpoints")


def test_flexible_response_header_tags_are_preserved():
    cls = response_class(METADATA, 12)
    broker = nested_class(METADATA, 12, "MetadataResponseBroker")
    value = cls(throttle_time=ms(0), brokers=(broker(node_id=7, host="b7", port=9092),), topics=())
    head = header_for(METADATA, 12, [(3, b"header-tag")])
    result, _addresses, _ = rewrite(METADATA, 12, kio_encode(value), head=head)
    assert result is not None and result.startswith(head)
    decoded = kio_decode(cls, result[len(head) :])
    assert decoded.brokers[0].host == PROXY_HOST and decoded.brokers[0].port == 20007


# --------------------------------------------------------------------------- Produce / Fetch


KIP951 = [(PRODUCE, v) for v in versions(PRODUCE, lowest=10)] + [
    (FETCH, v) for v in versions(FETCH, lowest=16)
]
LAYOUT = {PRODUCE: produce_response_layout, FETCH: fetch_response_layout}


def test_kip951_thresholds_match_kio():
    for api_key, first in ((PRODUCE, 10), (FETCH, 16)):
        for v in versions(api_key):
            has = "node_endpoints" in response_class(api_key, v).__dataclass_fields__
            assert has == (v >= first)
            assert apis.needs_response_rewrite(api_key, v) == (v >= first)


@pytest.mark.parametrize(("api_key", "version"), KIP951)
@SETTINGS
@given(data=st.data())
def test_node_endpoints_rewritten(api_key: int, version: int, data: Any):
    cls = response_class(api_key, version)
    endpoint = nested_class(api_key, version, "NodeEndpoint")
    value = data.draw(kio_values(cls))
    nodes = data.draw(st.lists(kio_values(endpoint), min_size=1, max_size=4).map(tuple))
    value = dataclasses.replace(value, node_endpoints=nodes)
    body = kio_encode(value)
    expected = dataclasses.replace(value, node_endpoints=tuple(proxied(n) for n in nodes))
    result, addresses, head = rewrite(api_key, version, body)
    assert addresses.calls == _advertised(nodes)
    if expected == value:
        assert result is None
        return
    assert result is not None and result.startswith(head)
    new_body = result[len(head) :]
    assert kio_decode(cls, new_body) == expected
    # Everything up to the top-level tagged fields (all record batches) is byte-identical.
    tags_offset = LAYOUT[api_key](body, 0, version).tags_offset
    assert new_body[:tags_offset] == body[:tags_offset]


@pytest.mark.parametrize(("api_key", "version"), KIP951)
@SETTINGS
@given(data=st.data())
def test_no_node_endpoints_forwarded_untouched(api_key: int, version: int, data: Any):
    value = data.draw(kio_values(response_class(api_key, version)))
    value = dataclasses.replace(value, node_endpoints=())
    result, addresses, _head = rewrite(api_key, version, kio_encode(value))
    assert result is None
    assert addresses.calls == []


@pytest.mark.parametrize(("api_key", "version"), KIP951)
def test_node_endpoints_with_only_unknown_leaders_untouched(api_key: int, version: int):
    endpoint = nested_class(api_key, version, "NodeEndpoint")
    value = minimal(response_class(api_key, version))
    value = dataclasses.replace(
        value, node_endpoints=(endpoint(node_id=-1, host="", port=-1, rack=None),)
    )
    result, addresses, _head = rewrite(api_key, version, kio_encode(value))
    assert result is None and addresses.calls == []


@pytest.mark.parametrize(("api_key", "version"), KIP951)
def test_unknown_top_level_tags_survive_node_endpoint_rewrite(api_key: int, version: int):
    cls = response_class(api_key, version)
    endpoint = nested_class(api_key, version, "NodeEndpoint")
    value = dataclasses.replace(
        minimal(cls),
        node_endpoints=(endpoint(node_id=4, host="b4", port=9092, rack="rack-a"),),
    )
    body = kio_encode(value)
    tags_offset = LAYOUT[api_key](body, 0, version).tags_offset
    endpoints_tag = body[tags_offset + 1 :]  # count byte, then tag 0 entry
    assert endpoints_tag[0] == 0
    # Rebuild the tag section with an extra future tag 9 after node_endpoints (tag 0).
    payload = kio_encode(endpoint(node_id=4, host="b4", port=9092, rack="rack-a"))
    tags = encode_tagged_fields([(0, b"\x02" + payload), (9, b"future")])
    result, _addresses, head = rewrite(api_key, version, body[:tags_offset] + tags)
    assert result is not None
    new_payload = kio_encode(endpoint(node_id=4, host=PROXY_HOST, port=20004, rack="rack-a"))
    assert result[len(head) :] == body[:tags_offset] + encode_tagged_fields(
        [(0, b"\x02" + new_payload), (9, b"future")]
    )


# --------------------------------------------------------------------------- ApiVersions


# Independent statement of the proxy's version policy (see apis.offered_range).
_KIO_CAPPED = {PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, SHARE_FETCH,
               SHARE_ACKNOWLEDGE,
               SASL_HANDSHAKE, 36}  # SaslHandshake, SaslAuthenticate: read by SASL inspection


def policy(api_key: int, lo: int, hi: int) -> tuple[int, int] | None:
    if api_key not in API_TABLE:
        return None
    if api_key in _KIO_CAPPED:
        hi = min(hi, API_TABLE[api_key][2])
    if api_key in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
        lo = max(lo, API_TABLE[api_key][1])  # every version needs decoding
    if api_key == DESCRIBE_QUORUM:
        hi = min(hi, 1)
    if api_key == SASL_HANDSHAKE:
        lo = max(lo, 1)
    return None if lo > hi else (lo, hi)


API_KEYS = st.one_of(
    st.sampled_from([*sorted(API_TABLE), 4, 5, 6, 7, 9999, -1, 32767, 1000]),
    st.integers(min_value=-(2**15), max_value=2**15 - 1),
)


@st.composite
def api_version_entries(draw: Any, entry_cls: type) -> tuple[Any, ...]:
    keys = draw(st.lists(API_KEYS, max_size=12, unique=True))
    out = []
    for key in keys:
        a, b = sorted(draw(st.lists(st.integers(0, 40), min_size=2, max_size=2)))
        out.append(entry_cls(api_key=key, min_version=a, max_version=b))
    return tuple(out)


def expected_api_keys(entries: tuple[Any, ...], entry: Any) -> tuple[Any, ...]:
    """The broker's entries as the proxy offers them, then the APIs the proxy answers itself
    (whatever the broker said of them)."""
    out = []
    for e in entries:
        if e.api_key in ANSWERED_BY_PROXY:
            continue
        offered = policy(e.api_key, e.min_version, e.max_version)
        if offered is not None:
            out.append(dataclasses.replace(e, min_version=offered[0], max_version=offered[1]))
    out += [entry(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in ANSWERED_BY_PROXY.items()]
    return tuple(out)


ANSWERED = [(48, 0, 1), (49, 0, 1)]


@pytest.mark.parametrize("version", versions(API_VERSIONS))
@SETTINGS
@given(data=st.data())
def test_api_versions(version: int, data: Any):
    cls = response_class(API_VERSIONS, version)
    value = data.draw(kio_values(cls))
    entries = data.draw(api_version_entries(nested_class(API_VERSIONS, version, "ApiVersion")))
    value = dataclasses.replace(value, error_code=ErrorCode(0), api_keys=entries)
    result, addresses, head = rewrite(API_VERSIONS, version, kio_encode(value))
    assert head == struct.pack(">i", CORRELATION_ID)  # header v0 whatever the version
    assert addresses.calls == []
    assert result is not None  # the body is always rebuilt
    assert result.startswith(head)
    decoded = kio_decode(cls, result[len(head) :])
    assert decoded == dataclasses.replace(value, api_keys=expected_api_keys(
        entries, nested_class(API_VERSIONS, version, "ApiVersion")))


@pytest.mark.parametrize("request_version", [1, 2, 3, 4, 5])
def test_api_versions_unsupported_version_answered_as_v0(request_version: int):
    """A broker that does not support the requested version answers error 35 with a v0 body."""
    cls = response_class(API_VERSIONS, 0)
    entry = nested_class(API_VERSIONS, 0, "ApiVersion")
    value = cls(
        error_code=ErrorCode(35),
        api_keys=(
            entry(api_key=API_VERSIONS, min_version=0, max_version=3),
            entry(api_key=METADATA, min_version=0, max_version=99),
            entry(api_key=9999, min_version=0, max_version=1),
        ),
    )
    result, _addresses, head = rewrite(API_VERSIONS, request_version, kio_encode(value))
    assert result is not None
    decoded = kio_decode(cls, result[len(head) :])
    assert decoded.error_code == 35
    assert decoded.api_keys == (
        entry(api_key=API_VERSIONS, min_version=0, max_version=3),
        entry(api_key=METADATA, min_version=0, max_version=API_TABLE[METADATA][2]),
        entry(api_key=48, min_version=0, max_version=1),
        entry(api_key=49, min_version=0, max_version=1),
    )


def test_api_versions_examples():
    cls = response_class(API_VERSIONS, 3)
    entry = nested_class(API_VERSIONS, 3, "ApiVersion")
    broker = [
        (PRODUCE, 0, 99), (FETCH, 0, 99), (METADATA, 0, 99), (9, 0, 9),
        (FIND_COORDINATOR, 0, 99), (SASL_HANDSHAKE, 0, 1), (API_VERSIONS, 0, 9),
        (DESCRIBE_QUORUM, 0, 2), (DESCRIBE_CLUSTER, 0, 99), (7, 0, 3), (SHARE_FETCH, 0, 99),
        (SHARE_ACKNOWLEDGE, 1, 1), (9999, 0, 0),
    ]
    value = cls(
        error_code=ErrorCode(0),
        api_keys=tuple(entry(api_key=k, min_version=a, max_version=b) for k, a, b in broker),
        throttle_time=ms(17),
        finalized_features_epoch=12,
    )
    result, _addresses, head = rewrite(API_VERSIONS, 3, kio_encode(value))
    assert result is not None
    decoded = kio_decode(cls, result[len(head) :])
    assert [(e.api_key, e.min_version, e.max_version) for e in decoded.api_keys] == [
        (PRODUCE, 0, API_TABLE[PRODUCE][2]),
        (FETCH, 0, API_TABLE[FETCH][2]),
        (METADATA, 0, API_TABLE[METADATA][2]),
        (9, 0, 9),  # not address-bearing: the broker's range
        (FIND_COORDINATOR, 0, API_TABLE[FIND_COORDINATOR][2]),
        (SASL_HANDSHAKE, 1, 1),
        (API_VERSIONS, 0, 9),  # not capped: only its api_keys array is edited
        (DESCRIBE_QUORUM, 0, 1),
        (DESCRIBE_CLUSTER, 0, API_TABLE[DESCRIBE_CLUSTER][2]),
        (SHARE_FETCH, 1, API_TABLE[SHARE_FETCH][2]),
        (SHARE_ACKNOWLEDGE, 1, 1),
        *ANSWERED,  # answered by the proxy itself, which the broker did not offer
    ]
    assert decoded.throttle_time == ms(17)
    assert decoded.finalized_features_epoch == 12


def test_api_versions_sasl_handshake_v0_only_is_hidden():
    cls = response_class(API_VERSIONS, 0)
    entry = nested_class(API_VERSIONS, 0, "ApiVersion")
    value = cls(error_code=ErrorCode(0),
                api_keys=(entry(api_key=SASL_HANDSHAKE, min_version=0, max_version=0),))
    result, _addresses, head = rewrite(API_VERSIONS, 0, kio_encode(value))
    assert result is not None
    assert [(e.api_key, e.min_version, e.max_version)
            for e in kio_decode(cls, result[len(head) :]).api_keys] == ANSWERED


def test_api_versions_entry_tags_and_trailing_fields_preserved_raw():
    # v3 body by hand: entries carry tagged fields kio would reject; they must survive.
    def entry(key: int, lo: int, hi: int, tags: list[tuple[int, bytes]]) -> bytes:
        return struct.pack(">hhh", key, lo, hi) + encode_tagged_fields(tags)

    trailing = struct.pack(">i", 99) + encode_tagged_fields([(3, b"\x01"), (42, b"future")])
    body = (
        struct.pack(">h", 0)
        + bytes([4])  # compact array of 3
        + entry(METADATA, 0, 99, [(7, b"m")])
        + entry(9999, 0, 1, [(1, b"gone")])
        + entry(9, 1, 8, [(2, b"kept")])
        + trailing
    )
    result, _addresses, head = rewrite(API_VERSIONS, 3, body)
    assert result is not None
    assert result[len(head) :] == (
        struct.pack(">h", 0)
        + bytes([5])
        + entry(METADATA, 0, API_TABLE[METADATA][2], [(7, b"m")])
        + entry(9, 1, 8, [(2, b"kept")])
        + entry(48, 0, 1, [])
        + entry(49, 0, 1, [])
        + trailing
    )


# --------------------------------------------------------------------------- undecodable


@pytest.mark.parametrize("version", versions(METADATA, lowest=9))
def test_metadata_with_unknown_top_level_tag_is_undecodable(version: int):
    cls = response_class(METADATA, version)
    broker = nested_class(METADATA, version, "MetadataResponseBroker")
    value = dataclasses.replace(
        minimal(cls), brokers=(broker(node_id=1, host="b1", port=9092),)
    )
    body = kio_encode(value)
    assert body.endswith(b"\x00")
    body = body[:-1] + encode_tagged_fields([(77, b"future")])
    with pytest.raises(UndecodableResponse) as info:
        rewrite(METADATA, version, body)
    assert isinstance(info.value, ProtocolError) and isinstance(info.value, MalformedFrame)
    assert info.value.reason == "undecodable_response"


@pytest.mark.parametrize("version", [0, 5, 8, 12])
def test_metadata_with_trailing_bytes_is_undecodable(version: int):
    value = minimal(response_class(METADATA, version))
    with pytest.raises(UndecodableResponse):
        rewrite(METADATA, version, kio_encode(value) + b"\x00")


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(METADATA, 0), (METADATA, 13), (FIND_COORDINATOR, 2), (FIND_COORDINATOR, 6),
     (DESCRIBE_CLUSTER, 1), (SHARE_FETCH, 1), (SHARE_ACKNOWLEDGE, 2), (PRODUCE, 10),
     (FETCH, 17)],
)
def test_truncated_bodies_are_undecodable(api_key: int, version: int):
    cls = response_class(api_key, version)
    value = minimal(cls)
    if "node_endpoints" in cls.__dataclass_fields__:
        endpoint = nested_class(api_key, version, "NodeEndpoint")
        value = dataclasses.replace(
            value, node_endpoints=(endpoint(node_id=1, host="h", port=1, rack=None),)
        )
    body = kio_encode(value)
    for cut in range(len(body)):
        with pytest.raises(UndecodableResponse):
            rewrite(api_key, version, body[:cut])


@pytest.mark.parametrize("version", [0, 3])
def test_truncated_api_versions_key_array_is_undecodable(version: int):
    """Only the leading api_keys array is parsed; a body cut inside it is undecodable. (What
    follows the array is copied through unparsed, as any pass-through bytes are.)"""
    cls = response_class(API_VERSIONS, version)
    entry = nested_class(API_VERSIONS, version, "ApiVersion")
    value = dataclasses.replace(
        minimal(cls),
        api_keys=(
            entry(api_key=METADATA, min_version=0, max_version=99),
            entry(api_key=9, min_version=0, max_version=9),
        ),
    )
    body = kio_encode(value)
    array_end = 2 + (1 if version >= 3 else 4) + 2 * (6 + (1 if version >= 3 else 0))
    for cut in range(array_end):
        with pytest.raises(UndecodableResponse):
            rewrite(API_VERSIONS, version, body[:cut])
    result, _addresses, _head = rewrite(API_VERSIONS, version, body[:array_end])
    assert result is not None


@pytest.mark.parametrize(("api_key", "version"), [(METADATA, 9), (PRODUCE, 10), (FETCH, 16)])
def test_header_only_flexible_frame_is_undecodable(api_key: int, version: int):
    # A v1 response header needs its tagged-field byte: 4 bytes is not even a header.
    entry = InFlight(api_key, version, 1, "c", 10, True)
    with pytest.raises(UndecodableResponse):
        ResponseRewriter(RecordingAddressMap())(entry, struct.pack(">i", 1))


@pytest.mark.parametrize(("api_key", "version"), KIP951)
def test_garbage_node_endpoints_is_undecodable(api_key: int, version: int):
    value = dataclasses.replace(minimal(response_class(api_key, version)),
                                node_endpoints=())
    body = kio_encode(value)
    tags_offset = LAYOUT[api_key](body, 0, version).tags_offset
    for payload in (b"\x02\x00\x00\x00\x01\x00", b"\x02\x00\x00\x00\x01\x03\xff\xfe\x00"):
        bad = body[:tags_offset] + encode_tagged_fields([(0, payload)])
        with pytest.raises(UndecodableResponse):
            rewrite(api_key, version, bad)


def test_address_map_failure_propagates_unchanged():
    class Exhausted(RuntimeError):
        pass

    class Failing:
        def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> Any:
            raise Exhausted("no free port")

    cls = response_class(METADATA, 1)
    broker = nested_class(METADATA, 1, "MetadataResponseBroker")
    value = cls(brokers=(broker(node_id=1, host="b", port=1, rack=None),), topics=())
    entry = InFlight(METADATA, 1, 1, "c", 10, True)
    with pytest.raises(Exhausted):
        ResponseRewriter(Failing())(entry, header_for(METADATA, 1) + kio_encode(value))


# --------------------------------------------------------------------------- via the stream


def test_metadata_rewritten_through_response_stream_byte_by_byte():
    cls = response_class(METADATA, 12)
    broker = nested_class(METADATA, 12, "MetadataResponseBroker")
    value = cls(
        throttle_time=ms(3),
        brokers=(broker(node_id=1, host="b1", port=9092), broker(node_id=2, host="b2", port=9092)),
        cluster_id="c",
        topics=(),
    )
    table = CorrelationTable()
    table.add(InFlight(METADATA, 12, CORRELATION_ID, "c", 10, True))
    stream = ResponseStream(table, ResponseRewriter(RecordingAddressMap()))
    data = frame(header_for(METADATA, 12) + kio_encode(value))
    out = bytearray()
    for i in range(len(data)):
        segments, _done = stream.feed(data[i : i + 1])
        for s in segments:
            out += s
    size = struct.unpack(">i", out[:4])[0]
    assert size == len(out) - 4
    head = header_for(METADATA, 12)
    assert bytes(out[4 : 4 + len(head)]) == head
    decoded = kio_decode(cls, bytes(out[4 + len(head) :]))
    assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [
        (1, PROXY_HOST, 20001), (2, PROXY_HOST, 20002)
    ]
