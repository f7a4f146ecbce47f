"""Storage throttling (the cluster-wide volume quota): producers held back on the disk usage
of the whole cluster, read from the volume topic (``StorageWatch``), applied to each Produce
(``StorageFilter``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.storage.filter import StorageFilter
from kafka_quota_proxy.proxy.features.storage.watch import StorageWatch

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.cluster_topics import Subscription
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["StorageFeature", "StorageFilter", "StorageWatch"]


class StorageFeature(Feature):
    name = "storage"

    @classmethod
    def make(cls, runtime: Runtime) -> StorageFeature | None:
        config = runtime.config
        if config.storage is None:
            return None
        return cls(StorageWatch(config.storage, runtime.quotas,
                                config.upstream.bootstrap_servers,
                                lambda: runtime.live_brokers))

    def __init__(self, watch: StorageWatch) -> None:
        self.watch = watch

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(StorageFilter, partial(StorageFilter, storage=self.watch))]

    def subscriptions(self) -> list[Subscription]:
        return [self.watch.subscription()]

    def start(self, runtime: Runtime) -> None:
        runtime.spawn(self.watch.run())

    def metric_families(self) -> Iterator[Any]:
        return self.watch.metric_families()
