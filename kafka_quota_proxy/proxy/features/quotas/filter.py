"""Client quotas on the request path (KIP-13, KIP-124, KIP-219): each request is recorded into
its budgets when its response starts, the response carries the throttle time, and the client is
read no further until it has passed.

Kafka reads one request per connection at a time, so each response is recorded, and the client
throttled, before the next request is read. The proxy keeps pipelining as long as that cannot
matter (``headroom``), and reads a limited client one frame at a time (``serial``).
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.proxy.clock import now_ms as _now_ms
from kafka_quota_proxy.proxy.filters.base import (
    Filter,
    FilterHost,
    forwarded_unanswered,
    propose_throttle,
)
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.manager import Sensor
from kafka_quota_proxy.quota.recording import record_request
from kafka_quota_proxy.quota.throttle import throttle_time_ms

_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)
_NO_LIMITS: frozenset[QuotaType] = frozenset()
_FETCHING = object()  # what a consumer Fetch of a client with a quota holds (``_reserved``)
# How soon a held first request asks again whether its budget is back within its quota
_RECHECK_MIN_MS = 10
_RECHECK_MAX_MS = 1000


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
        # what each request of a client with a quota holds until its response starts: its
        # produce sensor's in-flight bytes, or a place among the fetches (``headroom``)
        self._reserved: dict[InFlight, Sensor | object] = {}
        # The quota types this connection has forwarded a request of (see ``hold``)
        self._joined: set[QuotaType] = set()

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

    def hold(self, api_key: int | None) -> bool:
        """A connection's first request of a budget over its quota waits, unread and
        unforwarded, until the budget is back within it (re-checked at the throttle time the
        rate implies, at least every second). Kafka mutes the connection a throttled response
        went out on, not the budget: a client that reconnects instead of waiting would get a
        request through on every new connection (and with all its first bytes read at once,
        many). Connections that already carry the budget's requests keep Kafka's behaviour:
        each of their responses is throttled and the connection muted."""
        limits = self.limited  # (cached: the same as ``serial`` found)
        if not limits or api_key is None:
            return False
        joined = self._joined
        waiting = 0
        if api_key == _PRODUCE:
            # (scaled to 0: the storage PAUSE, whose own hold parks the request until the
            # state changes, counted in kafka_proxy_storage_held_connections)
            if (QuotaType.PRODUCE in limits and QuotaType.PRODUCE not in joined
                    and (self.quotas.produce_scale != 0 or self.quotas.storage_exempt(
                        self.client.user, self.client.client_id or ""))):
                waiting = self._over(QuotaType.PRODUCE)
        elif api_key == _FETCH and QuotaType.FETCH in limits and QuotaType.FETCH not in joined:
            waiting = self._over(QuotaType.FETCH)
        if not waiting and QuotaType.REQUEST in limits and QuotaType.REQUEST not in joined:
            waiting = self._over(QuotaType.REQUEST)
        if not waiting:
            return False
        self.stats.held_first_requests += 1
        self.host.mute(waiting)
        return True

    def _over(self, quota_type: QuotaType) -> int:
        """0 when this client's budget of ``quota_type`` is within its quota (produce: with
        the requests in flight counted, and under the storage scale in force), else how long
        to wait before asking again (ms)."""
        client = self.client
        client_id = client.client_id or ""
        now = _now_ms()
        manager = self.quotas.manager(client.scope)
        sensor = manager.sensor(quota_type, client.user, client_id, now)
        bound = sensor.bound
        if quota_type is QuotaType.PRODUCE:
            if manager.produce_headroom(client.user, client_id, now):
                return 0
            bound = manager.produce_bound(bound, client.user, client_id)
        elif quota_type is QuotaType.FETCH:
            if manager.fetch_headroom(client.user, client_id, now):
                return 0
        elif sensor.headroom(now):
            return 0
        rate, window = sensor.rate.measure(now)
        wait = throttle_time_ms(rate, bound, window) if bound else 0
        return min(max(wait, _RECHECK_MIN_MS), _RECHECK_MAX_MS)

    # ------------------------------------------------------------------ requests
    def request(self, entry: InFlight) -> None:
        key = entry.api_key
        if self._limits:  # this connection now carries requests of its budgets
            joined = self._joined
            joined.add(QuotaType.REQUEST)
            if key == _PRODUCE:
                joined.add(QuotaType.PRODUCE)
            elif key == _FETCH:
                joined.add(QuotaType.FETCH)
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
                self._reserved[entry] = sensor
        elif entry.api_key == _FETCH:  # (a client posing as a follower is no exception)
            self._fetching += 1
            self._reserved[entry] = _FETCHING

    def _release(self, entry: InFlight, held: Sensor | object) -> None:
        if held is _FETCHING:
            self._fetching -= 1
        elif isinstance(held, Sensor):
            held.in_flight -= entry.request_size - 4

    def _acks0_produce(self, entry: InFlight) -> None:
        """acks=0: no response to throttle, but the client is still held back (and its
        request time is exempt, as in Kafka)."""
        if not self.quotas.enabled(QuotaType.PRODUCE):
            entry.recorded = (_now_ms(), 0.0, 0, 0, 0)
            return
        throttle = self._record_unanswerable(entry, _now_ms())
        if throttle > 0:
            self.stats.throttled[QuotaType.PRODUCE.short] += 1
            self.stats.throttle_ms[QuotaType.PRODUCE.short] += throttle
            self.host.mute(throttle)

    def _record_unanswerable(self, entry: InFlight, now: int) -> int:
        """Record a Produce no response will ever start (acks=0, or its client gone) into
        its produce budget (its request time is not known: exempt, as in Kafka); return the
        throttle."""
        client = self.client
        throttle = record_request(
            self.quotas.manager(client.scope), client.user, entry.client_id or "", _PRODUCE,
            entry.request_size, -1, False, 0.0, now, entry.storage_scale, True, False,
            False)[0]
        entry.recorded = (now, 0.0, throttle, 0, 0)
        return throttle

    # ------------------------------------------------------------------ responses
    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        """Record this response's quotas (``quota.recording``, the rule the replays use);
        propose the throttle if one is violated."""
        if self._reserved:
            held = self._reserved.pop(entry, None)
            if held is not None:
                self._release(entry, held)
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
        # (every request still holding something: in flight, or dropped with a refusal)
        reserved, self._reserved = self._reserved, {}
        for entry, held in reserved.items():
            self._release(entry, held)
        if self.quotas.active:
            self._record_unanswered()

    def _record_unanswered(self) -> None:
        """The Produce requests that went upstream whole but whose responses never came (the
        client closed first, or the connection failed) are recorded now, their response
        unknown (as an acks=0 Produce): the broker writes their records all the same. A
        client that sent and closed without reading was otherwise charged only for the
        answers that came before it left. (A Fetch's response size is unknown: a consumer
        that never reads its fetches gets nothing, and is charged nothing.)"""
        if not self.quotas.enabled(QuotaType.PRODUCE):
            return
        now = _now_ms()
        for entry in forwarded_unanswered(self.host):
            if entry.api_key == _PRODUCE and not entry.exempt and entry.recorded is None:
                self._record_unanswerable(entry, now)
                self.stats.unanswered_produce_recorded += 1
