"""The proxy's own topics kept from its clients (``docs/security.md``, finding 1): requests
naming them refused or rewritten (``TopicGuardFilter``), responses amended and Metadata
filtered (``TopicGuard``, through each listener's rewriter)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter
from kafka_quota_proxy.proxy.features.topic_guard.guard import TopicGuard, guarded_names

if TYPE_CHECKING:
    from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
    from kafka_quota_proxy.proxy.features.acls.state import Acls
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["TopicGuard", "TopicGuardFeature", "TopicGuardFilter"]


class TopicGuardFeature(Feature):
    name = "topic_guard"

    @classmethod
    def make(cls, runtime: Runtime) -> TopicGuardFeature:
        return cls(TopicGuard(guarded_names(runtime.config)), runtime.acls)

    def __init__(self, guard: TopicGuard, acls: Acls | None = None) -> None:
        self.guard = guard
        self.acls = acls  # the topics each client may name, beside the proxy's own

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(TopicGuardFilter, partial(TopicGuardFilter, guard=self.guard, acls=self.acls))]

    def attach(self, rewriter: ResponseRewriter) -> None:
        rewriter.metadata_filter = self.guard.filter_metadata
        rewriter.amend = self.guard.amend

    def metric_families(self) -> Iterator[Any]:
        return self.guard.metric_families()
