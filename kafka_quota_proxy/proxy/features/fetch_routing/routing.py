"""Rack-aware fetch routing in the proxy: the topology fed from Metadata responses, the
decision for each consumer fetch (``FetchRoutingFilter``, one per connection to a broker's
port), and the figures the metrics export.

The pure parts are in ``routing/``; this module ties them to connections and the clock.
A consumer Fetch v11+ that reaches a partition leader's port is read (``protocol.fetch``);
when the selector picks another replica for a partition of the consumer's fetch session, the
response goes through the rewriter, which sets ``preferred_read_replica`` and empties the
records of that partition (what a Kafka leader running a replica selector answers; librdkafka
skips records that come with a preferred replica, and the consumer has not advanced, so it
reads the same offsets from the replica).

A Kafka leader that picks a preferred replica does not read the partition. So that the leader
behind the proxy does not either, a full fetch is planned before it is forwarded
(``routing.decide.plan_fetch``): the partitions to redirect are asked for 0 bytes (and the
whole request for 0 bytes when nothing else is in it), and the response redirects exactly
those. Incremental fetches are decided when their response comes, as their response may
leave partitions out.

A consumer that comes back to the leader for a partition soon after being sent away (the
replica answered with an error, went away, or lost the data) is served by the leader for
``bounce_ms`` (librdkafka damps preferred-replica changes within 60 s the same way), so
clients never ping-pong between a leader and a replica that does not serve them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily

from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.decoded import metadata_topics
from kafka_quota_proxy.protocol.fetch import (
    FetchRequestSummary,
    TopicKey,
)
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.proxy.metrics import family
from kafka_quota_proxy.routing.client_rack import ClientRacks
from kafka_quota_proxy.routing.decide import (
    FetchPlan,
    FetchSession,
    PartitionKey,
    Router,
    plan_fetch,
)
from kafka_quota_proxy.routing.selector import ClientMetadata, LeaderSelector
from kafka_quota_proxy.routing.topology import Topology

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import RacksConfig

_FETCH = int(ApiKey.FETCH)
BOUNCE_MS = 60_000
# Redirects remembered at most (client-id, topic, partition): past it those older than
# BOUNCE_MS go, and if still past half of it, the oldest ones too
REDIRECTED_LIMIT = 100_000
# The label of fetch bytes from client racks no broker, rule or proxy names (a Fetch v11+
# rack_id is the client's to choose: one label each would grow the metric without bound)
OTHER_RACK = "other"
UNREACHABLE_MS = 30_000


class FetchRouting:
    def __init__(self, config: RacksConfig | None, clock: Any = now_ms) -> None:
        self.enabled = config is not None and config.selector != "leader"
        self.config = config
        self.clock = clock
        self.topology = Topology(config.brokers if config else {})
        self.router = Router(self.topology, config.make_selector() if config else LeaderSelector())
        self.racks = config.client_racks() if config else ClientRacks()
        self.proxy_decides = config is not None and config.decide == "proxy"
        self.bounce_ms = BOUNCE_MS
        self._redirected: dict[tuple[str, TopicKey, int], int] = {}  # -> when (ms)
        self._unreachable_since: dict[int, int] = {}
        # figures for the metrics
        self.fetch_bytes: dict[tuple[str, str], int] = {}  # (client rack, broker rack) -> bytes
        self._known_racks: frozenset[str] = frozenset()
        self._known_of: tuple[int, ClientRacks] | None = None
        self.decisions: dict[str, int] = {"preferred_replica": 0, "broker_choice_kept": 0,
                                          "bounced_to_leader": 0}
        self.unparsed_requests = 0

    # ------------------------------------------------------------------ topology
    def observe_metadata(self, response: Any) -> None:
        """A decoded MetadataResponse (any version) on its way to a client."""
        if not self.enabled:
            return
        topology = self.topology
        topology.observe_brokers(
            (b.node_id, getattr(b, "rack", None)) for b in response.brokers)
        for name, topic_id, partitions in metadata_topics(response):
            if partitions is None:
                topology.forget_topic(name)
                continue
            topology.observe_topic(
                name,
                topic_id.bytes if topic_id is not None else None,
                ((p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes)
                 for p in partitions),
            )

    def set_reachable(self, node_id: int, reachable: bool) -> None:
        if reachable:
            self._unreachable_since.pop(node_id, None)
        else:
            self._unreachable_since[node_id] = self.clock()
        self.router.set_reachable(node_id, reachable)

    def _expire_unreachable(self, now: int) -> None:
        """Brokers marked unreachable are offered again after a while (a client that then
        fails to reach one marks it again)."""
        for node, since in list(self._unreachable_since.items()):
            if now - since >= UNREACHABLE_MS:
                self.set_reachable(node, True)

    # ------------------------------------------------------------------ decisions
    def client_rack(self, summary: FetchRequestSummary, client_id: str,
                    address: str | None) -> str | None:
        return self.racks.rack_for(summary.rack_id, client_id, address)[0]

    def decide(self, serving_node: int, client: ClientMetadata,
               session: FetchSession) -> dict[PartitionKey, int]:
        if self._unreachable_since:
            self._expire_unreachable(self.clock())
        return self.router.decide(serving_node, client, session.partitions)

    @property
    def generation(self) -> tuple[int, int]:
        return self.topology.generation, self.router.generation

    def _bounced(self, client_id: str, key: PartitionKey, now: int) -> bool:
        """Back at the leader too soon after being sent away: the leader serves it."""
        last = self._redirected.get((client_id, *key))
        return last is not None and now - last < self.bounce_ms

    def plan(self, client_id: str, decisions: dict[PartitionKey, int],
             summary: FetchRequestSummary, session: FetchSession) -> FetchPlan | None:
        """What the forwarded request asks the leader for (``session`` already updated with
        ``summary``), or None to forward it as sent; see ``routing.decide.FetchPlan``."""
        if not decisions and not session.zeroed:
            return None
        now = self.clock()

        def verdict(key: PartitionKey, node: int | None) -> int | None:
            return None if node is None or self._bounced(client_id, key, now) else node

        plan = plan_fetch(summary.session_epoch, summary.listed, session, decisions, verdict)
        if plan is not None:
            self.decisions["bounced_to_leader"] += sum(
                1 for key in set(summary.listed) if key in decisions and key not in plan.redirect)
        return plan

    def chooser(self, client_id: str, decisions: dict[PartitionKey, int],
                plan: FetchPlan | None = None) -> Any:
        """The ``protocol.fetch.Chooser`` for one response. For a planned fetch, the
        partitions the request asked nothing of (``plan.redirect``), and only those, are
        redirected: the others were asked for what the client wanted."""

        def choose(topic: TopicKey, partition: int, current: int) -> int | None:
            key = (topic, partition)
            node = plan.redirect.get(key) if plan is not None else decisions.get(key)
            if current >= 0 and not self.proxy_decides:
                if node is not None:
                    self.decisions["broker_choice_kept"] += 1
                return None
            if node is None:
                return None
            now = self.clock()
            if plan is None and self._bounced(client_id, key, now):
                self.decisions["bounced_to_leader"] += 1
                return None
            if len(self._redirected) > REDIRECTED_LIMIT:
                self._prune(now)
            self._redirected[(client_id, topic, partition)] = now
            self.decisions["preferred_replica"] += 1
            return node

        return choose

    def redirect_entries(self) -> int:
        """Redirects remembered (at most REDIRECTED_LIMIT + 1)."""
        return len(self._redirected)

    def _prune(self, now: int) -> None:
        kept = {k: t for k, t in self._redirected.items() if now - t < self.bounce_ms}
        if len(kept) > REDIRECTED_LIMIT // 2:  # the newest (insertion order: near enough)
            kept = dict(list(kept.items())[-(REDIRECTED_LIMIT // 2):])
        self._redirected = kept

    # ------------------------------------------------------------------ figures
    def count_fetch(self, client_rack: str | None, serving_node: int, size: int) -> None:
        key = (self.metric_rack(client_rack), self.topology.rack(serving_node) or "")
        self.fetch_bytes[key] = self.fetch_bytes.get(key, 0) + size

    def metric_rack(self, client_rack: str | None) -> str:
        """The client's rack as the metrics label it: empty when unknown, OTHER_RACK when no
        broker (advertised or overridden), ``racks.clients`` rule or the proxy names it."""
        if not client_rack:
            return ""
        topology = self.topology
        if self._known_of != (topology.generation, self.racks):
            known = {r for r in (*topology.advertised_racks.values(),
                                 *topology.rack_overrides.values()) if r}
            known.update(rule.rack for rule in self.racks.rules)
            if self.racks.proxy_rack:
                known.add(self.racks.proxy_rack)
            self._known_racks = frozenset(known)
            self._known_of = (topology.generation, self.racks)
        return client_rack if client_rack in self._known_racks else OTHER_RACK

    @property
    def cross_rack_bytes(self) -> int:
        return sum(n for (c, b), n in self.fetch_bytes.items() if c and b and c != b)

    def metric_families(self) -> Iterator[Any]:
        """This feature's metric families (``ProxyStats.feature_families``)."""
        c = CounterMetricFamily(
            "kafka_proxy_fetch_bytes",
            "Consumer fetch response bytes, by the client's rack and the serving broker's rack "
            "(empty: unknown; client_rack other: a rack no broker, racks.clients rule or the "
            "proxy names)", labels=["client_rack", "broker_rack"])
        for (client_rack, broker_rack), n in sorted(self.fetch_bytes.items()):
            c.add_metric([client_rack, broker_rack], n)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_fetch_cross_rack_bytes",
            "Consumer fetch response bytes served from another rack than the client's")
        c.add_metric([], self.cross_rack_bytes)
        yield c
        yield family(CounterMetricFamily, "kafka_proxy_replica_selector_decisions",
                      "Partitions of fetch responses: preferred_replica (the proxy pointed the "
                      "consumer at another replica), broker_choice_kept (the broker had set one), "
                      "bounced_to_leader (back at the leader too soon after a redirect)",
                      "decision", self.decisions)
        c = CounterMetricFamily("kafka_proxy_fetch_requests_unparsed",
                                "Consumer fetch requests the router could not read (left alone)")
        c.add_metric([], self.unparsed_requests)
        yield c
