"""The demo's clients: librdkafka producers and consumers authenticating to the proxy as their
users (SASL SCRAM, terminated by the proxy), each in its own thread.

Each producer writes partitions of its own. The embedded broker (tansu 0.6.0, memory storage)
reserves a batch's offsets before it stores the batch, so while two producers write one
partition a consumer reading it can be handed the later batch before the earlier one is
stored, and moves past the earlier one for good (seen without the proxy: 4 producers on one
partition, 1 to 3 skips per 30 s; none with a partition each). A Kafka broker appends under
the partition's lock and never does this; the demo's exactly-once audit is about the proxy, so
it keeps to one writer per partition, and checks that the offsets it reads follow each other."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOPIC = "demo-events"
PARTITIONS = 3
VALUE_BYTES = 1000


@dataclass(frozen=True)
class DemoClient:
    client_id: str
    user: str
    password: str
    role: str  # "producer" or "consumer"
    rate: float = 0.0  # producers: bytes/s offered (0: none)
    partitions: tuple[int, ...] = ()  # producers: the partitions written, in turn

    def config(self, bootstrap: str) -> dict[str, Any]:
        return {"bootstrap.servers": bootstrap, "client.id": self.client_id,
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": self.user, "sasl.password": self.password}


@dataclass
class ClientCounters:
    produced: int = 0
    consumed: int = 0
    errors: list[str] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)
    duplicates: int = 0
    # (a consumer, when it stops) per partition: where it was and the high watermark then
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    # (a consumer) per partition: the offset of the last message read, and every jump over
    # offsets it was never handed: (partition, last offset read, next offset read)
    last_offsets: dict[int, int] = field(default_factory=dict)
    skipped: list[tuple[int, int, int]] = field(default_factory=list)
    # (a consumer) the errors librdkafka delivered in place of messages
    consume_errors: list[str] = field(default_factory=list)


def produce(client: DemoClient, bootstrap: str, stop: threading.Event,
            counters: ClientCounters) -> None:
    """1 KB messages at ``client.rate`` bytes/s, librdkafka's defaults otherwise (acks=all,
    idempotent), until ``stop``; then everything queued is delivered."""
    from confluent_kafka import Producer

    # A 2 MB queue (librdkafka's default holds 1 GB): what is queued when the demo stops is
    # delivered at the producer's quota, in a second or two.
    producer = Producer({**client.config(bootstrap), "enable.idempotence": True,
                         "queue.buffering.max.kbytes": 2048})

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            counters.produced += 1
        else:
            counters.errors.append(str(err))

    payload = b"x" * VALUE_BYTES
    partitions = client.partitions or tuple(range(PARTITIONS))
    per_second = client.rate / VALUE_BYTES
    seq = 0
    start = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - start) * per_second)
        while seq < due and not stop.is_set():
            key = b"%s-%09d" % (client.client_id.encode(), seq)
            try:
                producer.produce(TOPIC, key=key, value=payload, on_delivery=delivered,
                                 partition=partitions[seq % len(partitions)])
            except BufferError:  # held back by its quota: the queue is full
                producer.poll(0.05)
                break
            seq += 1
        producer.poll(0.01)
    # What is still queued is delivered (at the quota) for the exactly-once check.
    remaining = producer.flush(60)
    if remaining:
        counters.errors.append(f"{remaining} messages not delivered")


def consume(client: DemoClient, bootstrap: str, stop: threading.Event,
            counters: ClientCounters, done: Callable[[], bool] | None = None) -> None:
    """Read the topic from the start. ``done``: after ``stop``, read on until it says so (or
    for 60 s): the auditing consumer catches up on everything acknowledged."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client.config(bootstrap), "group.id": client.client_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    try:
        deadline = None
        while True:
            if stop.is_set():
                if done is None:
                    break
                deadline = deadline or time.monotonic() + 60
                if done() or time.monotonic() > deadline:
                    break
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is None:
                    key = msg.key() or b""
                    if key in counters.seen:
                        counters.duplicates += 1
                    counters.seen.add(key)
                    counters.consumed += 1
                    partition, offset = msg.partition() or 0, msg.offset() or 0
                    last = counters.last_offsets.get(partition, -1)
                    if offset != last + 1:
                        counters.skipped.append((partition, last, offset))
                    counters.last_offsets[partition] = offset
                elif len(counters.consume_errors) < 100:
                    counters.consume_errors.append(str(msg.error()))
        with contextlib.suppress(Exception):  # (only to tell a lag from a loss)
            for tp in consumer.position([TopicPartition(TOPIC, p) for p in range(PARTITIONS)]):
                high = consumer.get_watermark_offsets(tp, timeout=2)[1]
                counters.positions[tp.partition] = (tp.offset, high)
    finally:
        consumer.close()


def create_topic(client: DemoClient, bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient(client.config(bootstrap))
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
