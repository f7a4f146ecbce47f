"""Authorization at the proxy with Kafka's ACL semantics (``docs/acls.md``): on when the
config has ``acls:``.

- ``Acls`` (``state``): the bindings in force in this process (the config's, and the dynamic
  ones of the ACL topic), the decisions, the figures. The proxy makes it (``Runtime.acls``):
  the topic guard asks it for each topic a request names (``proxy.features.topic_guard``).
- ``AclFilter`` (``filter``): the checks on whole requests (the cluster, the request's group
  or transactional id), answered with Kafka's error response when denied.
- ``AclStore`` (``store``) and ``AclAdminFilter`` (``admin_filter``): CreateAcls,
  DescribeAcls and DeleteAcls answered by the proxy, the dynamic bindings kept in a compacted
  topic every proxy reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.acls.admin_filter import AclAdminFilter
from kafka_quota_proxy.proxy.features.acls.filter import AclFilter
from kafka_quota_proxy.proxy.features.acls.state import Access, Acls
from kafka_quota_proxy.proxy.features.acls.store import AclStore

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig
    from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
    from kafka_quota_proxy.proxy.cluster_topics import Subscription
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["Access", "AclAdminFilter", "AclFilter", "AclStore", "Acls", "AclsFeature"]


class AclsFeature(Feature):
    name = "acls"
    wants_metadata = True  # topic ids learnt from every Metadata response

    @classmethod
    def make(cls, runtime: Runtime) -> AclsFeature | None:
        if runtime.acls is None:
            return None
        return cls(runtime, runtime.acls)

    def __init__(self, runtime: Runtime, acls: Acls) -> None:
        self.runtime = runtime
        self.acls = acls
        self.store = AclStore(acls, lambda: runtime.config,
                              [str(b) for b in runtime.config.upstream.bootstrap_servers])

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return [(AclFilter, partial(AclFilter, acls=self.acls)),
                (AclAdminFilter, partial(AclAdminFilter, acls=self.acls, store=self.store))]

    def subscriptions(self) -> list[Subscription]:
        return self.store.subscriptions()

    def start(self, runtime: Runtime) -> None:
        self.store.start(runtime)

    def attach(self, rewriter: ResponseRewriter) -> None:
        self.store.attach(rewriter)

    def observe_metadata(self, response: Any) -> None:
        self.acls.observe_metadata(response)

    def reload(self, config: ProxyConfig) -> None:
        if config.acls is not None:
            self.acls.reload(config.acls)

    def state_entries(self) -> dict[str, int]:
        return self.acls.state_entries()

    def metric_families(self) -> Iterator[Any]:
        yield from self.acls.metric_families()
        yield from self.store.metric_families()

    async def stop(self) -> None:
        await self.store.stop()
