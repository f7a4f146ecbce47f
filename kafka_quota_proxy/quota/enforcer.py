"""The proxy's quota state: one quota manager per upstream broker, and the storage scaling.

Kafka enforces quotas per broker (seed 000: "each client can publish/fetch a maximum of X MBps
per broker"), so the proxy keeps one ``QuotaManager`` per upstream node id, whichever proxy port
reached the broker (a bootstrap connection uses the budgets of the broker it goes to); only
bootstrap connections whose broker cannot be known (none known yet) get one of their own,
``BOOTSTRAP_SCOPE``. Time comes in as an argument
(milliseconds of a monotonic clock: ``proxy.clock.now_ms`` live).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from kafka_quota_proxy.quota.entities import QuotaType, Tags, quota_limit
from kafka_quota_proxy.quota.manager import (
    ONE_HOUR_MS,
    BudgetHook,
    HeadroomHook,
    PaceHeadroomHook,
    PaceHook,
    QuotaManager,
    QuotaSettings,
    Sensor,
    StorageScaling,
)

# a broker's scope -> the hooks of its budgets shared with other processes (``quota.shared``)
SharedHooks = Callable[[int], tuple[BudgetHook, HeadroomHook, PaceHook, PaceHeadroomHook]]

BOOTSTRAP_SCOPE = -1


@dataclass(frozen=True, slots=True)
class SensorView:
    broker: int
    sensor: Sensor
    rate: float


class QuotaEnforcer:
    def __init__(self, settings: QuotaSettings, idle_expiry_ms: int = ONE_HOUR_MS,
                 storage: StorageScaling | None = None) -> None:
        """``storage``: another enforcer's storage scaling, followed (a shadow's:
        ``quota.shadow``), not owned."""
        self.settings = settings
        self.idle_expiry_ms = idle_expiry_ms  # ``quotas.sensor_idle_expiry_seconds``
        self.managers: dict[int, QuotaManager] = {}
        self.generation = 0  # bumped on every config change
        self._enabled = {qt: False for qt in QuotaType}
        # Storage-aware throttling (see ``set_storage``), shared by every broker's manager
        self.storage = StorageScaling() if storage is None else storage
        self.storage_epoch = 0  # bumped whenever the storage scale changes
        self.shared: SharedHooks | None = None
        self._by_type = {qt: settings.for_type(qt) for qt in QuotaType}
        self._refresh_enabled()

    def share(self, hooks: SharedHooks) -> None:
        """Enforce every budget against the usage of every process sharing it (issue 16):
        each broker's manager gets ``hooks(scope)``, those made already included."""
        self.shared = hooks
        for scope, m in self.managers.items():
            m.hook, m.headroom_hook, m.pace_hook, m.pace_headroom_hook = hooks(scope)

    def bound(self, quota_type: QuotaType, tags: Tags) -> float | None:
        """The configured bound of the budget with these tags (None: unlimited), whichever
        broker's: the same config applies to every broker."""
        return quota_limit(self._by_type[quota_type], tags)[0]

    @property
    def produce_scale(self) -> float | None:
        """The factor every produce quota is scaled by (None: storage throttling is off)."""
        return self.storage.scale

    def _refresh_enabled(self) -> None:
        for qt in QuotaType:
            self._enabled[qt] = bool(self.settings.for_type(qt))
        if self.produce_scale is not None:
            self._enabled[QuotaType.PRODUCE] = True

    def configure_storage(self, unquoted_produce_bound: float,
                          exempt_users: frozenset[str],
                          exempt_client_ids: frozenset[str] = frozenset()) -> None:
        storage = self.storage
        storage.unquoted_produce_bound = unquoted_produce_bound
        storage.exempt_users = exempt_users
        storage.exempt_client_ids = exempt_client_ids

    def set_storage(self, scale: float | None) -> None:
        """Scale every produce quota by ``scale`` (storage throttling; 0: paused), or stop
        (None). Producers without a quota get ``unquoted_produce_bound`` scaled alike."""
        if scale == self.storage.scale:
            return
        self.storage.scale = scale
        self.storage_epoch += 1
        self._refresh_enabled()

    def enabled(self, quota_type: QuotaType) -> bool:
        return self._enabled[quota_type]

    @property
    def active(self) -> bool:
        return any(self._enabled.values())

    def manager(self, scope: int) -> QuotaManager:
        m = self.managers.get(scope)
        if m is None:
            hook, headroom, pace, pace_headroom = (
                self.shared(scope) if self.shared is not None else (None, None, None, None))
            m = self.managers[scope] = QuotaManager(
                self.settings, self.idle_expiry_ms, storage=self.storage, hook=hook,
                headroom=headroom, pace=pace, pace_headroom=pace_headroom)
        return m

    def update(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self._by_type = {qt: settings.for_type(qt) for qt in QuotaType}
        self.generation += 1
        self._refresh_enabled()
        for m in self.managers.values():
            m.update(settings)

    def request_time_ms(self, request_bytes: int, response_bytes: int, proxy_ms: float) -> float:
        """What a request costs a request quota (``quota.request_time``)."""
        return self.settings.request_time.charge_ms(request_bytes, response_bytes, proxy_ms)

    def storage_exempt(self, user: str, client_id: str) -> bool:
        """Never throttled by storage (``storage.exempt_users`` / ``exempt_client_ids``)."""
        return self.storage.exempt(user, client_id)

    def limits(self, user: str, client_id: str) -> frozenset[QuotaType]:
        """The quota types with a limit for this user and client-id."""
        m = self.manager(BOOTSTRAP_SCOPE)
        limited = frozenset(qt for qt in QuotaType if self._enabled[qt]
                            and m.resolve(qt, user, client_id).limit is not None)
        if self.produce_scale is not None and not self.storage_exempt(user, client_id):
            limited |= {QuotaType.PRODUCE}
        return limited

    def expire(self, now: int, idle_expiry_ms: int | None = None) -> int:
        """Drop the budgets idle for ``idle_expiry_ms`` (given: from now on), every broker's."""
        if idle_expiry_ms is not None:
            self.idle_expiry_ms = idle_expiry_ms
            for m in self.managers.values():
                m.idle_expiry_ms = idle_expiry_ms
        return sum(m.expire(now) for m in self.managers.values())

    def entries(self) -> tuple[int, int]:
        """(budgets, cache entries) held over every broker's manager: what client-ids and
        users cost the quota state (``kafka_proxy_client_state_entries``)."""
        budgets = cached = 0
        for m in self.managers.values():
            budgets += len(m.sensors)
            cached += m.cache_entries()
        return budgets, cached

    def top_sensors(self, limit: int, now: int) -> list[SensorView]:
        """The ``limit`` busiest budgets by current rate (for bounded-cardinality metrics)."""
        views = []
        for scope, m in self.managers.items():
            for sensor in m:
                rate, _ = sensor.rate.measure(now)
                views.append(SensorView(scope, sensor, rate))
        return heapq.nlargest(limit, views, key=lambda v: v.rate)
