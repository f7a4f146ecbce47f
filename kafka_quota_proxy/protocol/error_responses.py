"""The answer Kafka's broker gives to a request it refuses whole, built by the proxy.

When the broker refuses a whole request (JoinGroup without READ on the group, InitProducerId
without the rights on the transactional id or the cluster, DescribeConfigs without the right
on the cluster...), it answers with the response the request class builds in
``getErrorResponse(throttleTimeMs, Throwable)`` (Kafka's
``clients/.../common/requests/*Request.java``). ``error_response`` builds that same response,
for the APIs a group, transactional id or cluster check refuses whole: the top-level error
fields Kafka sets, and, where Kafka mirrors the request's items (topics and partitions,
groups, resources, ACL creations and filters, transactional ids, coordinator keys), one
result per item with the error on it, in the request's order. Every field Kafka leaves
alone keeps its spec default (else 0, an empty string or array, empty records); the throttle
time is 0.

``error_message`` fields that Kafka fills get the ``Errors`` enum's message for the code
(``Errors.message()``: "Group authorization failed." for 30...), None for a code outside
``MESSAGES``.

One request has no answer at all: a Produce with ``acks=0`` (Kafka's ``getErrorResponse``
returns null and the broker sends nothing): ``error_response`` then returns ``b""``.

Frames are whole, the request without its size prefix, the response with it. A request that
does not decode, or an API/version kio does not have, raises ``MalformedFrame``; an API not
covered here raises ``NotImplementedError``.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import request_body as decode_request
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_response_header
from kafka_quota_proxy.protocol.topic_fields import encode

# Kafka's ``Errors`` enum: the default message of the codes the proxy answers with.
MESSAGES: dict[int, str] = {
    15: "The coordinator is not available.",
    16: "This is not the correct coordinator.",
    29: "Topic authorization failed.",
    30: "Group authorization failed.",
    31: "Cluster authorization failed.",
    35: "The version of API is not supported.",
    41: "This is not the correct controller for this cluster.",
    53: "Transactional Id authorization failed.",
    54: "Security features are disabled.",
    58: "SASL Authentication failed.",
}

NO_ID = -1  # RecordBatch.NO_PRODUCER_ID, NO_PRODUCER_EPOCH; INVALID_OFFSET; UNKNOWN_*; noNode
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)  # Integer.MIN_VALUE
_SIZE = struct.Struct(">i")
_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


# ---------------------------------------------------------------------- building values
@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _parts(hint: Any) -> list[Any]:
    """The types a hint is made of (unions and tuples unwrapped, None left out)."""
    if typing.get_origin(hint) is None:
        return [hint]
    out: list[Any] = []
    for arg in typing.get_args(hint):
        if arg is not Ellipsis and arg is not type(None):
            out += _parts(arg)
    return out


def _is_array(hint: Any) -> bool:
    return any(typing.get_origin(t) is tuple for t in (hint, *typing.get_args(hint)))


def _default(hint: Any) -> Any:
    """The value Kafka's generated message classes start a field with when its spec gives no
    default: 0, false, an empty string, bytes or array, the zero uuid, empty records."""
    if _is_array(hint):
        return ()
    t = _parts(hint)[0]
    if t is ErrorCode:
        return ErrorCode(0)
    if isinstance(t, type):
        if dataclasses.is_dataclass(t):
            return None if type(None) in typing.get_args(hint) else _make(t)
        if issubclass(t, bool):
            return False
        if issubclass(t, int):
            return t(0)
        if issubclass(t, str):
            return t("")
        if t.__name__ == "Records":  # (empty, as Kafka's MemoryRecords.EMPTY: not null)
            return b""
        if issubclass(t, bytes):
            return b""
        if issubclass(t, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(t, datetime.datetime):
            return _EPOCH
        if t is uuid.UUID:
            return uuid.UUID(int=0)
    return None


def _make(cls: type, **given: Any) -> Any:
    """An entity of ``cls``: the ``given`` fields it has (those of other versions left out),
    every other one at its default."""
    names = _names(cls)
    fields = {k: v for k, v in given.items() if k in names}
    for f in dataclasses.fields(cls):
        if f.name in fields or f.default is not dataclasses.MISSING or (
                f.default_factory is not dataclasses.MISSING):
            continue
        fields[f.name] = _default(_hints(cls)[f.name])
    return cls(**fields)


@cache
def _item(cls: type, field: str) -> Any:
    """The entity class of the array ``field`` of ``cls``."""
    return next(t for t in _parts(_hints(cls)[field]) if dataclasses.is_dataclass(t))


def _get(value: Any, name: str, default: Any = None) -> Any:
    return getattr(value, name, default)


@dataclass(frozen=True, slots=True)
class _Refusal:
    """What a builder needs: the decoded request, the response class, the error."""

    version: int
    request: Any
    cls: Any
    code: ErrorCode
    message: str | None

    def item(self, *path: str) -> Any:
        """The entity class at ``path`` (array fields) from the response class."""
        cls = self.cls
        for field in path:
            cls = _item(cls, field)
        return cls

    def top(self, **given: Any) -> Any:
        return _make(self.cls, **given)


def _error(r: _Refusal) -> Any:
    """Only the top-level error code (and no items)."""
    return r.top(error_code=r.code)


def _error_and_message(r: _Refusal) -> Any:
    return r.top(error_code=r.code, error_message=r.message)


def _per_partition(r: _Refusal, topics: Iterable[Any], path: tuple[str, str],
                   topic_fields: Callable[[Any], dict[str, Any]],
                   partitions_of: Callable[[Any], Iterable[int]],
                   **partition_fields: Any) -> tuple[Any, ...]:
    """One result per request topic, one per partition in it, the error on each
    partition."""
    topic_cls = r.item(path[0])
    part_cls = r.item(*path)
    part_key = {"partition_responses": "index", "results_by_partition": "partition_index",
                "partition_result": "partition_id"}.get(path[1], "partition_index")
    code_key = "partition_error_code" if "partition_error_code" in _names(part_cls) else (
        "error_code")
    return tuple(
        _make(topic_cls, **topic_fields(topic), **{path[1]: tuple(
            _make(part_cls, **{part_key: p, code_key: r.code}, **partition_fields)
            for p in partitions_of(topic))})
        for topic in topics)


def _name_and_id(topic: Any) -> dict[str, Any]:
    """A request topic's name ("" for a null one, as the response has no null) and id."""
    name = _get(topic, "name")
    out = {"name": "" if name is None else name}
    if _get(topic, "topic_id") is not None:
        out["topic_id"] = topic.topic_id
    return out


def _indexes(attr: str) -> Callable[[Any], Iterable[int]]:
    """A request topic's partitions: its list of ints ``attr``, or of entities with an
    index."""
    def partitions(topic: Any) -> Iterable[int]:
        for p in getattr(topic, attr) or ():
            yield p if isinstance(p, int) else next(
                getattr(p, n) for n in ("partition_index", "partition", "index")
                if hasattr(p, n))
    return partitions


# ---------------------------------------------------------------------- one builder per API
def _produce(r: _Refusal) -> Any:
    # Partitions are grouped by topic (``responses().find(topic)``): a topic named twice in
    # the request gets one result.
    order: list[Any] = []
    partitions: dict[Any, list[int]] = {}
    for topic in r.request.topic_data:
        key = (_get(topic, "name"), _get(topic, "topic_id"))
        if key not in partitions:
            order.append(topic)
            partitions[key] = []
        partitions[key] += [p.index for p in topic.partition_data]
    return r.top(responses=_per_partition(
        r, order, ("responses", "partition_responses"), _name_and_id,
        lambda t: partitions[(_get(t, "name"), _get(t, "topic_id"))],
        base_offset=NO_ID, log_start_offset=NO_ID, record_errors=(),
        error_message=r.message))


def _fetch(r: _Refusal) -> Any:
    # v13+ (topic ids): the top-level error only, no partitions
    responses: tuple[Any, ...] = ()
    if r.version < 13:
        responses = _per_partition(
            r, r.request.topics, ("responses", "partitions"),
            lambda t: {"topic": t.topic, "topic_id": _get(t, "topic_id")},
            _indexes("partitions"), high_watermark=NO_ID)
    return r.top(error_code=r.code, session_id=_get(r.request, "session_id", 0),
                 responses=responses)


def _list_offsets(r: _Refusal) -> Any:
    return r.top(topics=_per_partition(
        r, r.request.topics, ("topics", "partitions"), lambda t: {"name": t.name},
        _indexes("partitions"), offset=NO_ID, timestamp=NO_ID))


def _metadata(r: _Refusal) -> Any:
    topic_cls = r.item("topics")
    topics = tuple(
        _make(topic_cls, **_name_and_id(t), error_code=r.code, is_internal=False,
              partitions=())
        for t in r.request.topics or ())
    return r.top(topics=topics, error_code=r.code)


def _offset_commit(r: _Refusal) -> Any:
    return r.top(topics=_per_partition(
        r, r.request.topics, ("topics", "partitions"), _name_and_id,
        _indexes("partitions")))


def _offset_fetch(r: _Refusal) -> Any:
    if r.version >= 8:
        group_cls = r.item("groups")
        return r.top(groups=tuple(_make(group_cls, group_id=g.group_id, error_code=r.code,
                                        topics=()) for g in r.request.groups))
    if r.version >= 2:
        return r.top(error_code=r.code, topics=())
    return r.top(topics=_per_partition(
        r, r.request.topics or (), ("topics", "partitions"), lambda t: {"name": t.name},
        _indexes("partition_indexes"), committed_offset=NO_ID, metadata=""))


def _find_coordinator(r: _Refusal) -> Any:
    if r.version < 4:  # prepareOldResponse(error, Node.noNode())
        return r.top(error_code=r.code, error_message=r.message, node_id=NO_ID, host="",
                     port=NO_ID)
    cls = r.item("coordinators")
    return r.top(coordinators=tuple(
        _make(cls, key=key, node_id=NO_ID, host="", port=NO_ID, error_code=r.code,
              error_message=r.message)
        for key in r.request.coordinator_keys))


def _join_group(r: _Refusal) -> Any:
    return r.top(error_code=r.code, generation_id=NO_ID,
                 protocol_name="" if r.version < 7 else None, leader="", member_id="",
                 members=())


def _sync_group(r: _Refusal) -> Any:
    return r.top(error_code=r.code, assignment=b"")


def _describe_groups(r: _Refusal) -> Any:
    cls = r.item("groups")
    return r.top(groups=tuple(
        _make(cls, group_id=g, error_code=r.code, group_state="", protocol_type="",
              protocol_data="", members=(),
              authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
        for g in r.request.groups))


def _list_groups(r: _Refusal) -> Any:
    return r.top(error_code=r.code, groups=())


def _named_topics(r: _Refusal, array: str) -> Any:
    """One result per topic the request names, under ``array``, with the error and its
    message (CreateTopics, CreatePartitions)."""
    cls = r.item(array)
    return r.top(**{array: tuple(
        _make(cls, name=t.name, error_code=r.code, error_message=r.message)
        for t in r.request.topics)})


def _create_topics(r: _Refusal) -> Any:
    return _named_topics(r, "topics")


def _delete_topics(r: _Refusal) -> Any:
    cls = r.item("responses")
    if r.version >= 6:
        entries = [(t.name, t.topic_id) for t in r.request.topics]
    else:
        entries = [(name, None) for name in r.request.topic_names]
    return r.top(responses=tuple(
        _make(cls, name=name, error_code=r.code,
              **({} if topic_id is None else {"topic_id": topic_id}))
        for name, topic_id in entries))


def _delete_records(r: _Refusal) -> Any:
    return r.top(topics=_per_partition(
        r, r.request.topics, ("topics", "partitions"), lambda t: {"name": t.name},
        _indexes("partitions"), low_watermark=NO_ID))


def _init_producer_id(r: _Refusal) -> Any:
    return r.top(error_code=r.code, producer_id=NO_ID, producer_epoch=NO_ID)


def _offset_for_leader_epoch(r: _Refusal) -> Any:
    topic_cls, part_cls = r.item("topics"), r.item("topics", "partitions")
    return r.top(topics=tuple(
        _make(topic_cls, topic=t.topic, partitions=tuple(
            _make(part_cls, partition=p.partition, error_code=r.code, leader_epoch=NO_ID,
                  end_offset=NO_ID)
            for p in t.partitions))
        for t in r.request.topics))


def _add_partitions_to_txn(r: _Refusal) -> Any:
    if r.version >= 4:  # a broker's verification request: the top-level error only
        return r.top(error_code=r.code)
    return r.top(results_by_topic_v3_and_below=_per_partition(
        r, r.request.v3_and_below_topics,
        ("results_by_topic_v3_and_below", "results_by_partition"),
        lambda t: {"name": t.name}, _indexes("partitions")))


def _txn_offset_commit(r: _Refusal) -> Any:
    return r.top(topics=_per_partition(
        r, r.request.topics, ("topics", "partitions"), lambda t: {"name": t.name},
        _indexes("partitions")))


def _create_acls(r: _Refusal) -> Any:
    cls = r.item("results")
    return r.top(results=tuple(_make(cls, error_code=r.code, error_message=r.message)
                               for _ in r.request.creations))


def _delete_acls(r: _Refusal) -> Any:
    cls = r.item("filter_results")
    return r.top(filter_results=tuple(
        _make(cls, error_code=r.code, error_message=r.message, matching_acls=())
        for _ in r.request.filters))


def _per_resource(field: str) -> Callable[[_Refusal], Any]:
    """DescribeConfigs, AlterConfigs, IncrementalAlterConfigs: one result per resource."""
    def build(r: _Refusal) -> Any:
        cls = r.item(field)
        return r.top(**{field: tuple(
            _make(cls, error_code=r.code, error_message=r.message,
                  resource_type=res.resource_type, resource_name=res.resource_name)
            for res in r.request.resources)})
    return build


def _alter_replica_log_dirs(r: _Refusal) -> Any:
    topics = [t for d in r.request.dirs for t in d.topics]
    return r.top(results=_per_partition(
        r, topics, ("results", "partitions"), lambda t: {"topic_name": t.name},
        _indexes("partitions")))


def _create_partitions(r: _Refusal) -> Any:
    return _named_topics(r, "results")


def _delete_groups(r: _Refusal) -> Any:
    cls = r.item("results")
    return r.top(results=tuple(_make(cls, group_id=g, error_code=r.code)
                               for g in r.request.groups_names))


def _elect_leaders(r: _Refusal) -> Any:
    results = _per_partition(
        r, r.request.topic_partitions or (), ("replica_election_results", "partition_result"),
        lambda t: {"topic": t.topic}, _indexes("partitions"), error_message=r.message)
    return r.top(error_code=r.code, replica_election_results=results)


def _alter_partition_reassignments(r: _Refusal) -> Any:
    return r.top(error_code=r.code, error_message=r.message, responses=_per_partition(
        r, r.request.topics, ("responses", "partitions"), lambda t: {"name": t.name},
        _indexes("partitions"), error_message=r.message))


def _list_partition_reassignments(r: _Refusal) -> Any:
    # the named partitions come back without an error of their own (none has a place)
    topic_cls, part_cls = r.item("topics"), r.item("topics", "partitions")
    return r.top(error_code=r.code, error_message=r.message, topics=tuple(
        _make(topic_cls, name=t.name, partitions=tuple(
            _make(part_cls, partition_index=p) for p in t.partition_indexes))
        for t in r.request.topics or ()))


def _describe_user_scram_credentials(r: _Refusal) -> Any:
    # one result per user asked for, with the error but without the user's name
    cls = r.item("results")
    return r.top(error_code=r.code, error_message=r.message, results=tuple(
        _make(cls, error_code=r.code, error_message=r.message)
        for _ in r.request.users or ()))


def _alter_user_scram_credentials(r: _Refusal) -> Any:
    # one result per user named in a deletion or an upsertion, sorted, each once
    users = sorted({d.name for d in r.request.deletions} | {u.name for u in r.request.upsertions})
    cls = r.item("results")
    return r.top(results=tuple(_make(cls, user=u, error_code=r.code, error_message=r.message)
                               for u in users))


def _describe_producers(r: _Refusal) -> Any:
    return r.top(topics=_per_partition(
        r, r.request.topics, ("topics", "partitions"), lambda t: {"name": t.name},
        _indexes("partition_indexes")))


def _describe_transactions(r: _Refusal) -> Any:
    cls = r.item("transaction_states")
    return r.top(transaction_states=tuple(
        _make(cls, transactional_id=t, error_code=r.code) for t in r.request.transactional_ids))


def _consumer_group_describe(r: _Refusal) -> Any:
    cls = r.item("groups")
    return r.top(groups=tuple(_make(cls, group_id=g, error_code=r.code, error_message=r.message)
                              for g in r.request.group_ids))


_BUILDERS: dict[int, Callable[[_Refusal], Any]] = {
    0: _produce,
    1: _fetch,
    2: _list_offsets,
    3: _metadata,
    8: _offset_commit,
    9: _offset_fetch,
    10: _find_coordinator,
    11: _join_group,
    12: _error,  # Heartbeat
    13: _error,  # LeaveGroup: no member results
    14: _sync_group,
    15: _describe_groups,
    16: _list_groups,
    19: _create_topics,
    20: _delete_topics,
    21: _delete_records,
    22: _init_producer_id,
    23: _offset_for_leader_epoch,
    24: _add_partitions_to_txn,
    25: _error,  # AddOffsetsToTxn
    26: _error,  # EndTxn
    28: _txn_offset_commit,
    29: _error_and_message,  # DescribeAcls
    30: _create_acls,
    31: _delete_acls,
    32: _per_resource("results"),  # DescribeConfigs
    33: _per_resource("responses"),  # AlterConfigs
    34: _alter_replica_log_dirs,
    # DescribeLogDirs: the error as the broker's cluster check sends it (v3+; v0-v2 have no
    # place for it: an empty response). getErrorResponse sets only the throttle time.
    35: _error,
    37: _create_partitions,
    42: _delete_groups,
    43: _elect_leaders,
    44: _per_resource("responses"),  # IncrementalAlterConfigs
    45: _alter_partition_reassignments,
    46: _list_partition_reassignments,
    47: _error,  # OffsetDelete
    50: _describe_user_scram_credentials,
    51: _alter_user_scram_credentials,
    60: _error_and_message,  # DescribeCluster
    61: _describe_producers,
    65: _describe_transactions,
    66: _error,  # ListTransactions
    68: _error,  # ConsumerGroupHeartbeat
    69: _consumer_group_describe,
}

COVERED: frozenset[int] = frozenset(_BUILDERS)


def error_response(api_key: int, api_version: int, correlation_id: int,
                   request_body: bytes | memoryview, error_code: int) -> bytes:
    """The whole response frame (size prefix, header, body) Kafka's broker sends when it
    refuses this request with ``error_code``; ``b""`` where it sends none (Produce with
    ``acks=0``)."""
    builder = _BUILDERS.get(api_key)
    if builder is None:
        raise NotImplementedError(
            f"{apis.api_name(api_key)} (API key {api_key}): no error response is built")
    try:
        load_request_schema(api_key, api_version)
        cls = load_response_schema(api_key, api_version)
    except Exception:
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{api_version} is not a version kio has") from None
    request = decode_request(request_body, api_key, api_version)
    if api_key == 0 and request.acks == 0:
        return b""
    refusal = _Refusal(api_version, request, cls, ErrorCode(error_code),
                       MESSAGES.get(error_code))
    try:
        value = builder(refusal)
        body = (encode_response_header(correlation_id,
                                       apis.response_header_version(api_key, api_version))
                + encode(value))
    except (AttributeError, TypeError, ValueError, StopIteration) as exc:
        raise MalformedFrame(f"{apis.api_name(api_key)} v{api_version}: the error response "
                             f"cannot be built: {exc!r}") from None
    return _SIZE.pack(len(body)) + body
