"""Greedy librdkafka clients and their achieved rates, for strict pacing's end-to-end test and
bench (``quotas.pacing``): producers keeping their queue full, consumers reading a topic from
the start, each event (time, key + value bytes) recorded; rates over whole throttle cycles
after the first window (``testkit.rates.cycle_rate``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from testkit.e2e import new_topic
from testkit.rates import cycle_rate

VALUE = b"p" * 1000
WARMUP_S = 15.0  # the first window's burst (10 s of quota with Kafka's window) and its payback


def quotas_yaml(pacing: str, quota: int, producer: str = "greedy-producer",
                consumer: str = "greedy-consumer") -> str:
    return f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  pacing: {pacing}
  entities:
    - {{client-id: {producer}, producer_byte_rate: {quota}}}
    - {{client-id: {consumer}, consumer_byte_rate: {quota}}}
"""


@dataclass
class Traffic:
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes)
    errors: list[str] = field(default_factory=list)

    def cycles(self, quota: float, measure_s: float, start: float = WARMUP_S) -> float:
        """/ ``quota``, over whole throttle cycles from ``start`` over ``measure_s`` or more
        (a consumer's fetch of several MB arrives at once: a plain span would count whole
        fetches or none); where there are no bursts (small requests paced evenly), over the
        span from ``start`` to the last event."""
        events = sorted(self.events)
        try:
            return cycle_rate(events, start, quota, measure_s=measure_s, whole=True) / quota
        except AssertionError:  # no bursts (small requests paced evenly): the plain rate
            end = events[-1][0]
            assert end - start >= measure_s, f"the run ended {end:.1f} s in"
            return sum(n for t, n in events if start <= t < end) / (end - start) / quota


def produce(bootstrap: str, topic: str, start: float, seconds: float, out: Traffic,
            client_id: str = "greedy-producer", **config: Any) -> None:
    """librdkafka at its defaults (but ``config``), its queue kept full for ``seconds``."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, **config})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            out.events.append((time.monotonic() - start, len(msg.value()) + len(msg.key())))
        elif "Purged" not in str(err):
            out.errors.append(str(err))

    seq = 0
    while time.monotonic() - start < seconds:
        try:
            producer.produce(topic, key=b"%09d" % seq, value=VALUE, on_delivery=delivered)
            seq += 1
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(30)


def consume(bootstrap: str, topic: str, partitions: int, start: float, seconds: float,
            out: Traffic, client_id: str = "greedy-consumer", **config: Any) -> None:
    """librdkafka at its defaults (but ``config``), reading ``topic`` from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "group.id": f"{client_id}-{bootstrap}", "enable.auto.commit": False,
                         **config})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    try:
        while time.monotonic() - start < seconds:
            for msg in consumer.consume(10_000, 0.2):
                if msg.error() is None:
                    out.events.append((time.monotonic() - start,
                                       len(msg.value() or b"") + len(msg.key() or b"")))
                else:
                    out.errors.append(str(msg.error()))
    finally:
        consumer.close()


def fill(bootstrap: str, messages: int, partitions: int, prefix: str = "paced-source") -> str:
    """A topic of ``messages`` messages of 1 KB, written straight to the broker."""
    topic = new_topic(bootstrap, prefix, partitions=partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, key=b"%09d" % i, value=VALUE, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return topic
