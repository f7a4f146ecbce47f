"""Controller mutation quotas (KIP-599): CreateTopics, CreatePartitions and DeleteTopics
charged by the partitions they create or delete (``ControllerMutationFilter``), the topics'
partitions learnt from Metadata (``ControllerMutations``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.controller_mutation.filter import ControllerMutationFilter
from kafka_quota_proxy.proxy.features.controller_mutation.mutations import ControllerMutations

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import QuotasConfig
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["ControllerMutationFeature", "ControllerMutationFilter", "ControllerMutations"]


class ControllerMutationFeature(Feature):
    name = "controller_mutation"
    wants_metadata = True

    @classmethod
    def make(cls, runtime: Runtime) -> ControllerMutationFeature:
        return cls(ControllerMutations(runtime.config.quotas))

    def __init__(self, mutations: ControllerMutations) -> None:
        self.mutations = mutations

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(ControllerMutationFilter,
                 partial(ControllerMutationFilter, mutations=self.mutations))]

    def observe_metadata(self, response: Any) -> None:
        self.mutations.observe_metadata(response)

    def reconfigure(self, quotas: QuotasConfig, now_ms: int) -> None:
        self.mutations.configure(quotas, now_ms)

    def expire(self, now_ms: int) -> int:
        """Budgets back at a full bucket (the same as a new one)."""
        return self.mutations.quotas.expire(now_ms)

    def state_entries(self) -> dict[str, int]:
        return {"mutation_budgets": len(self.mutations.quotas.budgets())}

    def metric_families(self) -> Iterator[Any]:
        return self.mutations.metric_families()
