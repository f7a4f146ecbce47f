"""The proxy's own time on a request (``InFlight.proxy_ms``, part of what a request quota
charges: ``quota.request_time``), timed per read of the client's bytes: a read's time goes to
the requests whose headers it read, a read that read none to the request whose frame it went
on with (a large Produce arrives in many reads, every one of them its time), and a read that
left a header incomplete to the request that header begins."""

from __future__ import annotations

import itertools

import pytest

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.proxy import connection as connection_module
from testkit.connection import DrivenConnection
from testkit.frames import produce_body_prefix, request_frame

MS = 0.001


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reading of the connection's clock is 1 ms after the one before: a read costs
    1 ms (start, end), 2 ms when it read a header (its forwarding is stamped in between)."""
    ticks = itertools.count()
    monkeypatch.setattr(connection_module, "_now", lambda: next(ticks) * MS)


def _entry(h: DrivenConnection, correlation_id: int) -> InFlight:
    entry = next(e for e in h.conn.table.entries() if e.correlation_id == correlation_id)
    assert isinstance(entry, InFlight)
    return entry


async def test_every_read_of_a_produce_frame_is_its_time(clock: None) -> None:
    h = await DrivenConnection.open()
    produce = request_frame(0, 7, 1, "p", produce_body_prefix(7, 1, None) + bytes(30_000))
    for at, end in ((0, 200), (200, 10_000), (10_000, 20_000), (20_000, len(produce))):
        h.client_sends(produce[at:end])
    assert h.upstream_got() == produce and h.closed_reason is None
    # 2 ms for the read with its header, 1 ms for each of the three after it
    assert _entry(h, 1).proxy_ms == pytest.approx(5.0)
    h.client_sends(request_frame(3, 12, 2, "p"))  # the next request's read is its own
    assert _entry(h, 2).proxy_ms == pytest.approx(2.0)
    assert _entry(h, 1).proxy_ms == pytest.approx(5.0)


async def test_a_header_split_over_reads_brings_its_time_to_its_request(clock: None) -> None:
    h = await DrivenConnection.open()
    metadata = request_frame(3, 12, 7, "a-client-id-of-some-length")
    h.client_sends(metadata[:9])  # not a whole header yet: 1 ms, kept
    h.client_sends(metadata[9:])
    assert h.upstream_got() == metadata
    assert _entry(h, 7).proxy_ms == pytest.approx(3.0)
