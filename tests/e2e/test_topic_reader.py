"""The reader of the proxy's own topics (``proxy.cluster_topics.TopicReader``) against a real
broker: a topic made after the reader started is read as soon as the feature that made it
says so (``check_soon``), not at the reader's next check."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

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


@contextlib.asynccontextmanager
async def _reading(bootstrap: str) -> AsyncIterator[tuple[str, TopicReader, Subscription,
                                                          list[bytes | None]]]:
    """A reader (its next check a minute away) of a topic that does not exist yet, past its
    first check: the topic's name, the reader, its subscription and the values it got."""
    topic = f"reader-{uuid.uuid4().hex[:8]}"
    got: list[bytes | None] = []
    sub = Subscription(topic, lambda key, value, ts: got.append(value),
                       lambda connected, reading: None, missing_ok=True)
    reader = TopicReader([bootstrap], check_seconds=60.0)
    reader.subscribe(sub)
    task = asyncio.get_running_loop().create_task(reader.run())
    try:
        await _until(lambda: sub.connected, 30)  # the first check: no topic yet
        yield topic, reader, sub, got
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _made_and_written(bootstrap: str, topic: str) -> float:
    """The topic made and one record written to it: when it was written."""
    from aiokafka import AIOKafkaProducer

    await ensure_topic([bootstrap], topic, 1, {}, {}, "test", 10, "test")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"v1", key=b"k")
        return time.monotonic()
    finally:
        await producer.stop()


def test_a_topic_made_after_the_start_is_read_at_once_when_said(tansu: TansuBroker) -> None:
    async def scenario() -> float:
        async with _reading(tansu.bootstrap) as (topic, reader, sub, got):
            assert not sub.present
            await _made_and_written(tansu.bootstrap, topic)
            reader.check_soon()  # (the next check is a minute away)
            return await _until(lambda: got == [b"v1"], 10)

    assert asyncio.run(scenario()) < 10


def test_a_topic_said_made_before_the_metadata_shows_it_is_looked_for_again(
        tansu: TansuBroker) -> None:
    """``check_soon`` before the topic reaches the metadata (another proxy is creating it as
    this one is told it exists): the reader looks for it again every quarter second for
    ``SOON_S``, and reads it within a second of its creation, not at its next check."""
    async def scenario() -> float:
        async with _reading(tansu.bootstrap) as (topic, reader, sub, got):
            reader.check_soon()
            await asyncio.sleep(1.0)
            assert not sub.present
            made = await _made_and_written(tansu.bootstrap, topic)
            await _until(lambda: got == [b"v1"], 10)
            return time.monotonic() - made

    seen = asyncio.run(scenario())
    print(f"read {seen:.2f} s after it was written")
    assert seen < SOON_S - 1.0
