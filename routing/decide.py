"""Which partitions of a consumer's fetch should move to another replica.

Only the partition leader redirects (as in Kafka: a follower serving a consumer never points
it elsewhere). Replicas on brokers that are not live (missing from the latest Metadata) or
that the proxy cannot reach are not offered to the selector; whatever a selector returns must
be one of the offered replicas, or the leader is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from routing.selector import ClientMetadata, PartitionView, ReplicaSelector, ReplicaView
from routing.topology import TopicKey, Topology

PartitionKey = tuple[TopicKey, int]


class FetchSession:
    """The partitions one connection's fetch session covers (KIP-227). An incremental fetch
    lists only changed partitions, but its response may carry any partition of the session,
    so decisions are made for the whole session."""

    __slots__ = ("partitions", "version")

    def __init__(self) -> None:
        self.partitions: frozenset[PartitionKey] = frozenset()
        self.version = 0

    def update(self, epoch: int, topics: Iterable[tuple[TopicKey, Iterable[int]]],
               forgotten: Iterable[tuple[TopicKey, Iterable[int]]]) -> None:
        asked = {(t, p) for t, parts in topics for p in parts}
        if epoch <= 0:  # -1: a full fetch without a session; 0: a new session (full)
            new = frozenset(asked)
        else:
            gone = {(t, p) for t, parts in forgotten for p in parts}
            new = (self.partitions | asked) - gone
        if new != self.partitions:
            self.partitions = new
            self.version += 1


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
