"""Client quotas altered and described through Kafka's Admin API (DescribeClientQuotas,
AlterClientQuotas, KIP-546): answered by the proxy (``QuotaAdminFilter``), the alters kept in
a compacted topic that every proxy reads (``ClientQuotaAdmin``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.quota_admin.admin import ClientQuotaAdmin
from kafka_quota_proxy.proxy.features.quota_admin.filter import QuotaAdminFilter

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.cluster_topics import Subscription
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory
    from kafka_quota_proxy.quota.client_quotas import Entity

__all__ = ["ClientQuotaAdmin", "QuotaAdminFeature", "QuotaAdminFilter"]


class QuotaAdminFeature(Feature):
    name = "quota_admin"

    @classmethod
    def make(cls, runtime: Runtime) -> QuotaAdminFeature:
        return cls(runtime)

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.admin = ClientQuotaAdmin(
            lambda: runtime.config.quotas,
            [str(b) for b in runtime.config.upstream.bootstrap_servers], runtime.quotas_changed)

    @property
    def overrides(self) -> dict[Entity, dict[str, float]]:
        """The quotas altered through AlterClientQuotas (here or through another proxy)."""
        return self.admin.overrides

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(QuotaAdminFilter, partial(QuotaAdminFilter, admin=self.admin,
                                           acls=self.runtime.acls))]

    def subscriptions(self) -> list[Subscription]:
        if not self.runtime.config.quotas.overrides.enabled:
            return []
        return [self.admin.subscription()]

    def start(self, runtime: Runtime) -> None:
        self.admin.client_options = runtime.client_options
        admin = self.admin

        async def prepare() -> None:
            await admin.prepare(with_acls=runtime.acls is not None)
            runtime.topics_made()  # (read from now on, not from the reader's next check)

        runtime.spawn(prepare())

    def metric_families(self) -> Iterator[Any]:
        return self.admin.metric_families()

    async def stop(self) -> None:
        await self.admin.stop()
