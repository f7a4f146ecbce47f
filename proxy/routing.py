"""Rack-aware fetch routing in the proxy: the topology fed from Metadata responses, the
decision for each consumer fetch, and the figures the metrics export.

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

from typing import TYPE_CHECKING, Any

from protocol.apis import ApiKey
from protocol.fetch import FIRST_VERSION, FetchRequestSummary, TopicKey
from proxy.quotas import now_ms
from routing.client_rack import ClientRacks
from routing.decide import FetchPlan, FetchSession, PartitionKey, Router, plan_fetch
from routing.selector import ClientMetadata, LeaderSelector
from routing.topology import Topology

if TYPE_CHECKING:
    from config.schema import RacksConfig

UNKNOWN_TOPIC_OR_PARTITION = 3
BOUNCE_MS = 60_000
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
        for topic in response.topics:
            name = topic.name
            if name is None:
                continue
            error = int(getattr(topic.error_code, "value", topic.error_code))
            if error == UNKNOWN_TOPIC_OR_PARTITION:
                topology.forget_topic(name)
                continue
            if error:
                continue
            topic_id = getattr(topic, "topic_id", None)
            topology.observe_topic(
                name,
                topic_id.bytes if topic_id is not None else None,
                ((p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes)
                 for p in topic.partitions),
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
    def wants(self, api_key: int, api_version: int, follower: bool) -> bool:
        """Whether to read this request (a consumer Fetch that can carry a rack)."""
        return (self.enabled and api_key == ApiKey.FETCH and api_version >= FIRST_VERSION
                and not follower)

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
            if len(self._redirected) > 100_000:
                self._prune(now)
            self._redirected[(client_id, topic, partition)] = now
            self.decisions["preferred_replica"] += 1
            return node

        return choose

    def _prune(self, now: int) -> None:
        self._redirected = {k: t for k, t in self._redirected.items()
                            if now - t < self.bounce_ms}

    # ------------------------------------------------------------------ figures
    def count_fetch(self, client_rack: str | None, serving_node: int, size: int) -> None:
        key = (client_rack or "", self.topology.rack(serving_node) or "")
        self.fetch_bytes[key] = self.fetch_bytes.get(key, 0) + size

    @property
    def cross_rack_bytes(self) -> int:
        return sum(n for (c, b), n in self.fetch_bytes.items() if c and b and c != b)
