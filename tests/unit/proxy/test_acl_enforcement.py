"""ACLs enforced on the request path (``proxy.features.acls.filter`` and ``topics``, through
the topic guard): the checks Kafka makes on whole requests (answered with Kafka's error
response, never forwarded), each topic checked for the API's operation (Produce walked as it
passes, with the transactional id; topics named by id; Metadata listings filtered; no
auto-creation without CREATE), and the lists the broker answers in full filtered."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.authorizer.acls import AclOperation, ResourceType
from kafka_quota_proxy.config.acls import AclsConfig
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.decoded import request_body, response_body
from kafka_quota_proxy.protocol.headers import encode_request_header, encode_response_header
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.protocol.topic_guard import SPOILED, ProduceTopics
from kafka_quota_proxy.proxy.features.acls.filter import AclFilter, ListedOnly, needs
from kafka_quota_proxy.proxy.features.acls.state import Acls
from kafka_quota_proxy.proxy.features.acls.topics import TopicAccess
from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter
from kafka_quota_proxy.proxy.features.topic_guard.guard import Metadata, Produce, TopicGuard
from testkit.filter_host import FakeFilterHost
from testkit.frames import kio_request

R, Op = ResourceType, AclOperation
GUARDED = "__kafka_quota_proxy_acls"
CONFIG = {
    "super_users": ["User:admin"],
    "bindings": [
        {"principal": "User:alice", "operation": ["Write", "Read", "Describe"], "topic": "a-",
         "pattern_type": "prefixed"},
        {"principal": "User:alice", "operation": "Read", "group": "a-",
         "pattern_type": "prefixed"},
        {"principal": "User:alice", "operation": "Write", "transactional_id": "a-tx"},
        {"principal": "User:alice", "operation": "Create", "topic": "a-new"},
        {"principal": "User:alice", "operation": "Write", "topic": "a-secret",
         "permission": "deny"},
        {"principal": "User:bob", "operation": "Describe", "topic": "*"},
        {"principal": "User:ops", "operation": ["Create", "Delete", "DescribeConfigs"],
         "cluster": True},
        {"principal": "User:remote", "operation": "Read", "topic": "*", "host": "10.0.0.9"},
    ]}
A_ID, B_ID = uuid.UUID(int=0xA), uuid.UUID(int=0xB)


def _acls() -> Acls:
    acls = Acls(AclsConfig.model_validate(CONFIG))
    acls.learn_topic("a-orders", A_ID)
    acls.learn_topic("b-private", B_ID)
    return acls


def _module(api_key: int, version: int, kind: str = "request") -> Any:
    cls = (load_request_schema if kind == "request" else load_response_schema)(api_key, version)
    return __import__(cls.__module__, fromlist=["_"])


def _entry(api_key: int, version: int, correlation_id: int = 7) -> InFlight:
    return InFlight(api_key, version, correlation_id, "client-1", 0, True)


def _guard_filter(user: str, peer_ip: str | None = None) -> tuple[TopicGuardFilter, TopicGuard]:
    guard = TopicGuard([GUARDED])
    host = FakeFilterHost(user)
    host.client.peer_ip = peer_ip
    return TopicGuardFilter(host, guard, _acls()), guard


# ---------------------------------------------------------------------- whole requests
def test_needs_follow_kafkas_checks_per_api() -> None:
    body = request_body(kio_request(11, 5, 1, group_id="g1", session_timeout=timedelta(0),
                                    rebalance_timeout=timedelta(0), member_id="",
                                    group_instance_id=None, protocol_type="consumer",
                                    protocols=()), 11, 5)
    assert needs(11, 5, body) == [((R.GROUP, Op.READ, "g1"), 30)]
    m = _module(22, 4)
    init = m.InitProducerIdRequest(transactional_id="tx", transaction_timeout=timedelta(0),
                                   producer_id=-1, producer_epoch=-1)
    assert needs(22, 4, init) == [((R.TRANSACTIONAL_ID, Op.WRITE, "tx"), 53)]
    m = _module(28, 3)
    commit = m.TxnOffsetCommitRequest(transactional_id="tx", group_id="g", producer_id=1,
                                      producer_epoch=0, generation_id=1, member_id="m",
                                      group_instance_id=None, topics=())
    assert needs(28, 3, commit) == [((R.TRANSACTIONAL_ID, Op.WRITE, "tx"), 53),
                                    ((R.GROUP, Op.READ, "g"), 30)]
    m = _module(24, 3)
    add = m.AddPartitionsToTxnRequest(v3_and_below_transactional_id="tx",
                                      v3_and_below_producer_id=1,
                                      v3_and_below_producer_epoch=0, v3_and_below_topics=())
    assert needs(24, 3, add) == [((R.TRANSACTIONAL_ID, Op.WRITE, "tx"), 53)]
    m = _module(10, 4)
    find = m.FindCoordinatorRequest(key_type=1, coordinator_keys=("t1", "t2"))
    assert needs(10, 4, find) == [((R.TRANSACTIONAL_ID, Op.DESCRIBE, "t1"), 53),
                                  ((R.TRANSACTIONAL_ID, Op.DESCRIBE, "t2"), 53)]
    m = _module(32, 4)
    configs = m.DescribeConfigsRequest(resources=(
        m.DescribeConfigsResource(resource_type=2, resource_name="t", configuration_keys=None),
        m.DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=None),
    ), include_synonyms=False, include_documentation=False)
    # (the topic's check is the topic guard's)
    assert needs(32, 4, configs) == [((R.CLUSTER, Op.DESCRIBE_CONFIGS, "kafka-cluster"), 31)]
    assert needs(35, 4, None) == [((R.CLUSTER, Op.DESCRIBE, "kafka-cluster"), 31)]


def _join(group: str) -> bytes:
    return kio_request(11, 5, 7, group_id=group, session_timeout=timedelta(seconds=10),
                       rebalance_timeout=timedelta(seconds=10), member_id="",
                       group_instance_id=None, protocol_type="consumer", protocols=())


def test_a_denied_group_is_answered_by_the_proxy_with_kafkas_error() -> None:
    host = FakeFilterHost("alice")
    f = AclFilter(host, _acls())
    allowed, denied = _entry(11, 5), _entry(11, 5)
    assert f.request_frame(allowed, _join("a-group"), True) is None
    assert allowed.answer is None  # forwarded
    assert f.request_frame(denied, _join("b-group"), True) is None
    assert denied.answer is not None  # answered, never forwarded
    answer = response_body(denied.answer, 11, 5)
    assert int(answer.error_code) == 30
    # a super user is never asked about
    admin = AclFilter(FakeFilterHost("admin"), _acls())
    entry = _entry(11, 5)
    admin.request_frame(entry, _join("b-group"), True)
    assert entry.answer is None


def test_denials_are_counted_and_logged_at_most_once_a_second() -> None:
    acls = _acls()
    f = AclFilter(FakeFilterHost("alice"), acls)
    for _ in range(3):
        f.request_frame(_entry(11, 5), _join("b-group"), True)
    assert acls.denied == {("GROUP", "READ"): 3}
    assert len(acls._logged) == 1


def test_idempotent_producer_ids_need_idempotent_write_or_write_on_some_topic() -> None:
    frame = kio_request(22, 4, 7, transactional_id=None,
                        transaction_timeout=timedelta(seconds=60), producer_id=-1,
                        producer_epoch=-1)
    alice, carol = _entry(22, 4), _entry(22, 4)
    AclFilter(FakeFilterHost("alice"), _acls()).request_frame(alice, frame, True)
    AclFilter(FakeFilterHost("carol"), _acls()).request_frame(carol, frame, True)
    assert alice.answer is None
    assert carol.answer is not None and int(response_body(carol.answer, 22, 4).error_code) == 31


def test_a_denied_api_without_an_error_response_is_refused() -> None:
    host = FakeFilterHost("alice")
    entry = _entry(57, 1)
    frame = kio_request(57, 1, 7, timeout=timedelta(seconds=1), feature_updates=(),
                        validate_only=False)
    AclFilter(host, _acls()).request_frame(entry, frame, True)
    assert [r[1] for r in host.refusals] == ["acl_denied"]


def test_listings_show_only_what_the_client_may_describe() -> None:
    m = _module(16, 4, "response")
    value = m.ListGroupsResponse(
        throttle_time=timedelta(0), error_code=ErrorCode(0), groups=tuple(
            m.ListedGroup(group_id=g, protocol_type="consumer", group_state="Stable")
            for g in ("a-1", "b-1", "a-2")))
    frame = encode_response_header(7, 1) + encode(value)
    entry = _entry(16, 4)
    AclFilter(FakeFilterHost("alice"), _acls()).request(entry)
    assert isinstance(entry.refused, ListedOnly)
    amended = entry.refused.amend(entry, frame)
    assert amended is not None
    assert [g.group_id for g in response_body(amended, 16, 4).groups] == ["a-1", "a-2"]
    # DESCRIBE on the cluster sees every group
    ops = _entry(16, 4)
    AclFilter(FakeFilterHost("admin"), _acls()).request(ops)
    assert ops.refused is None


# ---------------------------------------------------------------------- topics
def test_topic_access_asks_the_apis_operation() -> None:
    acls = _acls()
    alice = TopicAccess(acls.access("alice", None), TopicGuard([GUARDED]).topics)
    assert not alice.refused(1, "a-orders", None)  # Fetch: READ
    assert alice.refused(1, "b-private", None)
    assert alice.refused(1, GUARDED, None)  # the proxy's own, whatever the ACLs say
    assert not alice.refused(1, None, A_ID)  # by id: its name's rights
    assert alice.refused(1, None, B_ID)
    assert alice.refused(1, None, uuid.UUID(int=0xC))  # an id never seen: refused
    assert alice.refused(19, "a-orders", None)  # CreateTopics: CREATE
    assert not alice.refused(19, "a-new", None)
    ops = TopicAccess(acls.access("ops", None), TopicGuard([GUARDED]).topics)
    assert not ops.refused(19, "anything", None)  # CREATE on the cluster
    assert not ops.refused(20, "anything", None)  # DELETE on the cluster
    bob = TopicAccess(acls.access("bob", None), TopicGuard([GUARDED]).topics)
    assert bob.refused(20, "b-private", None)  # DESCRIBE but no DELETE
    remote = acls.access("remote", "10.0.0.9"), acls.access("remote", "10.0.0.8")
    assert [TopicAccess(a, TopicGuard([]).topics).refused(1, "x", None) for a in remote] == [
        False, True]


def _produce(version: int, topics: list[str], transactional_id: str | None = None) -> bytes:
    m = _module(0, version)
    data = tuple(m.TopicProduceData(name=t, partition_data=tuple(
        m.PartitionProduceData(index=i, records=b"\x00" * 70) for i in (0, 1)))
        for t in topics)
    value = m.ProduceRequest(transactional_id=transactional_id, acks=-1,
                             timeout=timedelta(seconds=5), topic_data=data)
    return encode_request_header(0, version, 9, "p") + encode(value)


def _walk(f: TopicGuardFilter, frame: bytes, version: int) -> tuple[bytes, ProduceTopics]:
    watch = f.watch_produce(version)
    watch.feed(frame, 0, len(frame))
    out = bytearray(frame)
    for at in watch.spoil:
        out[at] = SPOILED
    return bytes(out), watch


@pytest.mark.parametrize("version", [3, 9, 11])
def test_produce_spoils_the_topics_the_client_may_not_write(version: int) -> None:
    f, _ = _guard_filter("alice")
    sent, watch = _walk(f, _produce(version, ["a-orders", "a-secret", "b-private"]), version)
    assert [n for n, _, _ in watch.refused] == ["a-secret", "b-private"]
    assert b"a-orders" in sent and b"a-secret" not in sent and b"b-private" not in sent
    assert watch.error_code == 29
    entry = _entry(0, version)
    f.produce_watched(entry, watch)
    assert isinstance(entry.refused, Produce) and entry.refused.error_code == 29


def test_a_transactional_produce_needs_write_on_its_transactional_id() -> None:
    f, _ = _guard_filter("alice")
    sent, watch = _walk(f, _produce(9, ["a-orders"], "a-tx"), 9)
    assert watch.refused == [] and b"a-orders" in sent
    sent, watch = _walk(f, _produce(9, ["a-orders"], "b-tx"), 9)
    assert [n for n, _, _ in watch.refused] == ["a-orders"] and b"a-orders" not in sent
    assert watch.error_code == 53


def _metadata(topics: list[str] | None, auto_create: bool = True) -> bytes:
    m = _module(3, 12)
    value = m.MetadataRequest(
        topics=None if topics is None else tuple(
            m.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=t) for t in topics),
        allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False)
    return encode_request_header(3, 12, 7, "c") + encode(value)


def test_metadata_names_denied_topics_refused_and_hides_the_rest() -> None:
    f, guard = _guard_filter("alice")
    entry = _entry(3, 12)
    new = f.request_frame(entry, _metadata(["a-orders", "b-private", "a-missing"]), True)
    assert new is not None
    forwarded = request_body(new, 3, 12)
    assert [t.name for t in forwarded.topics] == ["a-orders", "a-missing"]
    # a-missing may not be created by alice: no auto-creation for this request
    assert forwarded.allow_auto_topic_creation is False
    assert isinstance(entry.refused, Metadata)
    assert [r.name for r in entry.refused.refs] == ["b-private"]
    # a listing of every topic: what alice may not describe is left out
    listing = _entry(3, 12)
    assert f.request_frame(listing, _metadata(None), True) is None
    m = _module(3, 12, "response")
    response = m.MetadataResponse(
        throttle_time=timedelta(0), brokers=(), cluster_id="c", controller_id=1,
        topics=tuple(m.MetadataResponseTopic(
            error_code=ErrorCode(0), name=n, topic_id=uuid.UUID(int=i + 1), is_internal=False,
            partitions=(), topic_authorized_operations=-2147483648)
            for i, n in enumerate(["a-orders", "b-private", GUARDED])))
    shown = guard.filter_metadata(listing, response)
    assert [t.name for t in shown.topics] == ["a-orders"]


def test_creatable_topics_keep_auto_creation() -> None:
    f, _ = _guard_filter("alice")
    entry = _entry(3, 12)
    assert f.request_frame(entry, _metadata(["a-new"]), True) is None  # forwarded as it is


def test_fetch_of_a_denied_topic_is_answered_and_the_rest_forwarded() -> None:
    m = _module(1, 12)
    request = m.FetchRequest(
        replica_id=-1, max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, topics=tuple(m.FetchTopic(
            topic=t, partitions=(m.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),)) for t in (
                    "a-orders", "b-private")),
        forgotten_topics_data=(), rack_id="")
    frame = encode_request_header(1, 12, 7, "c") + encode(request)
    f, _ = _guard_filter("alice")
    entry = _entry(1, 12)
    new = f.request_frame(entry, frame, True)
    assert new is not None
    assert [t.topic for t in request_body(new, 1, 12).topics] == ["a-orders"]
    assert f.acls is not None and f.acls.denied == {("TOPIC", "READ"): 1}  # (counted once)
    # every topic allowed: forwarded as it is
    allowed = dataclasses.replace(request, topics=request.topics[:1])
    entry = _entry(1, 12)
    assert f.request_frame(entry, encode_request_header(1, 12, 7, "c") + encode(allowed),
                           True) is None
    assert entry.refused is None and entry.answer is None
    # every topic denied: answered by the proxy, with empty records (clients refuse null)
    only = dataclasses.replace(request, topics=request.topics[1:])
    entry = _entry(1, 12)
    f.request_frame(entry, encode_request_header(1, 12, 7, "c") + encode(only), True)
    assert entry.answer is not None
    answer = response_body(entry.answer, 1, 12)
    assert [(t.topic, int(p.error_code), p.records) for t in answer.responses
            for p in t.partitions] == [("b-private", 29, b"")]


def test_groups_denied_among_others_are_answered_beside_the_brokers_answer() -> None:
    f = AclFilter(FakeFilterHost("alice"), _acls())
    frame = kio_request(15, 5, 7, groups=("a-1", "b-1", "a-2"),
                        include_authorized_operations=False)
    entry = _entry(15, 5)
    forwarded = f.request_frame(entry, frame, True)
    assert forwarded is not None and entry.answer is None
    assert request_body(forwarded, 15, 5).groups == ("a-1", "a-2")
    m = _module(15, 5, "response")
    broker = m.DescribeGroupsResponse(throttle_time=timedelta(0), groups=tuple(
        m.DescribedGroup(error_code=ErrorCode(0), group_id=g, group_state="Stable",
                         protocol_type="consumer", protocol_data="range", members=(),
                         authorized_operations=-2147483648) for g in ("a-1", "a-2")))
    assert entry.refused is not None
    amended = entry.refused.amend(entry, encode_response_header(7, 1) + encode(broker))
    assert amended is not None
    assert [(g.group_id, int(g.error_code)) for g in response_body(amended, 15, 5).groups] == [
        ("a-1", 0), ("a-2", 0), ("b-1", 30)]
    # all denied: answered by the proxy, each group with its error
    entry = _entry(15, 5)
    f.request_frame(entry, kio_request(15, 5, 7, groups=("b-1", "b-2"),
                                       include_authorized_operations=False), True)
    assert entry.answer is not None
    assert [(g.group_id, int(g.error_code)) for g in response_body(
        entry.answer, 15, 5).groups] == [("b-1", 30), ("b-2", 30)]


def test_partitions_added_to_a_transaction_with_a_denied_topic_add_none() -> None:
    m = _module(24, 3)
    frame = kio_request(24, 3, 7, v3_and_below_transactional_id="a-tx",
                        v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
                        v3_and_below_topics=tuple(m.AddPartitionsToTxnTopic(
                            name=t, partitions=(0, 1)) for t in ("a-orders", "b-private")))
    entry = _entry(24, 3)
    AclFilter(FakeFilterHost("alice"), _acls()).request_frame(entry, frame, True)
    assert entry.answer is not None
    answer = response_body(entry.answer, 24, 3)
    assert [(t.name, p.partition_index, int(p.partition_error_code))
            for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition] == [
        ("a-orders", 0, 55), ("a-orders", 1, 55), ("b-private", 0, 29), ("b-private", 1, 29)]
    allowed = kio_request(24, 3, 7, v3_and_below_transactional_id="a-tx",
                          v3_and_below_producer_id=1, v3_and_below_producer_epoch=0,
                          v3_and_below_topics=(m.AddPartitionsToTxnTopic(
                              name="a-orders", partitions=(0,)),))
    entry = _entry(24, 3)
    AclFilter(FakeFilterHost("alice"), _acls()).request_frame(entry, allowed, True)
    assert entry.answer is None


def test_authorized_operations_in_metadata_are_the_clients() -> None:
    f, guard = _guard_filter("alice")
    m = _module(3, 10)
    request = m.MetadataRequest(
        topics=(m.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name="a-orders"),),
        allow_auto_topic_creation=False, include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True)
    entry = _entry(3, 10)
    assert f.request_frame(entry, encode_request_header(3, 10, 7, "c") + encode(request),
                           True) is None
    r = _module(3, 10, "response")
    everything = 0b1111111111110  # (what the broker computed for the proxy's own principal)
    response = r.MetadataResponse(
        throttle_time=timedelta(0), brokers=(), cluster_id="c", controller_id=1,
        cluster_authorized_operations=everything, topics=(r.MetadataResponseTopic(
            error_code=ErrorCode(0), name="a-orders", topic_id=A_ID, is_internal=False,
            partitions=(), topic_authorized_operations=everything),))
    shown = guard.filter_metadata(entry, response)
    read, write, describe = (1 << int(op) for op in (Op.READ, Op.WRITE, Op.DESCRIBE))
    assert shown.topics[0].topic_authorized_operations == read | write | describe
    assert shown.cluster_authorized_operations == 0


def test_a_topic_id_never_learnt_is_unknown_and_asks_for_a_refresh() -> None:
    m = _module(1, 13)
    request = m.FetchRequest(
        replica_id=-1, max_wait=timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, topics=tuple(m.FetchTopic(
            topic_id=t, partitions=(m.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),))
            for t in (A_ID, uuid.UUID(int=0xC))),
        forgotten_topics_data=(), rack_id="")
    frame = encode_request_header(1, 13, 7, "c") + encode(request)
    f, _ = _guard_filter("alice")
    asked: list[bool] = []
    assert f.acls is not None
    f.acls.on_unknown_id = lambda: asked.append(True)
    entry = _entry(1, 13)
    new = f.request_frame(entry, frame, True)
    assert new is not None and [t.topic_id for t in request_body(new, 1, 13).topics] == [A_ID]
    assert asked == [True]
    # the response gets UNKNOWN_TOPIC_ID for it (clients ask Metadata again), not 29
    r = _module(1, 13, "response")
    broker = r.FetchResponse(throttle_time=timedelta(0), error_code=ErrorCode(0),
                             session_id=0, responses=())
    assert entry.refused is not None
    amended = TopicGuard([GUARDED]).amend(entry, encode_response_header(7, 1) + encode(broker))
    assert amended is not None
    assert [(t.topic_id, int(p.error_code)) for t in response_body(amended, 1, 13).responses
            for p in t.partitions] == [(uuid.UUID(int=0xC), 100)]


def test_groups_and_the_cluster_show_the_clients_authorized_operations() -> None:
    f = AclFilter(FakeFilterHost("alice"), _acls())
    entry = _entry(15, 5)
    assert f.request_frame(entry, kio_request(15, 5, 7, groups=("a-1",),
                                              include_authorized_operations=True), True) is None
    m = _module(15, 5, "response")
    broker = m.DescribeGroupsResponse(throttle_time=timedelta(0), groups=(m.DescribedGroup(
        error_code=ErrorCode(0), group_id="a-1", group_state="Stable", protocol_type="consumer",
        protocol_data="range", members=(), authorized_operations=0b11111111),))
    assert entry.refused is not None
    amended = entry.refused.amend(entry, encode_response_header(7, 1) + encode(broker))
    assert amended is not None
    read, describe = 1 << int(Op.READ), 1 << int(Op.DESCRIBE)
    assert response_body(amended, 15, 5).groups[0].authorized_operations == read | describe
    entry = _entry(60, 1)
    f.request_frame(entry, kio_request(60, 1, 7, include_cluster_authorized_operations=True,
                                       endpoint_type=1), True)
    c = _module(60, 1, "response")
    cluster = c.DescribeClusterResponse(
        throttle_time=timedelta(0), error_code=ErrorCode(0), error_message=None,
        endpoint_type=1, cluster_id="c", controller_id=1, brokers=(),
        cluster_authorized_operations=0b11111111)
    assert entry.refused is not None
    amended = entry.refused.amend(entry, encode_response_header(7, 1) + encode(cluster))
    assert amended is not None
    assert response_body(amended, 60, 1).cluster_authorized_operations == 0


def _describe_configs(resources: list[tuple[int, str]]) -> bytes:
    m = _module(32, 4)
    return kio_request(32, 4, 7, resources=tuple(m.DescribeConfigsResource(
        resource_type=t, resource_name=n, configuration_keys=None) for t, n in resources),
        include_synonyms=False, include_documentation=False)


def _results(answer: bytes) -> list[tuple[int, str, int]]:
    return sorted((int(r.resource_type), r.resource_name, int(r.error_code))
                  for r in response_body(answer, 32, 4).results)


def test_config_resources_are_answered_one_by_one() -> None:
    """The cluster's and groups' by the ACL filter, topics' by the topic guard: the broker
    is asked only for what the client may see, every denied resource gets its error."""
    acls = _acls()
    host = FakeFilterHost("ops")
    acl_filter, guard_filter = AclFilter(host, acls), TopicGuardFilter(host, TopicGuard([]), acls)
    entry = _entry(32, 4)
    frame = _describe_configs([(4, "1"), (32, "g"), (2, "t")])
    forwarded = acl_filter.request_frame(entry, frame, True)
    assert forwarded is not None
    forwarded = guard_filter.request_frame(entry, forwarded, True)  # (ops may not see t)
    assert forwarded is not None
    assert [(int(r.resource_type), r.resource_name)
            for r in request_body(forwarded, 32, 4).resources] == [(4, "1")]
    m = _module(32, 4, "response")
    broker = m.DescribeConfigsResponse(throttle_time=timedelta(0), results=(
        m.DescribeConfigsResult(error_code=ErrorCode(0), error_message=None, resource_type=4,
                                resource_name="1", configs=()),))
    assert entry.refused is not None
    amended = TopicGuard([]).amend(entry, encode_response_header(7, 1) + encode(broker))
    assert amended is not None
    assert _results(amended) == [(2, "t", 29), (4, "1", 0), (32, "g", 30)]
    # nothing left for the broker: answered by the proxy, with every resource's error
    alice = FakeFilterHost("alice")
    entry = _entry(32, 4)
    forwarded = AclFilter(alice, acls).request_frame(
        entry, _describe_configs([(4, "1"), (2, "a-orders")]), True)
    assert forwarded is not None
    TopicGuardFilter(alice, TopicGuard([]), acls).request_frame(entry, forwarded, True)
    assert entry.answer is not None
    assert _results(entry.answer) == [(2, "a-orders", 29), (4, "1", 31)]
