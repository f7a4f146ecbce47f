"""The proxy's features (``proxy.feature``), each in its own folder or file: the feature, its
request-path filter and what they share.

``FEATURES`` makes them, in the order of their filters on every connection: the ACLs' checks
on whole requests and the ACL admin APIs first (a denied request is answered before anything
else looks at it), the topic guard next (the features after it see requests without the
proxy's topics, nor those the ACLs deny), then the quotas, the shadow quotas (which read
what the quotas recorded), the
answers the proxy makes, the controller mutation quota, storage throttling, fetch routing and
the capture (which records what the quotas decided). Coordination and connection rates have
no filter: one shares the quotas' budgets, the other works at accept.
"""

from __future__ import annotations

from collections.abc import Callable

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.acls import AclsFeature
from kafka_quota_proxy.proxy.features.capture import CaptureFeature
from kafka_quota_proxy.proxy.features.connection_rates import ConnectionRateGuard
from kafka_quota_proxy.proxy.features.controller_mutation import ControllerMutationFeature
from kafka_quota_proxy.proxy.features.coordination import Coordination
from kafka_quota_proxy.proxy.features.fetch_routing import FetchRoutingFeature
from kafka_quota_proxy.proxy.features.quota_admin import QuotaAdminFeature
from kafka_quota_proxy.proxy.features.quotas import QuotasFeature
from kafka_quota_proxy.proxy.features.shadow_quotas import ShadowQuotasFeature
from kafka_quota_proxy.proxy.features.storage import StorageFeature
from kafka_quota_proxy.proxy.features.topic_guard import TopicGuardFeature

FEATURES: tuple[Callable[[Runtime], Feature | None], ...] = (
    AclsFeature.make,
    TopicGuardFeature.make,
    QuotasFeature.make,
    ShadowQuotasFeature.make,
    QuotaAdminFeature.make,
    ControllerMutationFeature.make,
    StorageFeature.make,
    FetchRoutingFeature.make,
    CaptureFeature.make,
    Coordination.make,
    ConnectionRateGuard.make,
)


def make_features(runtime: Runtime) -> list[Feature]:
    """The features the config turns on, in chain order."""
    return [f for f in (make(runtime) for make in FEATURES) if f is not None]
