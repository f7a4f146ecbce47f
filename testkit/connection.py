"""A real ``ProxiedConnection`` driven without sockets, for unit tests of the request path.

``DrivenConnection.open(filters)`` makes the connection as a listener does (the filters' chain
and an ``InterestTable`` of the address rewriter's and the filters' declarations, as
``ListenerKind._make_context`` builds them), over fake transports: the connection's own
``connection_made`` and ``_connect_upstream`` run, the upstream reached through the context's
``connect_upstream`` (a ``FakeTransport`` instead of a socket). A test then plays both peers::

    h = await DrivenConnection.open([partial(TopicGuardFilter, guard=guard)])
    h.client_sends(frames)           # the client's bytes (``data_received``)
    assert h.upstream_got() == ...   # every byte written to the broker so far
    h.upstream_sends(answers)        # the broker's bytes
    await h.settle()                 # callbacks the connection scheduled (``call_soon``)
    assert h.client_got() == ... and h.closed_reason is None

It needs a running event loop (asyncio's or uvloop's): the connection schedules on it
(connecting, refusal waits, interception resumed). Responses are not rewritten
(``PassThroughRewriter``) unless a rewriter is given.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from kafka_quota_proxy.config.schema import NetworkConfig
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.framing import Buffer
from kafka_quota_proxy.protocol.interests import InterestTable, addresses
from kafka_quota_proxy.proxy.brokers import ListeningRewriter
from kafka_quota_proxy.proxy.connection import ProxiedConnection, UpstreamSide
from kafka_quota_proxy.proxy.context import ConnectionContext, UpstreamConnector
from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory
from kafka_quota_proxy.proxy.metrics import ProxyStats

CLIENT_PEER = ("192.0.2.10", 50000)
BROKER = ("broker.test", 9092)
F = TypeVar("F", bound=Filter)


class FakeTransport:
    """A socket's transport as the connection uses it: ``written`` (every byte, in order),
    whether it reads (``reading``: ``pause_reading``/``resume_reading``), how it ended
    (``closing``, ``aborted``, ``eof``); ``buffered`` is what ``get_write_buffer_size``
    reports (a slow peer). Writing after ``close`` or ``abort`` fails the test."""

    def __init__(self, peername: tuple[str, int] | None = None) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = False
        self.aborted = False
        self.eof = False
        self.buffered = 0
        self.limits: tuple[int, int] | None = None  # (high, low) write buffer marks
        self._peername = peername

    def write(self, data: Buffer | bytearray) -> None:
        assert not self.closing and not self.eof, "written after close"
        self.written += data

    def writelines(self, parts: Iterable[Buffer | bytearray]) -> None:
        for part in parts:
            self.write(part)

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high or 0, low or 0)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peername if name == "peername" else default


class FakeHost:
    """The proxy as a connection sees it (``proxy.context.ConnectionHost``): every connection
    admitted; ``opened`` counts ``connection_opened``, ``closed`` holds each close's reason;
    ``draining`` may be set by a test."""

    def __init__(self) -> None:
        self.draining = False
        self.opened = 0
        self.closed: list[str] = []

    def admit(self, conn: Any, transport: Any) -> bool:
        return True

    def connection_opened(self, conn: Any) -> None:
        self.opened += 1

    def connection_closed(self, conn: Any, reason: str) -> None:
        self.closed.append(reason)


class PassThroughRewriter:
    """The response rewriter, changing nothing (the frames it is given still wait whole)."""

    def __call__(self, entry: InFlight, frame: Buffer) -> bytes | None:
        return None

    def rewrite_tail(self, entry: InFlight, tail: bytes) -> bytes:
        return tail


def filter_class(make: FilterFactory) -> type[Filter]:
    """The filter class a factory makes: the class itself, or a ``functools.partial`` of one
    (whose ``interests`` go into the connection's ``InterestTable``)."""
    cls = make.func if isinstance(make, functools.partial) else make
    if not (isinstance(cls, type) and issubclass(cls, Filter)):
        raise TypeError(f"not a Filter class or a partial of one: {make!r}")
    return cls


class DrivenConnection:
    """A ``ProxiedConnection`` (``conn``) between a fake client (``client``) and a fake broker
    (``upstream``, read by ``side``, the connection's ``UpstreamSide``); ``host`` records the
    closes."""

    def __init__(self, conn: ProxiedConnection, host: FakeHost, client: FakeTransport,
                 upstream: FakeTransport, side: UpstreamSide) -> None:
        self.conn = conn
        self.host = host
        self.client = client
        self.upstream = upstream
        self.side = side

    @classmethod
    async def open(cls, filters: Sequence[FilterFactory] = (), *,
                   network: NetworkConfig | None = None, listener: str = "broker-1",
                   scope: int = 1, rewriter: Any = None) -> DrivenConnection:
        """A connection of a listener with ``filters`` (in chain order), made and connected
        upstream. ``rewriter``: the responses' (default ``PassThroughRewriter``)."""
        host = FakeHost()
        declared = [filter_class(make) for make in filters]
        made: list[tuple[FakeTransport, UpstreamSide]] = []

        async def connect(host: str, port: int, factory: Callable[[], UpstreamSide]
                          ) -> tuple[FakeTransport, UpstreamSide]:
            """The connector the connection reaches its broker with: a fake transport."""
            side = factory()
            transport = FakeTransport((host, port))
            side.connection_made(cast(asyncio.Transport, transport))
            made.append((transport, side))
            return transport, side

        ctx = ConnectionContext(
            host=host, listener=listener, scope=scope, network=network or NetworkConfig(),
            connect_timeout_seconds=1.0, stats=ProxyStats(),
            rewriter=cast(ListeningRewriter, rewriter or PassThroughRewriter()),
            interests=InterestTable([addresses, *(c.interests for c in declared)]),
            filters=tuple(filters),
            filter_response_frames=InterestTable(c.interests for c in declared).response_frames,
            connect_upstream=cast(UpstreamConnector, connect))
        conn = ProxiedConnection(ctx, lambda: [(*BROKER, scope)])
        client = FakeTransport(CLIENT_PEER)
        conn.connection_made(cast(asyncio.Transport, client))
        for _ in range(100):  # (``_connect_upstream`` runs on the loop)
            if conn.upstream is not None or conn.closed:
                break
            await asyncio.sleep(0)
        if conn.upstream is None:
            raise AssertionError(f"the connection did not connect upstream: {host.closed}")
        ((upstream, side),) = made
        return cls(conn, host, client, upstream, side)

    # ------------------------------------------------------------------ driving it
    def client_sends(self, data: bytes) -> None:
        """The client's bytes, as one read."""
        self.conn.data_received(data)

    def upstream_sends(self, data: bytes) -> None:
        """The broker's bytes, as one read."""
        self.side.data_received(data)

    async def settle(self, turns: int = 5) -> None:
        """Let the loop run what the connection scheduled to run soon."""
        for _ in range(turns):
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ what came of it
    def upstream_got(self) -> bytes:
        """Every byte the connection wrote to the broker so far."""
        return bytes(self.upstream.written)

    def client_got(self) -> bytes:
        """Every byte the connection wrote to the client so far."""
        return bytes(self.client.written)

    @property
    def closed_reason(self) -> str | None:
        """The reason the connection closed with (None while open)."""
        return self.host.closed[-1] if self.host.closed else None

    def filter(self, kind: type[F]) -> F:
        """The connection's filter of class ``kind``."""
        (found,) = [f for f in self.conn.chain.filters if isinstance(f, kind)]
        return found
