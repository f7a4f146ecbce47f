"""A Produce the topic guard refuses (one its walk cannot follow, or one below v3 naming a
guarded topic) on a connection with requests pipelined before it: as Kafka, which reads one
request at a time and closes on one it cannot handle, the requests before it are answered,
then the connection closes; nothing of the Produce nor of what the client sent after it goes
upstream. Only where the Produce's first bytes went upstream with an earlier read does the
connection close at once (the broker holds part of the frame)."""

from __future__ import annotations

import asyncio
import struct
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from structlog.testing import capture_logs

from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter
from kafka_quota_proxy.proxy.features.topic_guard.guard import TopicGuard
from testkit.connection import DrivenConnection
from testkit.frames import frame, kio_request, request_frame

GUARDED = "__kafka_quota_proxy_quotas"
BATCH = b"\x00" * 61 + b'{"value":1e12}'  # opaque to the walk: skipped by its length
_HEAD = 4 + 8 + 2 + 1 + 1  # size, api key/version/correlation, client id "p", header tags


async def _connection() -> tuple[DrivenConnection, TopicGuard]:
    guard = TopicGuard([GUARDED, "__kafka_quota_proxy_usage"])
    return await DrivenConnection.open([partial(TopicGuardFilter, guard=guard)]), guard


def _produce(version: int, topic: str, correlation: int, acks: int = 1) -> bytes:
    """A Produce request of one topic, one partition (v0-2, which kio has no schema for, by
    hand: acks, timeout, then the topics)."""
    if version < 3:
        name = topic.encode()
        body = (struct.pack(">hii", acks, 5000, 1) + struct.pack(">h", len(name)) + name
                + struct.pack(">iii", 1, 0, len(BATCH)) + BATCH)
        return request_frame(0, version, correlation, "p", body)
    from kio.index import load_request_schema

    cls: Any = load_request_schema(0, version)
    m = __import__(cls.__module__, fromlist=["_"])
    data = (m.TopicProduceData(name=topic, partition_data=(
        m.PartitionProduceData(index=0, records=BATCH),)),)
    value = cls(transactional_id=None, acks=acks, timeout=timedelta(seconds=5), topic_data=data)
    return frame(encode_request_header(0, version, correlation, "p") + encode(value))


def _unfollowable(correlation: int) -> bytes:
    """A Produce v9 whose topic count never ends (the walk fails at that byte)."""
    good = _produce(9, "orders", correlation)
    at = _HEAD + 1 + 2 + 4  # after the null transactional_id, acks and timeout
    return good[:at] + b"\xff" * 6 + good[at + 6:]


def _cut_short(correlation: int) -> bytes:
    """A Produce v9 that ends (its size prefix right) before its topics do."""
    body = _produce(9, "orders", correlation)[4:-20]
    return len(body).to_bytes(4, "big") + body


def _metadata(correlation: int) -> bytes:
    """A Metadata v12 request naming a topic that is not guarded (read whole by the guard)."""
    from kio.schema.metadata.v12.request import MetadataRequestTopic
    from kio.schema.types import TopicName

    return frame(kio_request(3, 12, correlation, "c", topics=(
        MetadataRequestTopic(topic_id=None, name=TopicName("orders")),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))


def _answer(correlation: int) -> bytes:
    """The broker's answer (any body: responses pass through)."""
    return frame(struct.pack(">ihi", correlation, 0, 0))


def _before() -> bytes:
    return request_frame(18, 0, 1, "c") + _metadata(2) + request_frame(18, 0, 3, "c")


def _after() -> bytes:
    return (request_frame(18, 0, 8, "c") + _produce(9, "orders", 9)
            + _metadata(10) + request_frame(18, 0, 11, "c"))


REFUSED = {
    "unfollowable": (_unfollowable, "malformed_frame", "produce_unparsed"),
    "cut_short": (_cut_short, "malformed_frame", "produce_unparsed"),
    "guarded_v2": (lambda c: _produce(2, GUARDED, c), "guarded_topic", "produce_version"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_what_came_before_the_produce_is_answered_then_the_connection_closes(kind: str) -> None:
    make, reason, counted = REFUSED[kind]

    async def main() -> None:
        h, guard = await _connection()
        before = _before()
        with capture_logs() as logs:
            h.client_sends(before + make(5) + _after())
            assert h.upstream_got() == before  # nothing of the Produce, nor after it
            assert [e.correlation_id for e in h.conn.table.entries()] == [1, 2, 3]
            assert not h.conn.closed
            h.client_sends(request_frame(18, 0, 12, "c"))  # read no more: discarded
            assert h.upstream_got() == before
            answers = _answer(1) + _answer(2) + _answer(3)
            h.upstream_sends(answers[:7])
            assert not h.conn.closed
            h.upstream_sends(answers[7:])
        assert h.client_got() == answers  # every answer, then the close
        assert h.conn.closed and h.host.closed == [reason] and not h.upstream.aborted
        assert guard.closed == {counted: 1}
        refused = [e for e in logs if e["event"] == "request_refused"]
        assert [(e["reason"], e["answering"]) for e in refused] == [(reason, 3)]

    asyncio.run(main())


def test_a_produce_whose_failure_shows_before_its_end_is_cut_all_the_same() -> None:
    """The walk fails before the frame's last bytes arrive: the frame began in this read,
    so it is cut there, and its rest (read later) is discarded."""

    async def main() -> None:
        h, _ = await _connection()
        before = _before()
        bad = _unfollowable(5)
        h.client_sends(before + bad[: _HEAD + 20])
        assert h.upstream_got() == before and not h.conn.closed
        h.client_sends(bad[_HEAD + 20:] + _after())
        assert h.upstream_got() == before
        h.upstream_sends(_answer(1) + _answer(2) + _answer(3))
        assert h.client_got() == _answer(1) + _answer(2) + _answer(3)
        assert h.host.closed == ["malformed_frame"]

    asyncio.run(main())


def test_a_produce_begun_in_an_earlier_read_closes_the_connection_at_once() -> None:
    """Its first bytes are upstream already: the broker holds part of a frame, nothing can be
    cut, the connection closes at once (the answers before it are lost with it)."""

    async def main() -> None:
        h, guard = await _connection()
        before = _before()
        bad = _cut_short(5)
        first = _HEAD + 12  # past acks: the header read, the frame's first bytes forwarded
        with capture_logs() as logs:
            h.client_sends(before + bad[:first])
            assert h.upstream_got() == before + bad[:first]
            h.client_sends(bad[first:] + _after())
        assert h.upstream_got() == before + bad[:first]
        assert h.conn.closed and h.host.closed == ["malformed_frame"] and h.upstream.aborted
        assert not h.client_got() and guard.closed == {"produce_unparsed": 1}
        [closed] = [e for e in logs if e["event"] == "connection_closed"]
        assert "closed at once" in closed["detail"] and closed["in_flight"] == 4
        assert not [e for e in logs if e["event"] == "request_refused"]

    asyncio.run(main())


def test_a_refused_produce_first_closes_the_connection_with_nothing_to_answer() -> None:
    async def main() -> None:
        h, _ = await _connection()
        h.client_sends(_produce(2, GUARDED, 5) + _after())
        assert h.conn.closed and h.host.closed == ["guarded_topic"] and not h.upstream_got()

    asyncio.run(main())


def test_produce_frames_the_guard_lets_through_are_forwarded() -> None:
    """A Produce v9 naming a guarded topic goes on (its name spoiled); one below v3 without
    acks too (no answer to make): the connection stays open, nothing is cut."""

    async def main() -> None:
        h, guard = await _connection()
        spoiled = _produce(9, GUARDED, 5)
        quiet = _produce(2, GUARDED, 6, acks=0)
        data = _before() + spoiled + quiet + _after()
        h.client_sends(data)
        assert len(h.upstream_got()) == len(data) and h.upstream_got() != data
        assert not h.conn.closed and not h.host.closed and not guard.closed
        assert [e.correlation_id for e in h.conn.table.entries()] == [1, 2, 3, 5, 8, 9, 10, 11]

    asyncio.run(main())
