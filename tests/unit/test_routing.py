"""Rack-aware routing, pure: the selector (with Kafka's own example), topology updates, client
racks, fetch sessions and the routing decision."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.client_rack import ClientRacks, RackRule
from routing.decide import FetchSession, Router
from routing.selector import (
    ClientMetadata,
    LeaderSelector,
    PartitionView,
    RackAwareSelector,
    ReplicaView,
)
from routing.topology import Topology


def client(rack: str | None, client_id: str = "c") -> ClientMetadata:
    return ClientMetadata(rack, client_id, "10.0.0.1", "ANONYMOUS")


# Kafka's RackAwareReplicaSelectorTest: (id, rack, log end offset, time since caught up)
# (0,a,4,0) leader, (1,a,2,5), (2,b,3,3), (3,b,4,2). The proxy has no log end offsets: the
# in-sync replicas count as caught up, and the highest node id breaks ties.
KAFKA_EXAMPLE = PartitionView(
    "t", 0, ReplicaView(0, "a", True),
    (ReplicaView(0, "a", True), ReplicaView(1, "a", True), ReplicaView(2, "b", True),
     ReplicaView(3, "b", True)))


@pytest.mark.parametrize(("rack", "expected"), [("b", 3), (None, 0), ("", 0), ("a", 0),
                                                ("z", 0)])
def test_kafka_example(rack: str | None, expected: int) -> None:
    chosen = RackAwareSelector().select(client(rack), KAFKA_EXAMPLE)
    assert chosen is not None and chosen.node_id == expected


def test_out_of_sync_replicas_are_not_candidates() -> None:
    view = PartitionView("t", 0, ReplicaView(0, "a", True), (
        ReplicaView(0, "a", True), ReplicaView(2, "b", True), ReplicaView(3, "b", False)))
    assert RackAwareSelector().select(client("b"), view) == ReplicaView(2, "b", True)
    view = PartitionView("t", 0, ReplicaView(0, "a", True), (
        ReplicaView(0, "a", True), ReplicaView(3, "b", False)))
    assert RackAwareSelector().select(client("b"), view) == ReplicaView(0, "a", True)


def test_leader_selector_always_picks_the_leader() -> None:
    assert LeaderSelector().select(client("b"), KAFKA_EXAMPLE) == KAFKA_EXAMPLE.leader


@given(st.text(max_size=8), st.integers(0, 50), st.sampled_from(["t1", "t2"]))
def test_spread_is_stable_and_stays_in_the_clients_rack(cid: str, partition: int,
                                                        topic: str) -> None:
    view = PartitionView(topic, partition, ReplicaView(0, "a", True), (
        ReplicaView(0, "a", True), ReplicaView(2, "b", True), ReplicaView(3, "b", True),
        ReplicaView(4, "b", True)))
    selector = RackAwareSelector(spread=True)
    first = selector.select(client("b", cid), view)
    assert first is not None and first.rack == "b"
    assert selector.select(client("b", cid), view) == first


def test_spread_uses_every_candidate() -> None:
    selector = RackAwareSelector(spread=True)
    picks = set()
    for p in range(60):
        view = PartitionView("t", p, ReplicaView(0, "a", True), (
            ReplicaView(0, "a", True), ReplicaView(2, "b", True), ReplicaView(3, "b", True)))
        chosen = selector.select(client("b"), view)
        assert chosen is not None
        picks.add(chosen.node_id)
    assert picks == {2, 3}


# --------------------------------------------------------------------------- topology
def three_racks() -> Topology:
    topology = Topology()
    topology.observe_brokers([(1, "a"), (2, "b"), (3, "c")])
    topology.observe_topic("t", b"T" * 16, [(0, 1, [1, 2, 3], [1, 2, 3]),
                                            (1, 3, [3, 1, 2], [3, 1, 2])])
    return topology


def test_topology_by_name_and_topic_id() -> None:
    topology = three_racks()
    assert topology.partition("t", 0) == topology.partition(b"T" * 16, 0)
    assert topology.partition("t", 1).leader == 3  # type: ignore[union-attr]
    assert topology.partition("t", 2) is None and topology.partition(b"X" * 16, 0) is None
    assert topology.rack(2) == "b" and topology.rack(9) is None


def test_topology_generation_moves_only_on_change() -> None:
    topology = three_racks()
    g = topology.generation
    topology.observe_brokers([(1, "a"), (2, "b"), (3, "c")])
    topology.observe_topic("t", b"T" * 16, [(0, 1, [1, 2, 3], [1, 2, 3]),
                                            (1, 3, [3, 1, 2], [3, 1, 2])])
    assert topology.generation == g
    topology.observe_topic("t", b"T" * 16, [(0, 1, [1, 2, 3], [1, 3])])  # ISR shrank, p1 gone
    assert topology.generation > g
    assert topology.partition("t", 0).isr == (1, 3)  # type: ignore[union-attr]
    assert topology.partition("t", 1) is None
    topology.forget_topic("t")
    assert topology.partition("t", 0) is None and topology.topic_name(b"T" * 16) is None


def test_rack_overrides_win_over_broker_rack() -> None:
    topology = three_racks()
    topology.set_rack_overrides({2: "z"})
    assert topology.rack(2) == "z" and topology.rack(1) == "a"
    topology.observe_brokers([(1, None), (2, None)])
    assert topology.rack(1) is None and not topology.is_live(3)


# --------------------------------------------------------------------------- decisions
def test_router_redirects_only_from_the_leader_to_an_in_sync_replica_in_the_clients_rack(
) -> None:
    router = Router(three_racks(), RackAwareSelector())
    b = client("b")
    assert router.preferred_read_replica(1, b, "t", 0) == 2  # leader 1 (a) -> 2 (b)
    assert router.preferred_read_replica(3, b, b"T" * 16, 1) == 2  # leader 3 (c) -> 2 (b)
    assert router.preferred_read_replica(2, b, "t", 0) is None  # 2 is not the leader
    assert router.preferred_read_replica(1, client("a"), "t", 0) is None  # leader's rack
    assert router.preferred_read_replica(1, client(None), "t", 0) is None
    assert router.preferred_read_replica(1, b, "unknown", 0) is None
    assert router.decide(1, b, [("t", 0), ("t", 1)]) == {("t", 0): 2}


def test_router_skips_dead_and_unreachable_brokers() -> None:
    topology = three_racks()
    router = Router(topology, RackAwareSelector())
    router.set_reachable(2, False)
    assert router.preferred_read_replica(1, client("b"), "t", 0) is None
    router.set_reachable(2, True)
    assert router.preferred_read_replica(1, client("b"), "t", 0) == 2
    topology.observe_brokers([(1, "a"), (3, "c")])  # broker 2 left the cluster
    assert router.preferred_read_replica(1, client("b"), "t", 0) is None


def test_router_ignores_a_selector_choice_outside_the_replicas() -> None:
    class Rogue:
        def select(self, client: ClientMetadata, partition: PartitionView) -> ReplicaView:
            return ReplicaView(42, "b", True)

    assert Router(three_racks(), Rogue()).preferred_read_replica(1, client("b"), "t", 0) is None


# --------------------------------------------------------------------------- sessions
def test_fetch_session_tracks_incremental_fetches() -> None:
    s = FetchSession()
    s.update(0, [("t", [0, 1])], [])
    assert s.partitions == {("t", 0), ("t", 1)}
    v = s.version
    s.update(1, [("t", [1])], [])  # incremental: p1 changed, p0 still in the session
    assert s.partitions == {("t", 0), ("t", 1)} and s.version == v
    s.update(2, [("u", [5])], [("t", [0])])
    assert s.partitions == {("t", 1), ("u", 5)} and s.version > v
    s.update(-1, [("x", [0])], [])  # a full fetch without a session
    assert s.partitions == {("x", 0)}


# --------------------------------------------------------------------------- client racks
def test_client_rack_order() -> None:
    racks = ClientRacks([RackRule("b", client_id=re.compile("^billing-.*")),
                         RackRule("a", network=ipaddress.ip_network("10.1.0.0/16"))],
                        proxy_rack="p")
    assert racks.rack_for("c", "billing-1", "10.1.2.3") == ("c", "request")
    assert racks.rack_for("", "billing-1", "10.1.2.3") == ("b", "rule")
    assert racks.rack_for("", "other", "10.1.2.3") == ("a", "rule")
    assert racks.rack_for("", "other", "10.2.0.1") == ("p", "proxy")
    assert racks.rack_for("", "other", None) == ("p", "proxy")
    assert racks.rack_for("", "other", "not-an-ip") == ("p", "proxy")
    assert ClientRacks().rack_for("", "x", "10.1.2.3") == (None, "none")


def test_rule_with_both_conditions_needs_both() -> None:
    rule = RackRule("b", client_id=re.compile("app"), network=ipaddress.ip_network("::1/128"))
    assert rule.matches("app-1", "::1") and not rule.matches("app-1", "10.0.0.1")
    assert not rule.matches("other", "::1")
