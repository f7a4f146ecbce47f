"""The reads inside a frame's body (a large Produce arrives in many) decide nothing: the
filters are not asked (``serial``, ``hold``), the bytes go on as read. The read that ends
the frame is a frame boundary like any other: a client read one frame at a time is read no
further while its request is in flight."""

from __future__ import annotations

import itertools
from functools import partial

from kafka_quota_proxy.proxy.connection import EAGER_SERIAL_REQUESTS
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from testkit.connection import DrivenConnection
from testkit.frames import produce_body_prefix, request_frame, response_frame


class _OneAtATime(Filter):
    """Reads frames one at a time and another only once nothing is in flight (as quotas do
    for a client over its quota), counting how often it is asked."""

    def __init__(self, host: FilterHost, asked: list[int]) -> None:
        self.asked = asked
        self.table = host.table

    def serial(self) -> bool:
        self.asked.append(1)
        return True

    def headroom(self) -> bool:
        return not self.table


def _produce(correlation_id: int, size: int = 30_000) -> bytes:
    return request_frame(0, 7, correlation_id, "p",
                         produce_body_prefix(7, 1, None) + bytes(size))


async def test_reads_inside_a_frame_ask_nothing_and_go_on_as_read() -> None:
    asked: list[int] = []
    h = await DrivenConnection.open([partial(_OneAtATime, asked=asked)])
    first = _produce(1)
    cuts = (0, 200, 5_000, 10_000, 15_000, 20_000, len(first))
    reads = list(itertools.pairwise(cuts))
    for n, (at, end) in enumerate(reads):
        h.client_sends(first[at:end])
        assert h.upstream_got() == first[:end]  # cut-through, read by read
        if n == 0:
            at_start = len(asked)  # (asked when the frame started)
        elif n < len(reads) - 1:
            assert len(asked) == at_start  # not on the reads inside the frame
    assert len(asked) > at_start  # but when it ended
    assert h.closed_reason is None


async def test_the_read_that_ends_a_frame_still_stops_a_one_at_a_time_client() -> None:
    asked: list[int] = []
    h = await DrivenConnection.open([partial(_OneAtATime, asked=asked)])
    first, second = _produce(1), _produce(2, 500)
    h.client_sends(first[:10_000])
    assert h.client.reading
    h.client_sends(first[10_000:])  # ends the frame exactly: its request is in flight
    assert h.upstream_got() == first
    h.client_sends(second[:100])  # the next request's first bytes: held, and reading pauses
    assert h.upstream_got() == first
    assert not h.client.reading  # no headroom: the client is read no further
    h.upstream_sends(response_frame(0, 7, 1, bytes(20)))
    await h.settle()
    assert h.client.reading  # until the response
    assert h.upstream_got() == first + second[:100]
    h.client_sends(second[100:])
    assert h.upstream_got() == first + second
    assert h.closed_reason is None


async def test_a_client_that_waits_for_its_response_is_never_paused() -> None:
    """One request in flight at a time, as a client with ``max.in.flight`` 1 or at the end of
    its batch sends them: the reading never pauses (no pause and resume per request), and
    each request still goes upstream only after the response to the one before."""
    asked: list[int] = []
    h = await DrivenConnection.open([partial(_OneAtATime, asked=asked)])
    paused: list[bool] = []
    pause = h.client.pause_reading

    def counting() -> None:
        paused.append(True)
        pause()

    h.client.pause_reading = counting  # type: ignore[method-assign]
    sent = b""
    for correlation_id in range(1, 6):
        request = _produce(correlation_id, 300)
        h.client_sends(request)
        sent += request
        assert h.upstream_got() == sent
        h.upstream_sends(response_frame(0, 7, correlation_id, bytes(20)))
        await h.settle()
        assert h.client.reading
    assert paused == []
    assert h.closed_reason is None


async def test_a_client_that_sends_ahead_is_paused_at_once_for_a_while() -> None:
    """Once a client's next request came before the response, its reading pauses as soon as
    a request is read (its next bytes wait in the socket: no wake-up to hold them) for the
    next ``EAGER_SERIAL_REQUESTS`` requests; then the pause waits for the bytes again."""
    asked: list[int] = []
    h = await DrivenConnection.open([partial(_OneAtATime, asked=asked)])
    h.client_sends(_produce(1, 300))
    assert h.client.reading  # (lazy: nothing of the next one yet)
    h.client_sends(_produce(2, 300))  # sent ahead: held, and reading pauses
    assert not h.client.reading and h.upstream_got() == _produce(1, 300)
    paused_at_once = []
    for correlation_id in range(1, EAGER_SERIAL_REQUESTS + 4):
        h.upstream_sends(response_frame(0, 7, correlation_id, bytes(20)))
        await h.settle()  # the next request goes upstream
        assert h.upstream_got().endswith(_produce(correlation_id + 1, 300))
        paused_at_once.append(not h.client.reading)
        # the client has its next request ready: read now if reading, else when it resumes
        # (the held one went on at the response: what waits is in the socket)
        if h.client.reading:
            h.client_sends(_produce(correlation_id + 2, 300))  # ahead again: held, paused
            assert not h.client.reading
        else:
            h.conn.requests.hold(_produce(correlation_id + 2, 300))  # (in the socket)
    assert paused_at_once == [True] * EAGER_SERIAL_REQUESTS + [False] + [True] * 2
    assert h.closed_reason is None
