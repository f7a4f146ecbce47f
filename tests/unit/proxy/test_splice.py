"""Record batches moved client socket to broker socket in the kernel (``proxy.splice``): the
move itself on socket pairs, then a real ``ProxiedConnection`` between real loopback sockets
(the client's Produce frames, a reader in the broker's place that only records the bytes, as
a socket does) on both event loops, the broker's reader quick and then slow. Every byte
arrives once, in order; most of a large Produce is spliced; a broker socket that is full
holds the client back until it takes the bytes waiting; with ``network.splice`` off nothing
is spliced."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import timedelta
from typing import Any, cast

import pytest
import uvloop
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from kafka_quota_proxy.config.schema import NetworkConfig
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.interests import InterestTable, addresses
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.proxy import splice
from kafka_quota_proxy.proxy.brokers import ListeningRewriter
from kafka_quota_proxy.proxy.connection import ProxiedConnection
from kafka_quota_proxy.proxy.context import ConnectionContext
from kafka_quota_proxy.proxy.metrics import ProxyStats
from testkit.connection import FakeHost, PassThroughRewriter
from testkit.frames import frame, kio_encode, ms, request_frame, response_class, response_frame

pytestmark = pytest.mark.skipif(not splice.AVAILABLE, reason="no os.splice here")

MB = 1024 * 1024


@pytest.fixture
def pair() -> Any:
    """Makes connected loopback TCP socket pairs (non-blocking), closed after the test."""
    made: list[socket.socket] = []

    def make() -> tuple[socket.socket, socket.socket]:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            a = socket.create_connection(listener.getsockname())
            b, _ = listener.accept()
        for s in (a, b):
            s.setblocking(False)
            made.append(s)
        return a, b

    yield make
    for s in made:
        s.close()


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(MB)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_a_span_is_moved_as_far_as_the_source_holds_it(pair: Any) -> None:
    src_w, src = pair()
    sink, sink_r = pair()
    payload = os.urandom(300_000)
    src_w.sendall(payload[:200_000])
    result = splice.splice_span(src.fileno(), sink.fileno(), len(payload))
    assert result.moved == 200_000 and result.pipe is None and result.error is None
    src_w.sendall(payload[200_000:])
    result = splice.splice_span(src.fileno(), sink.fileno(), 50_000)  # (the limit holds)
    assert result.moved == 50_000
    assert _read_all(sink_r) == payload[:250_000]
    assert _read_all(src) == payload[250_000:]  # what was not asked for stays unread


def test_what_a_full_sink_will_not_take_waits_in_the_pipe_in_order(pair: Any) -> None:
    src_w, src = pair()
    sink, sink_r = pair()
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = os.urandom(400_000)
    src_w.sendall(payload[:150_000])
    result = splice.splice_span(src.fileno(), sink.fileno(), len(payload))
    # it stops at the first chunk the sink does not take whole: the rest stays unread
    assert 0 < result.moved <= 150_000 and result.pipe is not None and result.waiting > 0
    got = b""
    waiting = result.waiting
    while waiting:
        got += _read_all(sink_r)
        waiting, error = splice.drain(result.pipe, waiting, sink.fileno())
        assert error is None
    splice.release(result.pipe)
    assert got + _read_all(sink_r) == payload[:result.moved]
    assert _read_all(src) == payload[result.moved:150_000]


def test_a_closed_sink_is_an_error_of_the_sink(pair: Any) -> None:
    src_w, src = pair()
    sink, sink_r = pair()
    sink_r.close()
    sink.send(b"x")  # (taken; the peer's reset answers it, at once on loopback)
    src_w.sendall(b"x" * 100_000)
    result = splice.splice_span(src.fileno(), sink.fileno(), 100_000)
    assert result.side == "sink" and isinstance(result.error, OSError)


# ---------------------------------------------------------------- a real connection


def _produce(records: bytes, correlation: int) -> bytes:
    """A Produce v9 frame of acks=0 (no response: the reader in the broker's place answers
    nothing) with ``records`` in one partition."""
    m = __import__(load_request_schema(0, 9).__module__, fromlist=["_"])
    value = m.ProduceRequest(
        transactional_id=None, acks=0, timeout=timedelta(seconds=5),
        topic_data=(m.TopicProduceData(name="orders", partition_data=(
            m.PartitionProduceData(index=0, records=records),)),))
    return frame(encode_request_header(0, 9, correlation, "p") + encode(value))


class _Setup:
    """A ``ProxiedConnection`` (``conn``) accepted from a client (``reader``, ``writer``),
    connected to a plain socket in the broker's place (``broker``)."""

    conn: ProxiedConnection
    stats: ProxyStats
    broker: socket.socket
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


@contextlib.asynccontextmanager
async def _connected(splice_on: bool = True, high: int = 4 * MB) -> AsyncIterator[_Setup]:
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    setup = _Setup()
    setup.stats = ProxyStats()
    ctx = ConnectionContext(
        host=FakeHost(), listener="broker-1", scope=1,
        network=NetworkConfig(splice=splice_on, write_buffer_high_bytes=high,
                              write_buffer_low_bytes=min(high, MB)),
        connect_timeout_seconds=5.0,
        stats=setup.stats, rewriter=cast(ListeningRewriter, PassThroughRewriter()),
        interests=InterestTable([addresses]), filters=())
    conns: list[ProxiedConnection] = []

    def made() -> ProxiedConnection:
        conn = ProxiedConnection(ctx, lambda: [("127.0.0.1", port, 1)])
        conns.append(conn)
        return conn

    proxy = await loop.create_server(made, "127.0.0.1", 0)
    setup.reader, setup.writer = await asyncio.open_connection(
        "127.0.0.1", proxy.sockets[0].getsockname()[1])
    setup.broker, _ = await loop.sock_accept(listener)
    setup.broker.setblocking(False)
    while not conns or conns[0].upstream is None:  # (connected: set as it goes on)
        await asyncio.sleep(0)
    setup.conn = conns[0]
    try:
        yield setup
    finally:
        setup.writer.close()
        setup.conn.close("done")
        setup.broker.close()
        listener.close()
        proxy.close()
        await proxy.wait_closed()
        for lane in (setup.conn.request_lane, setup.conn.response_lane):
            assert lane is None or not lane.waiting  # (nothing left registered with the loop)


def _small_buffers(sock: Any) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)


async def _through_proxy(frames: bytes, *, splice_on: bool, slow: bool
                         ) -> tuple[bytes, ProxyStats, bool]:
    """The client sends ``frames`` through the connection to the socket in the broker's
    place, read at once, or (``slow``) 32 KiB at a time behind small socket buffers; what it
    got, the stats, and whether the connection held its client back for spliced bytes."""
    got = bytearray()
    held = False
    async with _connected(splice_on) as setup:
        if slow:
            setup.broker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            _small_buffers(setup.conn.upstream.transport.get_extra_info(  # type: ignore[union-attr]
                "socket"))
        setup.writer.write(frames)
        sending = asyncio.ensure_future(setup.writer.drain())
        while len(got) < len(frames):
            await asyncio.sleep(0.002 if slow else 0)
            held = held or setup.conn.client_gate.has("splice")
            with contextlib.suppress(BlockingIOError):
                got += setup.broker.recv(32 * 1024 if slow else MB)
        await sending
    return bytes(got), setup.stats, held


def _fetch_response(version: int, correlation: int, records: list[bytes]) -> bytes:
    cls = response_class(1, version)
    module = __import__(cls.__module__, fromlist=["x"])
    partitions = tuple(module.PartitionData(
        partition_index=i, error_code=ErrorCode.none, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, diverging_epoch=module.EpochEndOffset(),
        current_leader=module.LeaderIdAndEpoch(), snapshot_id=module.SnapshotId(),
        aborted_transactions=(), preferred_read_replica=-1, records=r)
        for i, r in enumerate(records))
    name = {"topic": "t"} if version < 13 else {"topic_id": uuid.UUID(int=7)}
    topic = module.FetchableTopicResponse(**name, partitions=partitions)
    return response_frame(1, version, correlation, kio_encode(
        cls(throttle_time=ms(0), error_code=ErrorCode.none, session_id=0, responses=(topic,))))


async def _fetched(version: int, responses: bytes, *, slow: bool, high: int = 4 * MB
                   ) -> tuple[bytes, ProxyStats, int]:
    """The client asks for one Fetch (v``version``) per response in ``responses``, which
    the broker's place sends back at once; what the client read (at once, or ``slow``: 32
    KiB at a time behind small socket buffers), the stats, and the most spliced bytes seen
    waiting for the client (0: the broker was never held back for them)."""
    count = 0
    at = 0
    while at < len(responses):
        at += 4 + int.from_bytes(responses[at : at + 4], "big")
        count += 1
    got = bytearray()
    held = 0
    async with _connected(high=high) as setup:
        if slow:
            _small_buffers(setup.conn.transport.get_extra_info("socket"))  # type: ignore[union-attr]
            setup.writer.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        setup.writer.write(b"".join(request_frame(1, version, n, "c") for n in range(count)))
        asked = b""
        while len(asked) < count * len(request_frame(1, version, 0, "c")):
            await asyncio.sleep(0)
            with contextlib.suppress(BlockingIOError):
                asked += setup.broker.recv(MB)
        setup.broker.setblocking(True)
        sending = asyncio.get_running_loop().run_in_executor(
            None, setup.broker.sendall, responses)
        while len(got) < len(responses):
            if slow:
                await asyncio.sleep(0.002)
            lane = setup.conn.response_lane
            assert lane is not None
            held = max(held, lane.waiting_bytes)
            assert bool(lane.waiting_bytes) == setup.conn.upstream.gate.has(  # type: ignore[union-attr]
                "splice")
            got += await setup.reader.read(32 * 1024 if slow else MB)
        await sending
    return bytes(got), setup.stats, held


def _on(loop: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if loop == "uvloop":
        return uvloop.run(asyncio.wait_for(main(), 60))
    return asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_large_produce_requests_are_mostly_spliced_and_arrive_whole(loop: str) -> None:
    """Three librdkafka-sized Produce frames (1 MB of records each): every byte reaches the
    broker's socket once and in order, and most of them went through the kernel."""
    frames = b"".join(_produce(os.urandom(MB), n) for n in range(3))
    got, stats, _ = _on(loop, lambda: _through_proxy(frames, splice_on=True, slow=False))
    assert got == frames
    assert stats.spliced["request"] > len(frames) // 2


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_full_broker_socket_holds_the_client_back_until_it_takes_the_bytes(
        loop: str) -> None:
    """The broker's side reads slowly (a small receive buffer, read a little at a time):
    spliced bytes wait in a pipe, the client is not read meanwhile, and what arrives is
    still every byte once and in order."""
    frames = b"".join(_produce(os.urandom(MB), n) for n in range(3))
    got, stats, paused = _on(loop, lambda: _through_proxy(frames, splice_on=True, slow=True))
    assert got == frames
    assert stats.splice_waits > 0 and paused
    assert stats.spliced["request"] > 0
    assert stats.backpressure["upstream_slow"] >= stats.splice_waits  # (a pause as any)


def test_with_splice_off_every_byte_is_read_and_written() -> None:
    frames = b"".join(_produce(os.urandom(MB), n) for n in range(2))
    got, stats, _ = _on("uvloop", lambda: _through_proxy(frames, splice_on=False, slow=False))
    assert got == frames
    assert stats.spliced["request"] == 0 and stats.splice_waits == 0


def test_past_the_bound_on_pipes_waiting_the_bytes_go_through_the_transport(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no connection allowed to keep a pipe waiting (``WAITING_MAX`` 0: what many
    connections held back at once leave), what a full broker socket does not take is read
    back and written as forwarded bytes are: still every byte once, in order."""
    monkeypatch.setattr(splice, "WAITING_MAX", 0)
    frames = b"".join(_produce(os.urandom(MB), n) for n in range(3))
    got, stats, held = _on("uvloop", lambda: _through_proxy(frames, splice_on=True, slow=True))
    assert got == frames
    assert stats.splice_waits == 0 and not held and stats.spliced["request"] > 0


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("version", [12, 16])
def test_large_fetch_responses_are_mostly_spliced_and_arrive_whole(loop: str, version: int
                                                                   ) -> None:
    """Fetch responses of two partitions of 1 MB each (librdkafka's max.partition.fetch.bytes)
    reach the client byte for byte, most of them through the kernel: v12 passed through
    whole, v16 walked for its top-level tagged fields (held back and rewritten in place)
    with the record batches between its headers spliced."""
    responses = b"".join(_fetch_response(version, n, [os.urandom(MB), os.urandom(MB)])
                         for n in range(2))
    got, stats, _ = _on(loop, lambda: _fetched(version, responses, slow=False))
    assert got == responses
    assert stats.spliced["response"] > len(responses) // 2


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_slow_client_holds_the_broker_back_until_it_takes_the_bytes(loop: str) -> None:
    """The client reads slowly: spliced bytes wait in a pipe, the broker is not read
    meanwhile, and the client still gets every byte once and in order."""
    responses = b"".join(_fetch_response(16, n, [os.urandom(MB), os.urandom(MB)])
                         for n in range(2))
    got, stats, held = _on(loop, lambda: _fetched(16, responses, slow=True))
    assert got == responses
    assert stats.splice_waits > 0 and held and stats.spliced["response"] > 0
    assert stats.backpressure["client_slow"] >= stats.splice_waits  # (a pause as any)


def test_what_waits_for_a_slow_client_stays_within_the_high_water_mark() -> None:
    """``network.write_buffer_high_bytes`` bounds what the proxy holds for a client, spliced
    bytes waiting in the pipe included (a splice moves at most that much at a time)."""
    responses = b"".join(_fetch_response(16, n, [os.urandom(MB), os.urandom(MB)])
                         for n in range(2))
    got, stats, held = _on("uvloop", lambda: _fetched(16, responses, slow=True,
                                                      high=64 * 1024))
    assert got == responses
    assert 0 < held <= 64 * 1024 and stats.splice_waits > 0


@pytest.mark.parametrize("refused_side", ["source", "sink"])
def test_where_the_system_refuses_splice_every_byte_still_arrives(
        monkeypatch: pytest.MonkeyPatch, refused_side: str) -> None:
    """A seccomp profile or a sandbox's kernel may refuse splice (EINVAL, EPERM, ENOSYS...):
    the connection goes on reading and writing every byte, the bytes already taken from the
    client (the sink refused) are read back and forwarded first, and splicing is off for
    the process from then on, new connections included."""
    real = os.splice
    monkeypatch.setattr(splice, "_unusable", False)

    def refusing(src: int, dst: int, count: int, *args: Any, **kwargs: Any) -> int:
        from_pipe = stat.S_ISFIFO(os.fstat(src).st_mode)
        if from_pipe == (refused_side == "sink"):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(src, dst, count, *args, **kwargs)

    monkeypatch.setattr(os, "splice", refusing)
    frames = b"".join(_produce(os.urandom(MB), n) for n in range(3))
    got, stats, _ = _on("uvloop", lambda: _through_proxy(frames, splice_on=True, slow=False))
    assert got == frames
    assert not splice.usable()
    if refused_side == "sink":
        assert stats.spliced["request"] > 0  # (taken into the pipe, then read back)
    got, stats, _ = _on("uvloop", lambda: _through_proxy(frames, splice_on=True, slow=False))
    assert got == frames and stats.spliced["request"] == 0
