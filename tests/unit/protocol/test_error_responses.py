"""The proxy's answer to a request it refuses whole is the response Kafka's broker builds in
the request class's ``getErrorResponse``: for every covered API and every version kio has,
a request with two items in each array the response mirrors is answered with the error
where Kafka puts it, on the request's own items, in order, with the fields Kafka sets."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.error_responses import COVERED, MESSAGES, error_response
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import parse_response_header
from testkit.frames import kio_decode, kio_encode, kio_values, request_frame

GROUP = 30
CLUSTER = 31
CORRELATION = 0x1234567


# ---------------------------------------------------------------------- sample requests
class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n % 100


def _leaf(tp: Any, path: str, counter: _Counter) -> Any:
    if tp is bool:
        return False
    if isinstance(tp, type) and issubclass(tp, str):
        return tp(path)
    if isinstance(tp, type) and issubclass(tp, int):
        return tp(counter.next())
    if isinstance(tp, type) and issubclass(tp, bytes):
        return tp(b"")
    if isinstance(tp, type) and issubclass(tp, datetime.timedelta):
        return tp.parse(datetime.timedelta(milliseconds=100))  # type: ignore[attr-defined]
    if tp is uuid.UUID:
        return uuid.UUID(int=0x100 + counter.next())
    raise NotImplementedError(f"no sample for {tp!r} at {path}")


def _value(hint: Any, path: str, counter: _Counter) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple(_value(args[0], f"{path}[{i}]", counter) for i in range(2))
    if args and origin is not None:  # X | None: a value
        return _value(args[0], path, counter)
    if dataclasses.is_dataclass(hint):
        return sample(typing.cast(type, hint), path, counter)
    return _leaf(hint, path, counter)


def sample(cls: type, path: str = "", counter: _Counter | None = None) -> Any:
    """A request entity with every field set (nullable ones too), two items in each array,
    each string its own path (``topics[1].name``) and ints counted up."""
    counter = counter or _Counter()
    hints = typing.get_type_hints(cls)
    fields = {f.name: _value(hints[f.name], f"{path}.{f.name}".lstrip("."), counter)
              for f in dataclasses.fields(cls)}
    if "acks" in fields:
        fields["acks"] = type(fields["acks"])(-1)
    return cls(**fields)


def _frame(api_key: int, version: int, value: Any) -> bytes:
    return request_frame(api_key, version, CORRELATION, "client-1", kio_encode(value))[4:]


def answer(api_key: int, version: int, value: Any, code: int) -> Any:
    """The proxy's answer to ``value``, checked as a frame and decoded with kio."""
    out = error_response(api_key, version, CORRELATION, _frame(api_key, version, value), code)
    assert int.from_bytes(out[:4], "big", signed=True) == len(out) - 4
    hv = apis.response_header_version(api_key, version)
    header = parse_response_header(out, 4, len(out), hv)
    assert header.correlation_id == CORRELATION
    resp = kio_decode(load_response_schema(api_key, version), out[4 + header.size:])
    if hasattr(resp, "throttle_time"):
        assert resp.throttle_time == datetime.timedelta(0)
    return resp


def _versions(api_key: int) -> list[int]:
    low, high = apis.kio_version_range(api_key)
    return list(range(low, high + 1))


def _has(value: Any, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(value)}


def _msg(code: int) -> str | None:
    return MESSAGES.get(code)


# ---------------------------------------------------------------------- what Kafka sets
def _parts(items: Any, index: str) -> list[int]:
    return [int(getattr(p, index)) if not isinstance(p, int) else int(p) for p in items]


def _mirrored(req_topics: Any, resp_topics: Any, *, req_name: str, resp_name: str,
              req_parts: str, resp_parts: str, req_index: str | None, resp_index: str,
              code: int, code_field: str = "error_code", **fields: Any) -> None:
    """The response has one entry per request topic, in order, named as the request names
    it, with one result per partition in order, the error and ``fields`` on each."""
    assert len(resp_topics) == len(req_topics) == 2
    for req, resp in zip(req_topics, resp_topics, strict=True):
        assert getattr(resp, resp_name) == getattr(req, req_name)
        req_p = getattr(req, req_parts)
        want = [int(p) for p in req_p] if req_index is None else _parts(req_p, req_index)
        assert len(want) == 2
        assert _parts(getattr(resp, resp_parts), resp_index) == want
        for p in getattr(resp, resp_parts):
            assert getattr(p, code_field) == code
            for k, v in fields.items():
                if _has(p, k):
                    assert getattr(p, k) == v, k


def _produce(v: int, req: Any, resp: Any, code: int) -> None:
    key = "topic_id" if v >= 13 else "name"
    _mirrored(req.topic_data, resp.responses, req_name=key, resp_name=key,
              req_parts="partition_data", resp_parts="partition_responses", req_index="index",
              resp_index="index", code=code, base_offset=-1, log_start_offset=-1,
              log_append_time=None, record_errors=(), error_message=_msg(code))


def _fetch(v: int, req: Any, resp: Any, code: int) -> None:
    if _has(resp, "error_code"):  # v7+
        assert resp.error_code == code
        assert resp.session_id == req.session_id
    if v >= 13:  # the top-level error only
        assert resp.responses == ()
        return
    _mirrored(req.topics, resp.responses, req_name="topic", resp_name="topic",
              req_parts="partitions", resp_parts="partitions", req_index="partition",
              resp_index="partition_index", code=code, high_watermark=-1,
              last_stable_offset=-1, log_start_offset=-1, preferred_read_replica=-1,
              records=b"")


def _list_offsets(v: int, req: Any, resp: Any, code: int) -> None:
    _mirrored(req.topics, resp.topics, req_name="name", resp_name="name",
              req_parts="partitions", resp_parts="partitions", req_index="partition_index",
              resp_index="partition_index", code=code, offset=-1, timestamp=-1,
              leader_epoch=-1)


def _metadata(v: int, req: Any, resp: Any, code: int) -> None:
    assert [t.name for t in resp.topics] == [t.name for t in req.topics]
    if v >= 10:
        assert [t.topic_id for t in resp.topics] == [t.topic_id for t in req.topics]
    for t in resp.topics:
        assert t.error_code == code and t.partitions == ()
        assert not _has(t, "is_internal") or t.is_internal is False
    assert resp.brokers == ()
    if v >= 13:
        assert resp.error_code == code


def _offset_commit(v: int, req: Any, resp: Any, code: int) -> None:
    key = "topic_id" if v >= 10 else "name"
    _mirrored(req.topics, resp.topics, req_name=key, resp_name=key, req_parts="partitions",
              resp_parts="partitions", req_index="partition_index",
              resp_index="partition_index", code=code)


def _offset_fetch(v: int, req: Any, resp: Any, code: int) -> None:
    if v >= 8:  # per group
        assert [g.group_id for g in resp.groups] == [g.group_id for g in req.groups]
        assert all(g.error_code == code and g.topics == () for g in resp.groups)
    elif v >= 2:  # the top-level error, no partitions
        assert resp.error_code == code and resp.topics == ()
    else:
        _mirrored(req.topics, resp.topics, req_name="name", resp_name="name",
                  req_parts="partition_indexes", resp_parts="partitions", req_index=None,
                  resp_index="partition_index", code=code, committed_offset=-1, metadata="")


def _find_coordinator(v: int, req: Any, resp: Any, code: int) -> None:
    entries = [resp] if v < 4 else list(resp.coordinators)
    if v >= 4:
        assert [c.key for c in resp.coordinators] == list(req.coordinator_keys)
    for c in entries:
        assert (c.error_code, c.node_id, c.host, c.port) == (code, -1, "", -1)
        if _has(c, "error_message"):
            assert c.error_message == _msg(code)


def _join_group(v: int, req: Any, resp: Any, code: int) -> None:
    assert resp.error_code == code
    assert (resp.generation_id, resp.member_id, resp.leader) == (-1, "", "")
    assert resp.protocol_name == ("" if v < 7 else None)
    assert resp.members == ()


def _error_only(v: int, req: Any, resp: Any, code: int) -> None:
    assert resp.error_code == code


def _sync_group(v: int, req: Any, resp: Any, code: int) -> None:
    assert resp.error_code == code and resp.assignment == b""


def _describe_groups(v: int, req: Any, resp: Any, code: int) -> None:
    assert [g.group_id for g in resp.groups] == list(req.groups)
    for g in resp.groups:
        assert g.error_code == code
        assert (g.group_state, g.protocol_type, g.protocol_data, g.members) == ("", "", "", ())
        if _has(g, "authorized_operations"):
            assert g.authorized_operations == -(2**31)


def _list_groups(v: int, req: Any, resp: Any, code: int) -> None:
    assert resp.error_code == code and resp.groups == ()


def _create_topics(v: int, req: Any, resp: Any, code: int) -> None:
    assert [t.name for t in resp.topics] == [t.name for t in req.topics]
    for t in resp.topics:
        assert t.error_code == code
        if _has(t, "error_message"):
            assert t.error_message == _msg(code)
        if _has(t, "num_partitions"):
            assert (t.num_partitions, t.replication_factor) == (-1, -1)


def _delete_topics(v: int, req: Any, resp: Any, code: int) -> None:
    if v >= 6:
        assert [(t.name, t.topic_id) for t in resp.responses] == [
            (t.name, t.topic_id) for t in req.topics]
    else:
        assert [t.name for t in resp.responses] == list(req.topic_names)
    assert all(t.error_code == code for t in resp.responses)


def _delete_records(v: int, req: Any, resp: Any, code: int) -> None:
    _mirrored(req.topics, resp.topics, req_name="name", resp_name="name",
              req_parts="partitions", resp_parts="partitions", req_index="partition_index",
              resp_index="partition_index", code=code, low_watermark=-1)


def _init_producer_id(v: int, req: Any, resp: Any, code: int) -> None:
    assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (code, -1, -1)


def _offset_for_leader_epoch(v: int, req: Any, resp: Any, code: int) -> None:
    _mirrored(req.topics, resp.topics, req_name="topic", resp_name="topic",
              req_parts="partitions", resp_parts="partitions", req_index="partition",
              resp_index="partition", code=code, leader_epoch=-1, end_offset=-1)


def _add_partitions_to_txn(v: int, req: Any, resp: Any, code: int) -> None:
    if v >= 4:
        assert resp.error_code == code and resp.results_by_transaction == ()
        return
    _mirrored(req.v3_and_below_topics, resp.results_by_topic_v3_and_below, req_name="name",
              resp_name="name", req_parts="partitions", resp_parts="results_by_partition",
              req_index=None, resp_index="partition_index", code=code,
              code_field="partition_error_code")


def _txn_offset_commit(v: int, req: Any, resp: Any, code: int) -> None:
    _mirrored(req.topics, resp.topics, req_name="name", resp_name="name",
              req_parts="partitions", resp_parts="partitions", req_index="partition_index",
              resp_index="partition_index", code=code)


def _error_and_message(v: int, req: Any, resp: Any, code: int) -> None:
    assert (resp.error_code, resp.error_message) == (code, _msg(code))


def _describe_acls(v: int, req: Any, resp: Any, code: int) -> None:
    _error_and_message(v, req, resp, code)
    assert resp.resources == ()


def _create_acls(v: int, req: Any, resp: Any, code: int) -> None:
    assert len(resp.results) == len(req.creations) == 2
    assert all((r.error_code, r.error_message) == (code, _msg(code)) for r in resp.results)


def _delete_acls(v: int, req: Any, resp: Any, code: int) -> None:
    assert len(resp.filter_results) == len(req.filters) == 2
    for r in resp.filter_results:
        assert (r.error_code, r.error_message, r.matching_acls) == (code, _msg(code), ())


def _per_resource(field: str) -> Callable[[int, Any, Any, int], None]:
    def check(v: int, req: Any, resp: Any, code: int) -> None:
        results = getattr(resp, field)
        assert [(r.resource_type, r.resource_name) for r in results] == [
            (r.resource_type, r.resource_name) for r in req.resources]
        assert len(results) == 2
        assert all((r.error_code, r.error_message) == (code, _msg(code)) for r in results)
    return check


def _alter_replica_log_dirs(v: int, req: Any, resp: Any, code: int) -> None:
    topics = [t for d in req.dirs for t in d.topics]
    assert len(resp.results) == len(topics) == 4
    for t, r in zip(topics, resp.results, strict=True):
        assert r.topic_name == t.name
        assert [p.partition_index for p in r.partitions] == list(t.partitions)
        assert all(p.error_code == code for p in r.partitions)


def _describe_log_dirs(v: int, req: Any, resp: Any, code: int) -> None:
    assert resp.results == ()
    if v >= 3:
        assert resp.error_code == code
    else:  # no place for an error in v0-v2
        assert not _has(resp, "error_code")


def _create_partitions(v: int, req: Any, resp: Any, code: int) -> None:
    assert [r.name for r in resp.results] == [t.name for t in req.topics]
    assert all((r.error_code, r.error_message) == (code, _msg(code)) for r in resp.results)


def _delete_groups(v: int, req: Any, resp: Any, code: int) -> None:
    assert [r.group_id for r in resp.results] == list(req.groups_names)
    assert all(r.error_code == code for r in resp.results)


def _elect_leaders(v: int, req: Any, resp: Any, code: int) -> None:
    if v >= 1:
        assert resp.error_code == code
    _mirrored(req.topic_partitions, resp.replica_election_results, req_name="topic",
              resp_name="topic", req_parts="partitions", resp_parts="partition_result",
              req_index=None, resp_index="partition_id", code=code, error_message=_msg(code))


def _alter_partition_reassignments(v: int, req: Any, resp: Any, code: int) -> None:
    _error_and_message(v, req, resp, code)
    _mirrored(req.topics, resp.responses, req_name="name", resp_name="name",
              req_parts="partitions", resp_parts="partitions", req_index="partition_index",
              resp_index="partition_index", code=code, error_message=_msg(code))


def _list_partition_reassignments(v: int, req: Any, resp: Any, code: int) -> None:
    _error_and_message(v, req, resp, code)
    assert [t.name for t in resp.topics] == [t.name for t in req.topics]
    for t, r in zip(req.topics, resp.topics, strict=True):
        assert [p.partition_index for p in r.partitions] == list(t.partition_indexes)
        assert all(p.replicas == () for p in r.partitions)


def _describe_user_scram_credentials(v: int, req: Any, resp: Any, code: int) -> None:
    _error_and_message(v, req, resp, code)
    assert len(resp.results) == len(req.users) == 2
    for r in resp.results:  # Kafka leaves the user's name out
        assert (r.user, r.error_code, r.error_message) == ("", code, _msg(code))


def _alter_user_scram_credentials(v: int, req: Any, resp: Any, code: int) -> None:
    users = sorted({d.name for d in req.deletions} | {u.name for u in req.upsertions})
    assert len(users) == 4
    assert [r.user for r in resp.results] == users
    assert all((r.error_code, r.error_message) == (code, _msg(code)) for r in resp.results)


def _describe_cluster(v: int, req: Any, resp: Any, code: int) -> None:
    _error_and_message(v, req, resp, code)
    assert resp.brokers == ()


def _describe_producers(v: int, req: Any, resp: Any, code: int) -> None:
    _mirrored(req.topics, resp.topics, req_name="name", resp_name="name",
              req_parts="partition_indexes", resp_parts="partitions", req_index=None,
              resp_index="partition_index", code=code, active_producers=())


def _describe_transactions(v: int, req: Any, resp: Any, code: int) -> None:
    states = resp.transaction_states
    assert [s.transactional_id for s in states] == list(req.transactional_ids)
    assert all(s.error_code == code for s in states)


def _consumer_group_describe(v: int, req: Any, resp: Any, code: int) -> None:
    assert [g.group_id for g in resp.groups] == list(req.group_ids)
    assert all((g.error_code, g.error_message) == (code, _msg(code)) for g in resp.groups)


CHECKS: dict[int, Callable[[int, Any, Any, int], None]] = {
    0: _produce, 1: _fetch, 2: _list_offsets, 3: _metadata, 8: _offset_commit,
    9: _offset_fetch, 10: _find_coordinator, 11: _join_group, 12: _error_only,
    13: _error_only, 14: _sync_group, 15: _describe_groups, 16: _list_groups,
    19: _create_topics, 20: _delete_topics, 21: _delete_records, 22: _init_producer_id,
    23: _offset_for_leader_epoch, 24: _add_partitions_to_txn, 25: _error_only,
    26: _error_only, 28: _txn_offset_commit, 29: _describe_acls, 30: _create_acls,
    31: _delete_acls, 32: _per_resource("results"), 33: _per_resource("responses"),
    34: _alter_replica_log_dirs, 35: _describe_log_dirs, 37: _create_partitions,
    42: _delete_groups, 43: _elect_leaders, 44: _per_resource("responses"),
    45: _alter_partition_reassignments, 46: _list_partition_reassignments, 47: _error_only,
    50: _describe_user_scram_credentials, 51: _alter_user_scram_credentials,
    60: _describe_cluster, 61: _describe_producers, 65: _describe_transactions,
    66: _error_only, 68: _error_only, 69: _consumer_group_describe,
}

CASES = [(k, v) for k in sorted(CHECKS) for v in _versions(k)]


def test_every_covered_api_is_checked() -> None:
    assert set(CHECKS) == set(COVERED)


@pytest.mark.parametrize(("api_key", "version"), CASES,
                         ids=[f"{apis.api_name(k)}-v{v}" for k, v in CASES])
@pytest.mark.parametrize("code", [GROUP, CLUSTER])
def test_answer_is_kafkas_error_response(api_key: int, version: int, code: int) -> None:
    req = sample(load_request_schema(api_key, version))
    CHECKS[api_key](version, req, answer(api_key, version, req, code), code)


# ---------------------------------------------------------------------- particular cases
def test_the_messages_are_kafkas() -> None:
    assert MESSAGES[29] == "Topic authorization failed."
    assert MESSAGES[30] == "Group authorization failed."
    assert MESSAGES[31] == "Cluster authorization failed."
    assert MESSAGES[53] == "Transactional Id authorization failed."
    assert MESSAGES[58] == "SASL Authentication failed."


def test_a_code_without_a_message_leaves_it_null() -> None:
    req = sample(load_request_schema(29, 3))
    resp = answer(29, 3, req, 7)
    assert (resp.error_code, resp.error_message) == (7, None)


def test_produce_without_acks_gets_no_answer() -> None:
    req = dataclasses.replace(sample(load_request_schema(0, 9)), acks=0)
    assert error_response(0, 9, CORRELATION, _frame(0, 9, req), 53) == b""


def test_produce_names_a_topic_twice_gets_one_result() -> None:
    req = sample(load_request_schema(0, 9))
    first = req.topic_data[0]
    req = dataclasses.replace(req, topic_data=(first, first))
    resp = answer(0, 9, req, 53)
    assert [t.name for t in resp.responses] == [first.name]
    assert [p.index for p in resp.responses[0].partition_responses] == [
        p.index for p in first.partition_data] * 2


def test_metadata_for_all_topics_answers_with_no_topic() -> None:
    req = dataclasses.replace(sample(load_request_schema(3, 12)), topics=None)
    resp = answer(3, 12, req, CLUSTER)
    assert resp.topics == ()


def test_metadata_by_id_answers_with_an_empty_name() -> None:
    req = sample(load_request_schema(3, 12))
    req = dataclasses.replace(req, topics=tuple(
        dataclasses.replace(t, name=None) for t in req.topics))
    resp = answer(3, 12, req, CLUSTER)
    assert [(t.name, t.topic_id) for t in resp.topics] == [
        ("", t.topic_id) for t in req.topics]


@pytest.mark.parametrize("api_key", [17, 18, 36, 48, 49, 57, 76])
def test_an_api_not_covered_is_named(api_key: int) -> None:
    with pytest.raises(NotImplementedError, match=apis.api_name(api_key)):
        error_response(api_key, 0, CORRELATION, b"", GROUP)


def test_a_request_that_does_not_decode_is_malformed() -> None:
    frame = request_frame(11, 5, CORRELATION, "client-1", b"\x00\x05abc")[4:]
    with pytest.raises(MalformedFrame):
        error_response(11, 5, CORRELATION, frame, GROUP)


def test_a_version_kio_does_not_have_is_malformed() -> None:
    high = apis.kio_version_range(11)[1] + 1
    with pytest.raises(MalformedFrame):
        error_response(11, high, CORRELATION, b"", GROUP)


def test_a_memoryview_is_read_like_bytes() -> None:
    req = sample(load_request_schema(22, 4))
    frame = _frame(22, 4, req)
    assert error_response(22, 4, 7, memoryview(frame), 53) == error_response(
        22, 4, 7, frame, 53)


# ---------------------------------------------------------------------- any request
@st.composite
def _requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    api_key, version = draw(st.sampled_from(CASES))
    value = draw(kio_values(load_request_schema(api_key, version), 2))
    return api_key, version, value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests(), st.sampled_from([GROUP, CLUSTER, 53]))
def test_any_request_gets_an_answer_kio_reads(case: tuple[int, int, Any], code: int) -> None:
    api_key, version, value = case
    if api_key == 0 and value.acks == 0:
        return
    answer(api_key, version, value, code)
