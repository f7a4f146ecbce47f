"""Rack-aware routing: the selector (with Kafka's own example), topology updates, client racks,
fetch sessions, the routing decision, and the plan that asks a leader for nothing of the
partitions it redirects (checked against a model of a broker's fetch sessions)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.fetch import FetchRequestSummary
from kafka_quota_proxy.proxy.features.fetch_routing.routing import FetchRouting
from kafka_quota_proxy.routing.client_rack import ClientRacks, RackRule
from kafka_quota_proxy.routing.decide import (
    FetchPlan,
    FetchSession,
    PartitionKey,
    Router,
    plan_fetch,
)
from kafka_quota_proxy.routing.selector import (
    ClientMetadata,
    LeaderSelector,
    PartitionView,
    RackAwareSelector,
    ReplicaView,
)
from kafka_quota_proxy.routing.topology import Topology


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


def test_fetch_session_knows_what_the_broker_holds_at_zero_bytes() -> None:
    s = FetchSession()
    s.update(0, [("t", [0, 1, 2])], [])
    s.forwarded(0, FetchPlan({("t", 0): 2, ("t", 1): 2}))  # a new session, 0 and 1 at 0 bytes
    assert s.zeroed == {("t", 0), ("t", 1)}
    s.update(1, [("t", [1])], [])  # listed again: with the bytes the client asks for
    assert s.zeroed == {("t", 0)}
    s.update(2, [], [("t", [0])])  # forgotten
    assert s.zeroed == set()
    s.update(0, [("t", [0])], [])
    s.forwarded(0, FetchPlan({("t", 0): 2}))
    s.update(1, [], [])
    s.forwarded(1, FetchPlan({}, close_session=True))  # the broker closes the session
    assert s.zeroed == set()
    s.update(-1, [("t", [0])], [])
    s.forwarded(-1, FetchPlan({("t", 0): 2}))  # no session: nothing held
    assert s.zeroed == set()


def _redirect_all(key: PartitionKey, node: int | None) -> int | None:
    return node


def _serve_all(key: PartitionKey, node: int | None) -> None:
    return None


def test_plan_of_full_fetches() -> None:
    s = FetchSession()
    keys = [("t", 0), ("t", 1)]
    for epoch in (-1, 0):
        s.update(epoch, [("t", [0, 1])], [])
        assert plan_fetch(epoch, keys, s, {("t", 0): 2}, _redirect_all) == FetchPlan(
            {("t", 0): 2})
        assert plan_fetch(epoch, keys, s, {("t", 0): 2, ("t", 1): 3}, _redirect_all
                          ) == FetchPlan({("t", 0): 2, ("t", 1): 3}, idle=True)
        assert plan_fetch(epoch, keys, s, {("t", 0): 2}, _serve_all) == FetchPlan({})
    assert plan_fetch(-1, [], s, {}, _redirect_all) == FetchPlan({})  # nothing listed


def test_plan_of_incremental_fetches() -> None:
    s = FetchSession()
    s.update(0, [("t", [0, 1])], [])
    s.forwarded(0, plan_fetch(0, [("t", 0), ("t", 1)], s, {("t", 0): 2}, _redirect_all))
    assert s.zeroed == {("t", 0)}
    s.update(1, [("t", [1])], [])
    # The session still holds partition 0 at 0 bytes: fine while it is redirected ...
    assert plan_fetch(1, [("t", 1)], s, {("t", 0): 2}, _redirect_all) is None
    # ... but once the leader must serve it (the replica went away, the client came back too
    # soon), the session is closed, and the listed partitions planned as in a full fetch.
    assert plan_fetch(1, [("t", 1)], s, {}, _redirect_all) == FetchPlan({}, close_session=True)
    assert plan_fetch(1, [("t", 1)], s, {("t", 0): 2, ("t", 1): 3}, _serve_all) == FetchPlan(
        {}, close_session=True)
    assert plan_fetch(1, [("t", 1)], s, {("t", 1): 3},
                      lambda key, node: node if key == ("t", 1) else None
                      ) == FetchPlan({("t", 1): 3}, idle=True, close_session=True)
    s.update(2, [], [("t", [0])])
    assert plan_fetch(2, [], s, {}, _redirect_all) is None  # an incremental fetch: no plan


def _summary(epoch: int, listed: list[PartitionKey],
             forgotten: tuple[PartitionKey, ...] | list[PartitionKey] = ()
             ) -> FetchRequestSummary:
    return FetchRequestSummary(-1, 0 if epoch < 0 else 7, epoch,
                               tuple((t, (p,)) for t, p in listed),
                               tuple((t, (p,)) for t, p in forgotten), "b")


def test_planned_response_redirects_exactly_what_the_leader_was_asked_nothing_of() -> None:
    now = [1_000_000]
    routing = FetchRouting(None, clock=lambda: now[0])
    decisions = {("t", 0): 2, ("t", 1): 2}
    session = FetchSession()
    listed = [("t", 0), ("t", 1)]
    session.update(-1, [("t", [0, 1])], [])
    plan = routing.plan("c", decisions, _summary(-1, listed), session)
    assert plan == FetchPlan(decisions, idle=True)
    choose = routing.chooser("c", decisions, plan)
    assert [choose("t", p, -1) for p in (0, 1)] == [2, 2]
    assert routing.decisions["preferred_replica"] == 2
    # Back at the leader within bounce_ms: served, so asked for its own bytes, and not
    # redirected even if the long poll outlasts bounce_ms.
    now[0] += 1000
    session.update(-1, [("t", [0])], [])
    plan = routing.plan("c", decisions, _summary(-1, [("t", 0)]), session)
    assert plan == FetchPlan({}) and routing.decisions["bounced_to_leader"] == 1
    now[0] += routing.bounce_ms
    assert routing.chooser("c", decisions, plan)("t", 0, -1) is None
    # After bounce_ms a new fetch is redirected again; a broker's own choice is kept.
    session.update(-1, [("t", [0])], [])
    plan = routing.plan("c", decisions, _summary(-1, [("t", 0)]), session)
    assert plan.redirect == {("t", 0): 2}
    assert routing.chooser("c", decisions, plan)("t", 0, 3) is None
    assert routing.decisions["broker_choice_kept"] == 1
    # No decisions and nothing held at 0 bytes: no plan, nothing to read.
    assert routing.plan("c", {}, _summary(-1, [("t", 0)]), session) is None


# A model of a Kafka broker's fetch sessions (KIP-227), a Java-like client, and the proxy in
# between: the proxy's plan and ``FetchSession`` run unchanged, the broker applies the patched
# request to its session, answers, and the client follows the redirects it gets (or not).
PARTITIONS = [("t", p) for p in range(4)]
CLIENT_MAX_BYTES = 1 << 20

step_strategy = st.fixed_dictionaries({
    "decisions": st.dictionaries(st.sampled_from(PARTITIONS), st.sampled_from([2, 3])),
    "advance_ms": st.sampled_from([0, 10, 30_000, 61_000]),
    "kind": st.sampled_from(["incremental", "incremental", "incremental", "full", "none"]),
    "add": st.sets(st.sampled_from(PARTITIONS)),
    "drop": st.sets(st.sampled_from(PARTITIONS)),
    "changed": st.sets(st.sampled_from(PARTITIONS)),
    "omitted": st.sets(st.sampled_from(PARTITIONS)),  # left out of an incremental response
    "obey": st.booleans(),
})


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step_strategy, min_size=1, max_size=25))
def test_no_partition_the_leader_must_serve_is_held_at_zero_bytes(steps: list[Any]) -> None:
    now = [1_000_000]
    routing = FetchRouting(None, clock=lambda: now[0])
    session = FetchSession()
    held: dict[PartitionKey, int] | None = None  # the broker's session: partition -> max bytes
    fetching: set[PartitionKey] = set()  # what the client fetches from this leader
    in_session: set[PartitionKey] = set()  # what the client's session handler last sent
    next_full = True
    for step in steps:
        now[0] += step["advance_ms"]
        decisions = step["decisions"]
        fetching = (fetching | step["add"]) - step["drop"]
        if step["kind"] == "none":  # a client without sessions (librdkafka)
            epoch, listed, forgotten = -1, sorted(fetching), []
        elif next_full or step["kind"] == "full":
            epoch, listed, forgotten = 0, sorted(fetching), []
        else:  # added and changed partitions are listed, removed ones forgotten
            epoch = 1
            listed = sorted((fetching - in_session) | (fetching & step["changed"]))
            forgotten = sorted(in_session - fetching)
        summary = _summary(epoch, listed, forgotten)
        session.update(epoch, summary.topics, summary.forgotten)
        session_decisions = {k: v for k, v in decisions.items() if k in session.partitions}
        plan = routing.plan("c", session_decisions, summary, session)
        if plan is not None and plan.patches:
            session.forwarded(epoch, plan)
        zero = plan.redirect if plan is not None else {}
        sent = {k: 0 if k in zero else CLIENT_MAX_BYTES for k in listed}
        effective = -1 if plan is not None and plan.close_session else epoch

        # The broker applies the request to its session and reads what it holds.
        if effective <= 0:
            read = dict(sent)
            held = dict(sent) if effective == 0 else None
        else:
            assert held is not None
            for k in forgotten:
                held.pop(k, None)
            held.update(sent)
            read = dict(held)
        if plan is not None and plan.idle:
            assert all(n == 0 for n in read.values())

        def must_serve(key: PartitionKey, decided: dict[PartitionKey, int]) -> bool:
            last = routing._redirected.get(("c", *key))
            return key not in decided or (last is not None and now[0] - last < routing.bounce_ms)

        # What the proxy believes the broker holds at 0 bytes is what it holds ...
        zeroed = {k for k, n in (held or {}).items() if n == 0}
        assert session.zeroed == zeroed
        # ... and the leader reads nothing only of partitions being redirected.
        for key, n in read.items():
            if n == 0:
                assert not must_serve(key, session_decisions), (key, plan, step)

        # The broker answers: every listed partition of a full fetch, the changed ones of an
        # incremental one. The proxy redirects some of them.
        answered = sorted(read) if effective <= 0 else sorted(set(read) - step["omitted"])
        if plan is None:
            choose = routing.chooser("c", session_decisions) if session_decisions else None
        else:
            choose = routing.chooser("c", session_decisions, plan) if plan.redirect else None
        redirected = {k for k in answered if choose is not None and choose(*k, -1) is not None}
        if plan is not None:
            assert redirected == set(plan.redirect)  # exactly what the leader was asked nothing of
        for key, n in read.items():  # the client is told where to go of what it gets none of
            if n == 0:
                assert key in redirected or ("c", *key) in routing._redirected, (key, step)
        if step["obey"]:
            fetching -= redirected
        in_session = set(listed) if epoch <= 0 else (in_session | set(listed)) - set(forgotten)
        next_full = effective < 0  # no session on the broker: the next fetch opens one


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
