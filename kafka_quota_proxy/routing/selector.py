"""Replica selectors: which replica a consumer should fetch a partition from.

The interface follows Kafka's ``org.apache.kafka.common.replica.ReplicaSelector``
(``select(topicPartition, clientMetadata, partitionView)``), with the information a proxy has:
no log end offsets or caught-up times, but the in-sync replica set. ``select`` returns the
replica to read from, or ``None`` for the leader. A user-supplied selector (``module:Class``
in the config) implements the same ``select``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ReplicaView:
    node_id: int
    rack: str | None
    in_sync: bool


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    leader: ReplicaView
    replicas: tuple[ReplicaView, ...]  # the available replicas, leader included


@dataclass(frozen=True, slots=True)
class ClientMetadata:
    rack_id: str | None
    client_id: str
    client_address: str
    principal: str


class ReplicaSelector(Protocol):
    def select(self, client: ClientMetadata, partition: PartitionView) -> ReplicaView | None: ...


class LeaderSelector:
    """Always the leader (Kafka's ``LeaderSelector``): routing off."""

    def select(self, client: ClientMetadata, partition: PartitionView) -> ReplicaView | None:
        return partition.leader


class RackAwareSelector:
    """Kafka's ``RackAwareReplicaSelector``, with what the proxy can know:

    - no client rack: the leader;
    - candidates: the in-sync replicas in the client's rack (the proxy sees no log end
      offsets, so only in-sync replicas count as caught up); none: the leader;
    - the leader among them: the leader;
    - else Kafka's last tie-break, the highest node id; or, with ``spread``, one candidate
      picked by a stable hash of (client-id, topic, partition), so that partitions and clients
      spread over equal replicas while each keeps its choice.
    """

    def __init__(self, spread: bool = False) -> None:
        self.spread = spread

    def select(self, client: ClientMetadata, partition: PartitionView) -> ReplicaView | None:
        rack = client.rack_id
        leader = partition.leader
        if not rack:
            return leader
        same = [r for r in partition.replicas if r.rack == rack and r.in_sync]
        if not same:
            return leader
        if any(r.node_id == leader.node_id for r in same):
            return leader
        if self.spread:
            same.sort(key=lambda r: r.node_id)
            key = f"{client.client_id}\0{partition.topic}\0{partition.partition}".encode()
            return same[zlib.crc32(key) % len(same)]
        return max(same, key=lambda r: r.node_id)
