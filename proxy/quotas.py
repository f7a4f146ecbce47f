"""Quota enforcement state of the proxy: one quota manager per upstream broker.

Kafka enforces quotas per broker (seed 000: "each client can publish/fetch a maximum of X MBps
per broker"), so the proxy keeps one ``QuotaManager`` per upstream node id; connections to the
bootstrap listener (metadata, mostly) get one of their own. The clock is the event loop's
monotonic time in milliseconds.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from quota.entities import QuotaType
from quota.manager import QuotaManager, QuotaSettings, Sensor

BOOTSTRAP_SCOPE = -1


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True)
class SensorView:
    broker: int
    sensor: Sensor
    rate: float


class QuotaEnforcer:
    def __init__(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self.managers: dict[int, QuotaManager] = {}
        self.generation = 0  # bumped on every config change
        self._enabled = {qt: False for qt in QuotaType}
        self._refresh_enabled()

    def _refresh_enabled(self) -> None:
        for qt in QuotaType:
            self._enabled[qt] = bool(self.settings.for_type(qt))

    def enabled(self, quota_type: QuotaType) -> bool:
        return self._enabled[quota_type]

    @property
    def active(self) -> bool:
        return any(self._enabled.values())

    def manager(self, scope: int) -> QuotaManager:
        m = self.managers.get(scope)
        if m is None:
            m = self.managers[scope] = QuotaManager(self.settings)
        return m

    def update(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self.generation += 1
        self._refresh_enabled()
        for m in self.managers.values():
            m.update(settings)

    def limits(self, user: str, client_id: str) -> frozenset[QuotaType]:
        """The quota types with a limit for this user and client-id."""
        m = self.manager(BOOTSTRAP_SCOPE)
        return frozenset(qt for qt in QuotaType
                         if self._enabled[qt] and m.resolve(qt, user, client_id).limit is not None)

    def expire(self, now: int) -> int:
        return sum(m.expire(now) for m in self.managers.values())

    def top_sensors(self, limit: int, now: int) -> list[SensorView]:
        """The ``limit`` busiest budgets by current rate (for bounded-cardinality metrics)."""
        views = []
        for scope, m in self.managers.items():
            for sensor in m:
                rate, _ = sensor.rate.measure(now)
                views.append(SensorView(scope, sensor, rate))
        return heapq.nlargest(limit, views, key=lambda v: v.rate)
