"""Shadow quotas: a candidate config evaluated on the traffic the live quotas record, whose
throttles are counted and never applied (``docs/shadow-quotas.md``).

``ShadowQuotas`` holds the candidate's budgets, one ``QuotaManager`` per broker as the live
``QuotaEnforcer`` keeps them (the same class), and records each request by the one recording
rule (``quota.recording.record_request``) with what the live quotas recorded: the same byte
counts, request time, quota clock reading and storage scale, at the same points (a response's
start; an acks=0 Produce when it is read; an unanswered Produce when its connection closes).
It records exactly as a replay of the capture under the candidate does (``quota.replay``:
every request at its ``quota_ms``, none moved in time or dropped), so the two give the same
would-be throttles: ``replayed_budgets`` sums a replay's per budget as ``budgets`` sums the
shadow's.

The storage scaling is the live enforcer's, followed: a replay applies each request's
recorded storage scale whatever the config replayed, and so does the shadow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka_quota_proxy.quota.enforcer import QuotaEnforcer, SensorView
from kafka_quota_proxy.quota.entities import QuotaType, Tags, resolve
from kafka_quota_proxy.quota.manager import ONE_HOUR_MS, QuotaSettings, StorageScaling
from kafka_quota_proxy.quota.recording import record_request
from kafka_quota_proxy.quota.replay import Row, StorageSettings, replay_rows

_PRODUCE, _FETCH, _REQUEST = QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST

# (broker, quota type, budget tags) -> (throttled requests, throttle ms)
Budget = tuple[int, QuotaType, Tags]
Totals = dict[Budget, tuple[int, int]]


class ShadowQuotas:
    """The candidate's budgets and what they would have imposed. ``throttled`` and
    ``throttle_ms`` (per quota type) only grow: they outlive budgets that expire, a config
    reloaded, the shadow switched off and on."""

    def __init__(self, settings: QuotaSettings, idle_expiry_ms: int = ONE_HOUR_MS,
                 storage: StorageScaling | None = None) -> None:
        self.enforcer = QuotaEnforcer(settings, idle_expiry_ms, storage=storage)
        self.throttled = {qt: 0 for qt in QuotaType}
        self.throttle_ms = {qt: 0 for qt in QuotaType}
        self.produce_on = self.fetch_on = self.request_on = False
        self._types(settings)

    @property
    def settings(self) -> QuotaSettings:
        return self.enforcer.settings

    def _types(self, settings: QuotaSettings) -> None:
        # (as ``replay_rows`` turns recording on: per quota type the candidate has)
        self.produce_on = bool(settings.for_type(_PRODUCE))
        self.fetch_on = bool(settings.for_type(_FETCH))
        self.request_on = bool(settings.for_type(_REQUEST))

    def update(self, settings: QuotaSettings) -> None:
        """Another candidate: the budgets keep what they measured (a new window shape starts
        them afresh), as the live budgets do on a reload."""
        self.enforcer.update(settings)
        self._types(settings)

    def record(self, scope: int, user: str, client_id: str, api_key: int, request_bytes: int,
               response_bytes: int, request_time_ms: float, now_ms: int,
               storage_scale: float | None) -> tuple[int, int, int]:
        """Record one request as the live quotas recorded it (``response_bytes`` -1: it has
        no response); return the (produce, fetch, request) throttles it would have had."""
        p, f, q = record_request(
            self.enforcer.manager(scope), user, client_id, api_key, request_bytes,
            response_bytes, False, request_time_ms, now_ms, storage_scale,
            self.produce_on or storage_scale is not None, self.fetch_on, self.request_on)
        if p or f or q:
            self._count(p, f, q)
        return p, f, q

    def _count(self, p: int, f: int, q: int) -> None:
        for qt, ms in ((_PRODUCE, p), (_FETCH, f), (_REQUEST, q)):
            if ms:
                self.throttled[qt] += 1
                self.throttle_ms[qt] += ms

    def expire(self, now_ms: int, idle_expiry_ms: int | None = None) -> int:
        return self.enforcer.expire(now_ms, idle_expiry_ms)

    def top_sensors(self, limit: int, now_ms: int) -> list[SensorView]:
        return self.enforcer.top_sensors(limit, now_ms)

    def budgets(self) -> Totals:
        """Per budget that would have throttled: (throttled requests, throttle ms)."""
        return {(scope, s.quota_type, s.tags): (s.throttled_requests, s.throttle_ms_total)
                for scope, m in self.enforcer.managers.items() for s in m
                if s.throttled_requests}


def replayed_budgets(broker_rows: Mapping[int, Sequence[Row]], settings: QuotaSettings,
                     storage: StorageSettings | None = None) -> Totals:
    """A replay of a capture under ``settings`` (``quota.replay.replay_rows``: each broker's
    rows in ``quota_ms``, ``seq`` order), summed per budget of ``settings`` as
    ``ShadowQuotas.budgets`` sums the shadow's."""
    totals: dict[Budget, list[int]] = {}
    by_type = {qt: settings.for_type(qt) for qt in QuotaType}
    for broker, rows in broker_rows.items():
        produce, fetch, request = replay_rows(rows, settings, storage=storage)
        for row, p, f, q in zip(rows, produce, fetch, request, strict=True):
            for qt, ms in ((_PRODUCE, p), (_FETCH, f), (_REQUEST, q)):
                if ms:
                    tags = resolve(by_type[qt], qt, row[1], row[2]).tags
                    t = totals.setdefault((broker, qt, tags), [0, 0])
                    t[0] += 1
                    t[1] += ms
    return {k: (n, ms) for k, (n, ms) in totals.items()}


def per_type(totals: Totals) -> dict[QuotaType, tuple[int, int]]:
    """``budgets`` or ``replayed_budgets`` summed per quota type."""
    out: dict[QuotaType, list[int]] = {}
    for (_, qt, _), (n, ms) in totals.items():
        t = out.setdefault(qt, [0, 0])
        t[0] += n
        t[1] += ms
    return {qt: (n, ms) for qt, (n, ms) in out.items()}


def capture_by_broker(rows: Iterable[Mapping[str, Any]]) -> dict[int, list[Row]]:
    """Capture rows (dicts of the capture's columns) as ``replay_rows`` takes them, per
    broker, in the replay's order (``quota_ms``, ``seq``)."""
    out: dict[int, list[Row]] = {}
    for r in sorted(rows, key=lambda r: (r["quota_ms"], r["seq"])):
        scale = r.get("storage_scale")
        out.setdefault(int(r["broker"]), []).append((
            int(r["quota_ms"]), str(r["user"]), str(r["client_id"]), int(r["api_key"]),
            int(r["request_bytes"]), int(r["response_bytes"]), int(r["duration_us"]),
            float(r["request_time_ms"]), bool(r["follower"]),
            int(r.get("quota_generation") or 0), None if scale is None else float(scale)))
    return out
