"""What one request costs a request quota (``request_percentage``).

Kafka (KIP-124) charges a request the time it occupies the broker's threads: the network
thread that reads and writes it and the request handler (I/O) thread that executes it. It
never charges the time a request waits: a Fetch parked in purgatory for ``max_wait_ms``, a
JoinGroup waiting for the group to form, a Produce with ``acks=all`` waiting on replication,
or the throttle itself. The broker's threads are out of the proxy's sight, and the time between
forwarding a request and its response is mostly such waiting, so the proxy charges:

    request time = the proxy's own event-loop time reading and forwarding the request
                 + an estimate of the broker's thread time from the request's sizes:
                   ``base_us`` per request + ``per_kib_us`` per KiB of request and response.

Both terms are work, neither is waiting: an idle consumer's long polls and a group join cost
microseconds however long they wait, a client flooding cheap requests pays for each one, and
bytes cost what moving them costs. Pure: no clock (the proxy measures its own time and passes
it in), shared by the live proxy and every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

# Defaults: the cheapest requests (ApiVersions, Metadata of a few topics, a heartbeat) take tens
# of microseconds of a broker's network and handler threads; a broker thread appends or reads
# record batches at about 1 GB/s (CRC checks, copying, the socket), so about 1 us per KiB.
DEFAULT_BASE_US = 50.0
DEFAULT_PER_KIB_US = 1.0
# The least an answered request is charged: 1 ns, the unit a request quota records in. A
# capture's ``request_time_ms`` of 0 reads as "not recorded" (captures before schema v3, where
# the replays estimate the charge with the model they replay under); with ``base_us`` and
# ``per_kib_us`` both 0 and no proxy time measured, the charge would be exactly 0 and read so,
# and a replay under another model would charge what the live engine (and a shadow) did not.
MIN_CHARGE_MS = 1e-6


@dataclass(frozen=True, slots=True)
class RequestTimeModel:
    """How a request's thread time is estimated (``quotas.request_time``)."""

    base_us: float = DEFAULT_BASE_US
    per_kib_us: float = DEFAULT_PER_KIB_US

    def broker_ms(self, request_bytes: int, response_bytes: int) -> float:
        """The estimate of the broker's thread time for a request of these sizes (frames with
        their size prefixes; ``response_bytes`` < 0: no response)."""
        moved = request_bytes + (response_bytes if response_bytes > 0 else 0)
        return (self.base_us + self.per_kib_us * moved / 1024.0) / 1000.0

    def charge_ms(self, request_bytes: int, response_bytes: int, proxy_ms: float) -> float:
        """What the request quota records for a request, in ms of one thread (at least
        ``MIN_CHARGE_MS``)."""
        charge = proxy_ms + self.broker_ms(request_bytes, response_bytes)
        return charge if charge >= MIN_CHARGE_MS else MIN_CHARGE_MS
