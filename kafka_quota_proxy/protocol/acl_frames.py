"""The frames of Kafka's ACL admin APIs, which the proxy will answer itself when it enforces
ACLs: DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), v1-v3 (v2+ flexible; v0, without
pattern types, is gone from Kafka 4.0 and not offered).

Requests decode to plain tuples of Kafka's wire codes, the way ``authorizer.acls`` names
them: an ACL is ``(resource_type, resource_name, pattern_type, principal, host, operation,
permission_type)``; a filter has the same fields, the name, principal and host possibly None
(any). Responses encode from the same tuples. Frames are whole, without their size prefix,
header included; what does not decode raises ``MalformedFrame``.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Sequence
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import request_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_response_header

DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
ACL_APIS = (DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS)
ANSWERED_VERSIONS = (1, 3)  # what the proxy will advertise and answer

# (resource_type, resource_name, pattern_type, principal, host, operation, permission_type)
Acl = tuple[int, str, int, str, str, int, int]
AclFilter = tuple[int, str | None, int, str | None, str | None, int, int]
# A DeleteAcls filter's result: (error_code, error_message, [(error_code, error_message, acl)])
DeleteResult = tuple[int, str | None, Sequence[tuple[int, str | None, Acl]]]


def _malformed(api_key: int, version: int, exc: Exception) -> MalformedFrame:
    return MalformedFrame(f"{apis.api_name(api_key)} v{version} request does not decode: "
                          f"{exc!r}")


def _filter(f: Any) -> AclFilter:
    return (int(f.resource_type_filter), f.resource_name_filter, int(f.pattern_type_filter),
            f.principal_filter, f.host_filter, int(f.operation), int(f.permission_type))


def decode_describe(frame: bytes | memoryview, version: int) -> AclFilter:
    body = request_body(frame, DESCRIBE_ACLS, version)
    try:
        return _filter(body)
    except (TypeError, ValueError, AttributeError) as exc:
        raise _malformed(DESCRIBE_ACLS, version, exc) from None


def decode_create(frame: bytes | memoryview, version: int) -> list[Acl]:
    body = request_body(frame, CREATE_ACLS, version)
    try:
        return [(int(c.resource_type), str(c.resource_name), int(c.resource_pattern_type),
                 str(c.principal), str(c.host), int(c.operation), int(c.permission_type))
                for c in body.creations]
    except (TypeError, ValueError, AttributeError) as exc:  # a null array kio let through
        raise _malformed(CREATE_ACLS, version, exc) from None


def decode_delete(frame: bytes | memoryview, version: int) -> list[AclFilter]:
    body = request_body(frame, DELETE_ACLS, version)
    try:
        return [_filter(f) for f in body.filters]
    except (TypeError, ValueError, AttributeError) as exc:
        raise _malformed(DELETE_ACLS, version, exc) from None


def _classes(api_key: int, version: int, *names: str) -> tuple[Any, ...]:
    cls: Any = load_response_schema(api_key, version)
    module = __import__(cls.__module__, fromlist=list(names))
    return (cls, *(getattr(module, n) for n in names))


def _encode(api_key: int, version: int, correlation_id: int, value: Any) -> bytes:
    """A whole response frame without its size prefix."""
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return (encode_response_header(correlation_id, apis.response_header_version(api_key, version))
            + buf.getvalue())


def _throttle(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def describe_response(version: int, correlation_id: int, throttle_ms: int, error_code: int,
                      error_message: str | None, acls: Sequence[Acl]) -> bytes:
    """A DescribeAcls response: the ACLs grouped by resource pattern, in the order each
    pattern is first met (``DescribeAclsResponse.aclsResources``)."""
    from kio.schema.errors import ErrorCode

    cls, resource_cls, acl_cls = _classes(DESCRIBE_ACLS, version, "DescribeAclsResource",
                                          "AclDescription")
    grouped: dict[tuple[int, str, int], list[Any]] = {}
    for rtype, name, pattern, principal, host, op, permission in acls:
        grouped.setdefault((rtype, name, pattern), []).append(acl_cls(
            principal=principal, host=host, operation=op, permission_type=permission))
    value = cls(
        throttle_time=_throttle(throttle_ms), error_code=ErrorCode(error_code),
        error_message=error_message,
        resources=tuple(resource_cls(resource_type=rtype, resource_name=name,
                                     pattern_type=pattern, acls=tuple(found))
                        for (rtype, name, pattern), found in grouped.items()))
    return _encode(DESCRIBE_ACLS, version, correlation_id, value)


def create_response(version: int, correlation_id: int, throttle_ms: int,
                    results: Sequence[tuple[int, str | None]]) -> bytes:
    """A CreateAcls response: per creation, in order, its error code and message."""
    from kio.schema.errors import ErrorCode

    cls, result_cls = _classes(CREATE_ACLS, version, "AclCreationResult")
    value = cls(throttle_time=_throttle(throttle_ms), results=tuple(
        result_cls(error_code=ErrorCode(code), error_message=message)
        for code, message in results))
    return _encode(CREATE_ACLS, version, correlation_id, value)


def delete_response(version: int, correlation_id: int, throttle_ms: int,
                    results: Sequence[DeleteResult]) -> bytes:
    """A DeleteAcls response: per filter, in order, its error and the ACLs it deleted."""
    from kio.schema.errors import ErrorCode

    cls, result_cls, matching_cls = _classes(DELETE_ACLS, version, "DeleteAclsFilterResult",
                                             "DeleteAclsMatchingAcl")
    value = cls(throttle_time=_throttle(throttle_ms), filter_results=tuple(
        result_cls(error_code=ErrorCode(code), error_message=message, matching_acls=tuple(
            matching_cls(error_code=ErrorCode(acl_code), error_message=acl_message,
                         resource_type=acl[0], resource_name=acl[1], pattern_type=acl[2],
                         principal=acl[3], host=acl[4], operation=acl[5],
                         permission_type=acl[6])
            for acl_code, acl_message, acl in matching))
        for code, message, matching in results))
    return _encode(DELETE_ACLS, version, correlation_id, value)
