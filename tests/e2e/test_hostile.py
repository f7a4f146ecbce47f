"""Hostile clients: one that pipelines requests and never reads the answers, one that opens
connections past the limit or the file-descriptor limit, slow senders, idle connections. Each
is bounded or closed with a counted reason while ordinary clients carry on."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


def _api_versions_v0(correlation: int) -> bytes:
    return struct.pack(">ihhih", 10, 18, 0, correlation, 0)


def _round_trip(proxy: ProxyProcess, port: int | None = None) -> bool:
    with KafkaWire("127.0.0.1", port or proxy.broker_port(111), timeout=10) as wire:
        wire.request(18, 3, client_software_name="ok", client_software_version="1")
    return True


def _closed(proxy: ProxyProcess, reason: str) -> float:
    return proxy.metrics().get(f'kafka_proxy_connections_closed_total{{reason="{reason}"}}', 0)


@pytest.fixture
def hostile_proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml="""network:
  request_header_timeout_seconds: 1
  request_read_timeout_seconds: 2
  connections_max_idle_seconds: 2
""").start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


def _upstream_sockets(process: psutil.Process, broker_port: int) -> int:
    return sum(1 for c in process.net_connections("tcp")
               if c.raddr and c.raddr.port == broker_port and c.status == "ESTABLISHED")


def test_unread_pipeline_is_bounded_and_freed_when_the_client_goes(
        tansu: TansuBroker) -> None:
    """ApiVersions v0 frames in batches of 1,000, never reading an answer: the proxy holds at
    most max_in_flight_requests (default 1,000) of them in flight, its memory stays flat, and
    when the client goes its upstream connection goes too."""
    # (no quota-overrides reader: its own connection to the broker would be counted below)
    proxy = ProxyProcess(tansu.bootstrap,
                         extra_yaml="quotas: {overrides: {enabled: false}}\n").start()
    try:
        port = proxy.wait_broker_listener(111)
        assert proxy.process is not None
        process = psutil.Process(proxy.process.pid)
        broker_port = int(tansu.bootstrap.rsplit(":", 1)[1])
        rss_before = process.memory_info().rss
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        sent = 0
        pending = b""
        correlation = 0
        deadline = time.monotonic() + 3.0  # a span of abuse, not a wait for a condition
        in_flight_max = 0
        while time.monotonic() < deadline:
            if not pending:
                pending = b"".join(_api_versions_v0(correlation + i) for i in range(1000))
                correlation += 1000
            try:
                n = sock.send(pending)
                sent += n
                pending = pending[n:]
            except BlockingIOError:  # the proxy stopped reading: what the bound is for
                time.sleep(0.01)
            in_flight_max = max(in_flight_max,
                                proxy.metrics().get("kafka_proxy_requests_in_flight", 0))
        rss_during = process.memory_info().rss
        assert _upstream_sockets(process, broker_port) >= 1
        sock.close()
        wait_for(lambda: _upstream_sockets(process, broker_port) == 0, 15,
                 what="the upstream connection to close with the client")
        closed = [e for e in proxy.closed_connections() if e.get("listener") != "bootstrap"]
        wait_for(lambda: proxy.metrics().get("kafka_proxy_connections", 1) == 0
                 or not proxy.metrics().get('kafka_proxy_connections{listener="broker"}'),
                 10, what="the connection closed")
        closed = [e for e in proxy.closed_connections() if e.get("in_flight") is not None]
        print(f"\nunread pipeline: {sent // 10:,} requests sent, in flight at most "
              f"{in_flight_max:.0f} (at close {[e['in_flight'] for e in closed]}), RSS "
              f"{rss_before >> 20} -> {rss_during >> 20} MB")
        assert sent // 10 > 5000  # the client did send far more than the bound
        assert in_flight_max <= 1000
        assert all(e["in_flight"] <= 1000 for e in closed)
        assert rss_during - rss_before < 40 << 20
        assert _round_trip(proxy)  # others carry on
    finally:
        proxy.stop()


def test_connections_past_the_limit_are_refused_and_counted(tansu: TansuBroker) -> None:
    """Under a file-descriptor limit of 256 the proxy admits (256 - 64) / 2 = 96 clients and
    refuses the rest at accept, counted and logged in a few lines; the metrics endpoint and
    ordinary clients keep working. Where the hard limit allows, the soft limit is raised."""
    proxy = ProxyProcess(tansu.bootstrap, nofile=(256, 256)).start()
    held: list[socket.socket] = []
    try:
        port = proxy.wait_broker_listener(111)
        metrics = proxy.metrics()
        assert metrics["kafka_proxy_max_connections"] == 96
        assert metrics["kafka_proxy_fd_limit"] == 256
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(lambda: proxy.metrics().get(
            'kafka_proxy_connections_refused_total{reason="max_connections"}', 0) >= 204, 20,
            what="the excess refused")
        metrics = proxy.metrics()  # answered at the limit
        assert metrics['kafka_proxy_connections{listener="broker"}'] == 96
        assert metrics["kafka_proxy_open_fds"] < 256

        def refused_logs() -> list[dict[str, Any]]:
            return [e for e in proxy.events() if e.get("event") == "connections_refused"]

        # Every refusal is logged, the end of a burst too, in a line a second at most.
        wait_for(lambda: sum(e["refused"] for e in refused_logs()) == 204, 10,
                 what="every refusal logged")
        assert 1 <= len(refused_logs()) <= 10
        for s in held[:10]:  # room again: an ordinary client gets through
            s.close()
        wait_for(lambda: proxy.metrics()['kafka_proxy_connections{listener="broker"}'] <= 86,
                 10, what="room again")
        assert _round_trip(proxy)
        assert not [e for e in proxy.events() if "Too many open files" in str(e)]
    finally:
        for s in held:
            s.close()
        proxy.stop()
    raised = ProxyProcess(tansu.bootstrap, nofile=(256, 4096)).start()
    try:
        raised.wait_broker_listener(111)
        assert raised.metrics()["kafka_proxy_fd_limit"] == 4096
        assert raised.metrics()["kafka_proxy_max_connections"] == (4096 - 64) // 2
    finally:
        raised.stop()


def test_slow_and_idle_connections_are_closed(hostile_proxy: ProxyProcess) -> None:
    proxy = hostile_proxy
    port = proxy.broker_port(111)
    frame = _api_versions_v0(7)
    # A header dribbled one byte at a time: closed once it has taken a second.
    slow_header = socket.create_connection(("127.0.0.1", port))
    slow_header.sendall(frame[:5])
    # A whole header, then the rest of a large frame never comes.
    slow_body = socket.create_connection(("127.0.0.1", port))
    slow_body.sendall(struct.pack(">ihhih", 1000, 18, 0, 8, 0))
    # Idle: one answered request, then nothing.
    idle = KafkaWire("127.0.0.1", port)
    idle.request(18, 3, client_software_name="idle", client_software_version="1")

    def dribble() -> bool:
        try:
            slow_header.send(b"\x00")
        except OSError:
            return True
        return False

    wait_for(lambda: _closed(proxy, "request_header_timeout") >= 1, 10, interval=0.3,
             what="the slow header closed")
    assert dribble() or KafkaWire.is_closed_by_peer(_Wrap(slow_header), 5)
    wait_for(lambda: _closed(proxy, "request_read_timeout") >= 1, 10,
             what="the stalled request closed")
    wait_for(lambda: _closed(proxy, "idle_timeout") >= 1, 10, what="the idle connection closed")
    assert idle.is_closed_by_peer(5)
    assert _round_trip(proxy)  # a working client is untouched
    for s in (slow_header, slow_body):
        s.close()
    idle.close()


class _Wrap:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
