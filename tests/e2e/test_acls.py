"""ACLs at the proxy (issue 28), end to end: a tansu broker (which knows nothing of the
proxy's users) behind a proxy terminating SASL, whose ``acls:`` say what each user may do.
librdkafka producers, group consumers and admin clients at their defaults, as each user:
what the ACLs allow goes through, what they deny gets Kafka's error codes, and Metadata
shows each user only the topics it may describe."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
ACLS = """acls:
  super_users: [User:admin]
  bindings:
    - {principal: User:alice, operation: [Write, Read, Describe], topic: a-, pattern_type: prefixed}
    - {principal: User:alice, operation: Read, group: a-, pattern_type: prefixed}
    - {principal: User:bob, operation: Describe, topic: a-, pattern_type: prefixed}
    - {principal: User:bob, operation: Read, group: "*"}
"""


@pytest.fixture
def proxy(tansu: TansuBroker, tmp_path: Path) -> Iterator[ProxyProcess]:
    text = ""
    for user, password in USERS.items():
        text = add_user(text, user, password, 4096)
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(text)
    p = ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      credentials_file: "{credentials}"
""", extra_yaml=ACLS).start()
    try:
        p.wait_broker_listener(111)
        yield p
    finally:
        p.stop()


def _conf(proxy: ProxyProcess, user: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": USERS[user], **extra}


def _create(proxy: ProxyProcess, user: str, *names: str) -> dict[str, KafkaException | None]:
    admin = AdminClient(_conf(proxy, user))
    out: dict[str, KafkaException | None] = {}
    for name, future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).items():
        try:
            future.result(timeout=30)
            out[name] = None
        except KafkaException as exc:
            out[name] = exc
    return out


def _produce(proxy: ProxyProcess, user: str, topic: str, n: int) -> list[KafkaError | None]:
    """Delivery reports of ``n`` messages (librdkafka's defaults, acks=all)."""
    reports: list[KafkaError | None] = []
    producer = Producer(_conf(proxy, user, **{"message.timeout.ms": 20000}))
    for i in range(n):
        producer.produce(topic, value=f"{user}-{i}".encode(),
                         on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(30)
    return reports


def _consume(proxy: ProxyProcess, user: str, topic: str, group: str, n: int
             ) -> tuple[list[bytes], list[KafkaError]]:
    """Up to ``n`` values read by a group consumer, and the errors it met (it stops at the
    first error, or after 30 s)."""
    # (session.timeout.ms 6 s: tansu makes a group join last half of it, 22.5 s by default)
    consumer = Consumer(_conf(proxy, user, **{"group.id": group, "session.timeout.ms": 6000,
                                              "auto.offset.reset": "earliest"}))
    values: list[bytes] = []
    errors: list[KafkaError] = []
    try:
        consumer.subscribe([topic])

        def step() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None:
                if msg.error() is not None:
                    errors.append(msg.error())
                else:
                    values.append(msg.value())
            return len(values) >= n or bool(errors)

        wait_for(step, 30, 0, what=f"{user} consuming {topic}")
        if not errors:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values, errors


def test_acls_allow_and_deny_produce_consume_and_topics(proxy: ProxyProcess) -> None:
    # admin (a super user) may create anything; alice may not create (no CREATE)
    assert _create(proxy, "admin", "a-orders", "b-private") == {
        "a-orders": None, "b-private": None}
    denied = _create(proxy, "alice", "a-new")["a-new"]
    assert denied is not None
    assert denied.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # alice writes a- topics; bob may only describe them; nobody else's topics
    assert _produce(proxy, "alice", "a-orders", 50) == [None] * 50
    assert {e.code() if e else None for e in _produce(proxy, "bob", "a-orders", 5)} == {
        KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert {e.code() if e else None for e in _produce(proxy, "alice", "b-private", 5)} == {
        KafkaError.TOPIC_AUTHORIZATION_FAILED}

    # alice reads them back in her group; bob's group is his, but he may not read the topic
    values, errors = _consume(proxy, "alice", "a-orders", "a-readers", 50)
    assert errors == [] and sorted(values) == sorted(f"alice-{i}".encode() for i in range(50))
    values, errors = _consume(proxy, "bob", "a-orders", "bob-readers", 1)
    assert values == [] and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # alice has no rights on groups outside a- (FindCoordinator asks DESCRIBE)
    values, errors = _consume(proxy, "alice", "a-orders", "b-group", 1)
    assert values == [] and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    # Metadata for all topics shows each user what it may describe
    def topics(user: str) -> set[str]:
        listed = AdminClient(_conf(proxy, user)).list_topics(timeout=30).topics
        return {t for t in listed if not t.startswith("__")}

    assert topics("alice") == topics("bob") == {"a-orders"}
    assert {"a-orders", "b-private"} <= topics("admin")

    # every denial counted per resource type and operation, and logged with its principal
    metrics = proxy.metrics()
    # (bob's produce: WRITE; alice's: DESCRIBE, in Metadata, before librdkafka sends any)
    assert metrics['kafka_proxy_acl_denials_total{operation="WRITE",resource_type="TOPIC"}'] >= 1
    assert metrics[
        'kafka_proxy_acl_denials_total{operation="DESCRIBE",resource_type="TOPIC"}'] >= 1
    assert metrics['kafka_proxy_acl_denials_total{operation="DESCRIBE",resource_type="GROUP"}'] >= 1
    logged = {(e.get("principal"), e.get("operation"), e.get("resource"))
              for e in proxy.events() if e.get("event") == "acl_denied"}
    assert ("User:bob", "WRITE", "a-orders") in logged
    assert ("User:alice", "DESCRIBE", "b-group") in logged


def test_a_deny_created_while_a_producer_runs_holds_within_a_second(
        proxy: ProxyProcess) -> None:
    """A super user adds a DENY through the Admin API while alice's producer runs: the
    messages alice sends from then on are refused (TOPIC_AUTHORIZATION_FAILED), within a
    second; the ones before went through."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    assert _create(proxy, "admin", "a-live") == {"a-live": None}
    reports: list[tuple[float, KafkaError | None]] = []
    producer = Producer(_conf(proxy, "alice", **{"linger.ms": 5, "message.timeout.ms": 20000}))
    sent = 0

    def produce_for(seconds: float) -> None:
        """(librdkafka refuses produce() at once for a topic it knows it may not write)"""
        nonlocal sent
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            sent += 1
            try:
                producer.produce("a-live", value=b"x" * 100, on_delivery=lambda err, _m:
                                 reports.append((time.monotonic(), err)))
            except KafkaException as exc:
                reports.append((time.monotonic(), exc.args[0]))
            producer.poll(0.01)

    produce_for(1.0)
    deny = AclBinding(ResourceType.TOPIC, "a-live", ResourcePatternType.LITERAL, "User:alice",
                      "*", AclOperation.WRITE, AclPermissionType.DENY)
    admin = AdminClient(_conf(proxy, "admin"))
    (future,) = admin.create_acls([deny], request_timeout=15).values()
    future.result(timeout=30)
    created = time.monotonic()
    produce_for(1.5)
    producer.flush(30)
    assert len(reports) == sent
    before = [err for at, err in reports if at < created]
    assert before and all(err is None for err in before)  # allowed until then
    failures = [at for at, err in reports
                if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert failures and failures[0] - created < 1.0
    late = [err for at, err in reports if at > created + 1.0]
    assert late and all(err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
                        for err in late)
