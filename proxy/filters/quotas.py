"""Client quotas on the request path (KIP-13, KIP-124, KIP-219): each request is recorded into
its budgets when its response starts, the response carries the throttle time, and the client is
read no further until it has passed.

Kafka reads one request per connection at a time, so each response is recorded, and the client
throttled, before the next request is read. The proxy keeps pipelining as long as that cannot
matter (``headroom``), and reads a limited client one frame at a time (``serial``).
"""

from __future__ import annotations

from protocol.apis import ApiKey
from protocol.correlation import InFlight
from proxy.clock import now_ms as _now_ms
from proxy.filters.base import Filter, FilterHost, propose_throttle
from proxy.metrics import ProxyStats
from quota.enforcer import QuotaEnforcer
from quota.entities import QuotaType
from quota.recording import record_request

_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)
_NO_LIMITS: frozenset[QuotaType] = frozenset()
_FETCHING = object()  # InFlight.quota_reservation of a consumer Fetch of a client with a quota


class QuotaFilter(Filter):
    """One connection's quotas. ``entry.recorded`` holds what was recorded for a request (when
    quotas are active): ``(quota_ms, request_time_ms, produce_throttle_ms, fetch_throttle_ms,
    request_throttle_ms)``, what the capture writes."""

    def __init__(self, host: FilterHost, quotas: QuotaEnforcer, stats: ProxyStats) -> None:
        self.host = host
        self.client = host.client
        self.quotas = quotas
        self.stats = stats
        self._limits_key: tuple[int, int, str | None, str] = (-1, -1, None, "")
        self._limits: frozenset[QuotaType] = _NO_LIMITS
        self._fetching = 0  # consumer Fetch requests awaiting their response

    # ------------------------------------------------------------------ reading
    @property
    def limited(self) -> frozenset[QuotaType]:
        """The quota types limiting this client (empty: read it freely, fully pipelined)."""
        quotas = self.quotas
        client_id = self.client.client_id
        if not quotas.active or client_id is None:
            self._limits = _NO_LIMITS
            return _NO_LIMITS
        key = (quotas.generation, quotas.storage_epoch, client_id, self.client.user)
        if key != self._limits_key:  # (the user changes when a client authenticates)
            self._limits_key = key
            self._limits = quotas.limits(self.client.user, client_id)
        return self._limits

    def serial(self) -> bool:
        return bool(self.limited)

    def headroom(self) -> bool:
        """Whether the next request of a client with a quota may be read while earlier ones
        still await their responses:
        - produce: while the rate, counting the requests in flight as if already recorded,
          is below the quota (so a queued burst cannot get past the first throttle);
        - fetch: while no consumer Fetch is in flight (its response size is unknown);
        - request time: never (as a Kafka broker, which reads one request per connection at
          a time: each throttle lands before the next request is read).
        """
        limits = self.limited
        if QuotaType.REQUEST in limits:
            return False
        if QuotaType.FETCH in limits and self._fetching:
            return False
        if QuotaType.PRODUCE in limits:
            client = self.client
            return self.quotas.manager(client.scope).produce_headroom(
                client.user, client.client_id or "", _now_ms())
        return True

    # ------------------------------------------------------------------ requests
    def request(self, entry: InFlight) -> None:
        key = entry.api_key
        if key == _PRODUCE:
            entry.storage_scale = self.quotas.produce_scale  # paced by it when recorded
        if not entry.expects_response:
            if key == _PRODUCE:
                self._acks0_produce(entry)
        elif self._limits:
            self._reserve(entry)

    def _reserve(self, entry: InFlight) -> None:
        """A request of a client with a quota goes upstream: note what it holds until its
        response (see ``headroom``)."""
        if entry.api_key == _PRODUCE:
            if QuotaType.PRODUCE in self._limits:
                client = self.client
                sensor = self.quotas.manager(client.scope).sensor(
                    QuotaType.PRODUCE, client.user, entry.client_id or "", _now_ms())
                sensor.in_flight += entry.request_size - 4
                entry.quota_reservation = sensor
        elif entry.api_key == _FETCH:  # (a client posing as a follower is no exception)
            self._fetching += 1
            entry.quota_reservation = _FETCHING

    def _release(self, entry: InFlight) -> None:
        held, entry.quota_reservation = entry.quota_reservation, None
        if held is _FETCHING:
            self._fetching -= 1
        elif held is not None:
            held.in_flight -= entry.request_size - 4

    def _acks0_produce(self, entry: InFlight) -> None:
        """acks=0: no response to throttle, but the client is still held back (and its
        request time is exempt, as in Kafka)."""
        quotas = self.quotas
        now = _now_ms()
        throttle = 0
        if quotas.enabled(QuotaType.PRODUCE):
            client = self.client
            throttle = record_request(
                quotas.manager(client.scope), client.user, entry.client_id or "", _PRODUCE,
                entry.request_size, -1, False, 0.0, now, entry.storage_scale, True, False,
                False)[0]
            if throttle > 0:
                self.stats.throttled[QuotaType.PRODUCE.short] += 1
                self.stats.throttle_ms[QuotaType.PRODUCE.short] += throttle
                self.host.mute(throttle)
        entry.recorded = (now, 0.0, throttle, 0, 0)

    # ------------------------------------------------------------------ responses
    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        """Record this response's quotas (``quota.recording``, the rule the replays use);
        propose the throttle if one is violated."""
        if entry.quota_reservation is not None:
            self._release(entry)
        quotas = self.quotas
        if not quotas.active or entry.exempt:  # (Kafka's authenticator records nothing)
            return
        client = self.client
        # the request's work, never its waiting (``quota.request_time``). Followers' fetches
        # (exempt in Kafka) never come through the proxy's listeners: a Fetch with a replica
        # id is a client's, answered by the topic guard, and recorded as any other.
        request_time = quotas.request_time_ms(
            entry.request_size, entry.response_size, entry.proxy_ms)
        produce, fetch, request = record_request(
            quotas.manager(client.scope), client.user, entry.client_id or "", entry.api_key,
            entry.request_size, entry.response_size, False, request_time, now_ms,
            entry.storage_scale, quotas.enabled(QuotaType.PRODUCE),
            quotas.enabled(QuotaType.FETCH), quotas.enabled(QuotaType.REQUEST))
        entry.recorded = (now_ms, request_time, produce, fetch, request)
        if produce:
            propose_throttle(entry, produce, QuotaType.PRODUCE)
        elif fetch:
            propose_throttle(entry, fetch, QuotaType.FETCH)
        if request:
            propose_throttle(entry, request, QuotaType.REQUEST)

    def closed(self, reason: str) -> None:
        for entry in self.host.table.entries():
            if entry.quota_reservation is not None:
                self._release(entry)
