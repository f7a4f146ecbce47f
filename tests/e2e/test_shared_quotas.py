"""Budgets shared by every process of every instance (issue 16): two proxy instances, each of
two workers, in front of one tansu, terminating SASL. Four librdkafka producers of user alice
(per-user quota) and four of client-id ``spread`` (per-client-id quota) are spread over both
instances (and, by SO_REUSEPORT, over their workers): over every whole throttle cycle after
the warm-up each entity gets its quota within 5 %, and over the run 0.8-1.4 of what one
enforcement point allows (its quota and the padded first window), where uncoordinated it
would get 2 to 4 times it. Every message acknowledged is in the topic
exactly once. The usage topic deleted mid-run puts every process into the fallback (quota /
4, said by a metric); recreating it brings them back."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.rates import Cycles, cycle_rate

pytestmark = pytest.mark.e2e

QUOTA = 1_000_000
VALUE = b"s" * 1000
WARMUP_S = 12.0
RUN_S = 52.0
USAGE_TOPIC = "__kafka_quota_proxy_usage"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}


def _instance(tansu: TansuBroker, name: str, users: Path) -> ProxyProcess:
    return ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      mechanisms: [SCRAM-SHA-256]
      credentials_file: "{users}"
""", extra_yaml=f"""workers: 2
coordination: {{enabled: true, instance: "{name}"}}
quotas:
  window: {{samples: 11, size_seconds: 1}}
  entities:
    - {{user: alice, producer_byte_rate: {QUOTA}}}
    - {{client-id: spread, producer_byte_rate: {QUOTA}}}
""")


def _client(bootstrap: str, user: str, client_id: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": client_id,
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": PASSWORDS[user]}


def _produce(config: dict[str, Any], topic: str, tag: str, seconds: float,
             delivered: list[tuple[float, int, bytes]], errors: list[str]) -> None:
    producer = Producer({**config, "acks": "1", "linger.ms": 5, "batch.size": 65536,
                         "queue.buffering.max.kbytes": 2048})

    def done(err: object, msg: object) -> None:
        if err is not None:
            if "Purged in queue" not in str(err):  # (dropped at the end, below)
                errors.append(str(err))
        else:
            m: Any = msg
            delivered.append((time.monotonic(), len(m.value()) + len(m.key()), m.key()))

    deadline = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, key=b"%s-%08d" % (tag.encode(), seq), value=VALUE,
                             on_delivery=done)
            seq += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    # what is still queued would trickle out at the quota: dropped, not counted
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(60)


def _metric(proxy: ProxyProcess, name: str, worker: str | None = None) -> list[float]:
    """A family's samples (one per worker, for this feature's gauges); ``worker``: the sum of
    that worker's samples, if any is above 0."""
    try:
        metrics = proxy.metrics()
    except OSError:
        return []
    if worker is not None:
        total = sum(v for k, v in metrics.items()
                    if k.startswith(name + "{") and f'worker="{worker}"' in k)
        return [total] if total > 0 else []
    return [v for k, v in metrics.items() if k.startswith(name + "{")]


def test_two_instances_of_two_workers_enforce_one_budget_per_entity(
        tansu: TansuBroker, tmp_path: Path) -> None:
    users = tmp_path / "users.yaml"
    text = ""
    for user, password in PASSWORDS.items():
        text = add_user(text, user, password, iterations=4096)
    users.write_text(text)
    instances = [_instance(tansu, name, users).start() for name in ("a", "b")]
    try:
        for proxy in instances:
            wait_for(lambda p=proxy: _metric(p, "kafka_proxy_shared_quota_live_processes")
                     == [4, 4], 60, what="every process sees the four")
            proxy.wait_broker_listener(111)
        topic = new_topic(tansu.bootstrap, "shared", partitions=2)
        runs: dict[str, list[tuple[float, int, bytes]]] = {"alice": [], "spread": []}
        errors: list[str] = []
        threads = []
        start = time.monotonic()
        for i in range(4):
            proxy = instances[i % 2]
            for user, client_id, run in (("alice", f"alice-app-{i}", runs["alice"]),
                                         ("bob", "spread", runs["spread"])):
                threads.append(threading.Thread(target=_produce, args=(
                    _client(proxy.bootstrap, user, client_id), topic, f"{client_id}-{i}",
                    RUN_S, run, errors)))
        for t in threads:
            t.start()
        # the producers' connections land on every worker of both instances
        wait_for(lambda: all(_metric(p, "kafka_proxy_connections_accepted_total", str(w))
                             for p in instances for w in (0, 1)), 30,
                 what="connections on every worker")
        for t in threads:
            t.join(RUN_S + 90)
        assert not errors, errors[:3]
        for entity, delivered in runs.items():
            # What one enforcement point allows a greedy client: its quota over the run, and
            # the padded first window (samples - 1 windows of quota at once).
            allowed = QUOTA * (RUN_S + 10)
            ratio = sum(n for _, n, _ in delivered) / allowed
            events = sorted((t - start, n) for t, n, _ in delivered)
            rate = cycle_rate(events, WARMUP_S, QUOTA)
            cycles = Cycles(events, QUOTA)
            whole = cycles.whole(WARMUP_S)[0]
            starts = [s for s in cycles.starts if s >= WARMUP_S]
            print(f"{entity}: {ratio:.3f} of what one enforcement point allows over the run; "
                  f"{rate / QUOTA:.3f} of the quota over the first whole throttle cycles "
                  f"after {WARMUP_S:.0f} s, {whole:.3f} over every whole cycle "
                  f"(cycles begun at {[round(s, 1) for s in starts]} s; 4 producers on 2 "
                  "instances x 2 workers)")
            # Uncoordinated, the processes the producers landed on (2 to 4) would each give
            # the whole quota: 2 to 4 times this. Over every whole throttle cycle after the
            # warm-up (from the first burst after 5 s without one to the last, as
            # bench/shared_budgets_bench.py measures its 90 s runs) the entity gets its quota
            # within 5 % (3 or 4 cycles in 52 s: measured 0.994-1.016 in 6; over 2 cycles of
            # 40 s runs, 0.996-1.092). (The first-cycles measure is printed only:
            # with bursts split over processes it can start a cycle at a second, smaller
            # burst: 0.64 once in CI where the run as a whole was 1.117.)
            assert len(starts) >= 2, (entity, cycles.starts)
            assert 0.95 <= whole <= 1.05, (entity, whole, starts)
            assert 0.8 <= ratio <= 1.4, (entity, ratio)
        for proxy in instances:
            throttled = _metric(proxy, "kafka_proxy_quota_throttled_requests_total")
            assert sum(throttled) > 0
            assert sum(_metric(proxy, "kafka_proxy_shared_quota_reports_read_total")) > 0
            assert _metric(proxy, "kafka_proxy_shared_quota_fallback") == [0, 0]

        # Every acknowledged message exactly once.
        keys = sorted(k for run in runs.values() for _, _, k in run)
        consumer = Consumer({**_client(instances[1].bootstrap, "bob", "checker"),
                             "group.id": "shared-check", "enable.auto.commit": False})
        seen: list[bytes] = []
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
            deadline = time.monotonic() + 90
            while len(seen) < len(keys) and time.monotonic() < deadline:
                seen += [m.key() for m in consumer.consume(10000, 1.0) if m.error() is None]
        finally:
            consumer.close()
        assert sorted(seen) == keys

        # The usage topic deleted: every process falls back to quota / 4 and says so ...
        admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
        admin.delete_topics([USAGE_TOPIC])[USAGE_TOPIC].result(30)
        for proxy in instances:
            wait_for(lambda p=proxy: _metric(p, "kafka_proxy_shared_quota_fallback") == [1, 1],
                     20, what="the fallback on every worker")
            assert _metric(proxy, "kafka_proxy_shared_quota_fallback_processes") == [4, 4]
        # (whichever a worker noticed first: its reader losing the topic, or its own
        # reports no longer coming back)
        reasons = {"usage topic not read", "own reports not read back"}
        wait_for(lambda: any(e.get("event") == "shared_quota_fallback"
                             and e.get("state") == "on" and e.get("reason") in reasons
                             for e in instances[0].events()),
                 10, what="the fallback logged with its reason")
        # ... and recreating it brings them back.
        try:
            admin.create_topics([NewTopic(USAGE_TOPIC, 1, 1)])[USAGE_TOPIC].result(30)
        except KafkaException as exc:  # a proxy re-created it first (after 10 s missing)
            assert exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, exc
        for proxy in instances:
            wait_for(lambda p=proxy: _metric(p, "kafka_proxy_shared_quota_fallback") == [0, 0]
                     and _metric(p, "kafka_proxy_shared_quota_live_processes") == [4, 4],
                     30, what="every process back on shared budgets")
    finally:
        for proxy in instances:
            proxy.stop()
