"""The Prometheus endpoint reports what flowed through the proxy."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


def test_metrics_count_requests_bytes_latency_and_rewrites(proxy: ProxyProcess) -> None:
    topic = f"metrics-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    before = proxy.metrics()
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5,
                         "client.id": "metrics-producer"})
    for i in range(2000):
        producer.produce(topic, value=b"m" * 500, key=b"%d" % i)
    assert producer.flush(30) == 0
    after = wait_for(lambda: (m := proxy.metrics())
                     .get('kafka_proxy_upstream_latency_seconds_count{api="produce"}', 0)
                     > before.get('kafka_proxy_upstream_latency_seconds_count{api="produce"}', 0)
                     and m, 10, what="produce latency observed")

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta('kafka_proxy_requests_total{api="produce"}') >= 1
    assert delta('kafka_proxy_request_bytes_total{api="produce"}') >= 2000 * 500
    assert delta('kafka_proxy_response_bytes_total{api="produce"}') > 0
    assert delta('kafka_proxy_requests_total{api="metadata"}') >= 1
    assert delta('kafka_proxy_responses_rewritten_total{api="metadata"}') >= 1
    assert after['kafka_proxy_upstream_brokers'] == 1
    assert after['kafka_proxy_connections_accepted_total{listener="broker"}'] >= 1
    assert 'kafka_proxy_upstream_latency_seconds_bucket{api="produce",le="+Inf"}' in after
