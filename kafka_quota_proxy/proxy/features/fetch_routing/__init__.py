"""Rack-aware fetch routing (KIP-392): consumers sent to an in-sync replica in their own rack
(``FetchRoutingFilter`` on the brokers' ports; the decisions are ``FetchRouting``'s)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.fetch_routing.filter import FetchRoutingFilter
from kafka_quota_proxy.proxy.features.fetch_routing.routing import FetchRouting
from kafka_quota_proxy.quota.enforcer import BOOTSTRAP_SCOPE

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.cluster import BrokerInfo
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["FetchRouting", "FetchRoutingFeature", "FetchRoutingFilter"]


class FetchRoutingFeature(Feature):
    name = "fetch_routing"
    wants_metadata = True

    @classmethod
    def make(cls, runtime: Runtime) -> FetchRoutingFeature:
        return cls(FetchRouting(runtime.config.racks))

    def __init__(self, routing: FetchRouting) -> None:
        self.routing = routing

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        # (not on the bootstrap listener: clients fetch from the leader's port; a bootstrap
        # connection's broker is chosen per connection and may change if it is unreachable)
        if not self.routing.enabled or scope == BOOTSTRAP_SCOPE:
            return []
        return [(FetchRoutingFilter, partial(FetchRoutingFilter, routing=self.routing))]

    def observe_metadata(self, response: Any) -> None:
        self.routing.observe_metadata(response)

    def observe_brokers(self, brokers: Iterable[BrokerInfo]) -> None:
        if self.routing.enabled:
            self.routing.topology.observe_brokers((b.node_id, b.rack) for b in brokers)

    def state_entries(self) -> dict[str, int]:
        return {"fetch_redirects": self.routing.redirect_entries(),
                "fetch_rack_pairs": len(self.routing.fetch_bytes)}

    def metric_families(self) -> Iterator[Any]:
        if not self.routing.enabled:
            return iter(())
        return self.routing.metric_families()
