"""The topic fields of Kafka's requests, derived from kio's schemas: every API that names
topics is handled, and each one's topics come out, go away and come back as errors."""

from __future__ import annotations

import dataclasses
import typing
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.types import TopicName

from kafka_quota_proxy.protocol import topic_fields as tf
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.headers import encode_request_header, encode_response_header
from kafka_quota_proxy.protocol.topic_fields import (
    HANDLING,
    TOPIC_AUTHORIZATION_FAILED,
    MetadataHandling,
    Refused,
    Results,
    TopicArray,
    Unguarded,
)
from testkit.frames import minimal

GUARDED = "__kafka_quota_proxy_quotas"
GUARDED_ID = uuid.UUID(int=0x1234)
OTHER = "orders"
OTHER_ID = uuid.UUID(int=0x5678)


def test_every_api_with_topic_fields_is_handled() -> None:
    """Derived from kio, checked against the handling table: a request schema that names
    topics and is not covered (a new API, or kio's next version) fails here."""
    derived = tf.topic_apis()
    assert set(derived) == set(HANDLING), (
        f"not handled: {sorted(set(derived) - set(HANDLING))}; "
        f"handled but naming no topic: {sorted(set(HANDLING) - set(derived))}")


def test_derivation_finds_the_known_fields() -> None:
    assert tf.topic_arrays(0, 9) == (TopicArray((("topic_data", True),), name="name"),)
    assert tf.topic_arrays(0, 13) == (TopicArray((("topic_data", True),), topic_id="topic_id"),)
    assert [a.path for a in tf.topic_arrays(1, 12)] == [
        "topics.topic", "forgotten_topics_data.topic"]
    assert tf.topic_arrays(20, 5) == (TopicArray((("topic_names", True),), items=True),)
    assert tf.topic_arrays(3, 12) == (
        TopicArray((("topics", True),), name="name", topic_id="topic_id"),)
    assert tf.topic_arrays(32, 4) == (TopicArray((("resources", True),), resource=True),)
    assert tf.topic_arrays(9, 8) == (
        TopicArray((("groups", True), ("topics", True)), name="name"),)
    # uuid fields that are not topic ids are not topics
    assert tf.topic_arrays(71, 0) == ()
    assert tf.topic_arrays(62, 2) == ()


# ---------------------------------------------------------------------- sample requests
def _inner(cls: type, field: str) -> tuple[type | None, bool]:
    hint = typing.get_type_hints(cls)[field]
    types = tf._types(hint)
    inner = next((t for t in types if dataclasses.is_dataclass(t)), None)
    return inner, tf._is_array(hint)


def _entry(cls: type, array: TopicArray, guarded: bool) -> Any:
    name = GUARDED if guarded else OTHER
    topic_id = GUARDED_ID if guarded else OTHER_ID
    value = minimal(cls)
    given: dict[str, Any] = {}
    if array.resource:
        given = {"resource_type": type(value.resource_type)(tf.RESOURCE_TOPIC),
                 "resource_name": name}
    if array.name:
        given[array.name] = name
    if array.topic_id:
        given[array.topic_id] = topic_id
    for f in dataclasses.fields(cls):  # a partition, where the entry lists some
        inner, is_array = _inner(cls, f.name)
        if not f.name.startswith("partition") or not is_array:
            continue
        if inner is None:
            given[f.name] = (0, 1)
        elif any(hasattr(minimal(inner), n) for n in tf._PARTITION_FIELDS):
            given[f.name] = (minimal(inner), dataclasses.replace(
                minimal(inner), **{next(n for n in tf._PARTITION_FIELDS
                                        if hasattr(minimal(inner), n)): 1}))
    return dataclasses.replace(value, **given)


def _fill(value: Any, steps: tuple[tuple[str, bool], ...], array: TopicArray) -> Any:
    (field, is_array), rest = steps[0], steps[1:]
    cls = type(value)
    inner, _ = _inner(cls, field)
    if not rest:
        if array.items:
            return dataclasses.replace(value, **{field: (TopicName(GUARDED), TopicName(OTHER))})
        assert inner is not None
        entries = (_entry(inner, array, True), _entry(inner, array, False))
        if not is_array:
            entries = entries[:1]
        return dataclasses.replace(value, **{field: entries if is_array else entries[0]})
    assert inner is not None
    current = getattr(value, field)
    child = (current[0] if current else minimal(inner)) if is_array else (
        current if current is not None else minimal(inner))
    child = _fill(child, rest, array)
    return dataclasses.replace(value, **{field: (child,) if is_array else child})


def _sample(api_key: int, version: int) -> bytes:
    cls = load_request_schema(api_key, version)
    value = minimal(cls)
    for array in tf.topic_arrays(api_key, version):
        value = _fill(value, array.steps, array)
    return encode_request_header(api_key, version, 7, "c") + tf.encode(value)


CASES = [(k, v) for k, vs in tf.topic_apis().items() for v in vs]


def _guarded(ref: tf.TopicRef) -> bool:
    return ref.name == GUARDED or ref.topic_id == GUARDED_ID


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_topics_come_out_and_go_away(api_key: int, version: int) -> None:
    frame = _sample(api_key, version)
    request = tf.read_topics(frame, api_key, version)
    refused = [r for r in request.refs if _guarded(r)]
    assert refused, request.refs
    assert any(not _guarded(r) for r in request.refs)
    handling = HANDLING[api_key]
    if isinstance(handling, Unguarded):
        return
    if isinstance(handling, tf.LeftOut):
        assert not tf.answer_whole(request, refused)
    removable = all(r.array.removable for r in refused)
    if removable:
        rest = tf.without(frame, request, refused)
        again = tf.read_topics(rest, api_key, version)
        assert again.refs and not any(_guarded(r) for r in again.refs)
        assert again.correlation_id == 7
    if isinstance(handling, MetadataHandling | tf.LeftOut):
        return
    answer = tf.refused_response(request, refused)
    value = response_body(answer, api_key, version)
    assert _has_error(value), value
    if isinstance(handling, Results) and not tf.answer_whole(request, refused):
        broker = _broker_response(api_key, version, request)
        merged = response_body(tf.with_refused(broker, api_key, version, refused),
                               api_key, version)
        names = _names(merged)
        assert _has_error(merged)
        assert all(r.name in names or r.topic_id in names for r in refused)


def _broker_response(api_key: int, version: int, request: tf.TopicRequest) -> bytes:
    """A broker's response to the request without the refused topics: its own results
    (outer arrays, such as OffsetFetch's groups, as many as the request's)."""
    cls = load_response_schema(api_key, version)
    value = tf.blank(cls)
    handling = HANDLING[api_key]
    assert isinstance(handling, Results)
    for ref in request.refs:
        path = tf._response_path(handling, ref)
        if len(path) > 1:
            outer_cls = tf._entry_class(cls, path[:1])
            if not getattr(value, path[0]):
                value = dataclasses.replace(value, **{path[0]: (tf.blank(outer_cls),)})
    head = encode_response_header(7, tf.apis.response_header_version(api_key, version))
    return head + tf.encode(value)


def _flatten(value: Any) -> list[Any]:
    out = [value]
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            out += _flatten(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            out += _flatten(item)
    return out


def _has_error(value: Any) -> bool:
    for v in _flatten(value):
        if dataclasses.is_dataclass(v):
            for n in ("error_code", "partition_error_code"):
                if int(getattr(v, n, 0) or 0) == TOPIC_AUTHORIZATION_FAILED:
                    return True
    return False


def _names(value: Any) -> set[Any]:
    return {v for v in _flatten(value) if isinstance(v, str | uuid.UUID)}


def test_refused_apis_have_a_top_level_error() -> None:
    for api_key, handling in HANDLING.items():
        if isinstance(handling, Refused):
            for v in tf.topic_apis()[api_key]:
                names = {f.name for f in dataclasses.fields(load_response_schema(api_key, v))}
                assert "error_code" in names, (api_key, v)
