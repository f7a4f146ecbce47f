"""Connection-creation rate quotas (KIP-612) at accept: the asyncio side of
``quota.connection_rate`` (``docs/connection-rate.md``).

Each accepted connection goes through two steps before the proxy reads a byte of it, as in
Kafka's ``ConnectionQuotas.inc``:

1. **The listener's rate** (``max_connection_creation_rate`` of its listener kind): the
   connection is recorded on the listener (each port is one listener, as one broker's
   listener in Kafka); over the rate it waits, unread, for the throttle time and is then
   served. Connections that arrive meanwhile wait behind it and are recorded in turn when
   their turn comes, as they wait in the backlog while Kafka's acceptor is blocked.
2. **The client address's rate** (``connection_creation_rate`` of its ``ip`` entity, else of
   the ``<default>`` ip entity): over it the connection is never served: it is held open,
   unread and unanswered, for the throttle time, then closed. No proxied connection is made
   for it, so nothing reaches a broker and no upstream connection is opened.

The address is the client's: the source named by the PROXY protocol header on listeners that
take one, else the socket's peer. Plain listeners check at ``connection_made`` (a small
protocol hands the transport over to the proxied connection when it passes); listeners that
read a PROXY header or make a TLS handshake first (``proxy.accept``) check after the header
and before the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.config.schema import ListenerKindConfig, ListenersConfig, QuotasConfig
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.feature import Feature
from kafka_quota_proxy.proxy.logs import RateLimitedLog, get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.connection_rate import (
    ConnectionRates,
    IpConnectionQuotas,
    ListenerCounts,
    address_of,
)
from kafka_quota_proxy.quota.entities import DEFAULT_NAME

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig
    from kafka_quota_proxy.proxy.admission import ConnectionSlots
    from kafka_quota_proxy.proxy.feature import Runtime
    from kafka_quota_proxy.quota.connection_limits import Slot

log = get_logger("kafka_quota_proxy.connection_rate")

CLOSE_REASON = "connection_rate_throttled"
LOG_EVERY_S = 1.0  # throttled and delayed connections are logged at most once a second each


@dataclass(slots=True)
class Admission:
    """One accepted connection on its way through the two steps."""

    listener: str
    kind: str | None  # its listener kind's name (None: the main kind)
    scope: int  # whose quotas apply: the upstream node id, or the bootstrap scope
    recorded: bool = False  # counted on the listener's rate


@dataclass(slots=True)
class _Queue:
    """A listener's connections waiting for its delay to end (Kafka's blocked acceptor)."""

    busy: bool = False
    waiting: deque[tuple[Admission, Callable[[], None], Callable[[], bool]]] = field(
        default_factory=deque)


class ConnectionRateGuard(Feature):
    """The rates of one proxy process, applied to the connections of every listener.

    ``room()``: whether a throttled connection may be held (a file descriptor each); when not,
    it is closed at once (``network.max_connections`` counts held connections)."""

    name = "connection_rates"

    def __init__(self, stats: ProxyStats, clock: Callable[[], int] = now_ms,
                 room: Callable[[], bool] | None = None) -> None:
        self.stats = stats
        self.clock = clock
        self.room = room
        # max_connections and the per-address limits, for plain listeners' connections going
        # through the steps (taken at accept, counted against the address once it passes)
        self.slots: ConnectionSlots | None = None
        self.rates = ConnectionRates()
        self.kind_rates: dict[str | None, int] = {}  # listener kind -> its rate
        self._queues: dict[str, _Queue] = {}
        self._held: dict[int, tuple[asyncio.TimerHandle, Callable[[], None]]] = {}
        self._held_ids = 0
        self._log_throttled = RateLimitedLog(log, "connection_throttled", "warning", LOG_EVERY_S)
        self._log_delayed = RateLimitedLog(log, "connection_delayed", "info", LOG_EVERY_S)

    # ------------------------------------------------------------------ configuration
    def configure(self, quotas: QuotasConfig,
                  kinds: list[tuple[str | None, ListenerKindConfig]] | None = None) -> None:
        """The ip entities of ``quotas`` (the YAML's with the altered ones over them) and
        the listener kinds' rates (None: as they are), applied to the live sensors."""
        self.reconfigure(quotas, self.clock())
        if kinds is not None:
            self.configure_listeners(kinds)

    def configure_listeners(self, kinds: list[tuple[str | None, ListenerKindConfig]]) -> None:
        """The listener kinds' rates (``max_connection_creation_rate``)."""
        self.kind_rates = {name: kind.max_connection_creation_rate for name, kind in kinds
                           if kind.max_connection_creation_rate is not None}

    @property
    def active(self) -> bool:
        """Some connection may be delayed or throttled (else connections skip the steps)."""
        return bool(self.kind_rates) or self.rates.ip_quotas.enabled

    @property
    def held(self) -> int:
        """Throttled connections held open now."""
        return len(self._held)

    def expire(self, now_ms: int) -> int:
        """The address sensors idle for an hour."""
        return self.rates.expire(self.clock())

    def state_entries(self) -> dict[str, int]:
        return {"ip_rate_sensors": len(self.rates.ips)}

    # ------------------------------------------------------------------ the proxy's feature
    @classmethod
    def make(cls, runtime: Runtime) -> ConnectionRateGuard:
        """Held throttled connections keep their place in ``max_connections`` (a file
        descriptor each)."""
        guard = cls(runtime.stats)
        guard.slots = runtime.slots
        guard.configure(runtime.config.quotas, runtime.config.listeners.kinds())
        return guard

    def reload(self, config: ProxyConfig) -> None:
        self.configure_listeners(config.listeners.kinds())

    def reconfigure(self, quotas: QuotasConfig, now_ms: int) -> None:
        window = quotas.window
        self.rates.configure(window.samples, window.size_seconds * 1000, ip_quotas(quotas))

    def draining(self) -> None:
        self.close_all()

    # ------------------------------------------------------------------ the two steps
    def turn(self, admission: Admission, go: Callable[[], None],
             alive: Callable[[], bool]) -> None:
        """Step 1: call ``go`` when the connection has passed its listener's rate: at once,
        or once the delays of the connections ahead of it and its own have passed.
        ``alive()``: whether the connection is still there when its turn comes."""
        if admission.kind not in self.kind_rates:
            go()
            return
        queue = self._queues.get(admission.listener)
        if queue is None:
            queue = self._queues[admission.listener] = _Queue()
        if queue.busy or queue.waiting:
            queue.waiting.append((admission, go, alive))
            return
        self._pass(queue, admission, go, alive)

    async def wait_turn(self, admission: Admission) -> None:
        """``turn`` for a coroutine (a cancelled wait gives up its place)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def go() -> None:
            if not future.done():
                future.set_result(None)

        self.turn(admission, go, lambda: not future.done())
        await future

    def _pass(self, queue: _Queue, admission: Admission, go: Callable[[], None],
              alive: Callable[[], bool]) -> None:
        bound = self.kind_rates.get(admission.kind)
        delay = self.rates.record_listener(admission.listener, bound, self.clock())
        admission.recorded = bound is not None
        if delay <= 0:
            self._go(go, alive)
            return
        queue.busy = True
        self._log_delayed(listener=admission.listener, delay_ms=delay,
                          max_connection_creation_rate=bound)
        asyncio.get_running_loop().call_later(delay / 1000.0, self._release, queue, go, alive)

    def _release(self, queue: _Queue, go: Callable[[], None], alive: Callable[[], bool]
                 ) -> None:
        queue.busy = False
        self._go(go, alive)
        while queue.waiting and not queue.busy:
            admission, go, alive = queue.waiting.popleft()
            if alive():
                self._pass(queue, admission, go, alive)

    @staticmethod
    def _go(go: Callable[[], None], alive: Callable[[], bool]) -> None:
        if not alive():
            return
        try:
            go()
        except Exception as exc:  # one connection failing must not stop the listener's queue
            log.error("connection_admission_failed", error=repr(exc)[:300])

    def admitted(self, admission: Admission, ip: str | None,
                 close: Callable[[], None]) -> bool:
        """Step 2: whether the connection from ``ip`` may be served. When not, it is held
        (unread: the caller reads nothing more of it) and ``close()`` is called once its
        throttle time has passed."""
        throttle = self.rates.record_ip(admission.listener, admission.scope, ip, self.clock(),
                                        listener_recorded=admission.recorded)
        if throttle <= 0:
            return True
        address = address_of(ip)
        assert address is not None  # (only an address can be throttled)
        limit = self.rates.ip_quotas.rate_for(address)
        if self.room is not None and not self.room():
            self._log_throttled(listener=admission.listener, client=ip, throttle_ms=throttle,
                                connection_creation_rate=limit, held=False)
            self._close(close)
            return False
        self._log_throttled(listener=admission.listener, client=ip, throttle_ms=throttle,
                            connection_creation_rate=limit)
        self._held_ids += 1
        key = self._held_ids
        # Kafka closes a throttled socket once its end time is in the past: strictly after it
        deadline = time.monotonic() + (throttle + 1) / 1000.0
        handle = asyncio.get_running_loop().call_later(
            (throttle + 1) / 1000.0, self._release_held, key, deadline)
        self._held[key] = (handle, close)
        return False

    def _release_held(self, key: int, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        held = self._held.get(key)
        if held is None:
            return
        if remaining > 0:  # (the loop's timers run on its cached time, which lags)
            handle = asyncio.get_running_loop().call_later(remaining, self._release_held, key,
                                                           deadline)
            self._held[key] = (handle, held[1])
            return
        del self._held[key]
        self._close(held[1])

    def _close(self, close: Callable[[], None]) -> None:
        self.stats.closed[CLOSE_REASON] += 1
        with contextlib.suppress(OSError):
            close()

    def close_all(self) -> None:
        """Shutting down: the held connections close now."""
        held, self._held = self._held, {}
        for handle, close in held.values():
            handle.cancel()
            self._close(close)

    # ------------------------------------------------------------------ plain listeners
    def protocol_factory(self, listener: str, kind: str | None, scope: int | Callable[[], int],
                         make: Callable[[int], asyncio.BaseProtocol]
                         ) -> Callable[[], asyncio.BaseProtocol]:
        """The protocol factory of a plain listener: ``make(scope)`` itself while no rate
        applies, else a protocol that takes the connection through the steps first.
        ``scope``: the listener's, or what chooses each connection's when it is accepted (the
        bootstrap listener: ``proxy.bootstrap``)."""
        choose = scope if callable(scope) else (lambda: scope)

        def factory() -> asyncio.BaseProtocol:
            chosen = choose()
            if not self.active:
                return make(chosen)
            return _GatedAccept(self, Admission(listener, kind, chosen),
                                lambda: make(chosen))

        return factory

    # ------------------------------------------------------------------ metrics
    def metric_families(self) -> Iterator[Any]:
        counts = sorted(self.rates.counts.items())
        families: tuple[tuple[str, str, Callable[[ListenerCounts], float]], ...] = (
            ("kafka_proxy_connections_ip_throttled",
             "Connections over their client address's connection_creation_rate: held "
             "unanswered, then closed (KIP-612)", lambda c: c.ip_throttled),
            ("kafka_proxy_connections_ip_throttle_seconds",
             "Throttle time of the connections over their address's rate",
             lambda c: c.ip_throttle_ms / 1000.0),
            ("kafka_proxy_connections_listener_delayed",
             "Connections over their listener's max_connection_creation_rate: served late",
             lambda c: c.delayed),
            ("kafka_proxy_connections_listener_delay_seconds",
             "Delay of the connections over their listener's rate",
             lambda c: c.delay_ms / 1000.0),
        )
        for name, doc, value_of in families:
            counter = CounterMetricFamily(name, doc, labels=["listener"])
            for listener, c in counts:
                counter.add_metric([listener], value_of(c))
            yield counter
        now = self.clock()
        rate = GaugeMetricFamily(
            "kafka_proxy_connection_accept_rate",
            "Connections per second a listener with a max_connection_creation_rate accepts "
            "(Kafka connection-accept-rate)", labels=["listener"])
        for listener in sorted(self.rates.listeners):
            measured = self.rates.listener_rate(listener, now)
            if measured is not None:
                rate.add_metric([listener], measured)
        yield rate
        for name, doc, n in (
            ("kafka_proxy_connections_throttled_held",
             "Connections over their address's rate held open now", self.held),
            ("kafka_proxy_ip_connection_rate_sensors",
             "Client addresses whose connection rate is measured (per quota scope)",
             len(self.rates.ips)),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], n)
            yield gauge


def ip_quotas(quotas: QuotasConfig) -> IpConnectionQuotas:
    """The ``ip_entities`` of a quotas section as the sensors use them."""
    return IpConnectionQuotas.of(
        (None if e.ip == DEFAULT_NAME else e.ip, e.connection_creation_rate)
        for e in quotas.ip_entities)


def listeners_without_rates(listeners: ListenersConfig) -> ListenersConfig:
    """``listeners`` with every ``max_connection_creation_rate`` unset: what tells whether a
    reload changed anything else of the listeners (the rates apply live, the rest at the next
    restart)."""
    extra = [k.model_copy(update={"max_connection_creation_rate": None})
             for k in listeners.extra]
    return listeners.model_copy(update={"max_connection_creation_rate": None, "extra": extra})


class _GatedAccept(asyncio.Protocol):
    """A plain listener's connection while it goes through the steps: handed over to the
    proxied connection when it passes (``set_protocol``), else held unread and closed."""

    def __init__(self, guard: ConnectionRateGuard, admission: Admission,
                 make: Callable[[], asyncio.BaseProtocol]) -> None:
        self.guard = guard
        self.admission = admission
        self.make = make
        self.transport: asyncio.Transport | None = None
        self.handed = False
        self._early: list[bytes] | None = []  # None: held (what arrives is dropped)
        self.slot: Slot | None = None

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, base)
        slots = self.guard.slots
        if slots is not None:
            self.slot = slots.take(self.admission.listener)
            if self.slot is None:  # past max_connections: refused at once
                self.handed = True
                transport.abort()
                return
        self.guard.turn(self.admission, self._passed, self._alive)
        if not self.handed:  # waiting or held: read nothing (uvloop starts reading after
            transport.pause_reading()  # this method returns, so pause again just after)
            asyncio.get_running_loop().call_soon(self._pause)

    def _pause(self) -> None:
        transport = self.transport
        if not self.handed and transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _passed(self) -> None:
        transport = self.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        ip = peer[0] if peer else None
        if not self.guard.admitted(self.admission, ip, transport.close):
            self._early = None
            return
        slots, slot = self.guard.slots, self.slot
        self.handed = True
        if slots is not None and slot is not None:
            if not slots.claim(slot, ip, self.admission.listener):
                transport.abort()  # its address holds max_connections_per_ip already
                return
            conn = self.make()
            slots.assign(slot, conn)
        else:
            conn = self.make()
        transport.set_protocol(conn)
        conn.connection_made(transport)
        early, self._early = self._early or [], None
        for data in early:  # read before the pause took hold
            cast(Any, conn).data_received(data)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        return None  # (closes the transport: a connection still waiting is skipped)

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed while waiting or held: its slot goes (once handed over, the proxied
        connection holds it)."""
        if not self.handed and self.slot is not None and self.guard.slots is not None:
            self.guard.slots.release(self.slot)
