"""The bound on requests in flight stops reading from a client that pipelines and never reads,
from its first byte on: what the proxy takes of it past the bound is one read.

uvloop starts reading a connection after ``connection_made`` returns, so the proxy's pause
while it connects to the broker did not take hold; a client whose bytes came in then and
reached the bound had its pause for the bound fall on a gate already paused, and the proxy read
(and held) everything it sent until a response came back: with long-poll fetches holding the
bound, tens of MB a second (see docs/reliability.md).
"""

from __future__ import annotations

import datetime
import random
import select
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kio.index import load_request_schema
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.static.primitive import i32Timedelta

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.frames import kio_encode, request_frame

pytestmark = pytest.mark.e2e

BOUND = 4  # network.max_in_flight_requests of the proxy under test
RUNS = 12
HOLD_S = 1  # how long the broker holds the long-poll fetches that fill the bound
# What one read hands the proxy (uvloop reads at most 256 KiB at once), and what it may keep of
# an incomplete request header besides: the most it may hold unread past the bound.
ONE_READ = 256 * 1024
UNREAD_MAX = ONE_READ + 68 * 1024
SEND_CAP = 16 << 20  # the client stops there (the proxy would have read all of it)
# What the client may get rid of with the fix: its own send buffer (set below), the proxy's
# receive window (the kernel's default, a few hundred KiB until the proxy reads much) and one
# read.
SENT_MAX = 8 << 20


def _api_versions_v0(correlation: int) -> bytes:
    return struct.pack(">ihhih", 10, 18, 0, correlation, 0)


def _long_poll(topic: str, correlation: int) -> bytes:
    """A Fetch the broker holds for ``HOLD_S`` (an empty partition, min_bytes 1)."""
    request = load_request_schema(1, 12)(
        max_wait=i32Timedelta.parse(datetime.timedelta(seconds=HOLD_S)), min_bytes=1,
        topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=())
    return request_frame(1, 12, correlation, "unread", kio_encode(request))


@pytest.fixture
def bounded_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, log_level="info", extra_yaml=f"""network:
  max_in_flight_requests: {BOUND}
quotas: {{overrides: {{enabled: false}}}}
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _attack(sock: socket.socket, first: bytes, rng: random.Random) -> int:
    """Send ``first`` at once, then ApiVersions v0 frames in sizes drawn from ``rng``, never
    reading, until the socket stays unwritable for 0.25 s (the proxy stopped reading),
    ``SEND_CAP`` is sent or 0.8 s have passed (before the fetches come back). Returns the
    bytes sent."""
    sock.setblocking(False)
    pending = memoryview(first)
    sent = 0
    correlation = 1 << 20  # (after those of ``first``)
    deadline = time.monotonic() + 0.8  # a span of abuse, not a wait for a condition
    while sent < SEND_CAP and time.monotonic() < deadline:
        if not pending:
            pending = memoryview(b"".join([_api_versions_v0(correlation + i)
                                           for i in range(1000)]))
            correlation += 1000
        if not select.select([], [sock], [], 0.25)[1]:
            break  # nothing more taken for 0.25 s: the proxy stopped reading
        size = len(pending) if sent == 0 else rng.randint(1, len(pending))
        try:
            n = sock.send(pending[:size])
        except BlockingIOError:
            continue
        sent += n
        pending = pending[n:]
    return sent


def test_a_client_pipelining_from_its_first_byte_is_held_to_one_read(
        tansu: TansuBroker, bounded_proxy: ProxyProcess) -> None:
    """Each run: a new connection whose first bytes (sent as it connects, so that the proxy
    reads them while it connects to the broker) are ``BOUND`` long-poll fetches, which hold the
    bound for ``HOLD_S``, then ApiVersions v0 frames in random sizes, never reading. The proxy
    holds at most one read of them unread (``kafka_proxy_client_unread_bytes``) and the client
    can send no more than the kernel's buffers take, in every run."""
    proxy = bounded_proxy
    topic = new_topic(tansu.bootstrap, "unread")
    port = proxy.broker_port(111)
    results = []
    for run in range(RUNS):
        # One connection at a time: the last one closes when its fetches come back (the proxy
        # reads again and finds the client's reset).
        wait_for(lambda: not proxy.metrics().get('kafka_proxy_connections{listener="broker"}'),
                 10, what="the last connection to close")
        first = b"".join(_long_poll(topic, i) for i in range(BOUND))
        first += b"".join(_api_versions_v0(BOUND + i) for i in range(1000))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            sent = _attack(sock, first, random.Random(run))
            metrics = proxy.metrics()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        results.append((sent, metrics["kafka_proxy_client_unread_bytes"],
                        metrics["kafka_proxy_requests_in_flight"]))
    print(f"\n(sent, unread, in flight) per run: {results}")
    for sent, unread, in_flight in results:
        assert in_flight <= BOUND, results
        assert unread <= UNREAD_MAX, results
        assert sent <= SENT_MAX, results
    wait_for(lambda: not proxy.metrics().get('kafka_proxy_connections{listener="broker"}'),
             10, what="the last connection to close")
    assert proxy.metrics()["kafka_proxy_client_unread_bytes"] == 0
