"""The proxy's features (``proxy.feature``), each in its own folder or file: the feature, its
request-path filter and what they share.

``FEATURES`` makes them, in the order of their filters on every connection: the topic guard
first (the features after it see requests without the proxy's topics), then the quotas, the
answers the proxy makes, the controller mutation quota, storage throttling, fetch routing and
the capture (which records what the quotas decided). Coordination and connection rates have
no filter: one shares the quotas' budgets, the other works at accept.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.feature import Feature, Runtime
from proxy.features.capture import CaptureFeature
from proxy.features.connection_rates import ConnectionRateGuard
from proxy.features.controller_mutation import ControllerMutationFeature
from proxy.features.coordination import Coordination
from proxy.features.fetch_routing import FetchRoutingFeature
from proxy.features.quota_admin import QuotaAdminFeature
from proxy.features.quotas import QuotasFeature
from proxy.features.storage import StorageFeature
from proxy.features.topic_guard import TopicGuardFeature

FEATURES: tuple[Callable[[Runtime], Feature | None], ...] = (
    TopicGuardFeature.make,
    QuotasFeature.make,
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
