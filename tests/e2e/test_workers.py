"""``workers: 2``: two processes share the listeners (SO_REUSEPORT) behind one supervisor: new
connections land on both, one metrics endpoint labels every sample with its worker, SIGHUP
reaches every worker, a killed worker is restarted and logged, idempotent producers lose and
duplicate nothing through it, and SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, wait_for

pytestmark = pytest.mark.e2e

PRODUCERS = 4
MESSAGES = 15_000


def _sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of a family's samples whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        if not key.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


def _metrics(proxy: ProxyProcess) -> dict[str, float]:
    """The supervisor's endpoint ({} until it listens: after its workers are ready)."""
    try:
        return proxy.metrics()
    except OSError:
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _produce(bootstrap: str, topic: str, n: int, errors: list[str], delivered: list[int]
             ) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "client.id": f"worker-test-{n}",
                  "enable.idempotence": True, "linger.ms": 5})

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[n] += 1

    for i in range(MESSAGES):
        while True:
            try:
                p.produce(topic, key=b"%d-%06d" % (n, i), value=b"w" * 200, on_delivery=done)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
        if i % 100 == 0:
            time.sleep(0.01)  # about 10,000 messages/s each: the run lasts a few seconds
    if p.flush(90):
        errors.append("not flushed")


def test_two_workers_share_the_listeners_and_survive_a_killed_worker(
        tansu: TansuBroker) -> None:
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml="workers: 2\n").start()
    try:
        wait_for(lambda: _metrics(proxy).get('kafka_proxy_workers{state="ready"}') == 2, 60,
                 what="both workers ready")
        # (logged once the supervisor's metrics endpoint is up: just after ready may show)
        started = wait_for(lambda: next((e for e in proxy.events()
                                         if e.get("event") == "workers_started"), None), 10,
                           what="workers_started logged")
        pids: list[int] = started["pids"]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proxy.wait_broker_listener(111)
        # The broker-port map is the same in every worker: connections spread over both
        # are told the same port for the broker.
        ports = set()
        for _ in range(20):
            with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
                answer = wire.request(3, 12, topics=None, allow_auto_topic_creation=False,
                                      include_topic_authorized_operations=False)
                ports |= {(b.node_id, b.port) for b in answer.brokers}
        assert ports == {(111, proxy.broker_port(111))}
        topic = new_topic(proxy.bootstrap, "workers", partitions=2)
        errors: list[str] = []
        delivered = [0] * PRODUCERS
        threads = [threading.Thread(target=_produce, args=(proxy.bootstrap, topic, n, errors,
                                                           delivered)) for n in range(PRODUCERS)]
        for t in threads:
            t.start()
        # Connections land on both workers.
        wait_for(lambda: all(_sum(proxy.metrics(), "kafka_proxy_connections_accepted_total",
                                  worker=str(w)) > 0 for w in (0, 1)), 30,
                 what="connections on both workers")
        wait_for(lambda: sum(delivered) > PRODUCERS * MESSAGES // 5, 30, what="a fifth sent")
        os.kill(pids[1], signal.SIGKILL)  # a worker dies in the middle of the run
        at_kill = sum(delivered)
        exited = wait_for(lambda: [e for e in proxy.events() if e.get("event") ==
                                   "worker_exited"], 20, what="worker_exited")
        assert exited[0]["worker"] == 1 and exited[0]["code"] == -signal.SIGKILL
        wait_for(lambda: [e for e in proxy.events() if e.get("event") == "worker_started"
                          and e.get("restarts") == 1], 30, what="the worker restarted")
        for t in threads:
            t.join(180)
        assert not errors, errors[:3]
        assert at_kill < PRODUCERS * MESSAGES * 0.9, at_kill  # the kill was under load
        metrics = proxy.metrics()
        assert metrics.get('kafka_proxy_worker_restarts_total{worker="1"}') == 1
        assert metrics.get('kafka_proxy_workers{state="ready"}') == 2
        # SIGHUP reaches every worker: each reloads the file.
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGHUP)
        wait_for(lambda: all(proxy.metrics().get(
            f'kafka_proxy_config_reloads_total{{result="success",worker="{w}"}}', 0) == 1
            for w in (0, 1)), 20, what="both workers reloaded")
        # ... an unchanged file: nothing said to need a restart (a worker's metrics port is
        # its own, not a change of metrics)
        reloaded = [e for e in proxy.events() if e.get("event") == "config_reloaded"]
        assert len(reloaded) >= 2 and not [e for e in reloaded if "restart_needed_for" in e]
        # Every acknowledged message exactly once, though a worker died under the producers.
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "workers",
                             "enable.auto.commit": False})
        seen: dict[bytes, int] = {}
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
            deadline = time.monotonic() + 90
            while len(seen) < PRODUCERS * MESSAGES and time.monotonic() < deadline:
                for m in consumer.consume(5000, 0.5):
                    if m.error() is None:
                        key: Any = m.key()
                        seen[key] = seen.get(key, 0) + 1
        finally:
            consumer.close()
        assert len(seen) == PRODUCERS * MESSAGES
        duplicated = [k for k, n in seen.items() if n > 1]
        assert not duplicated, duplicated[:5]
        now = [e for e in proxy.events() if e.get("event") == "worker_started"]
        all_pids = {e["pid"] for e in now}
    finally:
        code = proxy.stop()
    assert code == 0
    assert not [p for p in all_pids if _alive(p)]  # SIGTERM stopped every worker
    assert [e for e in proxy.events() if e.get("event") == "workers_stopped"]
