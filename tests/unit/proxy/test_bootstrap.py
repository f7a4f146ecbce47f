"""Where bootstrap connections go and whose budgets they use (``proxy.bootstrap``): the known
brokers in turn, each connection with its broker's node id as its scope; the bootstrap servers
with the bootstrap scope while no broker is known; a bootstrap server that is a known broker
gives its node id; and the connection-rate sensor of an address is one per broker whichever
port the connection came in on."""

from __future__ import annotations

from kafka_quota_proxy.protocol.addresses import BrokerAddresses
from kafka_quota_proxy.proxy.bootstrap import BootstrapRoutes
from kafka_quota_proxy.quota.enforcer import BOOTSTRAP_SCOPE
from testkit.accept import Conn, Transport, guard

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


async def test_a_bootstrap_connection_takes_the_scope_of_the_broker_it_reached() -> None:
    """Brokers 5 (unreachable) and 6 known: a bootstrap connection accepted for 5 tries it,
    then 6, and uses 6's budgets; the next one goes to 6 in turn."""
    import asyncio

    from kafka_quota_proxy.config.loading import parse_config
    from kafka_quota_proxy.demo.embedded_broker import free_port, free_port_range
    from kafka_quota_proxy.proxy.server import Proxy

    reached = 0

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal reached
        reached += 1
        await reader.read()
        writer.close()

    broker6 = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port6 = broker6.sockets[0].getsockname()[1]
    base, _ = free_port_range(5)
    proxy = Proxy(parse_config(f"""
listeners:
  bootstrap: "127.0.0.1:{free_port()}"
  advertised_host: "127.0.0.1"
  broker_ports: "{base}-{base + 4}"
upstream:
  bootstrap_servers: ["127.0.0.1:{port6}"]
"""))
    writers = []
    try:
        proxy.main.listening.advertise(5, "127.0.0.1", free_port(), None)  # nothing listens
        proxy.main.listening.advertise(6, "127.0.0.1", port6, None)
        proxy.live_brokers = {5, 6}
        await proxy.main.start()
        for expected in (1, 2):
            _, writer = await asyncio.open_connection(
                "127.0.0.1", proxy.config.listeners.bootstrap.port)
            writers.append(writer)
            while reached < expected:
                await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while (sorted(c.client.scope for c in proxy.connections) != [6, 6]
               and loop.time() < deadline):  # (set once the upstream connection is made)
            await asyncio.sleep(0.01)
        assert sorted(c.client.scope for c in proxy.connections) == [6, 6]
    finally:
        for writer in writers:
            writer.close()
        await proxy.shutdown()
        broker6.close()
