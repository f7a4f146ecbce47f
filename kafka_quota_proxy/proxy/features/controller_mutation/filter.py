"""The controller mutation quota on the request path (KIP-599, ``quota.mutation``).

CreateTopics, DeleteTopics and CreatePartitions frames are read whole before any of them goes
upstream. For a client under a ``controller_mutation_rate`` each topic is counted in request
order with what it will cost: CreateTopics the partitions it asks for (the broker's default
when it asks for none), DeleteTopics the topic's partitions, CreatePartitions the partitions
it adds (both as last seen in a Metadata response or a mutation's result; unknown: one).
Strict versions (CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+): a topic met with
the budget below zero is refused, never forwarded, and answered THROTTLING_QUOTA_EXCEEDED
(89) among the broker's results; a request whose topics are all refused is answered by the
proxy (never forwarded, as the quota admin APIs).
Older versions go through whole and are only throttled. The response carries the throttle
time (the larger of this quota's and the others') and the client is held back for it, as for
any quota. When the response comes, what a topic really cost is settled: the topics the
broker refused are given back, CreateTopics' counts corrected to the partitions created.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.mutation_frames import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    MUTATION_APIS,
    MutationRequest,
    TopicMutation,
    decode_request,
    decode_results,
    decoded_versions,
    refused_response,
    with_refused,
    without,
)
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.features.controller_mutation.mutations import (
    ControllerMutations,
    api_label,
)
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost, propose_throttle
from kafka_quota_proxy.quota.mutation import MutationBudget, MutationThrottle, strict

log = structlog.get_logger("kafka_quota_proxy.controller_mutation")


class _ControllerMutationQuota:
    """What ``entry.throttled_by`` names for the metrics (``kafka_proxy_throttled_requests``)."""

    short = "controller_mutation"


CONTROLLER_MUTATION = _ControllerMutationQuota()


@dataclass(slots=True)
class _Pending:
    request: MutationRequest
    budget: MutationBudget
    throttle: MutationThrottle
    forwarded: list[int] = field(default_factory=list)  # indices of the topics sent upstream
    charged: dict[int, float] = field(default_factory=dict)  # index -> partitions recorded
    refused: list[TopicMutation] = field(default_factory=list)


class ControllerMutationFilter(Filter):
    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key in MUTATION_APIS:
            low, high = decoded_versions(api_key)
            if low <= api_version <= high:
                return Interest.ANSWERED
        return Interest.NONE

    def __init__(self, host: FilterHost, mutations: ControllerMutations) -> None:
        self.host = host
        self.mutations = mutations
        self._pending: dict[int, _Pending] = {}  # id(entry) -> what its response settles
        self._learning: dict[int, MutationRequest] = {}  # id(entry) -> request, no quota

    # ------------------------------------------------------------------ requests
    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        key = entry.api_key
        if key not in MUTATION_APIS or entry.answer is not None:
            return None
        m = self.mutations
        if not patchable:  # larger than the proxy reads whole (1 MiB): forwarded as sent
            m.undecodable += 1
            log.info("mutation_request_unread", api=api_label(key),
                     detail=f"{entry.request_size} bytes, forwarded as sent, not counted")
            return None
        try:
            request = decode_request(frame, key, entry.api_version)
        except MalformedFrame as exc:  # the broker answers it (or closes) as it would
            m.undecodable += 1
            log.info("mutation_request_unread", api=api_label(key), detail=str(exc))
            return None
        budget = m.quotas.budget(self.host.client.user, entry.client_id or "")
        if budget is None:  # no quota: only what the topics have is learnt
            self._learning[id(entry)] = request
            return None
        now = now_ms()
        pending = _Pending(request, budget, MutationThrottle())
        label = api_label(key)
        if strict(key, request.version):
            for i, topic in enumerate(request.topics):
                if not budget.check(pending.throttle, now):
                    pending.refused.append(topic)
                    m.topics[(label, "throttled")] += 1
                    continue
                cost = self._cost(key, topic)
                budget.record(cost, now)
                pending.charged[i] = cost
                pending.forwarded.append(i)
                m.topics[(label, "accepted")] += 1
        else:
            costs = {i: self._cost(key, t) for i, t in enumerate(request.topics)}
            budget.record_permissive(sum(costs.values()), pending.throttle, now)
            pending.charged = costs
            pending.forwarded = list(costs)
            m.topics[(label, "accepted")] += len(costs)
        m.recorded[label] += sum(pending.charged.values())
        throttle = pending.throttle.throttle_ms(now)
        if throttle > 0:
            propose_throttle(entry, throttle, CONTROLLER_MUTATION)
        self._pending[id(entry)] = pending
        if not pending.refused:
            return None
        log.info("mutation_throttled", api=label, principal=self.host.client.user,
                 client_id=entry.client_id, refused=len(pending.refused),
                 forwarded=len(pending.forwarded), throttle_ms=throttle)
        if not pending.forwarded:  # answered: never forwarded, nothing to settle
            del self._pending[id(entry)]
            entry.answer = refused_response(key, request.version, entry.correlation_id,
                                            pending.refused)
            return None
        return without(frame, request, pending.forwarded)

    def _cost(self, api_key: int, topic: TopicMutation) -> float:
        """What a topic will cost, as far as the proxy knows before the broker answers."""
        m = self.mutations
        if api_key == CREATE_TOPICS:
            return float(topic.partitions if topic.partitions is not None
                         else m.default_partitions)
        known = m.partitions.count(topic.name, topic.topic_id)
        if api_key == DELETE_TOPICS:
            if known is None:
                m.estimated += 1
                return 1.0
            return float(known)
        if known is None or topic.partitions is None:
            m.estimated += 1
            return 1.0
        return float(max(topic.partitions - known, 0))

    # ------------------------------------------------------------------ responses
    def response_frame(self, entry: InFlight, frame: bytes | memoryview) -> None:
        if entry.api_key not in MUTATION_APIS:
            return
        key = id(entry)
        pending = self._pending.pop(key, None)
        learning = self._learning.pop(key, None)
        request = pending.request if pending is not None else learning
        if request is None:
            return
        try:
            results = decode_results(frame, entry.api_key, entry.api_version)
        except MalformedFrame as exc:
            log.info("mutation_response_unread", api=api_label(entry.api_key), detail=str(exc))
            return
        self._learn(request, results)
        if pending is None:
            return
        self._settle(pending, results)
        if pending.refused:
            entry.answer = with_refused(frame, entry.api_key, entry.api_version,
                                        pending.refused)

    def _learn(self, request: MutationRequest, results: tuple) -> None:  # type: ignore[type-arg]
        m = self.mutations
        asked = {t.name: t for t in request.topics if t.name is not None}
        for r in results:
            if r.error_code:
                continue
            if request.api_key == CREATE_TOPICS and r.name is not None:
                if r.partitions is not None:
                    m.partitions.observe(r.name, r.topic_id, r.partitions)
                    topic = asked.get(r.name)
                    if topic is not None and topic.partitions is None:
                        m.default_partitions = r.partitions
            elif request.api_key == DELETE_TOPICS:
                m.partitions.forget(r.name, r.topic_id)
            elif request.api_key == CREATE_PARTITIONS and r.name is not None:
                topic = asked.get(r.name)
                if topic is not None and topic.partitions is not None:
                    m.partitions.observe(r.name, None, topic.partitions)

    def _settle(self, pending: _Pending, results: tuple) -> None:  # type: ignore[type-arg]
        """Topics the broker refused cost nothing; CreateTopics costs what it created. A
        result is matched to its topic by id (DeleteTopics by id) or else by name, in order."""
        request = pending.request
        slots: dict[object, list[int]] = {}
        for i in pending.forwarded:
            t = request.topics[i]
            slots.setdefault(t.topic_id if t.topic_id is not None else t.name, []).append(i)
        now = now_ms()
        budget = pending.budget
        label = api_label(request.api_key)
        for r in results:
            found = slots.get(r.topic_id) if r.topic_id is not None else None
            if not found:
                found = slots.get(r.name)
            if not found:
                continue
            i = found.pop(0)
            charged = pending.charged.get(i, 0.0)
            if r.error_code:
                actual = 0.0
            elif request.api_key == CREATE_TOPICS and r.partitions is not None:
                actual = float(r.partitions)
            else:
                continue
            if actual != charged:
                budget.record(actual - charged, now)
                self.mutations.recorded[label] += actual - charged

    def closed(self, reason: str) -> None:
        self._pending.clear()
        self._learning.clear()
