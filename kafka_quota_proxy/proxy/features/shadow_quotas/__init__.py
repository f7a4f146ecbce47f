"""Shadow quotas (``quotas.shadow``): a candidate quota config evaluated live on the same
traffic as the quotas in force, with no effect on clients; the throttles and the time it
would have imposed, per budget, in the metrics (``docs/shadow-quotas.md``). Switched on, off
and changed by a reload (SIGHUP or the file watched), each logged."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.quotas import entity_rows
from kafka_quota_proxy.proxy.features.shadow_quotas.filter import ShadowQuotaFilter, ShadowSwitch
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import entity_families
from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.shadow import ShadowQuotas

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig, ShadowQuotasConfig
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["ShadowQuotaFilter", "ShadowQuotasFeature", "ShadowSwitch"]

log = get_logger("kafka_quota_proxy.shadow_quotas")


class ShadowQuotasFeature(Feature):
    name = "shadow_quotas"

    @classmethod
    def make(cls, runtime: Runtime) -> ShadowQuotasFeature:
        # (always made, its filter on every connection: a reload may switch it on)
        return cls(runtime)

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.switch = ShadowSwitch()
        # what the shadows switched off since the start would have imposed (the families'
        # totals only grow)
        self._past_throttled = {qt: 0 for qt in QuotaType}
        self._past_throttle_ms = {qt: 0 for qt in QuotaType}
        self._apply(runtime.config.quotas.shadow)

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(ShadowQuotaFilter, partial(ShadowQuotaFilter, switch=self.switch,
                                            quotas=self.runtime.quotas))]

    def reload(self, config: ProxyConfig) -> None:
        self._apply(config.quotas.shadow)

    def _apply(self, section: ShadowQuotasConfig | None) -> None:
        """Switch the shadow on (a fresh engine: nothing was recorded while off), off, or to
        another candidate (its budgets keep what they measured, as live budgets do)."""
        settings = section.settings() if section is not None and section.enabled else None
        engine = self.switch.engine
        if settings is None:
            if engine is not None:
                self.switch.engine = None
                for qt in QuotaType:
                    self._past_throttled[qt] += engine.throttled[qt]
                    self._past_throttle_ms[qt] += engine.throttle_ms[qt]
                log.info("shadow_quotas_disabled", **_totals(engine))
            return
        assert section is not None
        shape = {"entities": len(section.entities), "window_samples": settings.samples,
                 "window_ms": settings.window_ms}
        if engine is None:
            self.switch.engine = ShadowQuotas(
                settings, self.runtime.quotas.idle_expiry_ms, storage=self.runtime.quotas.storage)
            log.info("shadow_quotas_enabled", **shape)
        elif settings != engine.settings:
            engine.update(settings)
            log.info("shadow_quotas_reloaded", **shape, **_totals(engine))

    def expire(self, now_ms: int) -> int:
        """The shadow's budgets idle for ``quotas.sensor_idle_expiry_seconds``, as the live
        ones."""
        engine = self.switch.engine
        if engine is None:
            return 0
        expiry_s = self.runtime.config.quotas.sensor_idle_expiry_seconds
        return engine.expire(now_ms, int(expiry_s * 1000))

    def state_entries(self) -> dict[str, int]:
        engine = self.switch.engine
        budgets, cached = engine.enforcer.entries() if engine is not None else (0, 0)
        return {"shadow_quota_budgets": budgets, "shadow_quota_caches": cached}

    def metric_families(self) -> Iterator[Any]:
        engine = self.switch.engine
        on = GaugeMetricFamily("kafka_proxy_shadow_quota_enabled",
                               "Whether a shadow quota config (quotas.shadow) is evaluated")
        on.add_metric([], 1 if engine is not None else 0)
        yield on
        throttled = CounterMetricFamily(
            "kafka_proxy_shadow_quota_throttled_requests",
            "Requests the shadow quotas would have throttled (never applied), by quota",
            labels=["quota"])
        seconds = CounterMetricFamily(
            "kafka_proxy_shadow_quota_throttle_seconds",
            "Throttle time the shadow quotas would have imposed (never applied), by quota",
            labels=["quota"])
        for qt in QuotaType:
            n, ms = self._past_throttled[qt], self._past_throttle_ms[qt]
            if engine is not None:
                n += engine.throttled[qt]
                ms += engine.throttle_ms[qt]
            throttled.add_metric([qt.short], n)
            seconds.add_metric([qt.short], ms / 1000.0)
        yield throttled
        yield seconds
        if engine is not None:
            top = self.runtime.config.quotas.metrics_top_entities
            yield from entity_families(
                entity_rows(engine.top_sensors(top, now_ms())),
                "kafka_proxy_shadow_quota_entity", "Shadow quotas (never applied): ")


def _totals(engine: ShadowQuotas) -> dict[str, int]:
    """What a shadow would have imposed so far, for its log lines."""
    return {**{f"throttled_{qt.short}": engine.throttled[qt] for qt in QuotaType},
            **{f"throttle_ms_{qt.short}": engine.throttle_ms[qt] for qt in QuotaType}}
