"""Whole frames decoded with kio's schemas, for the few requests and responses the proxy
reads in full (the SASL exchange, the client quota admin APIs). Frames are without their size
prefix, header included; anything that does not decode raises ``MalformedFrame``. A client's
request is walked by ``array_counts`` first: kio's native reader would reserve memory for
whatever count the client wrote, and a failed allocation there aborts the process."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from kafka_quota_proxy.protocol import apis, array_counts
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import parse_request_header, parse_response_header


@cache
def _request_reader(api_key: int, version: int) -> Any:
    cls = load_request_schema(api_key, version)
    read = entity_reader(cls)

    def checked(body: memoryview, pos: int) -> Any:
        array_counts.check(cls, body, pos)
        return read(body, pos)
    return checked


@cache
def _response_reader(api_key: int, version: int) -> Any:
    return entity_reader(load_response_schema(api_key, version))


def request_body(frame: bytes | memoryview, api_key: int, version: int) -> Any:
    try:
        header = parse_request_header(frame, 0, len(frame))
        value, _ = _request_reader(api_key, version)(memoryview(frame)[header.size:], 0)
    except Exception as exc:  # kio raises KeyError, ValueError, DecodeError...
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{version} request does not decode: {exc!r}") from None
    return value


def response_body(frame: bytes | memoryview, api_key: int, version: int) -> Any:
    try:
        hv = apis.response_header_version(api_key, version)
        header = parse_response_header(frame, 0, len(frame), hv)
        value, _ = _response_reader(api_key, version)(memoryview(frame)[header.size:], 0)
    except Exception as exc:
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{version} response does not decode: {exc!r}") from None
    return value


UNKNOWN_TOPIC_OR_PARTITION = 3


def metadata_topics(response: Any) -> Iterator[tuple[str, Any, Any]]:
    """The named topics of a decoded MetadataResponse (any version): ``(name, topic_id or
    None, partitions)`` for a topic the response describes, ``(name, None, None)`` for one the
    broker does not know (UNKNOWN_TOPIC_OR_PARTITION); topics with other errors are left
    out."""
    for topic in response.topics:
        name = topic.name
        if name is None:
            continue
        error = int(getattr(topic.error_code, "value", topic.error_code))
        if error == UNKNOWN_TOPIC_OR_PARTITION:
            yield name, None, None
        elif not error:
            yield name, getattr(topic, "topic_id", None), topic.partitions
