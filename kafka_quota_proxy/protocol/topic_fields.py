"""Which requests name topics, where, and how to take topics out of them: derived from kio's
request schemas (generated from Kafka's JSON message specs), not from a hand-kept list.

``topic_arrays(api_key, version)`` walks kio's request class of that version (and every
nested entity): a field typed ``TopicName`` (kio's type for Kafka's ``topicName`` entity
type: ``name``, ``topic``, ``topic_name``, ``topic_names``, ``subscribed_topic_names``...),
a ``uuid`` field named ``topic_id``, or a ``resource_type``/``resource_name`` pair (config
and ACL resources, a topic when the type is 2) marks the entity that holds it as a topic
entry. Each ``TopicArray`` is the path from the request body to those entries.

``read_topics`` decodes a request and lists its topic entries (``TopicRef``: the topic's
name and/or id and where the entry is); ``without`` re-encodes the request with some entries
removed (a frame of another size). ``HANDLING`` says, for every API that has topic fields,
what the answer to a refused topic is (``Results``: an error result in a response array,
merged into the broker's response; ``Refused``: the whole request answered with a top-level
error; ``Metadata``; ``Unguarded``: not refused per topic, with the reason);
``tests/unit/protocol/test_topic_fields.py`` fails when a request schema names topics and
``HANDLING`` does not cover it. The topic guard (``proxy.features.topic_guard.filter``) and, later,
proxy-side ACLs use the same extraction.

Frames are whole, without their size prefix, header included. Anything that does not decode
raises ``MalformedFrame``.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import typing
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.decoded import request_body, response_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import (
    encode_response_header,
    parse_request_header,
    parse_response_header,
)

TOPIC_AUTHORIZATION_FAILED = 29
RESOURCE_TOPIC = 2  # ConfigResource.Type.TOPIC and ResourceType.TOPIC
ZERO_UUID = uuid.UUID(int=0)
_PARTITION_FIELDS = ("partition_index", "partition", "index", "partition_id")
# Request arrays whose topics are only taken out, never answered (a fetch session's forgotten
# topics: the response says nothing of them)
_SILENT = frozenset({"forgotten_topics_data"})


@dataclass(frozen=True, slots=True)
class TopicArray:
    """Topic entries of a request: ``steps`` lead from the body to them, each ``(field,
    is_array)``; an entry names its topic in ``name`` and/or ``topic_id`` (fields of the
    entry), or is itself a topic name (``items``), or is a resource (``resource``: its
    ``resource_type`` and ``resource_name``)."""

    steps: tuple[tuple[str, bool], ...]
    name: str | None = None
    topic_id: str | None = None
    items: bool = False
    resource: bool = False

    @property
    def removable(self) -> bool:
        """An entry can be taken out of the request (it is an item of an array)."""
        return bool(self.steps) and self.steps[-1][1]

    @property
    def path(self) -> str:
        return ".".join(s for s, _ in self.steps) + (
            f".{self.name}" if self.name else "") + (f".{self.topic_id}" if self.topic_id else "")


def _types(hint: Any) -> list[Any]:
    """The types a field's hint is made of (Optional and tuple unwrapped)."""
    origin = typing.get_origin(hint)
    if origin is None:
        return [hint]
    out: list[Any] = []
    for arg in typing.get_args(hint):
        if arg is Ellipsis or arg is type(None):
            continue
        out += _types(arg)
    return out


def _is_array(hint: Any) -> bool:
    return any(typing.get_origin(t) is tuple for t in [hint, *typing.get_args(hint)])


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _derive(cls: type, steps: tuple[tuple[str, bool], ...], out: list[TopicArray]) -> None:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    name_field = id_field = None
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        types = _types(hint)
        array = _is_array(hint)
        if TopicName in types:
            if array:
                out.append(TopicArray((*steps, (f.name, True)), items=True))
            elif name_field is None:
                name_field = f.name
            continue
        if uuid.UUID in types and f.name == "topic_id" and not array:
            id_field = f.name
            continue
        for t in types:
            if dataclasses.is_dataclass(t) and isinstance(t, type):
                _derive(t, (*steps, (f.name, array)), out)
    if name_field is not None or id_field is not None:
        out.append(TopicArray(steps, name=name_field, topic_id=id_field))
    elif {"resource_type", "resource_name"} <= names:
        out.append(TopicArray(steps, resource=True))


@cache
def topic_arrays(api_key: int, version: int) -> tuple[TopicArray, ...]:
    """Where requests of this API and version name topics (empty: nowhere, or a version kio
    does not know)."""
    try:
        cls = load_request_schema(api_key, version)
    except Exception:
        return ()
    out: list[TopicArray] = []
    _derive(cls, (), out)
    return tuple(out)


@cache
def response_topic_arrays(api_key: int, version: int) -> tuple[TopicArray, ...]:
    """Where responses of this API and version name topics (the same derivation)."""
    try:
        cls = load_response_schema(api_key, version)
    except Exception:
        return ()
    out: list[TopicArray] = []
    _derive(cls, (), out)
    return tuple(out)


def omit_topics(value: Any, api_key: int, version: int,
                omitted: Callable[[TopicRef], bool]) -> Any:
    """A decoded response without the topic entries ``omitted`` picks (a response that
    lists topics the client did not name: DescribeLogDirs for all topics)."""
    refs = [r for r in refs_of(value, response_topic_arrays(api_key, version))
            if r.array.removable and omitted(r)]
    return without_value(value, refs) if refs else value


def topic_apis() -> dict[int, tuple[int, ...]]:
    """Every API whose request names topics in some version kio knows, with those versions."""
    found: dict[int, tuple[int, ...]] = {}
    for api_key in sorted(API_TABLE):
        low, high = apis.kio_version_range(api_key)
        versions = tuple(v for v in range(low, high + 1) if topic_arrays(api_key, v))
        if versions:
            found[api_key] = versions
    return found


# ---------------------------------------------------------------------- how each API answers
@dataclass(frozen=True, slots=True)
class Results:
    """Refused topics are taken out of the request; each gets an error result, appended to
    the response array at ``response`` (field names from the body; outer arrays are matched
    to the request's by position), per partition when the result has partitions."""

    response: tuple[str, ...]
    # request array path -> response array path, where a version's request has several
    by_request: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    """A request naming a refused topic is answered whole by the proxy with the top-level
    ``error_code`` (an API whose request cannot go on without the topic)."""


@dataclass(frozen=True, slots=True)
class MetadataHandling:
    """Metadata: named refused topics answered with the error; a request for all topics
    answered without them."""


@dataclass(frozen=True, slots=True)
class LeftOut:
    """Refused topics are taken out of the request and nothing is said of them (a response
    with no place for a topic's error: as Kafka leaves out what a client may not see); a
    response listing them anyway (the request asked for all topics) has them taken out."""


@dataclass(frozen=True, slots=True)
class Unguarded:
    reason: str


Handling = Results | Refused | LeftOut | MetadataHandling | Unguarded

# Every API whose request names topics (``topic_apis()``; the unit test holds them equal).
HANDLING: dict[int, Handling] = {
    0: Results(("responses",)),  # Produce (hot path: ``protocol.topic_guard.ProduceTopics``)
    1: Results(("responses",)),  # Fetch
    2: Results(("topics",)),  # ListOffsets
    3: MetadataHandling(),
    8: Results(("topics",)),  # OffsetCommit
    9: Results(("topics",), by_request=((("groups", "topics"), ("groups", "topics")),)),
    19: Results(("topics",)),  # CreateTopics
    20: Results(("responses",)),  # DeleteTopics
    21: Results(("topics",)),  # DeleteRecords
    23: Results(("topics",)),  # OffsetForLeaderEpoch
    24: Results(("results_by_topic_v3_and_below",), by_request=(
        (("transactions", "topics"), ("results_by_transaction", "topic_results")),)),
    27: Results(("markers", "topics")),  # WriteTxnMarkers (inter-broker)
    28: Results(("topics",)),  # TxnOffsetCommit
    30: Unguarded("CreateAcls: ACL bindings are authorized on the cluster, not on the topic"),
    32: Results(("results",)),  # DescribeConfigs
    33: Results(("responses",)),  # AlterConfigs
    34: Results(("results",)),  # AlterReplicaLogDirs
    35: LeftOut(),  # DescribeLogDirs: results are per directory
    37: Results(("results",)),  # CreatePartitions
    43: Results(("replica_election_results",)),  # ElectLeaders
    44: Results(("responses",)),  # IncrementalAlterConfigs
    45: Results(("responses",)),  # AlterPartitionReassignments
    46: LeftOut(),  # ListPartitionReassignments
    47: Results(("topics",)),  # OffsetDelete
    52: Refused(), 53: Refused(), 54: Refused(), 55: Refused(), 56: Refused(),  # KRaft
    59: Refused(),  # FetchSnapshot
    61: Results(("topics",)),  # DescribeProducers
    68: Refused(),  # ConsumerGroupHeartbeat: a subscription to a refused topic
    73: Refused(),  # AssignReplicasToDirs
    75: Results(("topics",)),  # DescribeTopicPartitions
    76: Refused(),  # ShareGroupHeartbeat
    78: Results(("responses",)),  # ShareFetch
    79: Results(("responses",)),  # ShareAcknowledge
    83: Results(("results",)), 84: Results(("results",)), 85: Results(("results",)),
    86: Results(("results",)), 87: Results(("results",)),  # share group state
    88: Refused(),  # StreamsGroupHeartbeat
    90: Results(("topics",), by_request=((("groups", "topics"), ("groups", "topics")),)),
    91: Results(("responses",)),  # AlterShareGroupOffsets
    92: Results(("responses",)),  # DeleteShareGroupOffsets
}


# ---------------------------------------------------------------------- reading a request
@dataclass(frozen=True, slots=True)
class TopicRef:
    """One topic entry of a decoded request."""

    array: TopicArray
    where: tuple[int, ...]  # the index in each array step leading to it
    name: str | None
    topic_id: uuid.UUID | None
    entry: Any  # the kio entity (or the name, for ``items``)
    error_code: int = TOPIC_AUTHORIZATION_FAILED  # what its result says when refused


@dataclass(frozen=True, slots=True)
class TopicRequest:
    api_key: int
    version: int
    correlation_id: int
    header_size: int
    value: Any  # kio's request
    refs: tuple[TopicRef, ...]


def _walk(obj: Any, steps: Sequence[tuple[str, bool]], where: tuple[int, ...]
          ) -> Iterator[tuple[tuple[int, ...], Any]]:
    if not steps:
        yield where, obj
        return
    (field, array), rest = steps[0], steps[1:]
    child = getattr(obj, field)
    if child is None:
        return
    if array:
        for i, item in enumerate(child):
            yield from _walk(item, rest, (*where, i))
    else:
        yield from _walk(child, rest, where)


def refs_of(value: Any, arrays: Iterable[TopicArray]) -> tuple[TopicRef, ...]:
    out = []
    for array in arrays:
        for where, entry in _walk(value, array.steps, ()):
            if array.items:
                out.append(TopicRef(array, where, None if entry is None else str(entry), None,
                                    entry))
            elif array.resource:
                if int(entry.resource_type) == RESOURCE_TOPIC:
                    out.append(TopicRef(array, where, str(entry.resource_name), None, entry))
            else:
                name = getattr(entry, array.name) if array.name else None
                topic_id = getattr(entry, array.topic_id) if array.topic_id else None
                out.append(TopicRef(array, where, None if name is None else str(name),
                                    None if topic_id == ZERO_UUID else topic_id, entry))
    return tuple(out)


def read_topics(frame: bytes | memoryview, api_key: int, version: int) -> TopicRequest:
    """The topic entries of a request frame."""
    value = request_body(frame, api_key, version)
    header = parse_request_header(frame, 0, len(frame))
    try:
        refs = refs_of(value, topic_arrays(api_key, version))
    except (AttributeError, TypeError, ValueError) as exc:  # a null array kio let through
        raise MalformedFrame(
            f"{apis.api_name(api_key)} v{version} request does not decode: {exc!r}") from None
    return TopicRequest(api_key, version, header.correlation_id, header.size, value, refs)


def _rebuild(obj: Any, steps: Sequence[tuple[str, bool]], drop: set[tuple[int, ...]],
             where: tuple[int, ...]) -> Any:
    (field, array), rest = steps[0], steps[1:]
    child = getattr(obj, field)
    if child is None:
        return obj
    if array:
        items = []
        for i, item in enumerate(child):
            key = (*where, i)
            if not rest:
                if key not in drop:
                    items.append(item)
            else:
                items.append(_rebuild(item, rest, drop, key))
        new: Any = tuple(items)
    elif rest:
        new = _rebuild(child, rest, drop, where)
    else:
        return obj
    return dataclasses.replace(obj, **{field: new})


def without_value(value: Any, refused: Iterable[TopicRef]) -> Any:
    by_array: dict[TopicArray, set[tuple[int, ...]]] = {}
    for ref in refused:
        by_array.setdefault(ref.array, set()).add(ref.where)
    for array, drop in by_array.items():
        value = _rebuild(value, array.steps, drop, ())
    return value


def encode(value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return buf.getvalue()


def without(frame: bytes | memoryview, request: TopicRequest, refused: Iterable[TopicRef]
            ) -> bytes:
    """``frame`` without the entries ``refused`` (a frame of another size)."""
    return bytes(frame[: request.header_size]) + encode(without_value(request.value, refused))


# ---------------------------------------------------------------------- error results
# Fields Kafka leaves at -1 in the result of a partition it refuses (INVALID_HIGH_WATERMARK,
# INVALID_OFFSET, ...) where the spec gives no default.
_MINUS_ONE = frozenset({"high_watermark", "last_stable_offset", "log_start_offset",
                        "base_offset", "low_watermark", "offset", "timestamp",
                        "leader_epoch", "committed_offset", "committed_leader_epoch",
                        "end_offset", "start_offset", "lag", "leader_id"})


def _zero(hint: Any, name: str) -> Any:
    types = _types(hint)
    optional = type(None) in typing.get_args(hint)
    if _is_array(hint):
        return None if name in ("aborted_transactions",) and optional else ()
    t = types[0]
    if name == "records":  # (empty, not null, as Kafka's error results: clients refuse null)
        return b""
    if optional and (name == "error_message" or t is not str):
        return None
    if t is ErrorCode:
        return ErrorCode(0)
    if isinstance(t, type) and issubclass(t, bool):
        return False
    if isinstance(t, type) and issubclass(t, int):
        return t(-1 if name in _MINUS_ONE else 0)
    if isinstance(t, type) and issubclass(t, str):
        return ""
    if t is uuid.UUID:
        return ZERO_UUID
    if isinstance(t, type) and issubclass(t, datetime.timedelta):
        return datetime.timedelta(0)
    if isinstance(t, type) and issubclass(t, bytes):
        return b""
    if dataclasses.is_dataclass(t) and isinstance(t, type):
        return blank(t)
    return None


def blank(cls: type, **given: Any) -> Any:
    """An entity of ``cls`` with ``given`` fields, every other at its spec default (else zero,
    -1 for offsets, None for nullable fields)."""
    hints = _hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            fields[f.name] = given[f.name]
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        else:
            fields[f.name] = _zero(hints[f.name], f.name)
    return cls(**fields)


def _entry_class(cls: type, path: Sequence[str]) -> type:
    """The entity class of the array at ``path`` from ``cls``."""
    for field in path:
        hint = _hints(cls)[field]
        found: Any = next(t for t in _types(hint) if dataclasses.is_dataclass(t))
        cls = found
    return cls


def _request_partitions(entry: Any) -> list[int] | None:
    """The partitions a request entry names (None: it names none)."""
    if not dataclasses.is_dataclass(entry):
        return None
    for f in dataclasses.fields(entry):
        items = getattr(entry, f.name)
        if not isinstance(items, tuple) or not f.name.startswith("partition"):
            continue
        out = []
        for p in items:
            if isinstance(p, int):
                out.append(int(p))
            elif dataclasses.is_dataclass(p):
                index = next((getattr(p, n) for n in _PARTITION_FIELDS if hasattr(p, n)), None)
                if index is not None:
                    out.append(int(index))
        return out
    return None


def _error_fields(cls: type, error_code: int = TOPIC_AUTHORIZATION_FAILED) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    code = ErrorCode(error_code)
    out: dict[str, Any] = {}
    for n in ("error_code", "partition_error_code"):
        if n in names:
            out[n] = code
    return out


def error_result(cls: type, ref: TopicRef, partitions: list[int] | None = None,
                 error_code: int | None = None) -> Any:
    """``cls``'s result for a refused topic: its name or id as the request gave them,
    TOPIC_AUTHORIZATION_FAILED on the topic or on each partition the request named (or
    ``partitions``)."""
    hints = _hints(cls)
    if error_code is None:
        error_code = ref.error_code
    given: dict[str, Any] = _error_fields(cls, error_code)
    if partitions is None:
        partitions = _request_partitions(ref.entry)
    for f in dataclasses.fields(cls):
        types = _types(hints[f.name])
        if ref.array.resource and f.name in ("resource_type", "resource_name"):
            given[f.name] = getattr(ref.entry, f.name)
        elif TopicName in types and not _is_array(hints[f.name]):
            given[f.name] = ref.name
        elif f.name == "topic_id" and uuid.UUID in types:
            given[f.name] = ref.topic_id or ZERO_UUID
        elif _is_array(hints[f.name]) and partitions is not None:
            inner: Any = next((t for t in types if dataclasses.is_dataclass(t)), None)
            if inner is None:
                continue
            inner_names = {g.name for g in dataclasses.fields(inner)}
            index = next((n for n in _PARTITION_FIELDS if n in inner_names), None)
            if index is None:
                continue
            index_type = _types(_hints(inner)[index])[0]
            given[f.name] = tuple(
                blank(inner, **{index: index_type(p), **_error_fields(inner, error_code)})
                for p in partitions)
    if "error_code" not in given and "partition_error_code" not in given and not any(
            isinstance(v, tuple) and v for v in given.values()):
        raise ValueError(f"{cls.__name__} has no place for an error")
    return blank(cls, **given)


def _array_at(value: Any, path: Sequence[str]) -> Any:
    for field in path:
        value = getattr(value, field)
    return value


def _response_path(handling: Results, ref: TopicRef) -> tuple[str, ...]:
    request_path = tuple(s for s, _ in ref.array.steps)
    for req, resp in handling.by_request:
        if req == request_path:
            return resp
    return handling.response


def _with_results(value: Any, path: Sequence[str], outer: tuple[int, ...],
                  results: list[Any]) -> Any:
    """``value`` with ``results`` appended to the array at ``path``; ``outer``: the index in
    each array before the last (matched by position)."""
    field = path[0]
    child = getattr(value, field)
    if len(path) == 1:
        return dataclasses.replace(value, **{field: (*(child or ()), *results)})
    items = list(child or ())
    i = outer[0]
    if i >= len(items):
        raise ValueError(f"the response has no {field}[{i}]")
    items[i] = _with_results(items[i], path[1:], outer[1:], results)
    return dataclasses.replace(value, **{field: tuple(items)})


def add_results(value: Any, api_key: int, version: int, refused: Sequence[TopicRef]) -> Any:
    """A decoded response with the error results of ``refused`` after its own."""
    handling = HANDLING[api_key]
    assert isinstance(handling, Results)
    cls = load_response_schema(api_key, version)
    groups: dict[tuple[tuple[str, ...], tuple[int, ...]], list[Any]] = {}
    for ref in refused:
        if ref.array.steps[0][0] in _SILENT:
            continue
        path = _response_path(handling, ref)
        entry_cls = _entry_class(cls, path)
        groups.setdefault((path, ref.where[:-1]), []).append(error_result(entry_cls, ref))
    for (path, outer), results in groups.items():
        value = _with_results(value, path, outer, results)
    return value


def with_refused(frame: bytes | memoryview, api_key: int, version: int,
                 refused: Sequence[TopicRef]) -> bytes:
    """The broker's response (a whole frame) with the refused topics' results added."""
    hv = apis.response_header_version(api_key, version)
    header = parse_response_header(frame, 0, len(frame), hv)
    value = response_body(frame, api_key, version)
    try:
        value = add_results(value, api_key, version, refused)
    except (ValueError, AttributeError, TypeError, StopIteration) as exc:
        raise MalformedFrame(f"{apis.api_name(api_key)} v{version} response: the refused "
                             f"topics' results cannot be added: {exc!r}") from None
    return bytes(frame[: header.size]) + encode(value)


def response_without(frame: bytes | memoryview, api_key: int, version: int,
                     omitted: Callable[[TopicRef], bool]) -> bytes | None:
    """The broker's response (a whole frame) without the topics ``omitted`` picks (None:
    it has none)."""
    hv = apis.response_header_version(api_key, version)
    header = parse_response_header(frame, 0, len(frame), hv)
    value = response_body(frame, api_key, version)
    try:
        new = omit_topics(value, api_key, version, omitted)
    except (AttributeError, TypeError, ValueError) as exc:
        raise MalformedFrame(f"{apis.api_name(api_key)} v{version} response: topics cannot "
                             f"be left out: {exc!r}") from None
    return None if new is value else bytes(frame[: header.size]) + encode(new)


def refused_response(request: TopicRequest, refused: Sequence[TopicRef]) -> bytes:
    """The whole answer to a request the proxy answers itself: every refused topic's error
    result (``Results``), or the top-level error (``Refused``, or no result has a place)."""
    api_key, version = request.api_key, request.version
    cls: Any = load_response_schema(api_key, version)
    handling = HANDLING.get(api_key)
    value = None
    if isinstance(handling, Results):
        try:
            value = add_results(_with_outer(blank(cls), request, handling), api_key, version,
                                refused)
        except (ValueError, AttributeError, TypeError, StopIteration):
            value = None
    if value is None:
        names = {f.name for f in dataclasses.fields(cls)}
        if "error_code" not in names:
            raise MalformedFrame(f"{apis.api_name(api_key)} v{version}: no top-level error "
                                 "to answer a refused topic with")
        codes = {ref.error_code for ref in refused}
        value = blank(cls, error_code=ErrorCode(
            codes.pop() if len(codes) == 1 else TOPIC_AUTHORIZATION_FAILED))
    return (encode_response_header(request.correlation_id,
                                   apis.response_header_version(api_key, version))
            + encode(value))


def _with_outer(value: Any, request: TopicRequest, handling: Results) -> Any:
    """A blank response with, where results sit in an outer array (OffsetFetch's groups),
    one outer entry per request entry, its scalar fields (``group_id``) copied."""
    done = set()
    for ref in request.refs:
        path = _response_path(handling, ref)
        if len(path) != 2 or len(ref.array.steps) < 2 or path[0] in done:
            continue
        done.add(path[0])
        outer = getattr(request.value, ref.array.steps[0][0], None) or ()
        cls = _entry_class(type(value), path[:1])
        names = {f.name for f in dataclasses.fields(cls)}
        entries = []
        for item in outer:
            given = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)
                     if f.name in names and not isinstance(getattr(item, f.name), tuple)}
            entries.append(blank(cls, **given))
        value = dataclasses.replace(value, **{path[0]: tuple(entries)})
    return value


def answer_whole(request: TopicRequest, refused: Sequence[TopicRef]) -> bool:
    """Whether the proxy answers the request itself: nothing but refused topics is left in
    it, an entry cannot be taken out, or the API is refused whole."""
    handling = HANDLING.get(request.api_key)
    if not isinstance(handling, Results | LeftOut | MetadataHandling):
        return True
    if any(not ref.array.removable for ref in refused):
        return True
    if isinstance(handling, MetadataHandling | LeftOut):
        return False
    return _entries(request) == len(refused)


def _entries(request: TopicRequest) -> int:
    """The entries of a request's topic arrays: its topic refs, and a resource array's other
    resources (a broker's or a group's config, beside topics': not left out when the topics
    are refused)."""
    total = 0
    for array in topic_arrays(request.api_key, request.version):
        if array.resource:
            total += sum(1 for _ in _walk(request.value, array.steps, ()))
        else:
            total += sum(1 for ref in request.refs if ref.array == array)
    return total


# ---------------------------------------------------------------------- Metadata
def metadata_request_topics(value: Any, version: int) -> tuple[Any, ...] | None:
    """The topics a Metadata request names; None when it asks for all topics (a null array,
    or an empty one in v0)."""
    topics = value.topics
    if topics is None or (version == 0 and not topics):
        return None
    return tuple(topics)


def metadata_without(value: Any, version: int, refused: Sequence[TopicRef]) -> Any:
    """A Metadata request without the refused topics. In v0 an empty list asks for every
    topic: a request left with none keeps asking for all (the response is then cut to the
    refused topics' errors, ``metadata_amended``)."""
    return without_value(value, refused)


def metadata_amended(value: Any, version: int, refused: Sequence[TopicRef],
                     guarded: Callable[[str | None, uuid.UUID | None], bool],
                     only_refused: bool) -> Any:
    """A decoded MetadataResponse without the guarded topics (as Kafka leaves out, from all
    topics, those a client may not describe), with TOPIC_AUTHORIZATION_FAILED for each
    refused topic the request named (by name, or by id with a null name); ``only_refused``:
    the broker's topics are all left out (a v0 request left with no topics asked for all)."""
    cls = _entry_class(load_response_schema(3, version), ("topics",))
    kept = () if only_refused else tuple(
        t for t in value.topics
        if not guarded(t.name, getattr(t, "topic_id", None)))
    names = {f.name for f in dataclasses.fields(cls)}
    errors = []
    for ref in refused:
        given: dict[str, Any] = {"error_code": ErrorCode(ref.error_code), "name": ref.name}
        if "topic_id" in names:
            given["topic_id"] = ref.topic_id or ZERO_UUID
            if ref.topic_id is not None and ref.name is None:
                given["name"] = None
        errors.append(blank(cls, **given))
    if len(kept) == len(value.topics) and not errors:
        return value
    return dataclasses.replace(value, topics=(*kept, *errors))
