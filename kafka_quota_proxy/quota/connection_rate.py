"""Kafka's connection-creation rate quotas (KIP-612), as ``ConnectionQuotas`` in Kafka's
``SocketServer`` applies them when a connection is accepted. Pure: time comes in as an
argument (milliseconds); the caller holds, delays and closes the connections.

Two rates, each a Kafka sensor with one ``Rate`` stat over the quota window
(``quota.window.num`` x ``quota.window.size.seconds``: the proxy's ``quotas.window``) and an
upper bound, so a connection is a violation when the rate measured right after recording it is
above the limit. The throttle time is ``QuotaUtils.boundedThrottleTime``:
``min(round((rate - limit) / limit * W), one window)``, with ``W`` as ``Rate.windowSize``
measures it (a young sensor divides by at least ``samples - 1`` windows).

- **Listener** (``max_connection_creation_rate`` of a listener): ``record_listener`` records
  every connection accepted on it; a violation *delays* the connection by the throttle time
  (Kafka's acceptor blocks; the connection is then served). The caller passes the bound, and
  records nothing when the listener has none.
- **IP** (``connection_creation_rate`` of an ``ip`` entity, else of the ``<default>`` ip
  entity): ``record_ip`` records the connection on its address's sensor, one per quota scope
  and address, dropped after an hour without a record. Off for an address whose rate is
  ``2147483647`` (Kafka's ``IP_CONNECTION_RATE_DEFAULT``, also what an address without any ip
  entity gets). A violation un-records the connection from the address's and the listener's
  sensors and returns the throttle time: the caller keeps the connection open, unread and
  unanswered, for that long, then closes it.

Counts per listener (connections throttled or delayed, and their throttle times) are kept for
the metrics, as Kafka's ``ip-connection-accept-throttle-time`` and
``connection-accept-throttle-time`` sensors.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.throttle import throttle_time_ms

# Integer.MAX_VALUE: QuotaConfig.IP_CONNECTION_RATE_DEFAULT, the rate that turns the quota off
IP_CONNECTION_RATE_DEFAULT: Final = 2147483647
# ConnectionQuotas' IP sensors expire after an hour without a record
IP_SENSOR_EXPIRY_MS: Final = 3600 * 1000
# At most this many IP sensors (Kafka has no bound): past it, the tenth least recently used
# are dropped (those addresses start afresh), so a client with many addresses (an IPv6
# prefix) cannot grow the proxy's memory without end. About 130 MB at the bound (some 670
# bytes a sensor).
MAX_IP_SENSORS: Final = 200_000

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_of(name: str | None) -> Address | None:
    """The address a client or an ip entity names (as Java's ``InetAddress`` holds it: an
    IPv4-mapped IPv6 address is the IPv4 address); None for anything but an IP literal."""
    if not name:
        return None
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class IpConnectionQuotas:
    """``connection_creation_rate`` of the ``ip`` entities: per address, and the default
    (the ``<default>`` ip entity; None when there is none)."""

    rates: Mapping[Address, int] = field(default_factory=dict)
    default: int | None = None

    @classmethod
    def of(cls, entities: Iterable[tuple[str | None, float]]) -> IpConnectionQuotas:
        """From ``(ip entity name, connection_creation_rate)`` pairs, name None for the default
        entity; a later pair for the same address wins (as Kafka's last update does)."""
        rates: dict[Address, int] = {}
        default: int | None = None
        for name, rate in entities:
            if name is None:
                default = int(rate)
                continue
            address = address_of(name)
            if address is not None:
                rates[address] = int(rate)
        return cls(rates, default)

    def rate_for(self, address: Address) -> int:
        """``connectionRateForIp``: the address's own rate, else the default, else
        ``IP_CONNECTION_RATE_DEFAULT`` (no quota)."""
        rate = self.rates.get(address)
        if rate is not None:
            return rate
        return self.default if self.default is not None else IP_CONNECTION_RATE_DEFAULT

    @property
    def enabled(self) -> bool:
        """Some address may have a quota."""
        return (self.default is not None and self.default != IP_CONNECTION_RATE_DEFAULT) or any(
            r != IP_CONNECTION_RATE_DEFAULT for r in self.rates.values())


class RateSensor:
    """A Kafka sensor with one ``Rate`` stat: ``record(1.0, now)`` with the quota checked
    after recording (``Sensor.record``), ``record(-1.0, now, false)`` to take it back."""

    __slots__ = ("last_record_ms", "rate")

    def __init__(self, samples: int, window_ms: int, now_ms: int) -> None:
        self.rate = SampledRate(samples, window_ms)
        self.last_record_ms = now_ms

    def record_and_throttle(self, bound: float, now_ms: int, cap_ms: int) -> int:
        """Record one connection; the throttle time if the rate is now above ``bound``."""
        observed, window = self.rate.record_and_measure(1.0, now_ms)
        self.last_record_ms = now_ms
        return throttle_time_ms(observed, bound, window, cap_ms)

    def unrecord(self, now_ms: int) -> None:
        self.rate.record(-1.0, now_ms)
        self.last_record_ms = now_ms

    def measure(self, now_ms: int) -> float:
        return self.rate.measure(now_ms)[0]


@dataclass
class ListenerCounts:
    """What a listener's connections met (the metrics' counters)."""

    ip_throttled: int = 0  # over their address's rate: held, then closed
    ip_throttle_ms: int = 0
    delayed: int = 0  # over the listener's rate: served late
    delay_ms: int = 0


class ConnectionRates:
    """The sensors of one process: per listener, and per (scope, address)."""

    def __init__(self, samples: int = 11, window_ms: int = 1000,
                 ip_quotas: IpConnectionQuotas | None = None) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self.ip_quotas = ip_quotas or IpConnectionQuotas()
        self.listeners: dict[str, RateSensor] = {}
        self.ips: dict[tuple[int, Address], RateSensor] = {}
        self.max_ip_sensors = MAX_IP_SENSORS
        self.evicted = 0  # times the IP sensors were full
        self.counts: dict[str, ListenerCounts] = {}

    def configure(self, samples: int, window_ms: int, ip_quotas: IpConnectionQuotas) -> None:
        """New quotas apply to the live sensors (Kafka updates their quota in place); a new
        window starts the sensors afresh."""
        if (samples, window_ms) != (self.samples, self.window_ms):
            self.samples, self.window_ms = samples, window_ms
            self.listeners.clear()
            self.ips.clear()
        self.ip_quotas = ip_quotas

    @property
    def max_throttle_ms(self) -> int:
        """``maxThrottleTimeMs``: one quota window."""
        return self.window_ms

    def _counts(self, listener: str) -> ListenerCounts:
        counts = self.counts.get(listener)
        if counts is None:
            counts = self.counts[listener] = ListenerCounts()
        return counts

    def record_listener(self, listener: str, bound: float | None, now_ms: int) -> int:
        """A connection accepted on ``listener``, whose ``max_connection_creation_rate`` is
        ``bound`` (None: no limit, nothing recorded): how long to delay it before serving
        (0: at once)."""
        if bound is None:
            return 0
        sensor = self.listeners.get(listener)
        if sensor is None:
            sensor = self.listeners[listener] = RateSensor(self.samples, self.window_ms, now_ms)
        delay = sensor.record_and_throttle(bound, now_ms, self.max_throttle_ms)
        if delay > 0:
            counts = self._counts(listener)
            counts.delayed += 1
            counts.delay_ms += delay
        return delay

    def record_ip(self, listener: str, scope: int, ip: str | None, now_ms: int, *,
                  listener_recorded: bool = False) -> int:
        """A connection from ``ip`` to a listener of ``scope`` (after the listener's delay,
        if any; ``listener_recorded``: ``record_listener`` counted it): 0 when it may be
        served, else the throttle time it is held for before being closed. A throttled
        connection is not counted in either rate."""
        address = address_of(ip)
        if address is None:
            return 0
        bound = self.ip_quotas.rate_for(address)
        if bound == IP_CONNECTION_RATE_DEFAULT:
            return 0
        key = (scope, address)
        sensor = self.ips.get(key)
        if sensor is None:
            if len(self.ips) >= self.max_ip_sensors:
                self._evict(now_ms)
            sensor = self.ips[key] = RateSensor(self.samples, self.window_ms, now_ms)
        throttle = sensor.record_and_throttle(bound, now_ms, self.max_throttle_ms)
        if throttle <= 0:
            return 0
        sensor.unrecord(now_ms)
        if listener_recorded:
            on_listener = self.listeners.get(listener)
            if on_listener is not None:
                on_listener.unrecord(now_ms)
        counts = self._counts(listener)
        counts.ip_throttled += 1
        counts.ip_throttle_ms += throttle
        return throttle

    def _evict(self, now_ms: int) -> None:
        """Full: the idle sensors go, and if that is not a tenth, the least recently used."""
        self.expire(now_ms)
        excess = len(self.ips) - self.max_ip_sensors * 9 // 10
        if excess > 0:
            by_age = sorted(self.ips.items(), key=lambda kv: kv[1].last_record_ms)
            for k, _ in by_age[:excess]:
                del self.ips[k]
        self.evicted += 1

    def expire(self, now_ms: int) -> int:
        """Drop the IP sensors without a record for an hour; return how many."""
        idle = [k for k, s in self.ips.items()
                if now_ms - s.last_record_ms > IP_SENSOR_EXPIRY_MS]
        for k in idle:
            del self.ips[k]
        return len(idle)

    def listener_rate(self, listener: str, now_ms: int) -> float | None:
        """Kafka's ``connection-accept-rate`` of a listener with a limit (a pure read)."""
        sensor = self.listeners.get(listener)
        return None if sensor is None else sensor.measure(now_ms)
