"""Which partitions of a consumer's fetch should move to another replica.

Only the partition leader redirects (as in Kafka: a follower serving a consumer never points
it elsewhere). Replicas on brokers that are not live (missing from the latest Metadata) or
that the proxy cannot reach are not offered to the selector; whatever a selector returns must
be one of the offered replicas, or the leader is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kafka_quota_proxy.routing.selector import (
    ClientMetadata,
    PartitionView,
    ReplicaSelector,
    ReplicaView,
)
from kafka_quota_proxy.routing.topology import TopicKey, Topology

PartitionKey = tuple[TopicKey, int]


class FetchSession:
    """The partitions one connection's fetch session covers (KIP-227). An incremental fetch
    lists only changed partitions, but its response may carry any partition of the session,
    so decisions are made for the whole session.

    ``zeroed``: the partitions the broker's session holds with ``partition_max_bytes`` 0 (the
    proxy asked the leader for nothing of them in the full fetch that last listed them). The
    broker keeps reading them with 0 bytes until the client lists them again, which it does
    only when they change."""

    __slots__ = ("partitions", "version", "zeroed")

    def __init__(self) -> None:
        self.partitions: frozenset[PartitionKey] = frozenset()
        self.version = 0
        self.zeroed: frozenset[PartitionKey] = frozenset()

    def update(self, epoch: int, topics: Iterable[tuple[TopicKey, Iterable[int]]],
               forgotten: Iterable[tuple[TopicKey, Iterable[int]]]) -> None:
        asked = {(t, p) for t, parts in topics for p in parts}
        if epoch <= 0:  # -1: a full fetch without a session; 0: a new session (full)
            new = frozenset(asked)
            self.zeroed = frozenset()  # every partition is listed with what it asks now
        else:
            gone = {(t, p) for t, parts in forgotten for p in parts}
            new = (self.partitions | asked) - gone
            self.zeroed = self.zeroed - asked - gone
        if new != self.partitions:
            self.partitions = new
            self.version += 1

    def forwarded(self, epoch: int, plan: FetchPlan) -> None:
        """The request was forwarded patched as ``plan`` says."""
        if plan.close_session or epoch < 0:
            self.zeroed = frozenset()  # no session on the broker now
        elif epoch == 0:
            self.zeroed = frozenset(plan.redirect)


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What one consumer fetch to a leader asks for, decided before it is forwarded.

    - ``redirect``: the listed partitions the proxy sends to another replica: the leader is
      asked for 0 bytes of them and the response carries ``preferred_read_replica``;
    - ``idle``: every partition the leader would read is redirected, so the request also asks
      for ``max_bytes`` 0 and ``min_bytes`` 0 (brokers that ignore ``partition_max_bytes``,
      tansu among them, honour ``max_bytes``);
    - ``close_session``: the incremental fetch is sent with session epoch -1 (FINAL_EPOCH):
      its session holds 0 bytes for a partition the leader must serve again, which the client
      would not list again; the broker closes the session and the client's next fetch is a
      full one that lists every partition with its own max bytes.

    Only full fetches (and the incremental ones turned into sessionless ones to close their
    session) are planned: a broker answers every partition of those, so the redirect reaches
    the client. An incremental fetch's response leaves out partitions with nothing new, so
    its partitions are decided when the response comes (and read by the leader as asked).
    """

    redirect: Mapping[PartitionKey, int] = field(default_factory=dict)
    idle: bool = False
    close_session: bool = False

    @property
    def patches(self) -> bool:
        return bool(self.redirect) or self.close_session


# (partition, the replica the selector picked, or None) -> the replica to redirect it to now,
# or None for the leader (e.g. the client came back too soon after a redirect)
Verdict = Callable[[PartitionKey, "int | None"], "int | None"]


def plan_fetch(epoch: int, listed: Iterable[PartitionKey], session: FetchSession,
               decisions: Mapping[PartitionKey, int], verdict: Verdict) -> FetchPlan | None:
    """The plan for a fetch listing ``listed`` (``session`` already updated with it), or None
    for an incremental fetch left as sent (its response is decided when it comes)."""
    close = epoch > 0 and any(verdict(key, decisions.get(key)) is None for key in session.zeroed)
    if epoch > 0 and not close:
        return None
    keys = list(listed)
    redirect: dict[PartitionKey, int] = {}
    for key in keys:
        node = decisions.get(key)
        if node is not None:
            node = verdict(key, node)
            if node is not None:
                redirect[key] = node
    idle = bool(keys) and len(redirect) == len(set(keys))
    return FetchPlan(redirect, idle, close)


class Router:
    def __init__(self, topology: Topology, selector: ReplicaSelector) -> None:
        self.topology = topology
        self.selector = selector
        self.unreachable: set[int] = set()  # brokers the proxy failed to connect to
        self.generation = 0  # bumped with unreachable changes (topology has its own)

    def set_reachable(self, node_id: int, reachable: bool) -> None:
        if reachable and node_id in self.unreachable:
            self.unreachable.discard(node_id)
            self.generation += 1
        elif not reachable and node_id not in self.unreachable:
            self.unreachable.add(node_id)
            self.generation += 1

    def _view(self, name: str, partition: int, leader: int, replicas: tuple[int, ...],
              isr: tuple[int, ...]) -> PartitionView:
        topology = self.topology
        views = tuple(
            ReplicaView(node, topology.rack(node), node in isr)
            for node in replicas
            if node == leader or (topology.is_live(node) and node not in self.unreachable)
        )
        lead = next((v for v in views if v.node_id == leader), None)
        if lead is None:
            lead = ReplicaView(leader, topology.rack(leader), True)
            views = (lead, *views)
        return PartitionView(name, partition, lead, views)

    def preferred_read_replica(self, serving_node: int, client: ClientMetadata,
                               topic: TopicKey, partition: int) -> int | None:
        """The replica ``client`` should fetch ``topic``/``partition`` from instead of
        ``serving_node``, or ``None`` to stay."""
        topology = self.topology
        name = topology.topic_name(topic)
        if name is None:
            return None
        state = topology.partitions.get((name, partition))
        if state is None or state.leader != serving_node or state.leader < 0:
            return None
        view = self._view(name, partition, state.leader, state.replicas, state.isr)
        chosen = self.selector.select(client, view)
        if chosen is None or chosen.node_id == state.leader:
            return None
        if not any(v.node_id == chosen.node_id for v in view.replicas):
            return None  # not an available replica: keep the leader
        return chosen.node_id

    def decide(self, serving_node: int, client: ClientMetadata,
               partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        out = {}
        for topic, partition in partitions:
            node = self.preferred_read_replica(serving_node, client, topic, partition)
            if node is not None:
                out[(topic, partition)] = node
        return out
