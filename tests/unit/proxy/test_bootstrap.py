"""Where bootstrap connections go and whose budgets they use (``proxy.bootstrap``): the known
brokers in turn, each connection with its broker's node id as its scope; the bootstrap servers
with the bootstrap scope while no broker is known; a bootstrap server that is a known broker
gives its node id; and the connection-rate sensor of an address is one per broker whichever
port the connection came in on."""

from __future__ import annotations

from protocol.addresses import BrokerAddresses
from proxy.bootstrap import BootstrapRoutes
from quota.enforcer import BOOTSTRAP_SCOPE
from tests.unit.proxy.test_connection_rate import Conn, Transport, guard

SERVERS = [("kafka-a.example", 9092), ("kafka-b.example", 9092)]


def routes(live: set[int] | None = None) -> tuple[BootstrapRoutes, BrokerAddresses]:
    registry = BrokerAddresses("proxy.example", 30000, 30099)
    known = live if live is not None else set()
    return BootstrapRoutes(registry, SERVERS, lambda: known), registry


def test_no_broker_known_the_bootstrap_servers_in_turn_with_the_bootstrap_scope() -> None:
    r, _ = routes()
    assert r.choose() == BOOTSTRAP_SCOPE
    assert r.targets(BOOTSTRAP_SCOPE) == [("kafka-a.example", 9092, BOOTSTRAP_SCOPE),
                                          ("kafka-b.example", 9092, BOOTSTRAP_SCOPE)]
    assert r.targets(BOOTSTRAP_SCOPE) == [("kafka-b.example", 9092, BOOTSTRAP_SCOPE),
                                          ("kafka-a.example", 9092, BOOTSTRAP_SCOPE)]


def test_known_brokers_in_turn_each_connection_scoped_to_its_broker() -> None:
    r, registry = routes()
    for node, host in ((3, "b3.internal"), (1, "b1.internal"), (2, "b2.internal")):
        registry.advertise(node, host, 9092, None)
    assert [r.choose() for _ in range(4)] == [1, 2, 3, 1]
    # its broker first, the others after it, then the bootstrap servers (none is a broker)
    assert r.targets(2) == [("b2.internal", 9092, 2), ("b3.internal", 9092, 3),
                            ("b1.internal", 9092, 1),
                            ("kafka-a.example", 9092, BOOTSTRAP_SCOPE),
                            ("kafka-b.example", 9092, BOOTSTRAP_SCOPE)]


def test_only_the_brokers_of_the_latest_metadata() -> None:
    live = {1, 3}
    r, registry = routes(live)
    for node in (1, 2, 3):
        registry.advertise(node, f"b{node}.internal", 9092, None)
    assert [r.choose() for _ in range(3)] == [1, 3, 1]
    live.discard(3)  # 3 left the cluster after a connection was accepted for it
    assert [t[2] for t in r.targets(3)][:2] == [3, 1]


def test_a_bootstrap_server_that_is_a_known_broker_gives_its_node_id() -> None:
    r, registry = routes()
    registry.advertise(7, "KAFKA-B.example", 9092, None)  # (host names compared without case)
    assert r.scope_of("kafka-b.example", 9092) == 7
    assert r.scope_of("kafka-b.example", 9093) == BOOTSTRAP_SCOPE
    assert r.scope_of("kafka-a.example", 9092) == BOOTSTRAP_SCOPE  # an alias: unknown
    # accepted before any broker was known, connected after: the server reached decides
    assert r.targets(BOOTSTRAP_SCOPE) == [("kafka-a.example", 9092, BOOTSTRAP_SCOPE),
                                          ("kafka-b.example", 9092, 7)]
    # chosen broker 7: dialled once, at its advertised address (not again as a server)
    assert r.targets(r.choose()) == [("KAFKA-B.example", 9092, 7),
                                     ("kafka-a.example", 9092, BOOTSTRAP_SCOPE)]


async def test_bootstrap_and_broker_ports_share_an_address_sensor() -> None:
    """2/s over a 2 x 1 s window: 2 connections from one address per broker, whichever port:
    one through the bootstrap port (scoped to broker 1 at accept) and one through broker 1's
    port are served, the third (either port) is throttled; broker 2's own budget is apart."""
    g, _ = guard([{"ip": "<default>", "connection_creation_rate": 2}])
    r, registry = routes()
    registry.advertise(1, "b1.internal", 9092, None)
    made: list[Conn] = []

    def make(scope: int) -> Conn:
        made.append(Conn(scope))
        return made[-1]

    bootstrap = g.protocol_factory("bootstrap", None, r.choose, make)
    broker = g.protocol_factory("broker-1", None, 1, make)
    for factory in (bootstrap, broker, bootstrap, broker):
        factory().connection_made(Transport("10.0.0.1"))  # type: ignore[arg-type]
    assert [c.scope for c in made] == [1, 1]  # the 3rd and 4th held, not served
    assert g.held == 2
    registry.advertise(2, "b2.internal", 9092, None)
    # the next bootstrap connections go to brokers 1 (held) and 2 (its own sensor: served)
    for _ in range(2):
        bootstrap().connection_made(Transport("10.0.0.1"))  # type: ignore[arg-type]
    assert [c.scope for c in made] == [1, 1, 2] and g.held == 3
    g.close_all()
