"""The frames of Kafka's client quota admin APIs (KIP-546), which the proxy answers itself:
DescribeClientQuotas (48) and AlterClientQuotas (49), v0 and v1 (flexible).

A request the proxy answers never reaches the broker (which would enforce the quotas a
second time, or not know the API at all): the connection takes its frame out of what goes
upstream and sends the answer in its place among the broker's responses
(``protocol.response_stream``), in Kafka's order of responses on a connection.

Frames are whole, without their size prefix, header included. Anything that does not decode
raises ``MalformedFrame``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import request_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_response_header

DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
API_VERSIONS = 18
ANSWERED_VERSIONS = (0, 1)  # what the proxy advertises and answers

Component = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class DescribeRequest:
    components: tuple[tuple[str, int, str | None], ...]  # (entity type, match type, match)
    strict: bool


@dataclass(frozen=True, slots=True)
class AlterOp:
    key: str
    value: float
    remove: bool


@dataclass(frozen=True, slots=True)
class AlterRequest:
    entries: tuple[tuple[tuple[Component, ...], tuple[AlterOp, ...]], ...]
    validate_only: bool


def decode_describe(frame: bytes | memoryview, version: int) -> DescribeRequest:
    body = request_body(frame, DESCRIBE_CLIENT_QUOTAS, version)
    try:
        return DescribeRequest(
            tuple((str(c.entity_type), int(c.match_type), c.match) for c in body.components),
            bool(body.strict))
    except (TypeError, ValueError, AttributeError) as exc:  # a null array kio let through
        raise _malformed(DESCRIBE_CLIENT_QUOTAS, version, exc) from None


def decode_alter(frame: bytes | memoryview, version: int) -> AlterRequest:
    body = request_body(frame, ALTER_CLIENT_QUOTAS, version)
    try:
        return AlterRequest(
            tuple((tuple((str(e.entity_type), e.entity_name) for e in entry.entity),
                   tuple(AlterOp(str(op.key), float(op.value), bool(op.remove))
                         for op in entry.ops))
                  for entry in body.entries),
            bool(body.validate_only))
    except (TypeError, ValueError, AttributeError) as exc:
        raise _malformed(ALTER_CLIENT_QUOTAS, version, exc) from None


def _malformed(api_key: int, version: int, exc: Exception) -> MalformedFrame:
    return MalformedFrame(f"{apis.api_name(api_key)} v{version} request does not decode: "
                          f"{exc!r}")


def _encode(api_key: int, version: int, correlation_id: int, value: Any) -> bytes:
    """A whole response frame without its size prefix."""
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return (encode_response_header(correlation_id, apis.response_header_version(api_key, version))
            + buf.getvalue())


def describe_response(version: int, correlation_id: int, throttle_ms: int, error_code: int,
                      error_message: str | None,
                      entries: Sequence[tuple[Sequence[Component], Sequence[tuple[str, float]]]]
                      | None) -> bytes:
    """A DescribeClientQuotas response (``entries`` None on an error, as Kafka sends it)."""
    import datetime

    from kio.schema.errors import ErrorCode

    cls: Any = load_response_schema(DESCRIBE_CLIENT_QUOTAS, version)
    mod = __import__(cls.__module__, fromlist=["EntryData", "EntityData", "ValueData"])
    value = cls(
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        error_code=ErrorCode(error_code), error_message=error_message,
        entries=None if entries is None else tuple(
            mod.EntryData(
                entity=tuple(mod.EntityData(entity_type=t, entity_name=n) for t, n in entity),
                values=tuple(mod.ValueData(key=k, value=float(v)) for k, v in values))
            for entity, values in entries))
    return _encode(DESCRIBE_CLIENT_QUOTAS, version, correlation_id, value)


def alter_response(version: int, correlation_id: int, throttle_ms: int,
                   results: Sequence[tuple[Sequence[Component], int, str | None]]) -> bytes:
    """An AlterClientQuotas response: per entity, its error code and message."""
    import datetime

    from kio.schema.errors import ErrorCode

    cls: Any = load_response_schema(ALTER_CLIENT_QUOTAS, version)
    mod = __import__(cls.__module__, fromlist=["EntryData", "EntityData"])
    value = cls(
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        entries=tuple(
            mod.EntryData(error_code=ErrorCode(code), error_message=message,
                          entity=tuple(mod.EntityData(entity_type=t, entity_name=n)
                                       for t, n in entity))
            for entity, code, message in results))
    return _encode(ALTER_CLIENT_QUOTAS, version, correlation_id, value)
