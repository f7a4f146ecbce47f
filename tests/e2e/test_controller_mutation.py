"""The controller mutation quota (KIP-599, issue 17) through the proxy in front of tansu, with
real admin clients: kafka-python's KafkaAdminClient (CreateTopics v7 and DeleteTopics v6:
strict, throttled topics refused with THROTTLING_QUOTA_EXCEEDED) and confluent-kafka's
AdminClient (librdkafka: CreateTopics v4, permissive: created, then throttled). What exists
afterwards is checked on tansu directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.errors import NodeNotReadyError

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

THROTTLED = 89
RATE = 2  # partitions/s; 4 x 1 s window: a burst of 8


@pytest.fixture(scope="module")
def proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  controller_mutation_window: {{samples: 4, size_seconds: 1}}
  admin_principals: [ANONYMOUS]
  entities:
    - {{client-id: strict-admin, controller_mutation_rate: {RATE}}}
    - {{client-id: rdkafka-admin, controller_mutation_rate: {RATE}}}
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _kp_admin(bootstrap: str, client_id: str) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)


def _existing(tansu: TansuBroker) -> set[str]:
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    return set(admin.list_topics(timeout=10).topics)


def _create(admin: Any, topics: dict[str, int]) -> dict[str, int]:
    result = admin.create_topics({n: {"num_partitions": p, "replication_factor": 1}
                                  for n, p in topics.items()}, raise_errors=False)
    return {t["name"]: t["error_code"] for t in result["topics"]}


def _try_create(admin: Any, topics: dict[str, int]) -> dict[str, int] | None:
    """None while the client holds itself back (the throttle time of its last response)."""
    try:
        return _create(admin, topics)
    except NodeNotReadyError:
        return None


def _metric(proxy: ProxyProcess, name: str, labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels``."""
    return sum(v for k, v in proxy.metrics().items()
               if k.startswith(name + "{") and labels in k)


def _tokens(proxy: ProxyProcess, client_id: str) -> float:
    return _metric(proxy, "kafka_proxy_controller_mutation_tokens", f'client_id="{client_id}"')


def test_strict_topics_past_the_bucket_are_refused_and_never_created(
        proxy: ProxyProcess, tansu: TansuBroker) -> None:
    admin = _kp_admin(proxy.bootstrap, "strict-admin")
    free = _kp_admin(proxy.bootstrap, "no-quota")
    try:
        # a burst of 8: 3 + 3 go (8 -> 2), c goes on 2 tokens (-> -1), d meets -1: refused
        assert _create(admin, {"mq-a": 3, "mq-b": 3}) == {"mq-a": 0, "mq-b": 0}
        assert _create(admin, {"mq-c": 3, "mq-d": 2}) == {"mq-c": 0, "mq-d": THROTTLED}
        refused_at = time.monotonic()
        # the response carried the throttle time (500 ms: -1 token at 2/s): kafka-python
        # holds the connection back itself
        with pytest.raises(NodeNotReadyError, match="throttle"):
            _create(admin, {"mq-e": 1})
        existing = _existing(tansu)
        assert {"mq-a", "mq-b", "mq-c"} <= existing
        assert "mq-d" not in existing
        # back at 0 tokens half a second after -1 (2/s): e goes, and only then
        wait_for(lambda: _tokens(proxy, "strict-admin") >= 0, timeout=5)
        assert time.monotonic() - refused_at >= 0.4
        wait_for(lambda: _try_create(admin, {"mq-e": 1}) == {"mq-e": 0}, timeout=5)
        # a client-id without a quota is not counted
        assert set(_create(free, {f"mq-free-{i}": 5 for i in range(6)}).values()) == {0}
        # deletes cost the topics' partitions (known from their creation): from 3 tokens
        # (a little more by the time it goes), a takes 3, b overdraws, c is refused
        wait_for(lambda: _tokens(proxy, "strict-admin") >= 3, timeout=10)
        def delete() -> dict[str, int] | None:  # None while the client holds itself back
            try:
                result = admin.delete_topics(["mq-a", "mq-b", "mq-c"], raise_errors=False)
            except NodeNotReadyError:
                return None
            return {t["name"]: t["error_code"] for t in result["topics"]}

        codes = wait_for(delete, timeout=5)
        assert codes == {"mq-a": 0, "mq-b": 0, "mq-c": THROTTLED}
        existing = _existing(tansu)
        assert "mq-c" in existing and not {"mq-a", "mq-b"} & existing
        assert _metric(proxy, "kafka_proxy_controller_mutation_topics_total",
                       'result="throttled"') == 2  # d and c
    finally:
        admin.close()
        free.close()


def test_permissive_versions_create_everything_then_hold_the_client_back(
        proxy: ProxyProcess, tansu: TansuBroker) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap, "client.id": "rdkafka-admin"})
    names = [f"mq-rd-{i}" for i in range(3)]
    futures = admin.create_topics([NewTopic(n, 4, 1) for n in names])  # 12 of a burst of 8
    for f in futures.values():
        f.result(timeout=20)
    assert set(names) <= _existing(tansu)
    assert _tokens(proxy, "rdkafka-admin") < 0
    throttled = _metric(proxy, "kafka_proxy_quota_throttled_requests_total",
                        'quota="controller_mutation"')
    assert throttled >= 1
    # the next request on the connection waits for the throttle (~2 s of -4 tokens at 2/s)
    start = time.monotonic()
    admin.create_topics([NewTopic("mq-rd-next", 1, 1)])["mq-rd-next"].result(timeout=20)
    assert time.monotonic() - start >= 1.0


def test_an_altered_rate_applies_live(proxy: ProxyProcess, tansu: TansuBroker) -> None:
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as A

    admin = _kp_admin(proxy.bootstrap, "late")
    try:
        assert set(_create(admin, {"mq-late-1": 30, "mq-late-2": 30}).values()) == {0}
        manager = admin._manager

        async def alter() -> Any:
            return await manager.send(A(entries=[A.EntryData(
                entity=[A.EntryData.EntityData(entity_type="client-id", entity_name="late")],
                ops=[A.EntryData.OpData(key="controller_mutation_rate", value=1.0,
                                        remove=False)])], validate_only=False))

        response = manager.run(alter)
        assert [e.error_code for e in response.entries] == [0]
        # burst 4 now: 10 goes on a full bucket, then 1 is refused
        wait_for(lambda: _try_create(admin, {"mq-late-3": 10}) == {"mq-late-3": 0}, timeout=10)
        assert _create(admin, {"mq-late-4": 1}) == {"mq-late-4": THROTTLED}
        assert "mq-late-4" not in _existing(tansu)
    finally:
        admin.close()
