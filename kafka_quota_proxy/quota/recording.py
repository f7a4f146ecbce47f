"""Kafka's recording rule, as the proxy applies it: which value each request records into
which quota type. One function, called by the live proxy (``proxy.features.quotas.filter``) and by
every replay (``quota.replay``), so the two cannot drift apart.

- Produce: ``request_bytes - 4`` (the frame without its size prefix; acks=0 too, when it is
  read), paced by the storage scale in force when the request was read;
- a consumer Fetch (not a replica's): ``response_bytes - 4``;
- every request with a response (``response_bytes >= 0``) except replica fetches: its request
  time as a percentage of one thread;

each only while recording that quota type is on (some entity has a quota of it; for produce,
also while storage scaling is in force).
"""

from __future__ import annotations

from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, percent_of_thread

PRODUCE_KEY, FETCH_KEY = 0, 1
_PRODUCE, _FETCH, _REQUEST = QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST


def record_request(manager: QuotaManager, user: str, client_id: str, api_key: int,
                   request_bytes: int, response_bytes: int, follower: bool,
                   request_time_ms: float, now_ms: int, storage_scale: float | None,
                   produce_on: bool, fetch_on: bool, request_on: bool) -> tuple[int, int, int]:
    """Record one request into ``manager``; return the (produce, fetch, request) throttles in
    ms (0 where nothing was recorded or nothing throttles)."""
    p = f = q = 0
    if api_key == PRODUCE_KEY:
        if produce_on:
            p = manager.record(_PRODUCE, user, client_id, request_bytes - 4, now_ms,
                               storage_scale)
    elif api_key == FETCH_KEY and fetch_on and not follower:
        f = manager.record(_FETCH, user, client_id, response_bytes - 4, now_ms)
    if request_on and not follower and response_bytes >= 0:
        q = manager.record(_REQUEST, user, client_id, percent_of_thread(request_time_ms),
                           now_ms)
    return p, f, q
