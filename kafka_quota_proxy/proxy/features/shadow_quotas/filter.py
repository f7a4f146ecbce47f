"""Shadow quotas on the request path: each request recorded into the candidate's budgets
(``quota.shadow.ShadowQuotas``) with what the live quotas recorded, at the same points and
the same quota clock reading; whatever the candidate would impose is counted, never applied
(no throttle proposed, no client muted or held, no live budget touched).

The filter comes right after ``QuotaFilter`` in the chain (it reads what that recorded:
``entry.recorded``, the request time charged) and before ``CaptureFilter`` (which writes the
same clock reading), so the shadow records exactly the rows a capture holds, as a replay of it
records them. It is on every connection, so that a reload switching the shadow on reaches the
connections already open; while off it costs one attribute read per hook."""

from __future__ import annotations

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.proxy.clock import now_ms as _now_ms
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost, forwarded_unanswered
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.shadow import ShadowQuotas

_PRODUCE = int(ApiKey.PRODUCE)


class ShadowSwitch:
    """The shadow in force, which the feature switches on a reload: ``engine`` None is
    off."""

    __slots__ = ("engine",)

    def __init__(self) -> None:
        self.engine: ShadowQuotas | None = None


class ShadowQuotaFilter(Filter):
    def __init__(self, host: FilterHost, switch: ShadowSwitch, quotas: QuotaEnforcer) -> None:
        self.host = host
        self.client = host.client
        self.switch = switch
        self.quotas = quotas  # the live quotas (what they charged a request's time)
        self._closed = False

    def request(self, entry: InFlight) -> None:
        """An acks=0 Produce: recorded when read, as the live quotas (and the capture)
        record it, at their clock reading."""
        engine = self.switch.engine
        if engine is None or entry.expects_response or entry.api_key != _PRODUCE:
            return
        recorded = entry.recorded  # (the live quotas set it for every acks=0 Produce)
        now = recorded[0] if recorded is not None else _now_ms()
        client = self.client
        engine.record(client.scope, client.user, entry.client_id or "", _PRODUCE,
                      entry.request_size, -1, 0.0, now, entry.storage_scale)

    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        engine = self.switch.engine
        if engine is None or entry.exempt:  # (nothing of the SASL exchange is recorded)
            return
        recorded = entry.recorded
        # the request time the live quotas charged (the capture's ``request_time_ms``); while
        # they are not active, what they would have charged, as the capture writes it
        request_time = recorded[1] if recorded is not None else self.quotas.request_time_ms(
            entry.request_size, entry.response_size, entry.proxy_ms)
        client = self.client
        engine.record(client.scope, client.user, entry.client_id or "", entry.api_key,
                      entry.request_size, entry.response_size, request_time, now_ms,
                      entry.storage_scale)

    def closed(self, reason: str) -> None:
        """The Produce requests that reached the broker whole and were never answered,
        recorded as the live quotas record them (``QuotaFilter.closed``, just before). While
        those are not recording, the clock reading taken here is left in ``entry.recorded``,
        for the capture's row to carry the same one."""
        engine = self.switch.engine
        if engine is None or self._closed:
            return
        self._closed = True  # (nothing is recorded twice)
        client = self.client
        now: int | None = None
        for entry in forwarded_unanswered(self.host):
            if entry.api_key != _PRODUCE or entry.exempt:
                continue
            recorded = entry.recorded
            if recorded is None:
                if now is None:
                    now = _now_ms()
                recorded = entry.recorded = (now, 0.0, 0, 0, 0)
            engine.record(client.scope, client.user, entry.client_id or "", _PRODUCE,
                          entry.request_size, -1, 0.0, recorded[0], entry.storage_scale)
