"""Where the bootstrap listener's connections go, and whose budgets they use.

A Kafka broker has one budget per entity whichever of its addresses a client dialled, so a
connection to the proxy's bootstrap port must count against the budgets of the broker it
reaches, the same as a connection to that broker's own proxy port. The proxy picks that
broker when it accepts the connection, before its connection rate is checked:

- once brokers are known (from the metadata refresh, or any response rewritten), each
  bootstrap connection goes to the next of them in turn (those of the latest metadata, in
  node id order) at its upstream address, and its scope is that node id: its quota budgets,
  its client address's connection-rate sensor and its capture rows are that broker's. If that
  broker cannot be reached, the others are tried in turn, then the configured bootstrap
  servers; the connection's scope becomes the node id of the one reached.
- while no broker is known yet, it goes to ``upstream.bootstrap_servers`` in turn (as before
  the first refresh), with the bootstrap scope (``quota.enforcer.BOOTSTRAP_SCOPE``, -1: its
  own budgets, ``broker="bootstrap"`` in the metrics) at accept; once connected, a server
  whose address is a known broker's upstream address (host compared without case, and port)
  gives that node id. A server reached under another name than the one its broker advertises
  (a load balancer, a DNS alias, ``localhost`` for ``127.0.0.1``) keeps the bootstrap scope.

Pure: no I/O; the proxy passes its broker registry and live node ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kafka_quota_proxy.protocol.addresses import Broker, BrokerAddresses
from kafka_quota_proxy.quota.enforcer import BOOTSTRAP_SCOPE

# an upstream address to dial, and the quota scope of a connection that reaches it
Target = tuple[str, int, int]


class BootstrapRoutes:
    """Chooses, per bootstrap connection, the broker it goes to (``choose``) and the upstream
    addresses to try for it (``targets``)."""

    def __init__(self, registry: BrokerAddresses, servers: Sequence[tuple[str, int]],
                 live: Callable[[], set[int]]) -> None:
        """``servers``: ``upstream.bootstrap_servers``; ``live()``: the node ids of the
        latest metadata (empty before the first: every broker learnt counts)."""
        self.registry = registry
        self.servers = list(servers)
        self.live = live
        self._next = 0  # round robin over the known brokers
        self._next_server = 0  # round robin over the bootstrap servers

    def known(self) -> list[Broker]:
        """The brokers a bootstrap connection may go to, in node id order."""
        live = self.live()
        brokers = self.registry.by_node
        return [brokers[n] for n in sorted(brokers) if not live or n in live]

    def choose(self) -> int:
        """The scope of a connection accepted now: the next known broker's node id, else the
        bootstrap scope."""
        known = self.known()
        if not known:
            return BOOTSTRAP_SCOPE
        broker = known[self._next % len(known)]
        self._next += 1
        return broker.node_id

    def scope_of(self, host: str, port: int) -> int:
        """The node id of the broker at this upstream address, else the bootstrap scope."""
        host = host.lower()
        for b in self.registry.by_node.values():
            if b.port == port and b.host.lower() == host:
                return b.node_id
        return BOOTSTRAP_SCOPE

    def targets(self, scope: int) -> list[Target]:
        """The addresses to try, in order, for a connection accepted with ``scope``: its
        broker first, then the other known brokers after it, then the bootstrap servers (in
        turn) not among them."""
        out: list[Target] = []
        known = self.known()
        ids = [b.node_id for b in known]
        if scope in ids:
            i = ids.index(scope)
            out = [(b.host, b.port, b.node_id) for b in known[i:] + known[:i]]
        elif scope != BOOTSTRAP_SCOPE:
            chosen = self.registry.get(scope)  # (left the cluster since: tried all the same)
            if chosen is not None:
                out.append((chosen.host, chosen.port, chosen.node_id))
            out += [(b.host, b.port, b.node_id) for b in known]
        dialled = {(h.lower(), p) for h, p, _ in out}
        for host, port in self.server_order():
            if (host.lower(), port) not in dialled:
                out.append((host, port, self.scope_of(host, port)))
        return out

    def server_order(self) -> list[tuple[str, int]]:
        """The bootstrap servers, beginning with the next in turn."""
        servers = self.servers
        if not servers:
            return []
        i = self._next_server % len(servers)
        self._next_server += 1
        return servers[i:] + servers[:i]
