"""The ACL admin frames: requests decoded to Kafka's wire codes, responses encoded as Kafka's
schemas read them, every version the proxy answers (v1-v3)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from kafka_quota_proxy.protocol.acl_frames import (
    CREATE_ACLS,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    Acl,
    create_response,
    decode_create,
    decode_delete,
    decode_describe,
    delete_response,
    describe_response,
)
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from testkit.frames import kio_request

VERSIONS = [1, 2, 3]
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                max_size=12)
acls = st.tuples(st.integers(2, 7), names, st.integers(3, 4), names.map(lambda n: f"User:{n}"),
                 st.sampled_from(["*", "10.0.0.1"]), st.integers(2, 15), st.integers(2, 3))


def _module(api_key: int, version: int) -> Any:
    return __import__(load_request_schema(api_key, version).__module__, fromlist=["_"])


def _read(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, the decoded response): the correlation id leads every header."""
    return int.from_bytes(frame[:4], "big"), response_body(frame, api_key, version)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=30, deadline=None)
@given(created=st.lists(acls, max_size=4))
def test_create_requests_decode_to_their_acls(version: int, created: list[Acl]) -> None:
    mod = _module(CREATE_ACLS, version)
    frame = kio_request(CREATE_ACLS, version, 5, creations=tuple(
        mod.AclCreation(resource_type=t, resource_name=n, resource_pattern_type=p,
                        principal=who, host=h, operation=op, permission_type=perm)
        for t, n, p, who, h, op, perm in created))
    assert decode_create(frame, version) == created


@pytest.mark.parametrize("version", VERSIONS)
def test_describe_and_delete_filters_decode_with_their_nulls(version: int) -> None:
    describe = kio_request(DESCRIBE_ACLS, version, 6, resource_type_filter=2,
                           resource_name_filter=None, pattern_type_filter=2,
                           principal_filter="User:alice", host_filter=None, operation=1,
                           permission_type=3)
    assert decode_describe(describe, version) == (2, None, 2, "User:alice", None, 1, 3)
    mod = _module(DELETE_ACLS, version)
    delete = kio_request(DELETE_ACLS, version, 7, filters=(
        mod.DeleteAclsFilter(resource_type_filter=1, resource_name_filter="t",
                             pattern_type_filter=1, principal_filter=None, host_filter="*",
                             operation=4, permission_type=1),
        mod.DeleteAclsFilter(resource_type_filter=3, resource_name_filter=None,
                             pattern_type_filter=4, principal_filter=None, host_filter=None,
                             operation=1, permission_type=2)))
    assert decode_delete(delete, version) == [(1, "t", 1, None, "*", 4, 1),
                                              (3, None, 4, None, None, 1, 2)]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=30, deadline=None)
@given(found=st.lists(acls, max_size=6), throttle=st.integers(0, 10_000))
def test_describe_responses_group_acls_by_resource(version: int, found: list[Acl],
                                                   throttle: int) -> None:
    corr, value = _read(DESCRIBE_ACLS, version,
                        describe_response(version, 11, throttle, 0, None, found))
    assert corr == 11 and value.throttle_time == datetime.timedelta(milliseconds=throttle)
    back = [(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host,
             a.operation, a.permission_type) for r in value.resources for a in r.acls]
    assert sorted(back) == sorted(found)
    patterns = [(r.resource_type, r.resource_name, r.pattern_type) for r in value.resources]
    assert len(patterns) == len(set(patterns))  # one entry per resource pattern


@pytest.mark.parametrize("version", VERSIONS)
def test_create_and_delete_responses_carry_each_result_in_order(version: int) -> None:
    corr, value = _read(CREATE_ACLS, version, create_response(
        version, 12, 0, [(0, None), (42, "Invalid operation ANY")]))
    assert corr == 12
    assert [(int(r.error_code), r.error_message) for r in value.results] == [
        (0, None), (42, "Invalid operation ANY")]
    acl: Acl = (2, "t", 3, "User:bob", "*", 3, 3)
    corr, value = _read(DELETE_ACLS, version, delete_response(
        version, 13, 5, [(0, None, [(0, None, acl)]), (31, "Cluster authorization failed.", [])]))
    assert corr == 13
    first, second = value.filter_results
    assert [(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host, m.operation,
             m.permission_type) for m in first.matching_acls] == [acl]
    assert int(second.error_code) == 31 and second.matching_acls == ()


def test_what_does_not_decode_is_malformed() -> None:
    frame = kio_request(CREATE_ACLS, 3, 5, creations=())
    with pytest.raises(MalformedFrame):
        decode_create(frame[:-1] + b"\xff\xff", 3)
