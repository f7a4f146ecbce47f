"""One proxied connection: a client socket paired with its own upstream broker socket.

The asyncio protocols here are thin adapters over the sans-IO streams in ``protocol.stream``:
``data_received`` feeds the stream and writes what it returns. Backpressure: when one side's
write buffer passes its high-water mark, reading from the other side pauses until it drains.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from protocol.apis import ApiKey
from protocol.correlation import CorrelationTable, InFlight
from protocol.errors import ProtocolError
from protocol.fetch import ask_for_nothing, parse_fetch_request
from protocol.headers import parse_request_header
from protocol.rewrite import throttle_field
from protocol.stream import RequestStream, ResponseStream
from proxy.flow import ReadGate
from proxy.logs import get_logger
from proxy.quotas import now_ms
from quota.entities import ANONYMOUS, QuotaType
from quota.manager import percent_of_thread
from routing.decide import FetchSession, PartitionKey
from routing.selector import ClientMetadata

if TYPE_CHECKING:
    from proxy.server import Proxy
    from proxy.storage import StorageWatch

log = get_logger("kafka_quota_proxy.connection")

_ids = itertools.count(1)
_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)
_now = time.perf_counter
_clock = time.monotonic
FINISH_LINGER_S = 1.0  # draining: how long to wait for the client to close after our FIN
CLOSE_LINGER_S = 10.0  # how long a closed connection's unsent bytes wait for a slow client
_NO_LIMITS: frozenset[QuotaType] = frozenset()
_FETCHING = object()  # InFlight.reserved of a consumer Fetch of a client with a fetch quota


class ProxiedConnection(asyncio.Protocol):
    """The client-facing protocol; owns the upstream side and the sans-IO state."""

    def __init__(
        self,
        proxy: Proxy,
        listener: str,
        resolve_upstream: Callable[[], list[tuple[str, int]]],
        scope: int,
    ) -> None:
        self.proxy = proxy
        self.listener = listener
        self.scope = scope  # whose quotas apply: the upstream node id, or the bootstrap scope
        # The authenticated principal; ANONYMOUS until the proxy authenticates clients.
        self.user = ANONYMOUS
        self._muted_until = 0.0
        self._unmute: asyncio.TimerHandle | None = None
        self._client_id: str | None = None  # from the latest request header
        self._limits_key: tuple[int, int, str | None] = (-1, -1, None)
        self._limits: frozenset[QuotaType] = frozenset()
        self._fetching = 0  # consumer Fetch requests awaiting their response
        self.id = next(_ids)
        self._resolve_upstream = resolve_upstream
        self.table = CorrelationTable()
        cfg = proxy.config.network
        routing = proxy.routing
        self._routed = routing.enabled and scope >= 0  # a broker's port: fetch routing applies
        capture_produce = proxy.config.capture is not None
        routed = self._routed

        def wanted(e: InFlight) -> bool:
            """Requests read whole on their way upstream: consumer fetches to route."""
            return routing.wants(e.api_key, e.api_version, e.follower)

        # With capture on, produce requests are measured per partition as they pass.
        self.requests = RequestStream(
            self.table, cfg.max_frame_bytes, wanted if routed else None,
            measure_produce=capture_produce)
        self._session = FetchSession()
        self._rack_key: tuple[str, str] | None = None
        self._client_rack: str | None = None
        self._route_key: tuple[Any, ...] | None = None
        self._decisions: dict[PartitionKey, int] = {}
        self.responses = ResponseStream(
            self.table,
            proxy.rewriter,
            cfg.max_frame_bytes,
            proxy.rewriter.rewrite_tail,
            self._on_response,
            measure_fetch=proxy.config.capture is not None,
        )
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamSide | None = None
        self.client_gate = ReadGate()
        self.client_gate.on_resume = self._read_held
        self.peer = "?"
        self._peer_ip: str | None = None
        self.closed = False
        self._early: list[bytes] = []
        self._connect_task: asyncio.Task[None] | None = None
        self._max_in_flight = cfg.max_in_flight_requests
        # For the proxy's sweep (``Proxy._sweep``): when bytes last went either way, and
        # when the frame in progress from the client began (None: between frames).
        self.last_active = _clock()
        self.frame_started: float | None = None
        self._finishing = False  # draining: answered, FIN sent, what comes is discarded

    # ------------------------------------------------------------------ client side
    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)
        if not self.proxy.admit():
            self.closed = True
            transport.abort()
            return
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._peer_ip = peer[0] if peer else None
        net = self.proxy.config.network
        transport.set_write_buffer_limits(net.write_buffer_high_bytes, net.write_buffer_low_bytes)
        self.client_gate.attach(transport)
        self.client_gate.pause("connecting")
        self.proxy.connection_opened(self)
        self._connect_task = asyncio.get_running_loop().create_task(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        errors = []
        timeout = self.proxy.config.upstream.connect_timeout_seconds
        for host, port in self._resolve_upstream():
            try:
                transport, side = await asyncio.wait_for(
                    loop.create_connection(lambda: UpstreamSide(self), host, port), timeout
                )
            except (OSError, TimeoutError) as exc:
                errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            if self.closed:
                transport.close()
                return
            if self._routed:
                self.proxy.routing.set_reachable(self.scope, True)
            # Only now is the upstream where requests go: the bytes read while connecting go
            # first, then what comes after (set when the socket connected, bytes read between
            # that and this line went ahead of the earlier ones: answered out of order).
            self.upstream = side
            if self._early:
                early, self._early = self._early, []
                transport.writelines(early)
            self.client_gate.resume("connecting")
            return
        if self._routed:  # no consumer is sent to this broker for a while
            self.proxy.routing.set_reachable(self.scope, False)
        self.close("upstream_unreachable", detail="; ".join(errors) or "no upstream address known")

    @property
    def _limited(self) -> frozenset[QuotaType]:
        """The quota types limiting this client (empty: read it freely, fully pipelined)."""
        quotas = self.proxy.quotas
        if not quotas.active or self._client_id is None:
            self._limits = _NO_LIMITS
            return _NO_LIMITS
        key = (quotas.generation, quotas.storage_epoch, self._client_id)
        if key != self._limits_key:
            self._limits_key = key
            self._limits = quotas.limits(self.user, self._client_id)
        return self._limits

    def _hold_produce(self, storage: StorageWatch, data: bytes) -> bool:
        """While storage is paused, a produce request is neither read nor forwarded: it waits
        in the proxy, and the client is read no further, until producing may resume (a client
        that closes meanwhile takes it away: nothing reaches the broker twice)."""
        if (self.requests.next_api_key(data) != _PRODUCE
                or storage.exempt(self.user, self._client_id)):
            return False
        self.requests.hold(data)
        storage.park(self)
        return True

    def _headroom(self) -> bool:
        """Whether the next request of a client with a quota may be read while earlier ones
        still await their responses. Kafka reads one request per connection at a time, so
        each response is recorded, and the client throttled, before the next is read. The
        proxy keeps pipelining as long as that cannot matter:
        - produce: while the rate, counting the requests in flight as if already recorded,
          is below the quota (so a queued burst cannot get past the first throttle);
        - fetch: while no consumer Fetch is in flight (its response size is unknown);
        - request time: never (pipelined requests would wait on each other and overcount).
        """
        limits = self._limited
        if QuotaType.REQUEST in limits:
            return False
        if QuotaType.FETCH in limits and self._fetching:
            return False
        if QuotaType.PRODUCE in limits:
            return self.proxy.quotas.manager(self.scope).produce_headroom(
                self.user, self._client_id or "", now_ms())
        return True

    def _may_read_next(self) -> bool:
        n = len(self.table)
        return n == 0 or (n < self._max_in_flight and self._headroom())

    def data_received(self, data: bytes) -> None:
        if self._finishing:  # sent after draining began: never answered (the client saw FIN)
            return
        now = self.last_active = _clock()
        was_mid = self.requests.mid_frame
        storage = self.proxy.storage
        while not self.closed:
            # While storage is paused, frames are read one at a time, so that none slips
            # past ``_hold_produce`` behind another in the same read.
            paused = False
            if storage is not None and storage.paused:
                if self._hold_produce(storage, data):
                    return
                paused = True
            # Frames that may still be read before the bound on requests in flight
            room = self._max_in_flight - len(self.table)
            limited = paused or bool(self._limited) or room <= 1
            try:
                forward, events = self.requests.feed(data, stop_after_frame=limited,
                                                     max_frames=max(room, 1))
            except ProtocolError as exc:
                self.close(exc.reason, detail=str(exc), side="client")
                return
            if self.requests.mid_frame:
                if events or not was_mid:
                    self.frame_started = now
            else:
                self.frame_started = None
            was_mid = self.requests.mid_frame
            self._handle_requests(forward, events)
            if self.requests.mid_frame:  # a frame in progress goes on
                return
            if not limited:
                if not self.requests.held:
                    return
                # the bound on requests in flight stopped this read
                if len(self.table) >= self._max_in_flight:
                    self.client_gate.pause("serial")
                    return
            if not self._may_read_next():  # wait for responses before reading more
                self.client_gate.pause("serial")
                return
            if not self.requests.held or self.client_gate.paused:  # (paused: the held bytes
                return  # wait for the throttle or the backpressure to end)
            data = b""  # go on with the held bytes

    def _read_held(self) -> None:
        """Reading resumed: go on with requests held back while paused."""
        if self.requests.held and self._may_read_next():
            self.data_received(b"")

    def _handle_requests(self, forward: Any, events: list[InFlight]) -> None:
        if self.requests.captured:
            forward = self._read_captured(forward, events)
        if self.requests.measured:
            measured, self.requests.measured = self.requests.measured, []
            for entry in measured:
                if entry.pending is not None:  # acks=0: its record waited for the frame
                    self._capture_completed(entry)
        if events:
            stats = self.proxy.stats
            now = _now()
            self._client_id = events[-1].client_id or ""
            scale = self.proxy.quotas.produce_scale
            for entry in events:
                entry.annotation = now
                key = entry.api_key
                if key == _PRODUCE:
                    entry.storage_scale = scale  # paced by it when recorded (QuotaManager)
                stats.requests[key] += 1
                stats.request_bytes[key] += entry.request_size
                c = stats.client(entry.client_id)
                c[0] += entry.request_size
                c[2] += 1
                if not entry.expects_response:
                    if key == _PRODUCE:
                        self._acks0_produce(entry)
                elif self._limits:
                    self._reserve(entry)
        if forward:
            upstream = self.upstream
            if upstream is None:  # bytes may arrive before pausing takes hold
                self._early.append(bytes(forward))
            else:
                upstream.transport.write(forward)  # type: ignore[union-attr]

    def eof_received(self) -> bool | None:
        self._client_gone(None)
        return None

    # ------------------------------------------------------------------ fetch routing
    def _read_captured(self, forward: Any, events: list[InFlight]) -> Any:
        """Read the consumer fetches captured whole on their way upstream, for routing. A
        fetch that asks the leader for nothing of some partitions is patched in ``forward``
        (same size) when its whole frame is there (else it goes as the client sent it)."""
        captured, self.requests.captured = self.requests.captured, []
        starts: dict[int, int] = {}
        if not (self.requests.mid_frame and not self.requests.buffered):
            # ``forward`` ends with the last frame read: the frames read now end to end
            end = len(forward)
            for event in reversed(events):
                end -= event.request_size
                starts[id(event)] = end + 4
        out: bytearray | None = None
        for entry, frame in captured:
            at = starts.get(id(entry), -1)
            whole = at >= 4 and forward[at : at + len(frame)] == frame
            patched = self._route_fetch(entry, frame, whole)
            if patched is not None:
                if out is None:
                    out = bytearray(forward)
                out[at : at + len(patched)] = patched
        return forward if out is None else out

    def _route_fetch(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        """Where the replica selector sends partitions of this consumer's fetch session
        elsewhere, have the response rewritten, and (``patchable``) return the request to
        forward instead, asking the leader for nothing of them (see ``proxy.routing``)."""
        routing = self.proxy.routing
        try:
            header = parse_request_header(frame, 0, len(frame))
            summary = parse_fetch_request(frame, header.size, entry.api_version)
        except (IndexError, ValueError, struct.error):
            routing.unparsed_requests += 1
            return None
        if not summary.from_consumer:  # Fetch v15+ carries the replica id in a tag
            entry.follower = True
            return None
        cid = entry.client_id or ""
        rack_key = (summary.rack_id, cid)
        if rack_key != self._rack_key:
            self._rack_key = rack_key
            self._client_rack = routing.client_rack(summary, cid, self._peer_ip)
        session = self._session
        session.update(summary.session_epoch, summary.topics, summary.forgotten)
        key = (routing.generation, self._client_rack, session.version, cid, self.user)
        if key != self._route_key:
            self._route_key = key
            client = ClientMetadata(self._client_rack, cid, self.peer, self.user)
            self._decisions = routing.decide(self.scope, client, session)
        plan = routing.plan(cid, self._decisions, summary, session) if patchable else None
        if plan is None:
            if self._decisions:
                entry.route = routing.chooser(cid, self._decisions)
            return None
        if plan.redirect:
            entry.route = routing.chooser(cid, self._decisions, plan)
        if not plan.patches:
            return None
        session.forwarded(summary.session_epoch, plan)
        return ask_for_nothing(frame, summary, entry.api_version, plan.redirect,
                               idle=plan.idle, close_session=plan.close_session)

    # ------------------------------------------------------------------ quotas
    def _reserve(self, entry: InFlight) -> None:
        """A request of a client with a quota goes upstream: note what it holds until its
        response (see ``_headroom``)."""
        if entry.api_key == _PRODUCE:
            if QuotaType.PRODUCE in self._limits:
                sensor = self.proxy.quotas.manager(self.scope).sensor(
                    QuotaType.PRODUCE, self.user, entry.client_id or "", now_ms())
                sensor.in_flight += entry.request_size - 4
                entry.reserved = sensor
        elif entry.api_key == _FETCH and not entry.follower:
            self._fetching += 1
            entry.reserved = _FETCHING

    def _release(self, entry: InFlight) -> None:
        held, entry.reserved = entry.reserved, None
        if held is _FETCHING:
            self._fetching -= 1
        elif held is not None:
            held.in_flight -= entry.request_size - 4

    def _acks0_produce(self, entry: InFlight) -> None:
        """acks=0: no response to throttle, but the client is still held back (and its
        request time is exempt, as in Kafka)."""
        quotas = self.proxy.quotas
        throttle = 0
        now = now_ms()
        if quotas.enabled(QuotaType.PRODUCE):
            throttle = quotas.manager(self.scope).record(
                QuotaType.PRODUCE, self.user, entry.client_id or "", entry.request_size - 4,
                now)
            if throttle > 0:
                self.proxy.stats.throttled[QuotaType.PRODUCE.short] += 1
                self.proxy.stats.throttle_ms[QuotaType.PRODUCE.short] += throttle
                self.mute(throttle)
        if self.proxy.capture is not None:
            self._capture(entry, now, -1, 0.0, throttle, 0, 0)

    def _on_response(self, entry: InFlight) -> bool:
        """Record this response's quotas; throttle the client if one is violated. Returns
        whether the response goes through the rewriter (to set ``throttle_time_ms`` or
        ``preferred_read_replica``)."""
        if entry.reserved is not None:
            self._release(entry)
        routed = entry.route is not None  # the rewriter sets preferred_read_replica
        quotas = self.proxy.quotas
        capture = self.proxy.capture
        if not quotas.active and capture is None:
            return routed
        key = entry.api_key
        cid = entry.client_id or ""
        now = now_ms()
        elapsed_ms = (_now() - entry.annotation) * 1000.0
        manager = quotas.manager(self.scope) if quotas.active else None
        byte_throttle = request_throttle = 0
        kind = None
        request_time = 0.0
        if manager is not None:
            if key == _PRODUCE and quotas.enabled(QuotaType.PRODUCE):
                kind = QuotaType.PRODUCE
                byte_throttle = manager.record(kind, self.user, cid, entry.request_size - 4, now,
                                               entry.storage_scale)
            elif key == _FETCH and not entry.follower and quotas.enabled(QuotaType.FETCH):
                kind = QuotaType.FETCH
                byte_throttle = manager.record(kind, self.user, cid, entry.response_size - 4,
                                               now)
            if quotas.enabled(QuotaType.REQUEST) and not entry.follower:
                # Request time: proxy processing plus the upstream round trip (the proxy
                # cannot see broker thread time), as a percentage of one thread.
                request_time = elapsed_ms
                request_throttle = manager.record(
                    QuotaType.REQUEST, self.user, cid, percent_of_thread(elapsed_ms), now)
        if capture is not None:
            self._capture(entry, now, elapsed_ms, request_time,
                          byte_throttle if key == _PRODUCE else 0,
                          byte_throttle if key == _FETCH else 0, request_throttle)
        throttle = byte_throttle
        if request_throttle > throttle:
            throttle, kind = request_throttle, QuotaType.REQUEST
        storage = self.proxy.storage
        if (key == _PRODUCE and storage is not None and storage.paused
                and storage.pause_ms > throttle and not storage.exempt(self.user, cid)):
            throttle, kind = storage.pause_ms, QuotaType.PRODUCE  # back off while paused
        if throttle <= 0 or kind is None:
            return routed
        entry.throttle_ms = throttle
        self.proxy.stats.throttled[kind.short] += 1
        self.proxy.stats.throttle_ms[kind.short] += throttle
        self.mute(throttle)
        return routed or throttle_field(key, entry.api_version) is not None

    def _capture(self, entry: InFlight, quota_ms: int, elapsed_ms: float, request_time: float,
                 produce_ms: int, fetch_ms: int, request_ms: int) -> None:
        """One capture record (``proxy.capture.FIELDS`` order). A Fetch's waits on
        ``entry.pending`` for its response to complete (the stream measures its partitions on
        the way), and an acks=0 Produce's for the rest of its frame (read for its partitions):
        its sequence number is taken now, in the order the quotas recorded."""
        capture = self.proxy.capture
        assert capture is not None
        answered = elapsed_ms >= 0
        wall = time.time() * 1000.0 - (_now() - entry.annotation) * 1000.0
        row = (
            capture.run, capture.next_seq(), int(wall), quota_ms, self.id, self.scope, self.user,
            entry.client_id or "", self._peer_ip or "", entry.api_key, entry.api_version,
            entry.request_size, entry.response_size if answered else -1,
            int(elapsed_ms * 1000) if answered else -1, request_time, entry.follower,
            produce_ms, fetch_ms, request_ms, self._client_rack,
            self.proxy.quotas.generation,
            entry.storage_scale if entry.api_key == _PRODUCE else self.proxy.quotas.produce_scale,
            _partition_rows(entry.partitions),
        )
        if (entry.api_key == _FETCH and answered) or entry is self.requests.measuring:
            entry.pending = row
        else:
            capture.record(row)

    def _capture_completed(self, entry: InFlight) -> None:
        """The capture record of a Fetch whose response has completed, or of an acks=0
        Produce whose frame has (or of either, cut short)."""
        row, entry.pending = entry.pending, None
        capture = self.proxy.capture
        assert capture is not None
        capture.record((*row[:-1], _partition_rows(entry.partitions)))

    def mute(self, throttle_ms: int) -> None:
        """KIP-219: read nothing more from this client until the throttle time has passed."""
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
        if self.requests.mid_frame:
            self.close(
                "truncated_frame",
                side="client",
                detail="client closed the connection in the middle of a frame",
            )
        elif exc is not None:
            self.close("client_error", detail=str(exc))
        else:
            self.close("client_closed")

    def pause_writing(self) -> None:  # client is slow: stop reading the broker
        self.proxy.stats.backpressure["client_slow"] += 1
        if self.upstream is not None:
            self.upstream.gate.pause("client_backpressure")

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.gate.resume("client_backpressure")

    # ------------------------------------------------------------------ responses
    def upstream_data(self, data: bytes) -> None:
        self.last_active = _clock()
        try:
            segments, done = self.responses.feed(data)
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
            stats = self.proxy.stats
            now = _now()
            for entry in done:
                key = entry.api_key
                stats.response_bytes[key] += entry.response_size
                stats.client(entry.client_id)[1] += entry.response_size
                stats.observe_latency(key, now - entry.annotation)
                if key == _FETCH:
                    if self._routed and not entry.follower:
                        self.proxy.routing.count_fetch(self._client_rack, self.scope,
                                                       entry.response_size)
                    if entry.pending is not None:
                        self._capture_completed(entry)
            if self.client_gate.has("serial") and self._may_read_next():
                self.client_gate.resume("serial")  # reads held requests unless still muted
            if self.proxy.draining and not self.table:
                self.finish()

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
        if self.proxy.storage is not None:
            self.proxy.storage.unpark(self)  # a waiting produce request goes with the client
        if self._routed and self.table and reason in ("upstream_closed", "upstream_error"):
            # A broker does not drop connections with requests in flight unless it is going
            # away: send no consumer to it for a while.
            self.proxy.routing.set_reachable(self.scope, False)
        fields: dict[str, Any] = {
            "connection": self.id,
            "listener": self.listener,
            "client": self.peer,
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
        for cut_short in (self.responses.in_progress, self.requests.measuring):
            if cut_short is not None and cut_short.pending is not None:
                cut_short.partitions = None
                self._capture_completed(cut_short)
        for entry in self.table.entries():
            if entry.reserved is not None:
                self._release(entry)
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
        self.proxy.connection_closed(self, reason)


def _partition_rows(partitions: Any) -> list[tuple[str, int, int]] | None:
    if not partitions:
        return None
    return [(t if isinstance(t, str) else t.hex(), p, n) for t, p, n in partitions]


class UpstreamSide(asyncio.Protocol):
    __slots__ = ("conn", "gate", "transport")

    def __init__(self, conn: ProxiedConnection) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.gate = ReadGate()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, base)
        net = self.conn.proxy.config.network
        transport.set_write_buffer_limits(net.write_buffer_high_bytes, net.write_buffer_low_bytes)
        self.gate.attach(transport)

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
        self.conn.proxy.stats.backpressure["upstream_slow"] += 1
        self.conn.client_gate.pause("upstream_backpressure")

    def resume_writing(self) -> None:
        self.conn.client_gate.resume("upstream_backpressure")
