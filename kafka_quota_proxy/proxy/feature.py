"""What a feature of the proxy is, and the one interface the proxy runs each through.

A feature (the topic guard, quotas, quota admin, controller mutation quotas, storage
throttling, fetch routing, the traffic capture, coordination, connection rates) is one
object, made from the config when the proxy is made (``make``: None when the config leaves
it off). The proxy (``proxy.server``) then only loops over its features:

==============================  ==============================================================
``filters(scope)``              its request-path filters (``proxy.filters``) for the
                                connections of a listener of ``scope``, in chain order
``subscriptions()``             the proxy's own topics it reads (one ``TopicReader`` for all)
``start(runtime)``              files opened, background tasks spawned (``runtime.spawn``);
                                a ``StartupError`` stops the start
``attach(rewriter)``            one kind of listener's response rewriter (``on_metadata`` is
                                the proxy's: it calls ``observe_metadata`` below)
``observe_metadata(response)``  a decoded MetadataResponse on its way to a client (only for
                                features with ``wants_metadata``)
``observe_brokers(brokers)``    the brokers of the latest metadata refresh
``reload(config)``              a config file was reloaded (whatever changed in it)
``reconfigure(quotas, now_ms)`` the quotas in force changed: the YAML's, with the ones
                                altered through AlterClientQuotas over them
``expire(now_ms)``              the periodic sweep of idle state; returns entries dropped
``state_entries()``             entries of its structures keyed by client-chosen names
``metric_families()``           its Prometheus families
``draining()``                  shutdown began: nothing new is accepted
``stop()``                      after the drain (the last requests were answered)
==============================  ==============================================================

``FEATURES`` (``proxy.features``) lists them in chain order; adding a feature is its own file
(and its filter's) and one line there.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig, QuotasConfig
    from kafka_quota_proxy.protocol.rewrite import ResponseRewriter
    from kafka_quota_proxy.proxy.admission import ConnectionSlots
    from kafka_quota_proxy.proxy.cluster import BrokerInfo
    from kafka_quota_proxy.proxy.cluster_topics import Subscription
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory
    from kafka_quota_proxy.proxy.metrics import ProxyStats
    from kafka_quota_proxy.quota.enforcer import QuotaEnforcer


class Runtime(Protocol):
    """What features use of the proxy that runs them."""

    config: ProxyConfig
    stats: ProxyStats
    quotas: QuotaEnforcer  # the byte-rate and request budgets every feature shares
    # the ACLs in force (``acls:``): a ``proxy.features.acls.state.Acls``, or None (off);
    # typed loosely, as this module may not import the features back
    acls: Any
    process: str  # this process's id (``proxy.features.coordination.own_process_id``)
    worker: int | None  # this process's index among ``proxy.workers`` (None: the only one)
    processes: int  # the processes of this instance (``workers``)
    live_brokers: set[int]  # node ids in the latest metadata
    client_options: dict[str, Any]  # aiokafka's TLS and SASL options toward the brokers
    slots: ConnectionSlots  # max_connections and max_connections_per_ip

    def effective_quotas(self) -> QuotasConfig:
        """The quotas in force: the YAML's, with those altered through AlterClientQuotas
        over them."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` until shutdown begins."""

    def spawn_past_drain(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` until the last connection is drained (reporting and reading the
        proxy's topics while the last requests are answered)."""

    def quotas_changed(self) -> None:
        """The quotas altered through AlterClientQuotas changed (here or elsewhere)."""

    def topics_made(self) -> None:
        """A feature made (or found) one of the topics it subscribed to: the reader looks
        for them now rather than at its next check."""


class Feature:
    """Base of the proxy's features: every hook does nothing."""

    name: ClassVar[str] = ""
    wants_metadata: ClassVar[bool] = False  # observe_metadata is called

    @classmethod
    def make(cls, runtime: Runtime) -> Feature | None:
        """The feature, as the config asks for it (None: off)."""
        raise NotImplementedError

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        return []

    def subscriptions(self) -> list[Subscription]:
        return []

    def start(self, runtime: Runtime) -> None:
        pass

    def attach(self, rewriter: ResponseRewriter) -> None:
        pass

    def observe_metadata(self, response: Any) -> None:
        pass

    def observe_brokers(self, brokers: Iterable[BrokerInfo]) -> None:
        pass

    def reload(self, config: ProxyConfig) -> None:
        pass

    def reconfigure(self, quotas: QuotasConfig, now_ms: int) -> None:
        pass

    def expire(self, now_ms: int) -> int:
        return 0

    def state_entries(self) -> dict[str, int]:
        return {}

    def metric_families(self) -> Iterator[Any]:
        return iter(())

    def draining(self) -> None:
        pass

    async def stop(self) -> None:
        pass
