"""One proxied connection: a client socket paired with its own upstream broker socket.

The asyncio protocols here are thin adapters over the sans-IO streams
(``protocol.request_stream``, ``protocol.response_stream``): ``data_received`` feeds the
request stream and forwards what it returns; ``upstream_data`` hands the broker's bytes to the
response stream and answers its events (a response has started: the filters' ``response``
hooks, then whether to rewrite it whole). The connection keeps framing,
flow control and the correlation table; every feature of the request path is a filter
(``proxy.filters``), called through the chain resolved when the connection is made.
Backpressure: when one side's write buffer passes its high-water mark, reading from the other
side pauses until it drains.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import ssl
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.framing import Buffer
from kafka_quota_proxy.protocol.request_stream import (
    ClientIdChanged,
    FrameCopied,
    ProduceMeasured,
    ProduceWatched,
    RequestEvent,
    RequestRead,
    RequestStream,
)
from kafka_quota_proxy.protocol.response_stream import Forward, ResponseStarted, ResponseStream
from kafka_quota_proxy.protocol.rewrite import throttle_field
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.cluster import OwnIdentity, authenticate
from kafka_quota_proxy.proxy.context import ConnectionContext
from kafka_quota_proxy.proxy.filters.base import Client, Filter, FilterChain
from kafka_quota_proxy.proxy.flow import ReadGate
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.splice import READ_BYTES, Lane, socket_fd, usable
from kafka_quota_proxy.quota.entities import ANONYMOUS
from kafka_quota_proxy.security.principal_mapping import NoMatchingRule
from kafka_quota_proxy.security.x500 import subject_principal

log = get_logger("kafka_quota_proxy.connection")

_ids = itertools.count(1)
_FETCH = int(ApiKey.FETCH)
_now = time.perf_counter
_NO_REQUESTS: list[InFlight] = []  # (never changed)
_clock = time.monotonic
# The first bytes of a TLS ClientHello (a record of type handshake, TLS 1.0-1.3)
_TLS_HELLO = frozenset(bytes((0x16, 3, minor)) for minor in range(5))
FINISH_LINGER_S = 1.0  # draining: how long to wait for the client to close after our FIN
EAGER_SERIAL_REQUESTS = 16  # (``ProxiedConnection._eager_serial``)
CLOSE_LINGER_S = 10.0  # how long a closed connection's unsent bytes wait for a slow client
# How long the requests before a refused one may take to be answered (``refuse``): what a
# broker answers at once (a long poll past this is cut short: the client asked for what is
# refused, and holds nothing of the broker's or the proxy's longer)
REFUSAL_WAIT_S = 3.0


# The plaintext read buffer of both sides: one for the process (one event loop), copied out as
# each read's ``bytes`` at once (``buffer_updated``), as the loop's own read buffer is; read
# short where a splice follows (``Lane.read_size``)
_READ_BUFFER = memoryview(bytearray(READ_BYTES))


class ProxiedConnection(asyncio.BufferedProtocol):
    """The client-facing protocol; owns the upstream side and the sans-IO state."""

    def __init__(self, ctx: ConnectionContext,
                 resolve_upstream: Callable[[], list[tuple[str, int, int]]],
                 peer: tuple[str, int] | None = None, scope: int | None = None) -> None:
        """``resolve_upstream()``: the addresses to try in order, each with the quota scope of
        a connection that reaches it; ``scope``: the connection's until then (chosen at
        accept; None: its listener's)."""
        self.ctx = ctx
        self.id = next(_ids)
        # ANONYMOUS until an mTLS certificate or a SASL exchange names the principal
        self.client = Client(self.id, ctx.listener, ctx.scope if scope is None else scope,
                             ANONYMOUS)
        if peer is not None:  # the client's address as a PROXY protocol header gave it
            self.client.peer = f"{peer[0]}:{peer[1]}"
            self.client.peer_ip = peer[0]
        self.listener = ctx.listener
        self._muted_until = 0.0
        self._unmute: asyncio.TimerHandle | None = None
        self._resolve_upstream = resolve_upstream
        self.table = CorrelationTable()
        net = ctx.network
        interests = ctx.interests

        def request_frame(e: InFlight) -> bool:
            """Requests read whole on their way upstream (fetches to route or to answer,
            SASL, topics to guard)."""
            return interests.request_frame(e.api_key, e.api_version)

        self.requests = RequestStream(
            self.table, net.max_frame_bytes,
            request_frame if interests.wants_request_frames else None,
            measure_produce=interests.produce_partitions,
            whole=interests.whole if interests.wants_whole else None,
            answered_keys=interests.answered_keys)
        self.requests.gate_client_ids()  # each request judged by its own header's client-id
        self.chain = FilterChain([make(self) for make in ctx.filters])
        # the filter that follows Produce frames as they pass (the topic guard)
        self._watcher = next((f for f in self.chain.filters if f.watches_produce), None)
        if self._watcher is not None and interests.produce_topics:
            self.requests.watch(self._watcher.watch_produce)
        # SASL termination reads the client's bytes until the client has authenticated
        self._interceptor: Any = next((f for f in self.chain.filters if f.intercepts), None)
        self.responses = ResponseStream(
            self.table,
            self._response_frame if self.chain.response_frame else ctx.rewriter,
            net.max_frame_bytes,
            ctx.rewriter.rewrite_tail,
            interests,
            announce=bool(self.chain.response),
            answer=self._local_answer,
        )
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamSide | None = None
        self.client_gate = ReadGate()
        self.client_gate.on_resume = self._read_held
        self.closed = False
        self._early: list[bytes] = []
        self._response_holds: set[str] = set()  # ``hold_responses`` before the upstream was made
        self._connect_task: asyncio.Task[None] | None = None
        self._max_in_flight = net.max_in_flight_requests
        # The next request must wait for a response ("serial" in ``_read_on``), and nothing of
        # it has arrived yet: reading pauses when something does (``_read_requests``)
        self._serial_due = False
        # A client seen sending its next request before the response: reading pauses at once
        # for this many more requests (its next bytes wait in the socket, and it costs no
        # wake-up to hold them), then the lazy pause is tried again.
        self._eager_serial = 0
        # For the proxy's sweep (``Proxy._sweep``): when bytes last went either way, and
        # when the frame in progress from the client began (None: between frames).
        self.last_active = _clock()
        self.frame_started: float | None = None
        self._finishing = False  # draining: answered, FIN sent, what comes is discarded
        # A request the proxy refuses (``refuse``): the request, the reason and its detail;
        # the connection closes once every request before it is answered
        self._refusing: tuple[InFlight, str, str] | None = None
        # The proxy's time on requests (``data_received``): those the current read completed,
        # and the time spent so far on a frame still arriving.
        self._read_now: list[InFlight] = []
        self._reading_ms = 0.0
        self._last_read: InFlight | None = None  # the request read last (its frame may go on)
        # Splicing (``proxy.splice``), once the upstream is connected, when both sides are
        # plaintext: requests client -> broker, responses broker -> client
        self.request_lane: Lane | None = None
        self.response_lane: Lane | None = None

    @property
    def peer(self) -> str:
        return self.client.peer

    @property
    def unread_bytes(self) -> int:
        """Bytes read from the client and not written upstream yet (for the metrics)."""
        return self.requests.unread + sum(map(len, self._early))

    # ------------------------------------------------------------------ client side
    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)
        if not self.ctx.host.admit(self, transport):
            self.closed = True
            transport.abort()
            return
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if self.client.peer == "?":  # (else given by a PROXY protocol header)
            self.client.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
            self.client.peer_ip = peer[0] if peer else None
        self.ctx.host.connection_opened(self)
        if self.closed:  # (draining)
            return
        mapper = self.ctx.principal_mapper
        if mapper is not None:  # TLS (handshake done): the client certificate's principal
            sslobj = transport.get_extra_info("ssl_object")
            der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
            try:
                principal = subject_principal(der, mapper)
            except NoMatchingRule as exc:  # Kafka fails the authentication
                self.close("principal_mapping_failed", side="client", detail=str(exc))
                return
            if principal is not None:
                self.client.user = principal
        self._ready(transport)

    def _ready(self, transport: asyncio.Transport) -> None:
        """The client can be read: connect upstream (reading waits for it)."""
        net = self.ctx.network
        transport.set_write_buffer_limits(net.write_buffer_high_bytes, net.write_buffer_low_bytes)
        self.client_gate.attach(transport)
        self.client_gate.pause("connecting")
        self._connect_task = asyncio.get_running_loop().create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        errors = []
        timeout = self.ctx.connect_timeout_seconds
        upstream_tls = self.ctx.upstream_tls
        identity = self.ctx.upstream_identity
        side_class = UpstreamSide if upstream_tls is None else TlsUpstreamSide
        connect = self.ctx.connect_upstream
        for host, port, scope in self._resolve_upstream():
            try:
                if connect is not None:
                    transport, side = await asyncio.wait_for(
                        connect(host, port, lambda: side_class(self)), timeout)
                elif identity is None:
                    transport, side = await asyncio.wait_for(
                        loop.create_connection(
                            lambda: side_class(self), host, port, ssl=upstream_tls,
                            server_hostname=host if upstream_tls is not None else None),
                        timeout)
                else:
                    transport, side = await asyncio.wait_for(
                        self._authenticated_upstream(host, port, identity), timeout)
            except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
                errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            if self.closed:
                transport.close()
                return
            self.client.scope = scope  # the budgets of the broker reached
            for connected in self.chain.upstream_connected:
                connected(True)
            # Only now is the upstream where requests go: the bytes read while connecting go
            # first, then what comes after (set when the socket connected, bytes read between
            # that and this line went ahead of the earlier ones: answered out of order).
            self.upstream = side
            self._make_lanes(side, transport)
            for reason in self._response_holds:
                side.gate.pause(reason)
            if self._early:
                early, self._early = self._early, []
                transport.writelines(early)
            self.client_gate.resume("connecting")
            return
        for connected in self.chain.upstream_connected:
            connected(False)
        self.close("upstream_unreachable", detail="; ".join(errors) or "no upstream address known")

    async def _authenticated_upstream(self, host: str, port: int, identity: OwnIdentity
                                      ) -> tuple[asyncio.Transport, UpstreamSide]:
        """An upstream connection authenticated as the proxy (SASL termination): the exchange
        over a stream, then the socket handed to the upstream protocol."""
        tls = self.ctx.upstream_tls
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None)
        try:
            await authenticate(reader, writer, identity)
        except BaseException:
            writer.transport.abort()
            raise
        transport = cast(asyncio.Transport, writer.transport)
        side = (UpstreamSide if tls is None else TlsUpstreamSide)(self)
        side.stream = writer  # (a StreamWriter closes its transport when collected)
        transport.set_protocol(side)
        side.connection_made(transport)
        return transport, side

    def _may_read_next(self) -> bool:
        """Another request may be read: none in flight, or below the bound and every filter
        has headroom (quotas: see ``QuotaFilter.headroom``)."""
        n = len(self.table)
        if n == 0:
            return True
        if n >= self._max_in_flight:
            return False
        for headroom in self.chain.headroom:  # noqa: SIM110 (hot path: no generator)
            if not headroom():
                return False
        return True

    def _serial(self, data: bytes) -> bool | None:
        """Whether the filters want frames read one at a time now (quotas, storage); None when
        one holds the next frame back (it resumes reading later)."""
        serial = False
        for check in self.chain.serial:
            if check():
                serial = True
        if serial and self.chain.hold:
            api_key = self.requests.next_api_key(data)
            for hold in self.chain.hold:
                if hold(api_key):
                    self.requests.hold(data)
                    return None
        return serial

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read of the client goes: a short one where a splice follows."""
        lane = self.request_lane
        if lane is None:
            return _READ_BUFFER
        return _READ_BUFFER[:lane.read_size(self.requests.mid_frame)]

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(_READ_BUFFER[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        """The client's bytes: the intercepting filter's while it reads them (SASL termination,
        until the client has authenticated), else read as requests."""
        if self._interceptor is not None:
            self._intercepted(data)
        else:
            self._read_client(data)

    def _read_client(self, data: bytes) -> None:
        """Read requests, and time it: the proxy's own time on a request is part of what a
        request quota charges for it (``quota.request_time``). A read's time is shared by the
        requests whose headers it read; a read that read none went on with the frame of the
        last request read (a Produce arriving in many reads: its time is that request's), or
        with a header not complete yet (its time waits for that request)."""
        started = _now()
        self._read_requests(data)
        if self.request_lane is not None and self.requests.mid_frame:
            self.request_lane.splice()
        work = self._reading_ms + (_now() - started) * 1000.0
        read = self._read_now
        if read:
            share = work / len(read)
            for entry in read:
                entry.proxy_ms += share
            self._last_read = read[-1]
            read.clear()
            self._reading_ms = 0.0
        elif self.requests.reading_header:
            self._reading_ms = work
        else:
            self._reading_ms = 0.0
            last = self._last_read
            if last is not None and data:
                last.proxy_ms += work

    def _read_requests(self, data: bytes) -> None:
        if self._finishing or self._refusing is not None:
            return  # sent after draining began (the client saw FIN) or after a refused request
            # (discarded, never answered)
        now = self.last_active = _clock()
        requests = self.requests
        if requests.inside_frame(len(data)):
            # The body of a frame under way, which goes on past this read (a large Produce
            # arrives in many): nothing is asked of the filters (``serial``, ``hold`` and the
            # bound on requests in flight are for frames to come), only its watch or copy may
            # have something to say.
            try:
                forward, events = requests.feed(data)
            except ProtocolError as exc:
                self.close(exc.reason, detail=str(exc), side="client")
                return
            self._handle_requests(forward, events)
            return
        was_mid = requests.mid_frame
        if self._serial_due and data:
            # the next request, read before a response made room for it: it waits, unread,
            # as it would have in the socket had reading paused at once (``_read_on``)
            self._serial_due = False
            self._eager_serial = EAGER_SERIAL_REQUESTS
            requests.hold(data)
            self.client_gate.pause("serial")
            return
        while not self.closed:
            serial = self._serial(data)
            if serial is None:  # held back by a filter
                return
            # Frames that may still be read before the bound on requests in flight
            room = self._max_in_flight - len(self.table)
            if room <= 0 and (requests.reading_header or not requests.mid_frame):
                # At the bound with no frame under way (bytes can arrive after reading paused):
                # they stay unread until a response makes room.
                requests.hold(data)
                self.client_gate.pause("serial")
                return
            limited = serial or room <= 1
            read = self._feed_requests(data, limited, room)
            if read is None:
                return
            forward, events = read
            if requests.mid_frame:
                if not was_mid or (events and any(type(e) is RequestRead for e in events)):
                    self.frame_started = now
            else:
                self.frame_started = None
            was_mid = requests.mid_frame
            self._handle_requests(forward, events)
            if self._refusing is not None:  # the rest is discarded (``refuse``)
                return
            last = events[-1] if events else None
            if type(last) is ClientIdChanged:
                if not self._client_id_changed(last.client_id):
                    return
            elif requests.mid_frame or not self._read_on(limited):
                return  # (a frame in progress goes on with the next read)
            data = b""  # go on with the bytes held back

    def _make_lanes(self, side: UpstreamSide, upstream: asyncio.Transport) -> None:
        """The two lanes of splicing, when it is on and both sockets are plaintext TCP."""
        if not (self.ctx.network.splice and usable()) or type(self) is not ProxiedConnection:
            return
        client, broker = socket_fd(self.transport), socket_fd(upstream)
        if client is None or broker is None or type(side) is not UpstreamSide:
            return
        net = self.ctx.network
        marks = (net.write_buffer_high_bytes, net.write_buffer_low_bytes)
        stats = self.ctx.stats
        assert self.transport is not None

        def reading() -> bool:
            return not self.closed and self._interceptor is None and self._refusing is None

        def request_failed(side: str, error: OSError) -> None:
            if side == "source":
                self._client_gone(error)
            else:
                self.close("upstream_error", detail=str(error), side="upstream")

        def response_failed(side: str, error: OSError) -> None:
            if side == "sink":
                self._client_gone(error)
            else:
                self.close("upstream_error", detail=str(error), side="upstream")

        self.request_lane = Lane(self.requests, client, broker, self.client_gate, upstream,
                                 marks, stats, "request", "upstream_slow", reading,
                                 request_failed)
        self.response_lane = Lane(self.responses, broker, client, side.gate, self.transport,
                                  marks, stats, "response", "client_slow",
                                  lambda: not self.closed, response_failed)

    def _feed_requests(self, data: bytes, limited: bool, room: int
              ) -> tuple[Buffer | bytearray, list[RequestEvent]] | None:
        """``RequestStream.feed``, one frame at a time when ``limited``, else up to ``room``
        frames; None once a malformed frame closed the connection."""
        try:
            return self.requests.feed(data, stop_after_frame=limited, max_frames=max(room, 1))
        except ProtocolError as exc:
            reason = exc.reason
            if data[:3] in _TLS_HELLO and self.client.client_id is None:  # first bytes
                reason = "tls_on_plaintext_listener"
            self.close(reason, detail=str(exc), side="client")
            return None

    def _client_id_changed(self, client_id: str) -> bool:
        """The read stopped before a frame of another client-id (a connection's first frame,
        or a client-id changed): that frame is gated by its own limits, the next turn of the
        read loop judges them (``serial``, ``hold``), and with requests in flight it waits for
        their headroom as any frame of its client-id would. Whether to read on now."""
        self.client.client_id = client_id
        self.requests.accept_client_id(client_id)
        if self.table and not self._may_read_next():
            self.client_gate.pause("serial")
            return False
        return not self.client_gate.paused

    def _read_on(self, limited: bool) -> bool:
        """A read stopped between frames: whether to go on with the bytes held back now (else
        the client's reading pauses until responses make room, or there is nothing held)."""
        requests = self.requests
        if not limited:
            if not requests.held:
                return False
            # the bound on requests in flight stopped this read
            if len(self.table) >= self._max_in_flight:
                self.client_gate.pause("serial")
                return False
        if not self._may_read_next():  # wait for responses before reading more
            if requests.held or self._interceptor is not None or self._eager_serial:
                # (an intercepting filter reads what comes next itself: it waits in the socket)
                if self._eager_serial:
                    self._eager_serial -= 1
                self.client_gate.pause("serial")
            else:
                # Nothing of the next request is here yet: reading pauses only when it comes.
                # A client that waits for its response before sending more (one request in
                # flight, or the last of a batch) then costs no pause and resume of reading
                # (two system calls and their Python per request). One that sends ahead
                # would cost a wake-up to hold its next bytes instead: it is paused at once
                # for a while (``_eager_serial``).
                self._serial_due = True
            return False
        # (paused: the held bytes wait for the throttle or the backpressure to end)
        return requests.held and not self.client_gate.paused

    def _intercepted(self, data: bytes) -> None:
        """``data_received`` until the client has authenticated with the proxy."""
        f = self._interceptor
        if self.closed:
            return
        if f is None:  # (authenticated since this call was scheduled)
            self._read_client(data)
            return
        try:
            result = f.intercept(data)
        except ProtocolError as exc:
            self.close(exc.reason, detail=str(exc), side="client")
            return
        transport = self.transport
        assert transport is not None
        for answer in result.answers:
            transport.write(answer)
        if result.forward:
            self._read_client(result.forward)
        if result.failed is not None:  # the answer goes, then the connection closes
            self.close(result.failed.reason, detail=str(result.failed), side="client")
            return
        if f.authenticated:
            self._interceptor = None  # reading as usual from now on
            rest = f.rest
            if rest:
                self._read_client(rest)

    def unsent_upstream(self) -> int:
        """Bytes handed over for the broker that have not left for it (still in the upstream
        transport's buffer, or read while it was connecting)."""
        upstream = self.upstream
        buffered = sum(map(len, self._early))
        if upstream is not None and upstream.transport is not None:
            buffered += upstream.transport.get_write_buffer_size()
        if self.request_lane is not None:
            buffered += self.request_lane.waiting_bytes
        return buffered

    @property
    def client_buffered(self) -> int:
        """Bytes for the client that have not left for it (the transport's buffer, and
        spliced bytes waiting for room in its socket)."""
        transport = self.transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        if self.response_lane is not None:
            buffered += self.response_lane.waiting_bytes
        return buffered

    def hold_responses(self, reason: str) -> None:
        self._response_holds.add(reason)
        self.responses.answers_held = True
        if self.upstream is not None:
            self.upstream.gate.pause(reason)

    def release_responses(self, reason: str) -> None:
        self._response_holds.discard(reason)
        self.responses.answers_held = bool(self._response_holds)
        if self.upstream is not None:
            self.upstream.gate.resume(reason)
        if not self._response_holds and self.table.local and not self.closed:
            self._responses(b"")  # the answers that waited, and what came after them

    def _local_answer(self, entry: InFlight) -> bytes:
        """The frame of an answer the proxy made (``ResponseStream``'s ``answer``), with the
        throttle time the filters proposed."""
        return self.ctx.rewriter(entry, b"") or entry.answer or b""

    def resume_interception(self) -> None:
        if self._interceptor is not None:
            asyncio.get_running_loop().call_soon(self._intercepted, b"")

    def _read_held(self) -> None:
        """Reading resumed: go on with requests held back while paused. (The requests' reading,
        not ``data_received``: while a SASL-terminating listener still intercepts the client's
        bytes, what is held was forwarded by the interception already.)"""
        requests = self.requests
        if (requests.held or requests.reading_header) and self._may_read_next():
            self._read_client(b"")  # (a frame begun waits in reading_header)

    def _handle_requests(self, forward: Buffer | bytearray,
                         events: list[RequestEvent]) -> None:
        """What one read brought, in order: frames seen whole go through the filters' frame
        hooks (patched, answered, refused: ``read_events``), then the measured Produce frames
        and the requests read through their hooks, and what is left goes upstream."""
        chain = self.chain
        measured: list[InFlight]
        read: list[InFlight]
        if not events:  # (the rest of a frame under way)
            measured = read = _NO_REQUESTS
        elif len(events) == 1 and type(events[0]) is RequestRead:  # (the common read)
            measured, read = [], [events[0].entry]
        else:
            watcher = self._watcher
            outcome = read_events(forward, events, self._request_frame,
                                  watcher.produce_watched if watcher is not None else None,
                                  self._refused, self.table)
            if self.closed:  # a frame hook closed the connection
                return
            if self._refusing is not None:
                if outcome.forward is None:  # a request refused where it cannot be cut out
                    refusing = self._refusing
                    self.close(refusing[1], side="client",
                               detail=f"{refusing[2]} (closed at once: part of the frame "
                                      "went upstream with an earlier read)")
                    return
                if not self._drop_refused(outcome.dropped):
                    return
            assert outcome.forward is not None
            forward = outcome.forward
            measured, read = outcome.measured, outcome.read
        if measured:
            for entry in measured:
                for hook in chain.request_measured:
                    hook(entry)
        if read:
            stats = self.ctx.stats
            now = _now()
            self.client.client_id = read[-1].client_id or ""
            request_hooks = chain.request
            self._read_now += read
            for entry in read:
                entry.forwarded_at = now
                key = entry.api_key
                stats.requests[key] += 1
                stats.request_bytes[key] += entry.request_size
                c = stats.client(entry.client_id)
                c[0] += entry.request_size
                c[2] += 1
                for hook in request_hooks:
                    hook(entry)
            if self.closed:  # a filter refused the request: nothing more goes upstream
                return
        if forward and not self.closed:  # (closed: a filter refused what it cannot rewrite)
            upstream = self.upstream
            if upstream is None:  # read while connecting: uvloop starts reading after
                self._early.append(bytes(forward))  # ``connection_made`` whatever it was
                self.client_gate.enforce()  # told there; no more until connected
            else:
                upstream.transport.write(forward)  # type: ignore[union-attr]
        if self.table.local and not self.closed:
            self._responses(b"")  # the proxy's answers, if next in order

    def retire(self, f: Filter, hooks: tuple[str, ...]) -> None:
        self.chain.retire(f, hooks)

    def _response_frame(self, entry: InFlight, frame: Buffer) -> bytes | None:
        """A response held whole: the filters see it if they asked for it, then the
        rewriter."""
        if (entry.api_key, entry.api_version) in self.ctx.filter_response_frames:
            for hook in self.chain.response_frame:
                hook(entry, frame)
        return self.ctx.rewriter(entry, frame)

    def _request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        """Each filter sees the frame as the ones before it left it (the topic guard first:
        the controller mutation quota then counts what goes on without the proxy's topics);
        a frame one of them refused goes no further."""
        replaced = None
        for hook in self.chain.request_frame:
            patched = hook(entry, frame, patchable)
            if self._refusing is not None or self.closed:
                return None
            if patched is not None:
                frame = replaced = patched
        return replaced

    # ------------------------------------------------------------------ refusals
    def refuse(self, entry: InFlight, reason: str, detail: str) -> None:
        """A request the proxy will not forward and cannot answer (see ``FilterHost``): the
        connection reads nothing more, answers every request before it, then closes. (Kafka
        reads one request at a time per connection: what a client sent before a request its
        broker refuses to handle is answered before the connection closes.)"""
        if self.closed or self._refusing is not None:
            return
        self._refusing = (entry, reason, detail)
        self.frame_started = None  # no frame is read any further: none to time out
        # What the client sends from now on is read and discarded (``_read_requests``): a
        # client that hangs up is seen at once
        self.client_gate.open()

    def _refused(self, entry: InFlight) -> bool:
        refusing = self._refusing
        return refusing is not None and refusing[0] is entry

    def _drop_refused(self, dropped: list[InFlight]) -> bool:
        """The refused request and those read after it leave the table (they never go
        upstream); False once the connection is closed: nothing was left to answer, or the
        refused request came in an earlier read (its hooks ran)."""
        refusing = self._refusing
        assert refusing is not None
        entry, reason, detail = refusing
        if not dropped or dropped[0] is not entry:
            self.close(reason, detail=detail, side="client")
            return False
        table = self.table
        for gone in dropped:
            if gone.correlation_id in table and gone.expects_response:
                table.pop(gone.correlation_id)
        if not table:
            self.close(reason, detail=detail, side="client")
            return False
        log.info("request_refused", connection=self.id, client=self.peer, reason=reason,
                 detail=detail, answering=len(table))
        asyncio.get_running_loop().call_later(
            REFUSAL_WAIT_S, functools.partial(self.close, reason, detail=detail, side="client"))
        return True

    def eof_received(self) -> bool | None:
        self._client_gone(None)
        return None

    # ------------------------------------------------------------------ responses
    def _response_started(self, entry: InFlight) -> bool:
        """A response starts: the filters record it (and may throttle the client). Returns
        whether the response goes through the rewriter (to set ``throttle_time_ms`` or
        ``preferred_read_replica``)."""
        now = now_ms()
        elapsed_ms = (_now() - entry.forwarded_at) * 1000.0
        for hook in self.chain.response:
            hook(entry, now, elapsed_ms)
        # the rewriter sets preferred_read_replica, answers what a filter took out, or
        # replaces the response with the proxy's answer
        routed = (entry.route is not None or entry.refused is not None
                  or (entry.answer is not None and not entry.local))
        throttle = entry.throttle_ms
        if throttle <= 0:
            return routed
        stats = self.ctx.stats
        kind = entry.throttled_by.short
        stats.throttled[kind] += 1
        stats.throttle_ms[kind] += throttle
        self.mute(throttle)
        return routed or throttle_field(entry.api_key, entry.api_version) is not None

    def mute(self, throttle_ms: int) -> None:
        """KIP-219: read nothing more from this client until the throttle time has passed."""
        if self._refusing is not None:  # nothing more is read but to be discarded
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + throttle_ms / 1000.0
        if until <= self._muted_until:
            return
        self._muted_until = until
        if self._unmute is not None:
            self._unmute.cancel()
        self.client_gate.pause("throttle")
        self._unmute = loop.call_at(until, self.client_gate.resume, "throttle")

    def connection_lost(self, exc: Exception | None) -> None:
        self._client_gone(exc)

    def _client_gone(self, exc: Exception | None) -> None:
        if self.requests.mid_frame and self._refusing is None:  # (refusing: nothing more read)
            self.close(
                "truncated_frame",
                side="client",
                detail="client closed the connection in the middle of a frame",
            )
        elif exc is not None and not isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            self.close("client_error", detail=str(exc))
        else:  # a reset or a broken pipe is how many clients hang up: not an error
            self.close("client_closed", detail=str(exc) if exc is not None else None)

    def pause_writing(self) -> None:  # client is slow: stop reading the broker
        self.ctx.stats.backpressure["client_slow"] += 1
        if self.upstream is not None:
            self.upstream.gate.pause("client_backpressure")

    def resume_writing(self) -> None:
        if self.response_lane is not None:
            self.response_lane.drained()
        if self.upstream is not None:
            self.upstream.gate.resume("client_backpressure")

    def upstream_data(self, data: bytes) -> None:
        self.last_active = _clock()
        self._responses(data)

    def _responses(self, data: bytes) -> None:
        """The broker's bytes (or none: the proxy's own answers next in order) on their way
        to the client."""
        responses = self.responses
        try:
            responses.receive_data(data)
            event = responses.next_event()
            while type(event) is ResponseStarted:
                if self._response_started(event.entry):
                    responses.rewrite_whole()
                event = responses.next_event()
            segments, done = cast(Forward, event)
            if self.closed:  # a filter closed the connection (identities)
                return
        except ProtocolError as exc:
            self.close(exc.reason, detail=str(exc), side="upstream")
            return
        except Exception as exc:  # e.g. broker ports exhausted while rewriting
            self.close(getattr(exc, "reason", "internal_error"), detail=repr(exc), side="upstream")
            return
        transport = self.transport
        assert transport is not None
        if len(segments) == 1:
            transport.write(segments[0])
        elif segments:
            transport.writelines(segments)
        if done:
            stats = self.ctx.stats
            now = _now()
            done_hooks = self.chain.response_done
            for entry in done:
                key = entry.api_key
                stats.response_bytes[key] += entry.response_size
                stats.client(entry.client_id)[1] += entry.response_size
                stats.observe_latency(key, now - entry.forwarded_at)
                for hook in done_hooks:
                    hook(entry)
            if self._serial_due and self._may_read_next():
                self._serial_due = False  # (nothing came meanwhile: reading never paused)
            elif self.client_gate.has("serial") and self._may_read_next():
                self.client_gate.resume("serial")  # reads held requests unless still muted
            if not self.table:
                if self._refusing is not None:  # what came before the refused one answered
                    _, reason, detail = self._refusing
                    self.close(reason, detail=detail, side="client")
                elif self.ctx.host.draining:
                    self.finish()
        if self.response_lane is not None:
            self.response_lane.splice()

    # ------------------------------------------------------------------ lifecycle
    @property
    def idle(self) -> bool:
        """No request is waiting for its response."""
        return not self.table

    def finish(self) -> None:
        """Draining, with nothing in flight: end cleanly. FIN after the last response (not
        RST, which may also destroy that response on its way), then read and discard what the
        client still sends, until it closes or ``FINISH_LINGER_S`` passes."""
        transport = self.transport
        if self.closed or self._finishing:
            return
        if transport is None or not transport.can_write_eof():
            self.close("shutdown")
            return
        self._finishing = True
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None:
            upstream.transport.close()  # nothing in flight
        transport.write_eof()
        self.client_gate.open()
        asyncio.get_running_loop().call_later(FINISH_LINGER_S, self.close, "shutdown")

    def close(self, reason: str, *, detail: str | None = None, side: str | None = None) -> None:
        if self.closed:
            return
        if self._finishing:
            reason = "shutdown"  # the client closing after our FIN, or the linger ending
        self.closed = True
        fields: dict[str, Any] = {
            "connection": self.id,
            "listener": self.listener,
            "client": self.peer,
            "principal": self.client.user,
            "reason": reason,
            "in_flight": len(self.table),
        }
        if detail:
            fields["detail"] = detail
        if side:
            fields["offender"] = side
        if reason in ("client_closed", "shutdown"):
            log.debug("connection_closed", **fields)
        elif side is not None or reason == "upstream_unreachable":
            log.warning("connection_closed", **fields)
        else:
            log.info("connection_closed", **fields)
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self._unmute is not None:
            self._unmute.cancel()
        for lane in (self.request_lane, self.response_lane):
            if lane is not None:  # (bytes still waiting: the frame's end never goes)
                lane.close()
        for closed in self.chain.closed:  # (the table still holds what was in flight)
            closed(reason)
        upstream = self.upstream.transport if self.upstream is not None else None
        if upstream is not None:
            if self.table or upstream.get_write_buffer_size():
                # Requests whose answers nobody will read: dropped now, with the buffers and
                # the socket (a broker that stopped reading would otherwise keep them).
                upstream.abort()
            else:
                upstream.close()
        transport = self.transport
        if transport is not None:
            transport.close()  # what is buffered for the client is still sent...
            if transport.get_write_buffer_size():  # ...if the client reads it in time
                asyncio.get_running_loop().call_later(CLOSE_LINGER_S, transport.abort)
        self.ctx.host.connection_closed(self, reason)


class ReadOutcome(NamedTuple):
    """What ``read_events`` made of one read."""

    forward: Buffer | bytearray | None  # what goes upstream (None: a refused frame's first
    # bytes went with an earlier read: nothing can be cut out)
    read: list[InFlight]  # the requests read, before a refused one
    measured: list[InFlight]  # the Produce frames measured, before a refused one
    dropped: list[InFlight]  # a refused request and the requests read after it


def read_events(forward: Buffer | bytearray, events: list[RequestEvent],
                visit: Callable[[InFlight, bytes, bool], bytes | None],
                produce: Callable[[InFlight, Any], None] | None,
                refused: Callable[[InFlight], bool],
                table: CorrelationTable) -> ReadOutcome:
    """One read's events (``RequestStream.feed``), in order. A frame seen whole
    (``FrameCopied``) is given to ``visit(entry, frame, patchable)``: a replacement is patched
    in ``forward`` when the whole frame is there (``patchable``; else it goes as the client
    sent it), with its own size prefix when its size differs (a request forwarded without some
    of its topics); a frame answered (``entry.answer`` set) is taken out, its entry marked
    ``local``, its answer going to the client in order among the broker's responses
    (``ResponseStream``). A watched Produce frame (``ProduceWatched``) is given to
    ``produce(entry, watch)``. A request either refused (``refused(entry)``) is cut out of
    ``forward`` with everything after it, from where its frame starts; the events after it
    are not visited."""
    read: list[InFlight] = []
    measured: list[InFlight] = []
    patches: list[tuple[int, int, bytes]] = []
    dropped: list[InFlight] = []
    for i, event in enumerate(events):
        kind = type(event)
        if kind is RequestRead:
            read.append(event.entry)  # type: ignore[union-attr]
            continue
        if kind is ProduceMeasured:
            measured.append(event.entry)  # type: ignore[union-attr]
            continue
        if kind is ClientIdChanged:
            continue
        if kind is ProduceWatched:
            watched = cast(ProduceWatched, event)
            entry, at = watched.entry, watched.at
            assert produce is not None
            produce(entry, watched.watch)
            if not refused(entry):
                continue
            whole = at >= 4
        else:
            copied = cast(FrameCopied, event)
            entry, frame, at = copied.entry, copied.frame, copied.at
            whole = at >= 4 and forward[at : at + len(frame)] == frame
            patched = visit(entry, frame, whole)
            if not refused(entry):
                if entry.answer is not None and whole and not entry.local:
                    # answered by the proxy: the frame goes nowhere, its answer comes in its
                    # place
                    entry.local = True
                    table.local += 1
                    patches.append((at, len(frame), b""))
                elif patched is not None:
                    patches.append((at, len(frame), patched))
                continue
        if not whole:
            return ReadOutcome(None, read, measured, [entry])
        forward = forward[: at - 4]
        cut = next((n for n, e in enumerate(read) if e is entry), len(read))
        dropped = read[cut:] + [e.entry for e in events[i + 1:] if isinstance(e, RequestRead)]
        del read[cut:]
        break
    if not patches:
        return ReadOutcome(forward, read, measured, dropped)
    out = bytearray(forward)
    for at, length, patched in sorted(patches, reverse=True):  # the last first: offsets hold
        if len(patched) == length:
            out[at : at + length] = patched
        elif not patched:  # taken out, size prefix and all
            del out[at - 4 : at + length]
        else:
            out[at - 4 : at + length] = len(patched).to_bytes(4, "big") + patched
    return ReadOutcome(out, read, measured, dropped)


class UpstreamSide(asyncio.BufferedProtocol):
    __slots__ = ("conn", "gate", "stream", "transport")

    def __init__(self, conn: ProxiedConnection) -> None:
        self.conn = conn
        self.stream: Any = None  # the StreamWriter an authenticated connection began with
        self.transport: asyncio.Transport | None = None
        self.gate = ReadGate()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, base)
        net = self.conn.ctx.network
        transport.set_write_buffer_limits(net.write_buffer_high_bytes, net.write_buffer_low_bytes)
        self.gate.attach(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read of the broker goes: a short one where a splice follows."""
        conn = self.conn
        lane = conn.response_lane
        if lane is None:
            return _READ_BUFFER
        return _READ_BUFFER[:lane.read_size(conn.responses.in_progress is not None)]

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.upstream_data(_READ_BUFFER[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        self.conn.upstream_data(data)

    def eof_received(self) -> bool | None:
        self.conn.close("upstream_closed")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.close(
            "upstream_closed" if exc is None else "upstream_error", detail=str(exc) if exc else None
        )

    def pause_writing(self) -> None:  # broker is slow: stop reading the client
        self.conn.ctx.stats.backpressure["upstream_slow"] += 1
        self.conn.client_gate.pause("upstream_backpressure")

    def resume_writing(self) -> None:
        conn = self.conn
        if conn.request_lane is not None:
            conn.request_lane.drained()
        conn.client_gate.resume("upstream_backpressure")


# TLS: the TLS layer decrypts into the protocol's own buffer (asyncio's BufferedProtocol), as
# many records as are ready at once, instead of a fresh 256 KiB bytes object per 16 KiB record
# (uvloop's path for plain protocols): about a third less CPU per GB through TLS.
_TLS_READ_BUFFER = 256 * 1024


class _TlsReads:
    """The read buffer of a TLS connection's side (one per side, made at first read)."""

    _read_buffer: memoryview | None

    def get_buffer(self, sizehint: int) -> memoryview:
        buf = self._read_buffer
        if buf is None:
            buf = self._read_buffer = memoryview(bytearray(_TLS_READ_BUFFER))
        return buf

    def _read(self, nbytes: int) -> bytes:
        buf = self._read_buffer
        assert buf is not None
        return bytes(buf[:nbytes])


class TlsProxiedConnection(_TlsReads, ProxiedConnection):
    """A client connection over TLS."""

    _read_buffer: memoryview | None = None

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._read(nbytes))


class TlsUpstreamSide(_TlsReads, UpstreamSide):
    """The upstream side over TLS."""

    __slots__ = ("_read_buffer",)

    def __init__(self, conn: ProxiedConnection) -> None:
        super().__init__(conn)
        self._read_buffer = None

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.upstream_data(self._read(nbytes))
