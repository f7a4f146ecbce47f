"""Traffic capture on the request path: one ``CaptureRow`` per request (never payloads), in the
order the quotas recorded them, with what they recorded; the rows go to ``Capture`` (Parquet
files written off the event loop).

A row is built when the quotas record its request (its response starts; an acks=0 Produce when
it is read) and takes its sequence number then. A Fetch's row waits (``CaptureFilter._waiting``) for
its response to complete, as the stream measures its partitions on the way; an acks=0 Produce's
for the rest of its frame (walked for its partitions).
"""

from __future__ import annotations

import time
from typing import Any

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.features.capture.writer import Capture
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost, forwarded_unanswered
from kafka_quota_proxy.quota.capture_schema import CaptureRow
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer

_PRODUCE = int(ApiKey.PRODUCE)
_FETCH = int(ApiKey.FETCH)
_now = time.perf_counter
_NOT_RECORDED = (0, 0.0, 0, 0, 0)


class CaptureFilter(Filter):
    def __init__(self, host: FilterHost, capture: Capture, quotas: QuotaEnforcer) -> None:
        self.host = host
        self.client = host.client
        self.capture = capture
        self.quotas = quotas
        # rows waiting for their request's partitions: a Fetch's response, an acks=0
        # Produce's frame
        self._waiting: dict[InFlight, CaptureRow] = {}

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key == _PRODUCE and api_version >= 3:
            return Interest.PRODUCE_PARTITIONS
        if api_key == _FETCH:
            return Interest.FETCH_PARTITIONS
        return Interest.NONE

    def request(self, entry: InFlight) -> None:
        if not entry.expects_response and entry.api_key == _PRODUCE:  # acks=0: no response
            recorded = entry.recorded
            self._row(entry, recorded[0] if recorded is not None else now_ms(), -1.0)

    def request_measured(self, entry: InFlight) -> None:
        if entry in self._waiting:  # acks=0: its row waited for the frame
            self._complete(entry)

    def response(self, entry: InFlight, now_ms: int, elapsed_ms: float) -> None:
        if not entry.exempt:  # (the SASL exchange is never recorded: nothing to replay)
            self._row(entry, now_ms, elapsed_ms)

    def response_done(self, entry: InFlight) -> None:
        if entry.api_key == _FETCH and entry in self._waiting:
            self._complete(entry)

    def closed(self, reason: str) -> None:
        host = self.host
        for cut_short in (host.responses.in_progress, host.requests.measuring):
            if cut_short is not None and cut_short in self._waiting:
                cut_short.partitions = None
                self._complete(cut_short)
        # Produce requests the broker got whole but never answered (the quotas recorded them
        # just now, if active): a row each, without a response, as an acks=0 Produce's
        for entry in forwarded_unanswered(host):
            if entry.api_key == _PRODUCE and not entry.exempt:
                recorded = entry.recorded
                self._row(entry, recorded[0] if recorded is not None else now_ms(), -1.0)

    def _row(self, entry: InFlight, quota_ms: int, elapsed_ms: float) -> None:
        """The row of a request whose quotas were just recorded (``elapsed_ms`` < 0: it has
        no response)."""
        answered = elapsed_ms >= 0
        client = self.client
        quotas = self.quotas
        recorded = entry.recorded
        if recorded is not None:
            _, request_time, produce_ms, fetch_ms, request_ms = recorded
        else:  # no quota is active: what a request quota would charge, for the replays
            _, request_time, produce_ms, fetch_ms, request_ms = _NOT_RECORDED
            if answered and not entry.follower:
                request_time = quotas.request_time_ms(entry.request_size, entry.response_size,
                                                      entry.proxy_ms)
        is_produce = entry.api_key == _PRODUCE
        capture = self.capture
        row = CaptureRow(
            run=capture.run,
            instance=capture.instance,
            process=capture.process,
            seq=capture.next_seq(),
            ts_ms=int(time.time() * 1000.0 - (_now() - entry.forwarded_at) * 1000.0),
            quota_ms=quota_ms,
            connection=client.id,
            broker=client.scope,
            user=client.user,
            client_id=entry.client_id or "",
            client_address=client.peer_ip or "",
            api_key=entry.api_key,
            api_version=entry.api_version,
            request_bytes=entry.request_size,
            response_bytes=entry.response_size if answered else -1,
            duration_us=int(elapsed_ms * 1000) if answered else -1,
            request_time_ms=request_time,
            follower=entry.follower,
            throttle_produce_ms=produce_ms,
            throttle_fetch_ms=fetch_ms,
            throttle_request_ms=request_ms,
            client_rack=client.client_rack,
            quota_generation=quotas.generation,
            storage_scale=entry.storage_scale if is_produce else quotas.produce_scale,
            partitions=_partition_rows(entry.partitions),
        )
        if (entry.api_key == _FETCH and answered) or entry is self.host.requests.measuring:
            self._waiting[entry] = row
        else:
            capture.record(row)

    def _complete(self, entry: InFlight) -> None:
        """The row of a Fetch whose response has completed, or of an acks=0 Produce whose
        frame has (or of either, cut short)."""
        row = self._waiting.pop(entry)
        self.capture.record(row._replace(partitions=_partition_rows(entry.partitions)))


def _partition_rows(partitions: Any) -> list[tuple[str, int, int]] | None:
    if not partitions:
        return None
    return [(t if isinstance(t, str) else t.hex(), p, n) for t, p, n in partitions]
