"""Storage throttling on the request path (seed 004): while the cluster's volumes are past the
hard limit (PAUSE), a producer's next request waits in the proxy, unread and unforwarded, and
the client is read no further until producing may resume; responses to produce requests already
on their way carry ``storage.pause_throttle_ms``. (THROTTLE scales the produce quotas: that is
the quota filter's, through ``QuotaEnforcer.set_storage``.)
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.proxy.features.storage.watch import StorageWatch
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost, propose_throttle
from kafka_quota_proxy.quota.entities import QuotaType

_PRODUCE = int(ApiKey.PRODUCE)


class StorageFilter(Filter):
    def __init__(self, host: FilterHost, storage: StorageWatch) -> None:
        self.host = host
        self.client = host.client
        self.storage = storage

    def serial(self) -> bool:
        """While paused, frames are read one at a time, so that none slips past ``hold``
        behind another in the same read."""
        return self.storage.paused

    def hold(self, api_key: int | None) -> bool:
        """A produce request is neither read nor forwarded while paused: it waits, and the
        client is read no further, until producing may resume (a client that closes meanwhile
        takes it away: nothing reaches the broker twice)."""
        storage = self.storage
        if (not storage.paused or api_key != _PRODUCE
                or storage.exempt(self.client.user, self.client.client_id)):
            return False
        storage.park(self.host.client_gate)
        return True

    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        storage = self.storage
        if (entry.api_key == _PRODUCE and storage.paused
                and storage.pause_ms > entry.throttle_ms
                and not storage.exempt(self.client.user, entry.client_id or "")):
            propose_throttle(entry, storage.pause_ms, QuotaType.PRODUCE)  # back off while paused

    def closed(self, reason: str) -> None:
        self.storage.unpark(self.host.client_gate)  # a waiting request goes with the client
