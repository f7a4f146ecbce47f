"""How many client connections may be open at once: ``network.max_connections`` over every
listener, and per client address ``network.max_connections_per_ip`` with
``max_connections_per_ip_overrides`` (Kafka's ``max.connections.per.ip`` and
``max.connections.per.ip.overrides``).

As in Kafka's ``ConnectionQuotas.inc``, a connection counts against its address from the moment
the address is known until it closes, and a new one from an address that already holds its
limit is refused (Kafka closes it at once with ``TooManyConnectionsException``): the limit N
lets N connections through, the N+1th is refused. An override names an address (IPv4 or IPv6;
an IPv4-mapped IPv6 address is the IPv4 one, as Java's ``InetAddress`` holds it) and replaces
the default for it; 0 refuses every connection from it.

Sans-IO: the proxy calls ``take`` when it accepts a socket, ``claim`` once the client address is
known (the PROXY header's source where the listener takes one), ``release`` when the socket
closes, whatever stage it reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kafka_quota_proxy.quota.connection_rate import Address, address_of

MAX_INT = 2147483647  # Kafka's default max.connections.per.ip: no limit


class Slot:
    """One accepted connection's place: counted in the total from ``take``, against its
    address from ``claim``, until ``release``."""

    __slots__ = ("address", "owner", "released")

    def __init__(self) -> None:
        self.address: Address | None = None
        self.owner: object | None = None  # what closes it (the proxied connection)
        self.released = False


class ConnectionLimits:
    def __init__(self, max_connections: int, per_ip: int = MAX_INT,
                 overrides: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        self.max_connections = max_connections
        self.per_ip = per_ip
        items = overrides.items() if isinstance(overrides, Mapping) else overrides
        self.overrides: dict[Address, int] = {}
        for name, count in items:
            address = address_of(name)
            if address is None:
                raise ValueError(f"{name!r} is not an IP address")
            self.overrides[address] = count
        self.total = 0  # slots taken: connections at any stage
        self.counts: dict[Address, int] = {}  # per address, those that claimed it

    @property
    def limits_addresses(self) -> bool:
        """Some address may be refused (else ``claim`` always succeeds)."""
        return self.per_ip < MAX_INT or any(n < MAX_INT for n in self.overrides.values())

    def limit_for(self, address: Address) -> int:
        return self.overrides.get(address, self.per_ip)

    def take(self) -> Slot | None:
        """A slot for a socket just accepted, or None past ``max_connections``."""
        if self.total >= self.max_connections:
            return None
        self.total += 1
        return Slot()

    def claim(self, slot: Slot, ip: str | None) -> int | None:
        """Count ``slot`` against the address ``ip`` (a connection without an IP address, a
        Unix socket, counts against none). None when it may stay; else the address's limit,
        and ``slot`` is released: the connection is refused."""
        address = address_of(ip)
        if address is None or slot.released or slot.address is not None:
            return None
        count = self.counts.get(address, 0)
        limit = self.limit_for(address)
        if count >= limit:
            self.release(slot)
            return limit
        self.counts[address] = count + 1
        slot.address = address
        return None

    def release(self, slot: Slot) -> None:
        """The connection closed (a second call does nothing)."""
        if slot.released:
            return
        slot.released = True
        self.total -= 1
        address = slot.address
        if address is not None:
            left = self.counts[address] - 1
            if left:
                self.counts[address] = left
            else:
                del self.counts[address]
