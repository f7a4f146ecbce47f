"""The frames of the APIs that the controller mutation quota counts (KIP-599): CreateTopics
(19), DeleteTopics (20) and CreatePartitions (37), in the versions kio decodes.

What the proxy does with them (``proxy.features.controller_mutation.filter``): read the topics a
request mutates; forward the request without the topics its quota refuses (``without``, a
frame of another size) or, when it refuses them all, not at all (``refused_response``
answers); add the refused
topics' results (THROTTLING_QUOTA_EXCEEDED) to the broker's response (``with_refused``).

Frames are whole, without their size prefix, header included. Anything that does not decode
raises ``MalformedFrame``.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import request_body, response_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import (
    encode_response_header,
    parse_request_header,
    parse_response_header,
)

CREATE_TOPICS = 19
DELETE_TOPICS = 20
CREATE_PARTITIONS = 37
MUTATION_APIS = (CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS)
THROTTLING_QUOTA_EXCEEDED = 89
_RESULTS_FIELD = {CREATE_TOPICS: "topics", DELETE_TOPICS: "responses",
                  CREATE_PARTITIONS: "results"}


def decoded_versions(api_key: int) -> tuple[int, int]:
    """The versions of ``api_key`` read here (kio's); others pass through unread."""
    return apis.kio_version_range(api_key)


@dataclass(frozen=True, slots=True)
class TopicMutation:
    """One topic of a request. ``partitions``: CreateTopics, the partitions asked for (None:
    the broker's default); CreatePartitions, the new partition count; DeleteTopics, None."""

    name: str | None
    topic_id: uuid.UUID | None
    partitions: int | None


@dataclass(frozen=True, slots=True)
class MutationRequest:
    api_key: int
    version: int
    correlation_id: int
    topics: tuple[TopicMutation, ...]
    validate_only: bool
    value: Any  # kio's request
    header_size: int


@dataclass(frozen=True, slots=True)
class MutationResult:
    name: str | None
    topic_id: uuid.UUID | None
    error_code: int
    partitions: int | None  # CreateTopics v5+: the partitions created


def decode_request(frame: bytes | memoryview, api_key: int, version: int) -> MutationRequest:
    value = request_body(frame, api_key, version)
    header = parse_request_header(frame, 0, len(frame))
    try:
        topics: list[TopicMutation] = []
        listed = (value.topic_names if api_key == DELETE_TOPICS and version < 6
                  else value.topics)
        for t in listed:
            if api_key == CREATE_TOPICS:
                asked = int(t.num_partitions)
                parts = asked if asked > 0 else (len(t.assignments) or None)
                topics.append(TopicMutation(str(t.name), None, parts))
            elif api_key == DELETE_TOPICS:
                name = t if isinstance(t, str) else t.name
                topic_id = None if isinstance(t, str) else getattr(t, "topic_id", None)
                topics.append(TopicMutation(None if name is None else str(name), topic_id, None))
            else:
                topics.append(TopicMutation(str(t.name), None, int(t.count)))
        validate_only = bool(getattr(value, "validate_only", False))
    except (AttributeError, TypeError) as exc:  # e.g. a null array kio lets through
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{version} request does not decode: {exc!r}") from None
    return MutationRequest(api_key, version, header.correlation_id, tuple(topics),
                           validate_only, value, header.size)


def without(frame: bytes | memoryview, request: MutationRequest, keep: Sequence[int]) -> bytes:
    """``frame`` with only the topics at the indices ``keep`` (in their order)."""
    field = ("topic_names" if request.api_key == DELETE_TOPICS and request.version < 6
             else "topics")
    topics = getattr(request.value, field)
    value = dataclasses.replace(request.value, **{field: tuple(topics[i] for i in keep)})
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return bytes(frame[: request.header_size]) + buf.getvalue()


def decode_results(frame: bytes | memoryview, api_key: int, version: int
                   ) -> tuple[MutationResult, ...]:
    value = response_body(frame, api_key, version)
    out = []
    try:
        for r in getattr(value, _RESULTS_FIELD[api_key]):
            parts = getattr(r, "num_partitions", None)
            out.append(MutationResult(
                None if r.name is None else str(r.name), getattr(r, "topic_id", None),
                int(r.error_code), None if parts is None or parts < 0 else int(parts)))
    except (AttributeError, TypeError) as exc:
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{version} response does not decode: {exc!r}") from None
    return tuple(out)


def _refused_results(api_key: int, version: int, refused: Sequence[TopicMutation]) -> list[Any]:
    """Kafka's result for a topic its quota refused: THROTTLING_QUOTA_EXCEEDED with a null
    message (the exception's message is the error's default, which Kafka does not repeat)."""
    from kio.schema.errors import ErrorCode

    cls: Any = load_response_schema(api_key, version)
    mod = __import__(cls.__module__, fromlist=["_"])
    code = ErrorCode(THROTTLING_QUOTA_EXCEEDED)
    out = []
    for t in refused:
        if api_key == CREATE_TOPICS:
            fields: dict[str, Any] = {"name": t.name, "error_code": code}
            result_cls = mod.CreatableTopicResult
        elif api_key == DELETE_TOPICS:
            fields = {"name": t.name, "error_code": code}
            result_cls = mod.DeletableTopicResult
        else:
            fields = {"name": t.name, "error_code": code}
            result_cls = mod.CreatePartitionsTopicResult
        names = {f.name for f in dataclasses.fields(result_cls)}
        optional = {"topic_id": t.topic_id, "error_message": None, "num_partitions": -1,
                    "replication_factor": -1, "topic_config_error_code": 0, "configs": ()}
        fields.update({k: v for k, v in optional.items() if k in names})
        out.append(result_cls(**fields))
    return out


def with_refused(frame: bytes | memoryview, api_key: int, version: int,
                 refused: Sequence[TopicMutation]) -> bytes:
    """The broker's response with the refused topics' results after its own."""
    hv = apis.response_header_version(api_key, version)
    header = parse_response_header(frame, 0, len(frame), hv)
    value = response_body(frame, api_key, version)
    field = _RESULTS_FIELD[api_key]
    value = dataclasses.replace(value, **{
        field: (*getattr(value, field), *_refused_results(api_key, version, refused))})
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return bytes(frame[: header.size]) + buf.getvalue()


def refused_response(api_key: int, version: int, correlation_id: int,
                     refused: Sequence[TopicMutation]) -> bytes:
    """The whole answer to a request whose topics were all refused (throttle time 0: the
    rewriter sets it, as for any response)."""
    cls: Any = load_response_schema(api_key, version)
    value = cls(**{"throttle_time": datetime.timedelta(0),
                   _RESULTS_FIELD[api_key]: tuple(_refused_results(api_key, version, refused))})
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    return (encode_response_header(correlation_id, apis.response_header_version(api_key, version))
            + buf.getvalue())
