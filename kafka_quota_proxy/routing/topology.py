"""The cluster as Metadata responses describe it: each broker's rack, each partition's leader,
replicas and in-sync replicas.

Every Metadata response lists all live brokers, but only the topics it was asked for, so
brokers are replaced wholesale and topics one by one. Racks come from the brokers'
``broker.rack`` unless the operator overrides them. ``generation`` changes whenever anything
a routing decision depends on changes, so decisions can be cached against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

TopicKey: TypeAlias = str | bytes  # topic name, or 16-byte topic id (Fetch v13+)
_NO_TOPIC_ID = bytes(16)


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int  # -1: no leader
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class Topology:
    def __init__(self, rack_overrides: Mapping[int, str] | None = None) -> None:
        self.rack_overrides = dict(rack_overrides or {})
        self.advertised_racks: dict[int, str | None] = {}  # live brokers -> broker.rack
        self.partitions: dict[tuple[str, int], PartitionState] = {}
        self.topic_names: dict[bytes, str] = {}  # topic id -> name
        self._topic_partitions: dict[str, set[int]] = {}
        self.generation = 0

    # ------------------------------------------------------------------ updates
    def set_rack_overrides(self, overrides: Mapping[int, str]) -> None:
        if dict(overrides) != self.rack_overrides:
            self.rack_overrides = dict(overrides)
            self.generation += 1

    def observe_brokers(self, brokers: Iterable[tuple[int, str | None]]) -> None:
        """The live brokers (node id, rack) from a Metadata response."""
        new = {node: (rack or None) for node, rack in brokers}
        if new != self.advertised_racks:
            self.advertised_racks = new
            self.generation += 1

    def observe_topic(
        self,
        name: str,
        topic_id: bytes | None,
        partitions: Iterable[tuple[int, int, Iterable[int], Iterable[int]]],
    ) -> None:
        """One topic from a Metadata response: (partition, leader, replicas, isr) each."""
        changed = False
        if topic_id and topic_id != _NO_TOPIC_ID and self.topic_names.get(topic_id) != name:
            self.topic_names[topic_id] = name
            changed = True
        seen = set()
        for index, leader, replicas, isr in partitions:
            state = PartitionState(leader, tuple(replicas), tuple(isr))
            seen.add(index)
            key = (name, index)
            if self.partitions.get(key) != state:
                self.partitions[key] = state
                changed = True
        for index in self._topic_partitions.get(name, set()) - seen:
            del self.partitions[(name, index)]
            changed = True
        self._topic_partitions[name] = seen
        if changed:
            self.generation += 1

    def forget_topic(self, name: str) -> None:
        """A topic the cluster does not know (any more)."""
        parts = self._topic_partitions.pop(name, None)
        ids = [tid for tid, n in self.topic_names.items() if n == name]
        for tid in ids:
            del self.topic_names[tid]
        if parts:
            for index in parts:
                del self.partitions[(name, index)]
        if parts or ids:
            self.generation += 1

    # ------------------------------------------------------------------ queries
    def rack(self, node_id: int) -> str | None:
        override = self.rack_overrides.get(node_id)
        return override if override is not None else self.advertised_racks.get(node_id)

    def is_live(self, node_id: int) -> bool:
        return node_id in self.advertised_racks

    def topic_name(self, topic: TopicKey) -> str | None:
        return topic if isinstance(topic, str) else self.topic_names.get(topic)

    def partition(self, topic: TopicKey, partition: int) -> PartitionState | None:
        name = self.topic_name(topic)
        return None if name is None else self.partitions.get((name, partition))
