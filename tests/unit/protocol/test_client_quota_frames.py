"""The client quota admin frames the proxy answers (KIP-546): requests decoded, responses
encoded as Kafka's schemas read them."""

from __future__ import annotations

import io
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.client_quota_frames import (
    ALTER_CLIENT_QUOTAS,
    DESCRIBE_CLIENT_QUOTAS,
    AlterOp,
    alter_response,
    decode_alter,
    decode_describe,
    describe_response,
)
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_request_header, parse_response_header


def _request(api_key: int, version: int, correlation_id: int, client_id: str | None,
             value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return encode_request_header(api_key, version, correlation_id, client_id) + buf.getvalue()


def _module(api_key: int, version: int, names: list[str]) -> Any:
    cls = load_request_schema(api_key, version)
    return cls, __import__(cls.__module__, fromlist=names)


def _read_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    header = parse_response_header(frame, 0, len(frame),
                                   apis.response_header_version(api_key, version))
    value, _ = entity_reader(load_response_schema(api_key, version))(
        memoryview(frame)[header.size:], 0)
    return header.correlation_id, value


@pytest.mark.parametrize("version", [0, 1])
def test_describe_request_decodes(version: int) -> None:
    cls, mod = _module(DESCRIBE_CLIENT_QUOTAS, version, ["ComponentData"])
    value = cls(components=(mod.ComponentData(entity_type="user", match_type=0, match="alice"),
                            mod.ComponentData(entity_type="client-id", match_type=1,
                                              match=None)),
                strict=True)
    got = decode_describe(_request(DESCRIBE_CLIENT_QUOTAS, version, 7, "admin", value), version)
    assert got.components == (("user", 0, "alice"), ("client-id", 1, None))
    assert got.strict is True


@pytest.mark.parametrize("version", [0, 1])
def test_alter_request_decodes(version: int) -> None:
    cls, mod = _module(ALTER_CLIENT_QUOTAS, version, ["EntryData", "EntityData", "OpData"])
    value = cls(entries=(mod.EntryData(
        entity=(mod.EntityData(entity_type="user", entity_name=None),
                mod.EntityData(entity_type="client-id", entity_name="app")),
        ops=(mod.OpData(key="producer_byte_rate", value=1024.0, remove=False),
             mod.OpData(key="consumer_byte_rate", value=0.0, remove=True))),),
        validate_only=True)
    got = decode_alter(_request(ALTER_CLIENT_QUOTAS, version, 9, None, value), version)
    assert got.validate_only is True
    assert got.entries == ((((("user", None), ("client-id", "app"))),
                            (AlterOp("producer_byte_rate", 1024.0, False),
                             AlterOp("consumer_byte_rate", 0.0, True))),)


def test_a_request_that_does_not_decode_is_malformed() -> None:
    frame = encode_request_header(DESCRIBE_CLIENT_QUOTAS, 1, 1, "c") + b"\x05"
    with pytest.raises(MalformedFrame, match="describe_client_quotas v1 request does not decode"):
        decode_describe(frame, 1)


@pytest.mark.parametrize("version", [0, 1])
def test_describe_response_as_kafka_reads_it(version: int) -> None:
    frame = describe_response(version, 42, 5, 0, None, [
        ((("user", "alice"), ("client-id", None)), [("producer_byte_rate", 1000.0)])])
    correlation_id, value = _read_response(DESCRIBE_CLIENT_QUOTAS, version, frame)
    assert correlation_id == 42
    assert value.throttle_time.total_seconds() == 0.005
    assert value.error_code == 0 and value.error_message is None
    [entry] = value.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [
        ("user", "alice"), ("client-id", None)]
    assert [(v.key, v.value) for v in entry.values] == [("producer_byte_rate", 1000.0)]
    # an error: entries null, the message set
    _, value = _read_response(DESCRIBE_CLIENT_QUOTAS, version, describe_response(
        version, 1, 0, 42, "Invalid empty entity type.", None))
    assert (value.error_code, value.error_message, value.entries) == (
        42, "Invalid empty entity type.", None)


@pytest.mark.parametrize("version", [0, 1])
def test_alter_response_as_kafka_reads_it(version: int) -> None:
    frame = alter_response(version, 3, 0, [((("user", "bob"),), 0, None),
                                           ((("client-id", None),), 42, "Quota x")])
    correlation_id, value = _read_response(ALTER_CLIENT_QUOTAS, version, frame)
    assert correlation_id == 3
    assert [(e.error_code, e.error_message, [(c.entity_type, c.entity_name) for c in e.entity])
            for e in value.entries] == [(0, None, [("user", "bob")]),
                                        (42, "Quota x", [("client-id", None)])]


@pytest.mark.parametrize("api_key", [DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS])
def test_a_null_array_where_kafka_has_none_is_malformed(api_key: int) -> None:
    # v0: a non-nullable array of length -1 (kio reads it as None; the fuzz drill found it)
    frame = encode_request_header(api_key, 0, 1, "c") + b"\xff\xff\xff\xff\x00"
    decode = decode_describe if api_key == DESCRIBE_CLIENT_QUOTAS else decode_alter
    with pytest.raises(MalformedFrame, match="request does not decode"):
        decode(frame, 0)
