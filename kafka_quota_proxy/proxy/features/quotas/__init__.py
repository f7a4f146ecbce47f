"""Client quotas (KIP-13, KIP-124): byte rates and request time per entity, measured and
throttled on every connection (``QuotaFilter``) against the budgets of the proxy's
``QuotaEnforcer``, which the other features share."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.quotas.filter import QuotaFilter
from kafka_quota_proxy.proxy.metrics import EntityRow
from kafka_quota_proxy.quota.enforcer import BOOTSTRAP_SCOPE, SensorView

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import QuotasConfig
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["QuotaFilter", "QuotasFeature", "entity_rows"]


class QuotasFeature(Feature):
    name = "quotas"

    @classmethod
    def make(cls, runtime: Runtime) -> QuotasFeature:
        return cls(runtime)

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.enforcer = runtime.quotas
        runtime.stats.quota_entities = self.entity_rows

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(QuotaFilter, partial(QuotaFilter, quotas=self.enforcer,
                                      stats=self.runtime.stats))]

    def reconfigure(self, quotas: QuotasConfig, now_ms: int) -> None:
        self.enforcer.update(quotas.settings())

    def expire(self, now_ms: int) -> int:
        """Budgets idle for ``quotas.sensor_idle_expiry_seconds`` (Kafka's inactive sensor
        expiry, an hour)."""
        expiry_s = self.runtime.config.quotas.sensor_idle_expiry_seconds
        return self.enforcer.expire(now_ms, int(expiry_s * 1000))

    def state_entries(self) -> dict[str, int]:
        budgets, cached = self.enforcer.entries()
        return {"quota_budgets": budgets, "quota_caches": cached}

    def entity_rows(self) -> list[EntityRow]:
        """The most active entities' figures (``quotas.metrics_top_entities`` of them), which
        ``ProxyStats`` exports as its own families (``stats.quota_entities``)."""
        top = self.runtime.config.quotas.metrics_top_entities
        return entity_rows(self.enforcer.top_sensors(top, now_ms()))


def entity_rows(views: list[SensorView]) -> list[EntityRow]:
    """Budgets as the per-entity metrics export them (``proxy.metrics.entity_families``)."""
    rows: list[EntityRow] = []
    for view in views:
        s = view.sensor
        broker = "bootstrap" if view.broker == BOOTSTRAP_SCOPE else str(view.broker)
        rows.append((broker, s.quota_type.short, s.tags[0], s.tags[1], view.rate, s.bound,
                     s.throttled_requests, s.throttle_ms_total))
    return rows
