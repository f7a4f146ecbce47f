"""Fetch routing on one connection to a broker's port (``FetchRoutingFilter``): the
decisions are ``FetchRouting``'s (``proxy.features.fetch_routing.routing``)."""

from __future__ import annotations

import struct
from typing import Any

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.fetch import FIRST_VERSION, ask_for_nothing, parse_fetch_request
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.proxy.features.fetch_routing.routing import FetchRouting
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.routing.decide import FetchSession, PartitionKey
from kafka_quota_proxy.routing.selector import ClientMetadata

_FETCH = int(ApiKey.FETCH)


class FetchRoutingFilter(Filter):
    """Fetch routing on one connection to a broker's port: reads consumer fetches whole on
    their way upstream, decides where each partition of the consumer's fetch session is served,
    asks the leader for nothing of the partitions it redirects, and counts fetch bytes by
    rack. Sets ``client.client_rack``."""

    def __init__(self, host: FilterHost, routing: FetchRouting) -> None:
        self.host = host
        self.client = host.client
        self.routing = routing
        self._session = FetchSession()
        self._rack_key: tuple[str, str] | None = None
        self._route_key: tuple[Any, ...] | None = None
        self._decisions: dict[PartitionKey, int] = {}

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key == _FETCH and api_version >= FIRST_VERSION:
            return Interest.REQUEST_FRAME
        return Interest.NONE

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        """Where the replica selector sends partitions of this consumer's fetch session
        elsewhere, have the response rewritten, and (``patchable``) return the request to
        forward instead, asking the leader for nothing of them."""
        if entry.answer is not None:  # answered by the proxy (a client posing as a follower)
            return None
        routing = self.routing
        client = self.client
        try:
            header = parse_request_header(frame, 0, len(frame))
            summary = parse_fetch_request(frame, header.size, entry.api_version)
        except (IndexError, ValueError, struct.error):
            routing.unparsed_requests += 1
            return None
        if not summary.from_consumer:  # Fetch v15+ carries the replica id in a tag
            entry.follower = True
            return None
        cid = entry.client_id or ""
        rack_key = (summary.rack_id, cid)
        if rack_key != self._rack_key:
            self._rack_key = rack_key
            client.client_rack = routing.client_rack(summary, cid, client.peer_ip)
        session = self._session
        session.update(summary.session_epoch, summary.topics, summary.forgotten)
        key = (routing.generation, client.client_rack, session.version, cid, client.user)
        if key != self._route_key:
            self._route_key = key
            metadata = ClientMetadata(client.client_rack, cid, client.peer, client.user)
            self._decisions = routing.decide(client.scope, metadata, session)
        plan = routing.plan(cid, self._decisions, summary, session) if patchable else None
        if plan is None:
            if self._decisions:
                entry.route = routing.chooser(cid, self._decisions)
            return None
        if plan.redirect:
            entry.route = routing.chooser(cid, self._decisions, plan)
        if not plan.patches:
            return None
        session.forwarded(summary.session_epoch, plan)
        return ask_for_nothing(frame, summary, entry.api_version, plan.redirect,
                               idle=plan.idle, close_session=plan.close_session)

    def response_done(self, entry: InFlight) -> None:
        if entry.api_key == _FETCH and not entry.follower:
            self.routing.count_fetch(self.client.client_rack, self.client.scope,
                                     entry.response_size)

    def upstream_connected(self, ok: bool) -> None:
        # unreachable: no consumer is sent to this broker for a while
        self.routing.set_reachable(self.client.scope, ok)

    def closed(self, reason: str) -> None:
        if self.host.table and reason in ("upstream_closed", "upstream_error"):
            # A broker does not drop connections with requests in flight unless it is going
            # away: send no consumer to it for a while.
            self.routing.set_reachable(self.client.scope, False)
