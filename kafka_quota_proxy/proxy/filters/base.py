"""What a request-path filter is, and the chain a connection resolves once.

A filter is one feature on one connection (identities, quotas, storage throttling, capture,
fetch routing). It defines the hooks it needs; the connection calls each defined hook, filter
by filter in chain order, at fixed points of a request's life:

==========================  ================================================================
``request(entry)``          a request's header was read; it is forwarded next (``entry`` is in
                            the correlation table when it expects a response)
``request_frame(entry,      the whole frame of a request the filter declared an interest in
frame, patchable)``         (``interests``), as the filters before it left it: may return a
                            replacement, of any size (only when ``patchable``)
``request_measured(entry)`` a Produce frame walked as it passed has ended (``partitions`` set)
``response(entry, now_ms,   a response started (``response_size`` known), before any of its
elapsed_ms)``               bytes go to the client; may ``propose_throttle``
``response_frame(entry,     the whole frame of a response the filter declared an interest in
frame)``                    (``RESPONSE_FRAME``), before it is rewritten and sent
``response_done(entry)``    a response has gone to the client whole
``upstream_connected(ok)``  the broker connection was made (or every address failed)
``closed(reason)``          the connection closed (the table still holds what was in flight)
==========================  ================================================================

and three questions the connection asks before reading the client further:
``serial()`` (read one frame at a time now), ``hold(api_key)`` (the next frame waits unread:
the filter resumes reading later) and ``headroom()`` (another request may be read while some
are in flight).

A hook a filter does not define is not called: ``FilterChain`` collects, once per connection,
the bound methods of the filters that override each hook, so the hot path loops over short
tuples (usually of one method, or none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.request_stream import RequestStream
from kafka_quota_proxy.protocol.response_stream import ResponseStream
from kafka_quota_proxy.proxy.flow import ReadGate


class Client:
    """What filters know of the client of one connection; a filter may fill in what the ones
    after it read (fetch routing: the client's rack; identities: the user)."""

    __slots__ = ("client_id", "client_rack", "id", "listener", "peer", "peer_ip", "scope", "user")

    def __init__(self, conn_id: int, listener: str, scope: int, user: str) -> None:
        self.id = conn_id
        self.listener = listener
        # whose quotas apply: the upstream node id, or the bootstrap scope
        self.scope = scope
        self.user = user  # the authenticated principal
        self.client_id: str | None = None  # from the latest request header
        self.client_rack: str | None = None  # set by fetch routing
        self.peer = "?"
        self.peer_ip: str | None = None


def forwarded_unanswered(host: FilterHost) -> list[InFlight]:
    """At close: the requests whose whole frames reached the broker and whose responses never
    came, oldest first. The broker processes them (a Produce's records are written) although
    the client will never read their answers, so their quotas are recorded and captured then,
    as Kafka's request handlers record a request whose client has gone. A frame cut short (its
    end never read from the client, or never sent before the broker connection was dropped)
    reaches the broker truncated and is never processed."""
    entries = [e for e in host.table.entries() if not e.local]
    # the bytes that never left, newest first: the rest of the frame under way, then what is
    # still buffered for the broker (the newest frames' ends)
    unsent = host.requests.frame_remaining + host.unsent_upstream()
    while entries and unsent > 0:
        unsent -= entries.pop().request_size
    return entries


class FilterHost(Protocol):
    """What a filter may use of its connection."""

    client: Client
    client_gate: ReadGate  # reading from the client
    table: CorrelationTable
    requests: RequestStream
    responses: ResponseStream

    def mute(self, throttle_ms: int) -> None:
        """KIP-219: read nothing more from the client until ``throttle_ms`` has passed."""

    def unsent_upstream(self) -> int:
        """Bytes handed over for the broker that have not left for it yet."""

    def close(self, reason: str, *, detail: str | None = None, side: str | None = None) -> None:
        """Close the connection, logged with ``reason`` (nothing more is forwarded)."""

    def refuse(self, entry: InFlight, reason: str, detail: str) -> None:
        """A request (whose whole frame a ``request_frame`` hook was given, or a Produce frame
        a watch followed) that must not go upstream and that the proxy cannot answer: it and
        whatever was read after it are dropped, the requests before it answered, then the
        connection closes, logged with ``reason`` (at once where the frame cannot be cut out:
        part of it went upstream with an earlier read)."""

    def retire(self, f: Filter, hooks: tuple[str, ...]) -> None:
        """``f`` needs these hooks no more on this connection (``FilterChain.retire``)."""

    def resume_interception(self) -> None:
        """The intercepting filter has bytes to go on with (soon, not from inside a hook)."""

    def hold_responses(self, reason: str) -> None:
        """Read no more from the broker until ``release_responses(reason)``: the responses
        wait, in order (an answer the proxy is still making)."""

    def release_responses(self, reason: str) -> None:
        """Lift ``hold_responses(reason)``."""


def propose_throttle(entry: InFlight, throttle_ms: int, by: Any) -> None:
    """A filter's throttle for this response: the largest proposed wins (the first of equals)."""
    if throttle_ms > entry.throttle_ms:
        entry.throttle_ms = throttle_ms
        entry.throttled_by = by


class Filter:
    """Base of request-path filters: every hook does nothing (and is never called)."""

    # Reads the client's bytes before the request stream until it says otherwise (SASL
    # termination: ``intercept``, ``authenticated``, ``rest``); at most one per chain.
    intercepts = False
    # Follows Produce frames as they pass, never held (``watch_produce(api_version)`` makes
    # the watch, ``produce_watched(entry, watch)`` hears of one that named what it watches
    # for or did not parse: the topic guard); at most one per chain.
    watches_produce = False

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        """The frames this filter needs to see (``protocol.interests``); declared per filter
        class, collected once into the proxy's ``InterestTable``."""
        return Interest.NONE

    def watch_produce(self, api_version: int) -> Any:
        """(``watches_produce``) The watch that follows one Produce frame."""
        raise NotImplementedError

    def produce_watched(self, entry: InFlight, watch: Any) -> None:
        """(``watches_produce``) A Produce frame's watch found what it watches for, or the
        frame did not parse."""
        raise NotImplementedError

    def request(self, entry: InFlight) -> None:
        pass

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        return None

    def request_measured(self, entry: InFlight) -> None:
        pass

    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        pass

    def response_frame(self, entry: InFlight, frame: bytes | memoryview) -> None:
        pass

    def response_done(self, entry: InFlight) -> None:
        pass

    def upstream_connected(self, ok: bool) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass

    def serial(self) -> bool:
        return False

    def hold(self, api_key: int | None) -> bool:
        return False

    def headroom(self) -> bool:
        return True


def _defined(filters: list[Filter], hook: str) -> tuple[Any, ...]:
    """The bound ``hook`` of each filter that overrides ``Filter``'s, in order."""
    base = getattr(Filter, hook)
    return tuple(getattr(f, hook) for f in filters if getattr(type(f), hook) is not base)


class FilterChain:
    """The filters of one connection, each hook resolved once to the tuple of bound methods
    of the filters that define it (in chain order)."""

    __slots__ = ("closed", "filters", "headroom", "hold", "request", "request_frame",
                 "request_measured", "response", "response_done", "response_frame", "serial",
                 "upstream_connected")

    def __init__(self, filters: list[Filter]) -> None:
        self.filters = tuple(filters)
        self._resolve(filters)

    def retire(self, f: Filter, hooks: tuple[str, ...]) -> None:
        """Stop calling ``f``'s ``hooks`` (a filter whose work on the per-request path is done:
        identities once the client has authenticated)."""
        for hook in hooks:
            bound = getattr(f, hook)
            setattr(self, hook, tuple(h for h in getattr(self, hook) if h != bound))

    def _resolve(self, filters: list[Filter]) -> None:
        self.request: tuple[Callable[[InFlight], None], ...] = _defined(filters, "request")
        self.request_frame: tuple[Callable[[InFlight, bytes, bool], bytes | None], ...] = (
            _defined(filters, "request_frame"))
        self.request_measured: tuple[Callable[[InFlight], None], ...] = _defined(
            filters, "request_measured")
        self.response: tuple[Callable[[InFlight, int, float], None], ...] = _defined(
            filters, "response")
        self.response_frame: tuple[Callable[[InFlight, bytes | memoryview], None], ...] = (
            _defined(filters, "response_frame"))
        self.response_done: tuple[Callable[[InFlight], None], ...] = _defined(
            filters, "response_done")
        self.upstream_connected: tuple[Callable[[bool], None], ...] = _defined(
            filters, "upstream_connected")
        self.closed: tuple[Callable[[str], None], ...] = _defined(filters, "closed")
        self.serial: tuple[Callable[[], bool], ...] = _defined(filters, "serial")
        self.hold: tuple[Callable[[int | None], bool], ...] = _defined(filters, "hold")
        self.headroom: tuple[Callable[[], bool], ...] = _defined(filters, "headroom")


# Makes one filter of a new connection (each feature's factory is given the connection).
FilterFactory = Callable[[FilterHost], Filter]
