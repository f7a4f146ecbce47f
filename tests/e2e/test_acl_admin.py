"""The ACL admin APIs answered by the proxy (issue 28, ``docs/acls.md``, "The ACL admin
APIs"), end to end: two proxy processes terminating SASL in front of one tansu broker (which
offers none of these APIs: the proxy advertises and answers them), librdkafka's AdminClient
at its defaults. A super user creates, describes and deletes ACLs; a user without ALTER on
the cluster is refused with Kafka's error; a binding created through one proxy holds on the
other within a second and survives that proxy's restart; no client reads or writes the ACL
topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

ACL_TOPIC = "__kafka_quota_proxy_acls"
USERS = {"admin": "admin-pw", "alice": "alice-pw", "viewer": "viewer-pw"}
ACLS = """acls:
  super_users: [User:admin]
  bindings:
    - {principal: User:alice, operation: [Read, Describe], topic: a-, pattern_type: prefixed}
    - {principal: User:viewer, operation: Describe, cluster: true}
"""
ANY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                       AclOperation.ANY, AclPermissionType.ANY)


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = ""
    for user, password in USERS.items():
        text = add_user(text, user, password, 4096)
    path = tmp_path_factory.mktemp("acl-admin") / "credentials.yaml"
    path.write_text(text)
    return path


def _proxy(tansu: TansuBroker, credentials: Path) -> ProxyProcess:
    return ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      credentials_file: "{credentials}"
""", extra_yaml=ACLS)


@pytest.fixture
def proxies(tansu: TansuBroker, credentials: Path) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    a = _proxy(tansu, credentials).start()
    b = _proxy(tansu, credentials).start()
    try:
        for p in (a, b):
            p.wait_broker_listener(111)
        yield a, b
    finally:
        a.stop()
        b.stop()


def _conf(proxy: ProxyProcess, user: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": USERS[user], **extra}


def _admin(proxy: ProxyProcess, user: str) -> AdminClient:
    return AdminClient(_conf(proxy, user))


def _key(b: AclBinding) -> tuple[Any, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
            b.permission_type)


def _described(admin: AdminClient, flt: AclBindingFilter = ANY) -> set[tuple[Any, ...]]:
    return {_key(b) for b in admin.describe_acls(flt, request_timeout=15).result(timeout=30)}


def _error(future: Any) -> int | None:
    """The Kafka error code a call ended with (None: it succeeded)."""
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def _create(admin: AdminClient, *bindings: AclBinding) -> list[int | None]:
    return [_error(f) for f in admin.create_acls(list(bindings), request_timeout=15).values()]


class Describer:
    """kafka-python's admin client as one user: whether DescribeAcls is allowed. (librdkafka's
    Python AdminClient returns an empty list where the response's top-level error is
    CLUSTER_AUTHORIZATION_FAILED; kafka-python raises it.)"""

    def __init__(self, proxy: ProxyProcess, user: str) -> None:
        from kafka.admin import KafkaAdminClient

        self.client = KafkaAdminClient(
            bootstrap_servers=proxy.bootstrap, security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=user,
            sasl_plain_password=USERS[user], client_id=f"acl-describer-{user}")
        _OPEN.append(self)

    def allowed(self) -> bool:
        from kafka.admin._acls import (
            ACLFilter,
            ACLOperation,
            ACLPermissionType,
            ACLResourcePatternType,
            ResourcePatternFilter,
        )
        from kafka.admin._acls import ResourceType as KResourceType
        from kafka.errors import ClusterAuthorizationFailedError

        any_acl = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                            permission_type=ACLPermissionType.ANY,
                            resource_pattern=ResourcePatternFilter(
                                KResourceType.ANY, None, ACLResourcePatternType.ANY))
        try:
            self.client.describe_acls(any_acl)
        except ClusterAuthorizationFailedError as exc:
            assert str(exc).endswith(": Cluster authorization failed."), exc
            return False
        return True

    def close(self) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
            self.client.close()


# Describers not closed yet: closed after each test, failed or not (a kafka-python client
# left open retries its stopped proxy for ever, and every socket it gives up on reaches a
# later test's garbage collection as an unclosed-socket warning)
_OPEN: list[Describer] = []


@pytest.fixture(autouse=True)
def _describers_closed() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN[-1].close()


def test_acls_are_managed_through_the_proxy_and_hold_on_every_proxy(
        proxies: tuple[ProxyProcess, ProxyProcess]) -> None:
    a, b = proxies
    admin_a, admin_b = _admin(a, "admin"), _admin(b, "admin")
    config = {
        (ResourceType.TOPIC, "a-", ResourcePatternType.PREFIXED, "User:alice", "*",
         AclOperation.READ, AclPermissionType.ALLOW),
        (ResourceType.TOPIC, "a-", ResourcePatternType.PREFIXED, "User:alice", "*",
         AclOperation.DESCRIBE, AclPermissionType.ALLOW),
        (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:viewer", "*",
         AclOperation.DESCRIBE, AclPermissionType.ALLOW)}
    # the config's bindings, described through either proxy (tansu knows no ACL API)
    assert _described(admin_a) == _described(admin_b) == config

    # alice has no right on the cluster: CreateAcls, DeleteAcls and DescribeAcls refused
    alice_a = _admin(a, "alice")
    grant = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                       "User:alice", "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    assert _create(alice_a, grant) == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]
    (deleted,) = alice_a.delete_acls([ANY], request_timeout=15).values()
    assert _error(deleted) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    alice_reads_a, alice_reads_b = Describer(a, "alice"), Describer(b, "alice")
    assert not alice_reads_a.allowed()  # 31 as the top-level error
    # viewer may describe (DESCRIBE on the cluster), not create
    viewer = _admin(a, "viewer")
    assert _described(viewer) == config
    assert _create(viewer, grant) == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]
    # an invalid binding: Kafka's INVALID_REQUEST for that creation
    bad_cluster = AclBinding(ResourceType.BROKER, "other", ResourcePatternType.LITERAL,
                             "User:alice", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    assert _create(admin_a, bad_cluster) == [KafkaError.INVALID_REQUEST]

    # a binding created through a reaches b, and its deletion through b reaches a, from the
    # start (the topic is made at start by whichever proxy comes first; each reader looks
    # for it as soon as its proxy has made or found it, not at its next check, 5 s later: the
    # bound, 3.5 s, leaves room for a loaded machine)
    warm = AclBinding(ResourceType.GROUP, "warm", ResourcePatternType.LITERAL, "User:bob", "*",
                      AclOperation.READ, AclPermissionType.ALLOW)
    assert _create(admin_a, warm) == [None]
    assert _key(warm) in _described(admin_a)  # in force on a once answered
    wait_for(lambda: _key(warm) in _described(admin_b), 3.5, interval=0.05,
             what="b reading the ACL topic")
    warm_filter = AclBindingFilter(ResourceType.GROUP, "warm", ResourcePatternType.LITERAL,
                                   None, None, AclOperation.ANY, AclPermissionType.ANY)
    (gone,) = admin_b.delete_acls([warm_filter], request_timeout=15).values()
    assert [_key(x) for x in gone.result(timeout=30)] == [_key(warm)]
    wait_for(lambda: _key(warm) not in _described(admin_a), 3.5, interval=0.05,
             what="a reading the ACL topic")
    assert _create(admin_a, warm) == [None]  # (kept: listed below)

    # the super user grants alice DESCRIBE on the cluster through a: b lets alice describe
    # within a second
    assert not alice_reads_b.allowed()
    created = time.monotonic()
    assert _create(admin_a, grant) == [None]
    wait_for(alice_reads_b.allowed, 5, interval=0.02,
             what="b applying the binding created through a")
    seen = time.monotonic() - created
    print(f"binding created through a in force on b after {seen:.3f} s")
    assert seen < 1.0
    assert _described(_admin(b, "alice")) == config | {_key(warm), _key(grant)}

    # b restarted comes back with the dynamic bindings (read from the topic)
    alice_reads_b.close()
    b.stop()
    b.start()
    b.wait_broker_listener(111)
    alice_reads_b, admin_b = Describer(b, "alice"), _admin(b, "admin")
    wait_for(alice_reads_b.allowed, 10, interval=0.1, what="the binding after b's restart")
    assert _described(admin_b) == config | {_key(warm), _key(grant)}

    # deleted through b: every dynamic binding of alice, not the config's
    alice_any = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice",
                                 None, AclOperation.ANY, AclPermissionType.ANY)
    (gone,) = admin_b.delete_acls([alice_any], request_timeout=15).values()
    assert [_key(x) for x in gone.result(timeout=30)] == [_key(grant)]
    assert not alice_reads_b.allowed()  # in force on b once answered
    wait_for(lambda: not alice_reads_a.allowed(), 5, interval=0.02, what="the deletion on a")
    assert _described(admin_a) == config | {_key(warm)}
    assert a.metrics()['kafka_proxy_acl_creates_total{result="ok"}'] >= 3
    assert a.metrics()['kafka_proxy_acl_creates_total{result="refused"}'] >= 2
    assert b.metrics()["kafka_proxy_acls_topic_reading"] == 1
    alice_reads_a.close()
    alice_reads_b.close()


def _end_offset(bootstrap: str, topic: str) -> int:
    """The topic's end offset, asked of the broker directly."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "acl-probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def test_no_client_reads_or_writes_the_acl_topic(
        tansu: TansuBroker, proxies: tuple[ProxyProcess, ProxyProcess]) -> None:
    """Not even a super user: the topic is left out of Metadata, a record forged for it is
    refused with TOPIC_AUTHORIZATION_FAILED (and grants nothing), a consumer of it gets that
    error and no record."""
    a, _ = proxies
    admin = _admin(a, "admin")
    deny = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:eve", "*",
                      AclOperation.READ, AclPermissionType.DENY)
    assert _create(admin, deny) == [None]
    end = _end_offset(tansu.bootstrap, ACL_TOPIC)
    assert end >= 1  # the binding's record, on the cluster
    assert ACL_TOPIC not in admin.list_topics(timeout=15).topics

    errors: list[Any] = []
    producer = Producer(_conf(a, "admin", **{"message.timeout.ms": 10_000}))
    producer.produce(ACL_TOPIC, key=b'["CLUSTER","kafka-cluster","LITERAL","User:alice","*",'
                     b'"ALL","ALLOW"]', value=b'{"v":1}',
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors
    assert _end_offset(tansu.bootstrap, ACL_TOPIC) == end
    alice = Describer(a, "alice")
    assert not alice.allowed()  # the forged record granted nothing
    alice.close()

    consumer = Consumer(_conf(a, "admin", **{"group.id": "acl-snoop",
                                             "enable.auto.commit": False}))
    codes: list[int] = []
    records = 0
    try:
        consumer.subscribe([ACL_TOPIC])
        deadline = time.monotonic() + 15
        while not codes and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.2):
                if m.error() is not None:
                    codes.append(m.error().code())
                else:
                    records += 1
    finally:
        consumer.close()
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in codes, codes
    assert records == 0
