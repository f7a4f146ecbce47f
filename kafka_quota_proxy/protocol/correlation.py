"""Per-connection correlation table: correlation id -> what was asked.

Kafka answers the requests of one connection in order, each response carrying the
request's correlation id; the response alone does not say which API it answers, so the
proxy must remember. Produce with ``acks=0`` gets no response and is never entered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.protocol.errors import CorrelationError

if TYPE_CHECKING:
    from kafka_quota_proxy.protocol.fetch import Chooser
    from kafka_quota_proxy.protocol.incremental import PartitionBytes

# what the quotas recorded for a request: (quota_ms, request_time_ms, produce_throttle_ms,
# fetch_throttle_ms, request_throttle_ms)
Recorded = tuple[int, float, int, int, int]


class InFlight:
    """One request seen on a connection, from its header to its response: what the filters of
    the I/O layer need to carry along (the protocol layer sets the request's and response's
    facts, ``route`` and ``throttle_ms`` are read by the rewriter; the rest it never reads)."""

    __slots__ = (
        "answer",
        "api_key",
        "api_version",
        "client_id",
        "correlation_id",
        "exempt",
        "expects_response",
        "follower",
        "forwarded_at",
        "local",
        "partitions",
        "proxy_ms",
        "recorded",
        "refused",
        "request_size",
        "response_size",
        "route",
        "storage_scale",
        "throttle_ms",
        "throttled_by",
    )

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        client_id: str | None,
        request_size: int,
        expects_response: bool,
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.request_size = request_size
        self.expects_response = expects_response
        self.response_size = 0
        self.throttle_ms = 0  # set by the I/O layer when a quota throttles this request
        self.throttled_by: Any = None  # ... and which (the quota type)
        self.follower = False  # a Fetch from a replica (replica_id >= 0), not a consumer
        # handled by the broker's authenticator, not its request handler (the SASL exchange):
        # never recorded in a quota, never captured
        self.exempt = False
        self.forwarded_at: float = 0.0  # when the request was forwarded (perf_counter seconds)
        # the I/O layer's own time reading and forwarding it (ms; what a request quota charges
        # besides the broker's estimated work: ``quota.request_time``)
        self.proxy_ms = 0.0
        # what the quotas recorded for it (``proxy.features.quotas.filter``)
        self.recorded: Recorded | None = None
        # Fetch: ``protocol.fetch.Chooser`` picking partitions' preferred_read_replica
        self.route: Chooser | None = None
        # Produce: the storage scale in force when the I/O layer read the request
        self.storage_scale: float | None = None
        # Produce when read, Fetch when measured: [(topic, partition, bytes of record batches)]
        self.partitions: PartitionBytes | None = None
        # a request the proxy answers itself (``Interest.ANSWERED``): its response frame
        # (without size prefix); or, set on a response, the frame that replaces the broker's
        self.answer: bytes | None = None
        # answered by the proxy and never forwarded: its answer goes to the client in its
        # place among the broker's responses (``ResponseStream``)
        self.local = False
        # what a filter took out of the request before forwarding it (the topic guard's
        # refused topics), for the rewriter's ``amend`` to put their results in the response
        self.refused: object = None

    def __repr__(self) -> str:
        return (
            f"InFlight(api_key={self.api_key}, api_version={self.api_version}, "
            f"correlation_id={self.correlation_id}, client_id={self.client_id!r})"
        )


class CorrelationTable:
    """The requests awaiting their responses, in the order they were read (the order their
    responses go to the client). ``local``: how many of them the proxy answers itself."""

    __slots__ = ("_by_id", "local")

    def __init__(self) -> None:
        self._by_id: dict[int, InFlight] = {}
        self.local = 0

    def first(self) -> InFlight | None:
        """The request whose response goes to the client next."""
        for entry in self._by_id.values():
            return entry
        return None

    def add(self, entry: InFlight) -> None:
        if entry.correlation_id in self._by_id:
            raise CorrelationError(
                f"correlation id {entry.correlation_id} is already in flight on this connection"
            )
        self._by_id[entry.correlation_id] = entry

    def pop(self, correlation_id: int) -> InFlight:
        try:
            return self._by_id.pop(correlation_id)
        except KeyError:
            raise CorrelationError(
                f"response with correlation id {correlation_id} matches no request in flight"
            ) from None

    def __len__(self) -> int:
        return len(self._by_id)

    def entries(self) -> list[InFlight]:
        return list(self._by_id.values())

    def __contains__(self, correlation_id: int) -> bool:
        return correlation_id in self._by_id
