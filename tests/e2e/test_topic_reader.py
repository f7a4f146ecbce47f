"""The reader of the proxy's own topics (``proxy.cluster_topics.TopicReader``) against a real
broker: a topic made after the reader started is read as soon as the feature that made it
says so (``check_soon``), not at the reader's next check."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.proxy.cluster_topics import SOON_S, Subscription, TopicReader, ensure_topic

pytestmark = pytest.mark.e2e


async def _until(cond: object, timeout: float) -> float:
    start = time.monotonic()
    while not cond():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_a_topic_made_after_the_start_is_read_at_once_when_said(tansu: TansuBroker) -> None:
    async def scenario() -> float:
        from aiokafka import AIOKafkaProducer

        topic = f"reader-{uuid.uuid4().hex[:8]}"
        got: list[bytes | None] = []
        sub = Subscription(topic, lambda key, value, ts: got.append(value),
                           lambda connected, reading: None, missing_ok=True)
        reader = TopicReader([tansu.bootstrap], check_seconds=60.0)
        reader.subscribe(sub)
        task = asyncio.get_running_loop().create_task(reader.run())
        try:
            await _until(lambda: sub.connected, 30)  # the first check: no topic yet
            assert not sub.present
            await ensure_topic([tansu.bootstrap], topic, 1, {}, {}, "test", 10, "test")
            producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"v1", key=b"k")
            finally:
                await producer.stop()
            reader.check_soon()  # (the next check is a minute away)
            return await _until(lambda: got == [b"v1"], 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    assert asyncio.run(scenario()) < 10


def test_a_topic_said_made_before_the_metadata_shows_it_is_looked_for_again(
        tansu: TansuBroker) -> None:
    """``check_soon`` before the topic reaches the metadata (another proxy is creating it as
    this one is told it exists): the reader looks for it again every quarter second for
    ``SOON_S``, and reads it within a second of its creation, not at its next check."""
    async def scenario() -> float:
        from aiokafka import AIOKafkaProducer

        topic = f"reader-{uuid.uuid4().hex[:8]}"
        got: list[bytes | None] = []
        sub = Subscription(topic, lambda key, value, ts: got.append(value),
                           lambda connected, reading: None, missing_ok=True)
        reader = TopicReader([tansu.bootstrap], check_seconds=60.0)
        reader.subscribe(sub)
        task = asyncio.get_running_loop().create_task(reader.run())
        try:
            await _until(lambda: sub.connected, 30)  # the first check: no topic yet
            reader.check_soon()
            await asyncio.sleep(1.0)
            assert not sub.present
            await ensure_topic([tansu.bootstrap], topic, 1, {}, {}, "test", 10, "test")
            producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"v1", key=b"k")
                made = time.monotonic()
            finally:
                await producer.stop()
            await _until(lambda: got == [b"v1"], 10)
            return time.monotonic() - made
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    seen = asyncio.run(scenario())
    print(f"read {seen:.2f} s after it was written")
    assert seen < SOON_S - 1.0
