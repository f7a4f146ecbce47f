"""DescribeAcls, CreateAcls and DeleteAcls answered by the proxy
(``proxy.features.acls.admin_filter`` and ``store``), as Kafka's AclApis and the KRaft
controller's AclControlManager answer them: authorization on the cluster, Kafka's checks and
messages, the writes to the ACL topic (answered once stored), the topic's records applied, and
the frames of these APIs never reaching the broker."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
from kio.index import load_request_schema

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.authorizer.records import encode_record
from kafka_quota_proxy.config.acls import AclsConfig
from kafka_quota_proxy.config.schema import ProxyConfig
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.acl_frames import CREATE_ACLS, DELETE_ACLS, DESCRIBE_ACLS
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.interests import InterestTable, addresses
from kafka_quota_proxy.protocol.request_stream import WHOLE_FRAME_MAX
from kafka_quota_proxy.protocol.rewrite import ResponseRewriter, cap_api_versions
from kafka_quota_proxy.proxy.cluster_topics import MAC_HEADER, record_mac
from kafka_quota_proxy.proxy.features.acls.admin_filter import AclAdminFilter
from kafka_quota_proxy.proxy.features.acls.state import Acls
from kafka_quota_proxy.proxy.features.acls.store import AclStore, AclWriteFailed
from kafka_quota_proxy.proxy.features.quota_admin.admin import ClientQuotaAdmin
from kafka_quota_proxy.proxy.features.quota_admin.filter import QuotaAdminFilter
from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter
from testkit.connection import DrivenConnection
from testkit.filter_host import FakeFilterHost
from testkit.frames import frame as sized
from testkit.frames import kio_request, request_frame

R, P, Op, Perm = ResourceType, PatternType, AclOperation, AclPermissionType
CONFIG = {
    "super_users": ["User:admin"],
    "bindings": [
        {"principal": "User:alice", "operation": ["Read", "Describe"], "topic": "a-",
         "pattern_type": "prefixed"},
        {"principal": "User:ops", "operation": "Alter", "cluster": True},
        {"principal": "User:viewer", "operation": "Describe", "cluster": True},
    ]}
ALICE_READ = AclBinding(R.TOPIC, "a-", P.PREFIXED, "User:alice", "*", Op.READ, Perm.ALLOW)
BOB_WRITE = AclBinding(R.TOPIC, "b", P.LITERAL, "User:bob", "*", Op.WRITE, Perm.ALLOW)
BOB_GROUP = AclBinding(R.GROUP, "g", P.LITERAL, "User:bob", "10.0.0.1", Op.READ, Perm.DENY)


def _config(coordination: dict[str, Any] | None = None, **acls: Any) -> ProxyConfig:
    return ProxyConfig.model_validate({
        "coordination": coordination or {},
        "listeners": {"bootstrap": "127.0.0.1:19092", "advertised_host": "127.0.0.1",
                      "broker_ports": "19100-19110"},
        "upstream": {"bootstrap_servers": ["broker:9092"]},
        "acls": {**CONFIG, **acls}})


class FakeStore(AclStore):
    """The store with its writes recorded instead of sent (``fail``: refused), applied
    when they succeed, as the real one does once the cluster acknowledged them."""

    def __init__(self, acls: Acls, config: ProxyConfig | None = None) -> None:
        config = config or _config()
        super().__init__(acls, lambda: config, [])
        self.writes: list[tuple[list[AclBinding], list[AclBinding], str]] = []
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def write(self, created: list[AclBinding], deleted: list[AclBinding],
                    principal: str) -> None:
        self.writes.append((created, deleted, principal))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise AclWriteFailed("NotEnoughReplicas")
        for b in created:
            self.acls.add_dynamic(b)
        for b in deleted:
            self.acls.remove_dynamic(b)


def _setup(user: str = "admin") -> tuple[AclAdminFilter, FakeFilterHost, Acls, FakeStore]:
    acls = Acls(AclsConfig.model_validate(CONFIG))
    store = FakeStore(acls)
    host = FakeFilterHost(user)
    return AclAdminFilter(host, acls, store), host, acls, store


def _module(api_key: int, version: int) -> Any:
    return __import__(load_request_schema(api_key, version).__module__, fromlist=["_"])


def _describe_frame(version: int = 3, rtype: int = 1, name: str | None = None,
                    pattern: int = 1, principal: str | None = None, host: str | None = None,
                    op: int = 1, perm: int = 1) -> bytes:
    return kio_request(DESCRIBE_ACLS, version, 7, resource_type_filter=rtype,
                       resource_name_filter=name, pattern_type_filter=pattern,
                       principal_filter=principal, host_filter=host, operation=op,
                       permission_type=perm)


def _wire(b: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (int(b.resource_type), b.name, int(b.pattern_type), b.principal, b.host,
            int(b.operation), int(b.permission))


def _create_frame(creations: list[tuple[int, str, int, str, str, int, int]],
                  version: int = 3) -> bytes:
    mod = _module(CREATE_ACLS, version)
    return kio_request(CREATE_ACLS, version, 8, creations=tuple(
        mod.AclCreation(resource_type=t, resource_name=n, resource_pattern_type=p,
                        principal=who, host=h, operation=op, permission_type=perm)
        for t, n, p, who, h, op, perm in creations))


def _delete_frame(filters: list[tuple[int, str | None, int, str | None, str | None, int, int]],
                  version: int = 3) -> bytes:
    mod = _module(DELETE_ACLS, version)
    return kio_request(DELETE_ACLS, version, 9, filters=tuple(
        mod.DeleteAclsFilter(resource_type_filter=t, resource_name_filter=n,
                             pattern_type_filter=p, principal_filter=who, host_filter=h,
                             operation=op, permission_type=perm)
        for t, n, p, who, h, op, perm in filters))


def _run(f: AclAdminFilter, frame: bytes) -> InFlight:
    header = parse_request_header(frame, 0, len(frame))
    entry = InFlight(header.api_key, header.api_version, header.correlation_id,
                     header.client_id, len(frame) + 4, True)
    f.request(entry)
    assert f.request_frame(entry, frame, True) is None  # never replaced: answered
    return entry


def _answer(entry: InFlight) -> Any:
    assert entry.answer is not None
    assert int.from_bytes(entry.answer[:4], "big") == entry.correlation_id
    return response_body(entry.answer, entry.api_key, entry.api_version)


def _described(value: Any) -> list[tuple[int, str, int, str, str, int, int]]:
    return [(int(r.resource_type), r.resource_name, int(r.pattern_type), a.principal, a.host,
             int(a.operation), int(a.permission_type))
            for r in value.resources for a in r.acls]


async def _settle(f: AclAdminFilter) -> None:
    while f._writes:
        await asyncio.gather(*f._writes)


# ---------------------------------------------------------------------- DescribeAcls
@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("user", ["admin", "viewer", "ops"])  # super user, DESCRIBE, ALTER
def test_describe_lists_every_binding_in_force_the_filter_matches(version: int,
                                                                  user: str) -> None:
    f, host, acls, store = _setup(user)
    acls.add_dynamic(BOB_WRITE)
    value = _answer(_run(f, _describe_frame(version)))
    assert (value.error_code, value.error_message) == (0, None)
    assert set(_described(value)) == {_wire(b) for b in acls.bindings()}
    assert len(_described(value)) == 5  # alice's two, ops', viewer's and bob's
    # grouped by resource pattern: alice's two bindings under one resource
    (alice,) = [r for r in value.resources if r.resource_name == "a-"]
    assert len(alice.acls) == 2
    # a filter: MATCH finds the prefixed binding for a name under it
    value = _answer(_run(f, _describe_frame(version, rtype=2, name="a-orders", pattern=2)))
    assert _described(value) == [_wire(ALICE_READ), (*_wire(ALICE_READ)[:5], 8, 3)]
    assert store.describes == {"ok": 2, "refused": 0}
    assert host.closes == []


def test_describe_needs_describe_on_the_cluster() -> None:
    f, _, acls, store = _setup("alice")
    value = _answer(_run(f, _describe_frame()))
    assert (value.error_code, value.error_message, value.resources) == (
        31, "Cluster authorization failed.", ())
    assert store.describes == {"ok": 0, "refused": 1}
    assert acls.denied == {("CLUSTER", "DESCRIBE"): 1}


def test_a_filter_of_unknown_codes_matches_nothing_and_a_raw_unknown_closes() -> None:
    """Kafka reads a code it does not know as UNKNOWN (no binding matches it) but refuses to
    parse a request carrying UNKNOWN's own code, 0: it closes the connection."""
    f, host, _, _ = _setup()
    value = _answer(_run(f, _describe_frame(op=99)))
    assert (value.error_code, _described(value)) == (0, [])
    entry = _run(f, _describe_frame(rtype=0))
    assert entry.answer is None
    assert host.closes == [("invalid_request", "client",
                            "DescribeAclsRequest contains UNKNOWN elements")]


# ---------------------------------------------------------------------- CreateAcls
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_create_writes_the_valid_bindings_and_answers_once_stored(version: int) -> None:
    f, host, acls, store = _setup("ops")  # ALTER on the cluster, not a super user
    store.gate = asyncio.Event()
    java_host = AclBinding(R.TOPIC, "c", P.LITERAL, "User:carol", "0:0:0:0:0:0:0:1", Op.READ,
                           Perm.ALLOW)
    entry = _run(f, _create_frame([
        _wire(BOB_WRITE),
        (int(R.CLUSTER), "my-cluster", 3, "User:x", "*", int(Op.ALTER), 3),
        (int(R.TOPIC), "", 3, "User:x", "*", int(Op.READ), 3),
        (99, "t", 3, "User:x", "*", int(Op.READ), 3),
        (int(R.TOPIC), "t", 99, "User:x", "*", int(Op.READ), 3),
        (int(R.TOPIC), "t", 3, "User:x", "*", 99, 3),
        (int(R.TOPIC), "t", 3, "User:x", "*", int(Op.READ), 99),
        (int(R.TOPIC), "t", 3, "alice", "*", int(Op.READ), 3),
        (int(R.TOPIC), "t", 3, "User:", "*", int(Op.READ), 3),  # the proxy's own check
        (int(R.CLUSTER), CLUSTER_NAME, 4, "User:x", "*", int(Op.ALTER), 3),  # the proxy's too
        _wire(java_host),
        _wire(BOB_WRITE),  # twice: both created, written once
    ], version))
    assert [(r.error_code, r.error_message) for r in _answer(entry).results] == [
        (0, None),
        (42, "The only valid name for the CLUSTER resource is kafka-cluster"),
        (42, "Invalid empty resource name"),
        (42, "Invalid resourceType UNKNOWN"),
        (42, "Invalid patternType UNKNOWN"),
        (42, "Invalid operation UNKNOWN"),
        (42, "Invalid permissionType UNKNOWN"),
        (42, "Could not parse principal from `alice` (no colon is present separating the "
             "principal type from the principal name)"),
        (42, "principal 'User:' is not of the form Type:name (User:alice)"),
        (42, "the cluster resource is the LITERAL 'kafka-cluster'"),
        (0, None),
        (0, None)]
    # the responses wait until the cluster has the bindings; not in force before
    assert host.holds == ["acl_change:8"] and host.released == []
    assert BOB_WRITE not in acls.dynamic
    store.gate.set()
    await _settle(f)
    assert host.released == ["acl_change:8"]
    normal = AclBinding(R.TOPIC, "c", P.LITERAL, "User:carol", "::1", Op.READ, Perm.ALLOW)
    assert store.writes == [([BOB_WRITE, java_host], [], "User:ops")]
    assert acls.dynamic == {BOB_WRITE, normal}
    assert acls.authorizer.authorize("User:bob", "10.1.1.1", Op.WRITE, R.TOPIC, "b")
    assert store.creates == {"ok": 1, "refused": 0, "failed": 0}


def test_create_needs_alter_on_the_cluster() -> None:
    f, host, _, store = _setup("viewer")  # DESCRIBE only
    entry = _run(f, _create_frame([_wire(BOB_WRITE), _wire(BOB_GROUP)]))
    assert [(r.error_code, r.error_message) for r in _answer(entry).results] == [
        (31, "Cluster authorization failed.")] * 2
    assert store.writes == [] and host.holds == []
    assert store.creates == {"ok": 0, "refused": 1, "failed": 0}


@pytest.mark.parametrize(("field", "code", "message"), [
    (0, int(R.ANY), "resourceType must not be ANY"),
    (2, int(P.MATCH), "patternType must not be MATCH"),
    (2, int(P.ANY), "patternType must not be ANY"),
    (5, int(Op.ANY), "operation must not be ANY"),
    (6, int(Perm.ANY), "permissionType must not be ANY"),
])
def test_a_filters_value_in_a_creation_fails_the_whole_request(field: int, code: int,
                                                               message: str) -> None:
    """Kafka's ResourcePattern and AccessControlEntry refuse them: the request fails with
    UNKNOWN_SERVER_ERROR on every creation, nothing created."""
    f, host, _, store = _setup()
    bad = list(_wire(BOB_GROUP))
    bad[field] = code
    entry = _run(f, _create_frame([_wire(BOB_WRITE), tuple(bad)]))  # type: ignore[list-item]
    assert [(r.error_code, r.error_message) for r in _answer(entry).results] == [
        (-1, message)] * 2
    assert store.writes == [] and host.holds == []


def test_a_raw_unknown_code_in_a_creation_closes_before_any_check() -> None:
    f, host, _, store = _setup("nobody")
    bad = (*_wire(BOB_WRITE)[:5], 0, 3)
    entry = _run(f, _create_frame([_wire(BOB_WRITE), bad]))
    assert entry.answer is None and store.writes == []
    assert host.closes == [("invalid_request", "client",
                            "CreatableAcls contain unknown elements")]


async def test_a_create_that_cannot_be_stored_answers_unknown_server_error() -> None:
    f, host, acls, store = _setup()
    store.fail = True
    entry = _run(f, _create_frame([_wire(BOB_WRITE), (int(R.TOPIC), "", 3, "User:x", "*",
                                                      int(Op.READ), 3)]))
    await _settle(f)
    assert [(r.error_code, r.error_message) for r in _answer(entry).results] == [
        (-1, "the ACLs could not be stored: NotEnoughReplicas"),
        (42, "Invalid empty resource name")]
    assert acls.dynamic == set() and host.released == ["acl_change:8"]
    assert store.creates == {"ok": 0, "refused": 0, "failed": 1}


# ---------------------------------------------------------------------- DeleteAcls
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_delete_removes_the_dynamic_bindings_each_filter_matches(version: int) -> None:
    f, host, acls, store = _setup()
    for b in (BOB_WRITE, BOB_GROUP):
        acls.add_dynamic(b)
    acls.add_dynamic(ALICE_READ)  # also the config's: stays in force once deleted
    entry = _run(f, _delete_frame([
        (int(R.ANY), None, int(P.ANY), "User:bob", None, int(Op.ANY), int(Perm.ANY)),
        (int(R.TOPIC), "b", int(P.MATCH), None, None, int(Op.ANY), int(Perm.ANY)),
        (int(R.TOPIC), None, int(P.ANY), "User:alice", None, int(Op.ANY), int(Perm.ANY)),
        (99, None, int(P.ANY), None, None, int(Op.ANY), int(Perm.ANY)),
        (int(R.ANY), None, int(P.ANY), None, None, 99, int(Perm.ANY)),
        (int(R.GROUP), None, int(P.ANY), None, "::1", int(Op.ANY), int(Perm.ANY)),
    ], version))
    results = _answer(entry).filter_results
    got = [(r.error_code, r.error_message,
            [(m.error_code, m.resource_name, m.principal, m.host) for m in r.matching_acls])
           for r in results]
    assert got == [
        (0, None, [(0, "b", "User:bob", "*"), (0, "g", "User:bob", "10.0.0.1")]),
        (0, None, [(0, "b", "User:bob", "*")]),  # listed by both filters, as Kafka does
        (0, None, [(0, "a-", "User:alice", "*")]),  # the dynamic one, not the config's
        (42, "Unknown patternFilter.", []),
        (42, "Unknown entryFilter.", []),
        (0, None, [])]
    await _settle(f)
    assert store.writes == [([], [BOB_WRITE, BOB_GROUP, ALICE_READ], "User:admin")]
    assert acls.dynamic == set()
    assert ALICE_READ in acls.bindings()  # the config's
    assert host.holds == host.released == ["acl_change:9"]


async def test_deleting_only_config_bindings_deletes_nothing_and_lists_nothing() -> None:
    f, host, acls, store = _setup()
    entry = _run(f, _delete_frame([(int(R.ANY), None, int(P.ANY), None, None, int(Op.ANY),
                                    int(Perm.ANY))]))
    ((result,),) = [_answer(entry).filter_results]
    assert (result.error_code, result.matching_acls) == (0, ())
    assert store.writes == [] and host.holds == []
    assert len(list(acls.bindings())) == 4


def test_delete_needs_alter_on_the_cluster() -> None:
    f, _, acls, store = _setup("alice")
    acls.add_dynamic(BOB_WRITE)
    entry = _run(f, _delete_frame([(int(R.ANY), None, int(P.ANY), None, None, int(Op.ANY),
                                    int(Perm.ANY))] * 2))
    assert [(r.error_code, r.error_message, r.matching_acls)
            for r in _answer(entry).filter_results] == [
        (31, "Cluster authorization failed.", ())] * 2
    assert store.writes == [] and acls.dynamic == {BOB_WRITE}
    assert store.deletes == {"ok": 0, "refused": 1, "failed": 0}


async def test_a_delete_that_cannot_be_stored_answers_unknown_server_error() -> None:
    f, _, acls, store = _setup()
    acls.add_dynamic(BOB_WRITE)
    store.fail = True
    entry = _run(f, _delete_frame([
        (int(R.TOPIC), None, int(P.ANY), None, None, int(Op.ANY), int(Perm.ANY)),
        (int(R.GROUP), None, int(P.ANY), None, None, int(Op.ANY), int(Perm.ANY))]))
    await _settle(f)
    assert [(r.error_code, r.error_message, len(r.matching_acls))
            for r in _answer(entry).filter_results] == [
        (-1, "the ACLs could not be deleted: NotEnoughReplicas", 0), (0, None, 0)]
    assert acls.dynamic == {BOB_WRITE}


def test_versions_other_than_1_to_3_close_the_connection() -> None:
    f, host, _, _ = _setup()
    for version in (0, 4):
        entry = InFlight(CREATE_ACLS, version, 3, "c", 20, True)
        f.request(entry)
        assert host.closes[-1] == (
            "unsupported_version", "client", f"create_acls v{version}: the proxy answers v1-3")
    assert AclAdminFilter.interests(CREATE_ACLS, 0) == 0
    assert AclAdminFilter.interests(DELETE_ACLS, 3) != 0


# ---------------------------------------------------------------------- the ACL topic
def test_the_topics_records_are_applied_and_bad_ones_counted() -> None:
    acls = Acls(AclsConfig.model_validate(CONFIG))
    store = AclStore(acls, _config, [])
    store.observe(*encode_record(BOB_WRITE, True), 0)
    store.observe(*encode_record(BOB_GROUP, True), 0)
    store.observe(*encode_record(BOB_WRITE, False), 0)
    store.observe(b"junk", b"{}", 0)
    store.observe(None, None, 0)
    assert acls.dynamic == {BOB_GROUP}
    assert (store.records_read, store.bad_records) == (3, 2)
    (sub,) = store.subscriptions()
    assert (sub.topic, sub.missing_ok, sub.secret) == ("__kafka_quota_proxy_acls", True, None)
    metrics = {(s.name, tuple(s.labels.items())): s.value
               for f in store.metric_families() for s in f.samples}
    assert metrics[("kafka_proxy_acl_records_total", (("result", "bad"),))] == 2
    assert metrics[("kafka_proxy_acls_topic_reading", ())] == 0


def test_with_a_secret_only_signed_records_are_applied() -> None:
    config = _config({"secret": "s" * 16}, topic="acls-t")
    acls = Acls(AclsConfig.model_validate(CONFIG))
    store = AclStore(acls, lambda: config, [])
    (sub,) = store.subscriptions()
    assert sub.secret == b"s" * 16
    key, value = encode_record(BOB_WRITE, True)
    sub.deliver(key, value, 0, None)
    assert acls.dynamic == set() and store.unsigned_records == 1
    sub.deliver(key, value, 0, [(MAC_HEADER, record_mac(b"s" * 16, "acls-t", key, value))])
    assert acls.dynamic == {BOB_WRITE}


class _Future:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def __await__(self) -> Any:
        if self.fail:
            raise RuntimeError("KafkaTimeoutError")
        return iter(())


class _Producer:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, Any]] = []
        self.fail = fail
        self.stopped = False

    async def send(self, topic: str, value: bytes | None, key: bytes, **kw: Any) -> _Future:
        self.sent.append((topic, value, key, kw.get("headers")))
        return _Future(self.fail)

    async def stop(self) -> None:
        self.stopped = True


async def test_a_write_is_applied_once_acknowledged_and_not_when_it_fails() -> None:
    acls = Acls(AclsConfig.model_validate(CONFIG))
    store = AclStore(acls, _config, [])
    store._producer = producer = _Producer()
    await store.write([BOB_WRITE], [ALICE_READ], "User:admin")
    assert [(t, v) for t, v, _, _ in producer.sent] == [
        ("__kafka_quota_proxy_acls", b'{"v":1}'), ("__kafka_quota_proxy_acls", None)]
    assert acls.dynamic == {BOB_WRITE}
    store._producer = failing = _Producer(fail=True)
    with pytest.raises(AclWriteFailed):
        await store.write([BOB_GROUP], [], "User:admin")
    assert acls.dynamic == {BOB_WRITE} and failing.stopped and store._producer is None


# ---------------------------------------------------------------------- never forwarded
def test_attach_advertises_the_three_apis_on_that_listener_only() -> None:
    plain, with_acls = ResponseRewriter(None), ResponseRewriter(None)  # type: ignore[arg-type]
    assert plain.answered == apis.ANSWERED_BY_PROXY
    AclStore(Acls(AclsConfig()), _config, []).attach(with_acls)
    assert with_acls.answered == {**apis.ANSWERED_BY_PROXY, 29: (1, 3), 30: (1, 3), 31: (1, 3)}
    assert plain.answered == apis.ANSWERED_BY_PROXY
    # ApiVersions v0 body: error 0, two APIs the broker offers (Metadata, CreateAcls 0-3)
    body = (b"\x00\x00" + (2).to_bytes(4, "big") + b"\x00\x03\x00\x00\x00\x0c"
            + b"\x00\x1e\x00\x00\x00\x03")

    def ranges(out: bytes) -> dict[int, tuple[int, int]]:
        n = int.from_bytes(out[2:6], "big")
        return {int.from_bytes(out[6 + 6 * i: 8 + 6 * i], "big"):
                (int.from_bytes(out[8 + 6 * i: 10 + 6 * i], "big"),
                 int.from_bytes(out[10 + 6 * i: 12 + 6 * i], "big")) for i in range(n)}

    assert ranges(cap_api_versions(body, 0))[30] == (0, 3)  # ACLs off: the broker's
    assert ranges(cap_api_versions(body, 0, answered=with_acls.answered))[30] == (1, 3)
    assert ranges(cap_api_versions(body, 0, answered=with_acls.answered))[29] == (1, 3)


def test_the_interest_table_knows_the_answered_apis() -> None:
    off = InterestTable([addresses, QuotaAdminFilter.interests])
    on = InterestTable([addresses, QuotaAdminFilter.interests, AclAdminFilter.interests])
    assert off.answered_keys == frozenset(apis.ANSWERED_BY_PROXY)
    assert on.answered_keys == frozenset({29, 30, 31, *apis.ANSWERED_BY_PROXY})


def _driven_filters(acls: Acls, store: FakeStore) -> list[Any]:
    from kafka_quota_proxy.proxy.features.topic_guard.guard import TopicGuard

    return [partial(TopicGuardFilter, guard=TopicGuard(["__kafka_quota_proxy_acls"])),
            partial(AclAdminFilter, acls=acls, store=store)]


async def test_a_create_acls_frame_never_reaches_the_broker_whatever_its_size() -> None:
    acls = Acls(AclsConfig.model_validate(CONFIG))
    store = FakeStore(acls)
    # answered: nothing upstream, the answer to the client (ANONYMOUS: refused)
    h = await DrivenConnection.open(_driven_filters(acls, store))
    h.client_sends(sized(_create_frame([_wire(BOB_WRITE)])))
    await h.settle()
    assert h.upstream_got() == b"" and h.closed_reason is None
    assert b"Cluster authorization failed." in h.client_got()
    # above WHOLE_FRAME_MAX, arriving in parts: the connection closes, nothing upstream
    rtype, _, *rest = _wire(BOB_WRITE)
    big = sized(_create_frame([(rtype, "x" * (WHOLE_FRAME_MAX + 10), *rest)]))  # type: ignore[list-item]
    h = await DrivenConnection.open(_driven_filters(acls, store))
    h.client_sends(big[:1000])
    await h.settle()
    assert h.upstream_got() == b"" and h.closed_reason == "frame_too_large"
    # v0 (not answered): closed before any byte goes upstream
    h = await DrivenConnection.open(_driven_filters(acls, store))
    h.client_sends(request_frame(DESCRIBE_ACLS, 0, 5, "c", body=b"\x02" + b"\xff" * 6))
    await h.settle()
    assert h.upstream_got() == b"" and h.closed_reason == "unsupported_version"


async def test_without_acls_a_create_acls_frame_goes_to_the_broker_as_it_came() -> None:
    from kafka_quota_proxy.proxy.features.topic_guard.guard import TopicGuard

    h = await DrivenConnection.open([partial(TopicGuardFilter, guard=TopicGuard([]))])
    frame = sized(_create_frame([_wire(BOB_WRITE)]))
    h.client_sends(frame)
    await h.settle()
    assert h.upstream_got() == frame and h.closed_reason is None


# ---------------------------------------------------------------------- client quotas
def test_with_acls_client_quotas_ask_the_cluster_configs_rights() -> None:
    from kafka_quota_proxy.config.schema import QuotasConfig

    acls = Acls(AclsConfig.model_validate({
        "bindings": [{"principal": "User:viewer", "operation": "DescribeConfigs",
                      "cluster": True},
                     {"principal": "User:ops", "operation": "AlterConfigs", "cluster": True}]}))
    quotas = QuotasConfig.model_validate({"admin_principals": ["viewer"]})  # (ignored)
    admin = ClientQuotaAdmin(lambda: quotas, [], lambda: None)

    def may(user: str, op: AclOperation) -> bool:
        return QuotaAdminFilter(FakeFilterHost(user), admin, acls)._may(op, "x")

    assert may("viewer", Op.DESCRIBE_CONFIGS) and not may("viewer", Op.ALTER_CONFIGS)
    assert may("ops", Op.ALTER_CONFIGS) and may("ops", Op.DESCRIBE_CONFIGS)  # implied
    assert not may("nobody", Op.DESCRIBE_CONFIGS)
    # without ACLs: the quotas' principals
    assert QuotaAdminFilter(FakeFilterHost("viewer"), admin)._may(Op.ALTER_CONFIGS, "x")
