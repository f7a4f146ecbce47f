"""ACLs at the proxy (issue 28) as kafka-python, aiokafka and librdkafka see them: one proxy
terminating SASL SCRAM-SHA-256 (SASL_PLAINTEXT) in front of a tansu broker, its ``acls:``
saying what each user may do, shared by every test of this file. Each test does what the
ACLs allow and what they deny, and asserts the error each client library surfaces for
Kafka's error code: produce, group consumption and offset commits, transactional and
idempotent producers, the admin APIs (create, delete, describe configs, listings), and a
SIGHUP reload that takes an allow away from a live producer.

``tests/e2e/test_acls.py`` covers librdkafka's plain producer, group consumer, topic creation
and Metadata listing; librdkafka is used here only for what it does not cover.

Notes on the clients (not on the proxy): tansu answers aiokafka's InitProducerId (v0)
UNKNOWN_SERVER_ERROR, so aiokafka's transactional and idempotent producers are exercised only
where the proxy denies them before tansu is asked; kafka-python 3.0's ``describe_configs``
drops per-resource error codes, so describe configs is asserted with aiokafka and librdkafka.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiokafka.errors as aio_errors
import kafka.errors as kp_errors
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTP
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from aiokafka.structs import OffsetAndMetadata as AioOffset
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

USERS = {name: f"{name}-pw" for name in
         ("admin", "alice", "bob", "tx", "idem", "creator", "viewer", "carol")}
# the reload test takes this line out of the file (and puts it back)
CAROL_WRITE = "    - {principal: User:carol, operation: Write, topic: c-reload}\n"
ACLS = """quotas:
  watch_seconds: 0
acls:
  super_users: [User:admin]
  bindings:
    - {principal: User:alice, operation: [Write, Read], topic: c-, pattern_type: prefixed}
    - {principal: User:alice, operation: Read, group: cg-, pattern_type: prefixed}
    - {principal: User:alice, operation: Describe, group: cd-, pattern_type: prefixed}
    - {principal: User:bob, operation: Describe, topic: c-, pattern_type: prefixed}
    - {principal: User:bob, operation: Read, group: "*"}
    - {principal: User:tx, operation: Write, transactional_id: tx-ok, pattern_type: prefixed}
    - {principal: User:tx, operation: Describe, transactional_id: tx-no, pattern_type: prefixed}
    - {principal: User:tx, operation: Write, topic: c-, pattern_type: prefixed}
    - {principal: User:tx, operation: Describe, topic: d-, pattern_type: prefixed}
    - {principal: User:idem, operation: Write, topic: c-idem}
    - {principal: User:creator, operation: [Create, Delete], topic: n-, pattern_type: prefixed}
    - {principal: User:viewer, operation: Describe, group: cg-, pattern_type: prefixed}
    - {principal: User:viewer, operation: DescribeConfigs, topic: c-, pattern_type: prefixed}
""" + CAROL_WRITE
# What each user may do, in words:
# - alice: write and read c-* topics (so describe them), read groups cg-*, describe groups
#   cd-* (finds their coordinator, may not join nor commit)
# - bob: describe c-* topics only (no WRITE anywhere: an idempotent producer is refused
#   IDEMPOTENT_WRITE), read every group
# - tx: WRITE on transactional ids tx-ok*, DESCRIBE only on tx-no*; write c-*, describe d-*
# - idem: WRITE on the topic c-idem, nothing on the cluster
# - creator: CREATE and DELETE on n-* topics
# - viewer: DESCRIBE on groups cg-*, DESCRIBE_CONFIGS on c-* topics (not DESCRIBE)
# - carol: WRITE on c-reload, until the reload test takes it away
C_TOPICS = {"c-orders", "c-idem", "c-reload", "c-keep"}
OTHER_TOPICS = {"b-private", "d-log"}

TIMEOUTS = {"request_timeout_ms": 5000}


@dataclass
class Env:
    proxy: ProxyProcess

    def kw(self, user: str, **extra: Any) -> dict[str, Any]:
        """kafka-python's and aiokafka's connection settings for ``user``."""
        return {"bootstrap_servers": self.proxy.bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": user,
                "sasl_plain_password": USERS[user], **TIMEOUTS, **extra}

    def conf(self, user: str, **extra: Any) -> dict[str, Any]:
        """librdkafka's settings for ``user``."""
        return {"bootstrap.servers": self.proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                "sasl.password": USERS[user], **extra}

    def kp_admin(self, user: str) -> KafkaAdminClient:
        return KafkaAdminClient(**self.kw(user))


@pytest.fixture(scope="module")
def env(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    text = ""
    for user, password in USERS.items():
        text = add_user(text, user, password, 4096)
    credentials = tmp_path_factory.mktemp("acl-clients") / "credentials.yaml"
    credentials.write_text(text)
    proxy = ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      credentials_file: "{credentials}"
""", extra_yaml=ACLS).start()
    try:
        proxy.wait_broker_listener(111)
        e = Env(proxy)
        admin = e.kp_admin("admin")
        try:
            admin.create_topics([NewTopic(n, 1, 1) for n in sorted(C_TOPICS | OTHER_TOPICS)])
            wait_for(lambda: set(admin.list_topics()) >= C_TOPICS | OTHER_TOPICS, 20,
                     what="the topics")
        finally:
            admin.close()
        # two groups with committed offsets, for the listings: one viewer may describe
        for group in ("cg-listed", "xg-hidden"):
            consumer = KafkaConsumer(**e.kw("admin", group_id=group, enable_auto_commit=False))
            try:
                tp = TopicPartition("c-keep", 0)
                consumer.assign([tp])
                consumer.commit({tp: OffsetAndMetadata(0, "", -1)})
            finally:
                consumer.close()
        yield e
    finally:
        proxy.stop()


def _values(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def _raised(action: Callable[[], object], timeout: float = 20) -> BaseException:
    """The exception ``action`` raises, called until it raises (a consumer's poll)."""
    caught: list[BaseException] = []

    def step() -> bool:
        try:
            action()
        except Exception as exc:
            caught.append(exc)
        return bool(caught)

    wait_for(step, timeout, 0, what="an error")
    return caught[0]


# ---------------------------------------------------------------- kafka-python


def test_kafka_python_produce_consume_and_commit(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]
    values = _values(f"kp-{tag}", 20)
    # alice writes c-orders (kafka-python 3's default producer: idempotent, acks=all)
    producer = KafkaProducer(**env.kw("alice", max_block_ms=5000))
    try:
        for value in values:
            producer.send("c-orders", value)
        producer.flush(20)
        assert producer.send("c-orders", b"one more").get(10).offset >= len(values)
        # b-private: not even described to her (Metadata), so never sent
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            producer.send("b-private", b"x").get(10)
    finally:
        producer.close(5)
    # bob may describe c-orders, not write it: the Produce itself is refused
    producer = KafkaProducer(**env.kw("bob", max_block_ms=5000, enable_idempotence=False))
    try:
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            producer.send("c-orders", b"x").get(10)
    finally:
        producer.close(5)

    def group_consumer(user: str, group: str) -> KafkaConsumer:
        return KafkaConsumer("c-orders", **env.kw(
            user, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=6000, heartbeat_interval_ms=1000, request_timeout_ms=7000))

    # alice reads them in her group cg-*, and commits
    consumer = group_consumer("alice", f"cg-kp-{tag}")
    try:
        seen: set[bytes] = set()

        def read_all() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                seen.update(r.value for r in records)
            return set(values) <= seen

        wait_for(read_all, 30, 0, what="alice reading her messages")
        tp = TopicPartition("c-orders", 0)
        consumer.commit()
        assert consumer.committed(tp) == consumer.position(tp) > 0
    finally:
        consumer.close()
    # bob's group is his (READ on every group), but he may not READ the topic (Fetch)
    consumer = group_consumer("bob", f"bob-kp-{tag}")
    try:
        error = _raised(lambda: consumer.poll(timeout_ms=500))
        assert isinstance(error, kp_errors.TopicAuthorizationFailedError), repr(error)
    finally:
        consumer.close()
    # alice may describe cd-* groups (FindCoordinator) but not READ them (JoinGroup)
    consumer = group_consumer("alice", f"cd-kp-{tag}")
    try:
        error = _raised(lambda: consumer.poll(timeout_ms=500))
        assert isinstance(error, kp_errors.GroupAuthorizationFailedError), repr(error)
    finally:
        consumer.close()

    # OffsetCommit from assigned consumers: READ on the group, then READ on each topic
    def commit(user: str, group: str) -> int | None:
        c = KafkaConsumer(**env.kw(user, group_id=group, enable_auto_commit=False))
        try:
            tp = TopicPartition("c-orders", 0)
            c.assign([tp])
            c.commit({tp: OffsetAndMetadata(3, "", -1)})
            return c.committed(tp)
        finally:
            c.close()

    assert commit("alice", f"cg-kpc-{tag}") == 3
    with pytest.raises(kp_errors.GroupAuthorizationFailedError):
        commit("alice", f"cd-kpc-{tag}")
    with pytest.raises(kp_errors.TopicAuthorizationFailedError):
        commit("bob", f"bob-kpc-{tag}")


# --------------------------------------------------------------------- aiokafka


async def test_aiokafka_produce_consume_and_commit(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]
    values = _values(f"aio-{tag}", 20)
    producer = AIOKafkaProducer(**env.kw("alice"))  # aiokafka's default: not idempotent
    await producer.start()
    try:
        for value in values:
            await producer.send("c-orders", value)
        await producer.flush()
        with pytest.raises(aio_errors.TopicAuthorizationFailedError):
            await producer.send_and_wait("b-private", b"x")
    finally:
        await producer.stop()
    producer = AIOKafkaProducer(**env.kw("bob"))
    await producer.start()
    try:
        with pytest.raises(aio_errors.TopicAuthorizationFailedError):
            await producer.send_and_wait("c-orders", b"x")
    finally:
        await producer.stop()

    def group_consumer(user: str, group: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer("c-orders", **env.kw(
            user, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=6000, heartbeat_interval_ms=1000))

    consumer = group_consumer("alice", f"cg-aio-{tag}")
    await consumer.start()
    try:
        seen: set[bytes] = set()
        async with asyncio.timeout(30):
            while not set(values) <= seen:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    seen.update(r.value for r in records)
        tp = AioTP("c-orders", 0)
        await consumer.commit()
        assert await consumer.committed(tp) == await consumer.position(tp) > 0
    finally:
        await consumer.stop()
    consumer = group_consumer("bob", f"bob-aio-{tag}")
    await consumer.start()
    try:
        with pytest.raises(aio_errors.TopicAuthorizationFailedError):
            async with asyncio.timeout(30):
                while True:
                    await consumer.getmany(timeout_ms=500)
    finally:
        await consumer.stop()
    consumer = group_consumer("alice", f"cd-aio-{tag}")
    try:
        with pytest.raises(aio_errors.GroupAuthorizationFailedError):
            await consumer.start()  # (it waits for its assignment: JoinGroup is refused)
    finally:
        await consumer.stop()

    async def commit(user: str, group: str) -> int | None:
        c = AIOKafkaConsumer(**env.kw(user, group_id=group, enable_auto_commit=False))
        await c.start()
        try:
            tp = AioTP("c-orders", 0)
            c.assign([tp])
            await c.commit({tp: AioOffset(3, "")})
            return await c.committed(tp)
        finally:
            await c.stop()

    assert await commit("alice", f"cg-aioc-{tag}") == 3
    with pytest.raises(aio_errors.GroupAuthorizationFailedError):
        await commit("alice", f"cd-aioc-{tag}")
    with pytest.raises(aio_errors.TopicAuthorizationFailedError):
        await commit("bob", f"bob-aioc-{tag}")


# ------------------------------------------------- transactional and idempotent producers


def test_transactional_producers(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]

    def librdkafka(transactional_id: str) -> Producer:
        return Producer(env.conf("tx", **{"transactional.id": transactional_id,
                                          "transaction.timeout.ms": 10000,
                                          "message.timeout.ms": 10000}))

    # WRITE on the transactional id and the topic: a whole transaction
    producer = librdkafka(f"tx-ok-cf-{tag}")
    producer.init_transactions(15)
    producer.begin_transaction()
    reports: list[KafkaError | None] = []
    for value in _values(f"txn-{tag}", 5):
        producer.produce("c-orders", value, on_delivery=lambda err, _msg: reports.append(err))
    producer.commit_transaction(15)
    assert reports == [None] * 5
    # ... but not on a topic it may only describe (AddPartitionsToTxn): abortable
    producer.begin_transaction()
    producer.produce("d-log", b"x")
    with pytest.raises(KafkaException) as caught:
        producer.commit_transaction(15)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert caught.value.args[0].txn_requires_abort()
    producer.abort_transaction(15)

    # DESCRIBE (not WRITE) on the transactional id: InitProducerId refused, fatal
    producer = librdkafka(f"tx-no-cf-{tag}")
    with pytest.raises(KafkaException) as caught:
        producer.init_transactions(15)
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert caught.value.args[0].fatal()

    # kafka-python, the same
    kp = KafkaProducer(**env.kw("tx", transactional_id=f"tx-ok-kp-{tag}", max_block_ms=10000))
    try:
        kp.init_transactions()
        kp.begin_transaction()
        assert kp.send("c-orders", f"kp-txn-{tag}".encode()).get(10).offset >= 0
        kp.commit_transaction()
    finally:
        kp.close(5)
    kp = KafkaProducer(**env.kw("tx", transactional_id=f"tx-no-kp-{tag}", max_block_ms=10000))
    try:
        with pytest.raises(kp_errors.TransactionalIdAuthorizationFailedError):
            kp.init_transactions()
    finally:
        kp.close(5)

    # aiokafka's start() initialises the transactional producer: refused the same way
    async def aio_refused() -> None:
        producer = AIOKafkaProducer(**env.kw("tx", transactional_id=f"tx-no-aio-{tag}"))
        try:
            with pytest.raises(aio_errors.TransactionalIdAuthorizationFailed):
                await producer.start()
        finally:
            await producer.stop()

    asyncio.run(aio_refused())


def test_librdkafka_idempotent_producer(env: Env) -> None:
    def produce(user: str, topic: str, n: int) -> list[int | None]:
        reports: list[int | None] = []
        producer = Producer(env.conf(user, **{"enable.idempotence": True,
                                              "message.timeout.ms": 10000}))
        for value in _values(user, n):
            producer.produce(topic, value,
                             on_delivery=lambda err, _msg: reports.append(err and err.code()))
        assert producer.flush(20) == 0
        return reports

    # WRITE on one topic is enough for an idempotent producer (no IDEMPOTENT_WRITE)
    assert produce("idem", "c-idem", 10) == [None] * 10
    assert produce("idem", "c-orders", 3) == [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 3
    # no WRITE anywhere: InitProducerId refused CLUSTER_AUTHORIZATION_FAILED, fatal (without
    # callbacks: confluent-kafka raises a fatal error through the next Python callback)
    producer = Producer(env.conf("bob", **{"enable.idempotence": True,
                                           "message.timeout.ms": 10000}))
    producer.produce("c-orders", b"x")
    with pytest.raises(KafkaException) as caught:
        producer.flush(20)
    assert caught.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert caught.value.args[0].fatal()


# ------------------------------------------------------------------------- admin


def test_admin_create_and_delete_topics(env: Env) -> None:
    tag = uuid.uuid4().hex[:8]
    admin, alice, creator = (env.kp_admin(u) for u in ("admin", "alice", "creator"))
    try:
        # CREATE: neither on the cluster nor on the topic
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            alice.create_topics([NewTopic(f"c-new-{tag}", 1, 1)])
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            creator.create_topics([NewTopic(f"c-new-{tag}", 1, 1)])
        # CREATE on the prefix n-
        created = creator.create_topics([NewTopic(f"n-{tag}", 1, 1)])
        assert [t["error_code"] for t in created["topics"]] == [0]
        wait_for(lambda: f"n-{tag}" in admin.list_topics(), 20, what="the new topic")
        assert f"c-new-{tag}" not in admin.list_topics()
        # DELETE on the prefix n-; not on c-keep for alice (who may describe it)
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            alice.delete_topics(["c-keep"])
        deleted = creator.delete_topics([f"n-{tag}"])
        assert [t["error_code"] for t in deleted["topics"]] == [0]
        wait_for(lambda: f"n-{tag}" not in admin.list_topics(), 20, what="the topic deleted")
        assert "c-keep" in admin.list_topics()
    finally:
        for client in (admin, alice, creator):
            client.close()

    # aiokafka answers with the responses: their error codes are Kafka's
    async def aio() -> None:
        creator = AIOKafkaAdminClient(**env.kw("creator"))
        await creator.start()
        try:
            from aiokafka.admin import NewTopic as AioNewTopic

            response = await creator.create_topics([AioNewTopic(f"n-aio-{tag}", 1, 1),
                                                    AioNewTopic(f"c-aio-{tag}", 1, 1)])
            assert {t[0]: t[1] for t in response.topic_errors} == {
                f"n-aio-{tag}": 0, f"c-aio-{tag}": 29}
            response = await creator.delete_topics([f"n-aio-{tag}", "c-keep"])
            assert {t[0]: t[1] for t in response.topic_error_codes} == {
                f"n-aio-{tag}": 0, "c-keep": 29}
        finally:
            await creator.close()

    asyncio.run(aio())


def test_describe_configs_of_a_topic(env: Env) -> None:
    # viewer has DESCRIBE_CONFIGS on c-*, nothing on b-private
    async def aio() -> dict[str, int]:
        viewer = AIOKafkaAdminClient(**env.kw("viewer"))
        await viewer.start()
        try:
            responses = await viewer.describe_configs([
                AioConfigResource(AioConfigResourceType.TOPIC, "c-orders"),
                AioConfigResource(AioConfigResourceType.TOPIC, "b-private")])
        finally:
            await viewer.close()
        return {r[3]: r[0] for response in responses for r in response.resources}

    assert asyncio.run(aio()) == {"c-orders": 0, "b-private": 29}

    viewer = AdminClient(env.conf("viewer"))
    futures = viewer.describe_configs([ConfigResource("topic", "c-orders"),
                                       ConfigResource("topic", "b-private")],
                                      request_timeout=10)
    outcome: dict[str, int | None] = {}
    for resource, future in futures.items():
        try:
            future.result(timeout=15)
            outcome[resource.name] = None
        except KafkaException as exc:
            outcome[resource.name] = exc.args[0].code()
    assert outcome == {"c-orders": None, "b-private": KafkaError.TOPIC_AUTHORIZATION_FAILED}


def test_list_topics_shows_only_describable_ones(env: Env) -> None:
    def kp_topics(user: str) -> set[str]:
        admin = env.kp_admin(user)
        try:
            return {t for t in admin.list_topics() if not t.startswith("__")}
        finally:
            admin.close()

    async def aio_topics(user: str) -> set[str]:
        admin = AIOKafkaAdminClient(**env.kw(user))
        await admin.start()
        try:
            return {t for t in await admin.list_topics() if not t.startswith("__")}
        finally:
            await admin.close()

    assert kp_topics("alice") == asyncio.run(aio_topics("alice")) == C_TOPICS
    # DESCRIBE_CONFIGS does not imply DESCRIBE: viewer sees no topic
    assert kp_topics("viewer") == asyncio.run(aio_topics("viewer")) == set()
    assert kp_topics("admin") >= C_TOPICS | OTHER_TOPICS


def test_list_consumer_groups_shows_only_describable_ones(env: Env) -> None:
    def kp_groups(user: str) -> set[str]:
        admin = env.kp_admin(user)
        try:
            return {g["group_id"] for g in admin.list_groups()}
        finally:
            admin.close()

    def cf_groups(user: str) -> set[str]:
        admin = AdminClient(env.conf(user))  # (kept alive until the answer)
        result = admin.list_consumer_groups(request_timeout=10).result(timeout=15)
        assert result.errors == []
        return {g.group_id for g in result.valid}

    everything = kp_groups("admin")
    assert {"cg-listed", "xg-hidden"} <= everything and everything == cf_groups("admin")
    for user in ("viewer", "alice"):  # DESCRIBE on cg-* (alice: READ, which implies it)
        for groups in (kp_groups(user), cf_groups(user)):
            assert "cg-listed" in groups and "xg-hidden" not in groups
            assert all(g.startswith(("cg-", "cd-")) for g in groups), groups
    assert kp_groups("bob") == everything  # READ on every group


# ------------------------------------------------------------------------ reload


def test_reload_taking_an_allow_away_stops_a_live_producer(env: Env) -> None:
    proxy = env.proxy
    assert proxy.process is not None

    def reloads() -> float:
        return proxy.metrics().get('kafka_proxy_config_reloads_total{result="success"}', 0)

    def sighup() -> None:
        before = reloads()
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGHUP)
        wait_for(lambda: reloads() > before, 10, what="the reload on SIGHUP")

    original = proxy.config_path.read_text()
    producer = KafkaProducer(**env.kw("carol", max_block_ms=3000, linger_ms=0,
                                      request_timeout_ms=3000))
    try:
        assert producer.send("c-reload", b"before").get(5).offset >= 0
        proxy.config_path.write_text(original.replace(CAROL_WRITE, ""))
        start = time.monotonic()
        proxy.process.send_signal(signal.SIGHUP)
        sent: list[int] = []

        def refused() -> bool:
            try:
                sent.append(producer.send("c-reload", b"after").get(5).offset)
            except kp_errors.TopicAuthorizationFailedError:
                return True
            return False

        wait_for(refused, 5, 0, what="carol's produce refused after the reload")
        assert time.monotonic() - start < 3, (time.monotonic() - start, len(sent))
    finally:
        producer.close(5)
        proxy.config_path.write_text(original)
        sighup()
    # and given back, a new producer of carol's writes again
    producer = KafkaProducer(**env.kw("carol", max_block_ms=3000, request_timeout_ms=3000))
    try:
        assert producer.send("c-reload", b"again").get(5).offset >= 0
    finally:
        producer.close(5)
