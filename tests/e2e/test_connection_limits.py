"""Who may hold the proxy's connections, end to end against tansu:

- sockets still in their TLS handshake count against ``network.max_connections``: silent ones
  fill it and the next connection is refused at once (it used to be accepted, uncounted, until
  file descriptors ran out);
- ``network.max_connections_per_ip`` (Kafka's ``max.connections.per.ip``): an address's N+1th
  connection is refused at once while another address, one with an override, and one named by
  a trusted PROXY header are served;
- PROXY protocol headers are taken only from ``proxy_protocol_trusted_sources``: a client
  elsewhere that sends one claiming a fresh address on every connection is refused, a header
  from the trusted load balancer is served as the address it names.

Every refusal is counted and logged with its reason."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
from kafka_quota_proxy.protocol.proxy_header import encode_v1
from testkit.certs import Certs
from testkit.e2e import KafkaWire, ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

REFUSED = "kafka_proxy_connections_refused_total"


def _served(port: int, source: str | None = None, preamble: bytes = b"",
            ssl_context: Any = None) -> KafkaWire | None:
    """A connection that got an ApiVersions answer (kept open), or None if it was refused."""
    try:
        wire = KafkaWire("127.0.0.1", port, timeout=10, source=source, preamble=preamble,
                         ssl_context=ssl_context)
    except OSError:  # reset as it connected
        return None
    try:
        ok = int(wire.request(18, 0).error_code) == 0
    except (ConnectionError, OSError):
        ok = False
    if not ok:
        wire.close()
        return None
    return wire


def _refused_at_once(port: int, source: str | None = None, preamble: bytes = b"",
                     send: bool = True) -> bool:
    """The proxy closes the connection before answering anything (within 5 s); ``send``: an
    ApiVersions request is sent first (not to a TLS port, which closes on it anyway)."""
    try:
        wire = KafkaWire("127.0.0.1", port, timeout=5, source=source, preamble=preamble)
    except OSError:  # reset as it connected
        return True
    with wire:
        try:
            if send:
                wire.send_raw(wire.encode(18, 0))
        except OSError:
            return True
        return wire.is_closed_by_peer(5)


def _metric(p: ProxyProcess, name: str, **labels: str) -> float:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return p.metrics().get(f"{name}{{{inner}}}" if inner else name, 0.0)


def _logged(p: ProxyProcess, event: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in p.events() if e.get("event") == event and e.get("reason") == reason]


@pytest.fixture
def started(tansu: TansuBroker) -> Iterator[list[ProxyProcess]]:
    procs: list[ProxyProcess] = []
    yield procs
    for p in procs:
        p.stop()


def test_silent_tls_handshakes_count_against_max_connections(
        tansu: TansuBroker, started: list[ProxyProcess], tmp_path: Path) -> None:
    certs = Certs(tmp_path, "limits")
    server = certs.server()
    p = ProxyProcess(tansu.bootstrap, log_level="info", listeners_yaml=f"""  security:
    protocol: SSL
    tls: {{cert_file: "{server.cert}", key_file: "{server.key}"}}
""", extra_yaml="""network:
  max_connections: 20
  request_header_timeout_seconds: 60
""")
    started.append(p)
    p.start()
    port = p.wait_broker_listener(111)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        # never a ClientHello: each holds its slot from accept on (accepted in order, before
        # the next), so the 21st is refused at once, before it has sent anything
        assert _refused_at_once(port, send=False)
        assert _metric(p, "kafka_proxy_connection_slots") == 20
        wait_for(lambda: _metric(p, REFUSED, reason="max_connections") >= 1, 10,
                 what="the refusal counted")
        wait_for(lambda: _logged(p, "connections_refused", "max_connections"), 10,
                 what="the refusal logged")
        with pytest.raises((ConnectionError, OSError)), KafkaWire(
                "127.0.0.1", port, timeout=5, ssl_context=certs.client_context()) as wire:
            wire.request(18, 0)
    finally:
        for s in silent:
            s.close()
    wait_for(lambda: _metric(p, "kafka_proxy_connection_slots") == 0, 10,
             what="the slots freed when the silent sockets closed")
    wire = _served(port, ssl_context=certs.client_context())
    assert wire is not None  # room again: a TLS client is served
    wire.close()


def test_max_connections_per_ip_with_overrides_and_trusted_proxy_headers(
        tansu: TansuBroker, started: list[ProxyProcess]) -> None:
    lb_port = free_port()
    p = ProxyProcess(tansu.bootstrap, log_level="info", listeners_yaml=f"""  extra:
    - name: LB
      bootstrap: "127.0.0.1:{lb_port}"
      broker_ports: "{lb_port + 1}-{lb_port + 20}"
      security:
        proxy_protocol: v1
        proxy_protocol_trusted_sources: ["127.0.0.1/32"]
""", extra_yaml="""network:
  max_connections_per_ip: 3
  max_connections_per_ip_overrides: {"127.0.0.2": 5}
""")
    started.append(p)
    p.start()
    port = p.wait_broker_listener(111)
    held: list[KafkaWire] = []
    try:
        # 127.0.0.1: three served (the bootstrap and a broker port share the address's count)
        for target in (p.bootstrap_port, port, port):
            wire = _served(target)
            assert wire is not None
            held.append(wire)
        assert _refused_at_once(port) and _refused_at_once(p.bootstrap_port)
        # 127.0.0.2 has an override of 5: served while 127.0.0.1 is full
        for _ in range(5):
            wire = _served(port, source="127.0.0.2")
            assert wire is not None
            held.append(wire)
        assert _refused_at_once(port, source="127.0.0.2")
        # through the trusted load balancer (127.0.0.1, full itself): the header's source is
        # the address counted
        for i in range(3):
            wire = _served(lb_port, preamble=encode_v1(("198.51.100.9", 5000 + i),
                                                       ("127.0.0.1", lb_port)))
            assert wire is not None
            held.append(wire)
        assert _refused_at_once(lb_port, preamble=encode_v1(("198.51.100.9", 5999),
                                                            ("127.0.0.1", lb_port)))
        wire = _served(lb_port, preamble=encode_v1(("198.51.100.10", 1), ("127.0.0.1", lb_port)))
        assert wire is not None
        held.append(wire)
        wait_for(lambda: _metric(p, REFUSED, reason="max_connections_per_ip") == 4, 10,
                 what="4 refusals counted")
        wait_for(lambda: sum(e["refused"] for e in _logged(
            p, "connections_refused", "max_connections_per_ip")) == 4, 10,
            what="4 refusals logged")
        assert {e.get("client") for e in _logged(
            p, "connections_refused", "max_connections_per_ip")} <= {
            "127.0.0.1", "127.0.0.2", "198.51.100.9"}
        # a connection that closes gives its address's place back
        held.pop(0).close()
        wait_for(lambda: (w := _served(port)) is not None and held.append(w) is None, 10,
                 what="127.0.0.1 served again")
    finally:
        for wire in held:
            wire.close()


def test_proxy_headers_only_from_trusted_sources(tansu: TansuBroker,
                                                 started: list[ProxyProcess]) -> None:
    """The load balancer is 127.0.0.2; 127.0.0.1 is a client that reaches the PROXY port
    itself and claims a new address on each of 60 connections, under a 2/s per-address
    connection rate: none is served. The load balancer's headers are."""
    p = ProxyProcess(tansu.bootstrap, listeners_yaml="""  security:
    proxy_protocol: v1
    proxy_protocol_trusted_sources: ["127.0.0.2/32"]
""", extra_yaml="""quotas:
  ip_entities:
    - {ip: "<default>", connection_creation_rate: 2}
""")
    started.append(p)
    p.start()
    port = p.bootstrap_port

    def untrusted() -> float:
        return _metric(p, "kafka_proxy_connections_closed_total",
                       reason="proxy_header_untrusted_source")

    # the readiness probe of ProxyProcess.start is from 127.0.0.1 too: counted first
    before = wait_for(untrusted, 10, what="the readiness probe refused")
    t0 = time.monotonic()
    claimed_served = 0
    for i in range(60):
        header = encode_v1((f"203.0.113.{i + 1}", 40000), ("127.0.0.1", port))
        wire = _served(port, preamble=header)
        if wire is not None:
            claimed_served += 1
            wire.close()
    spent = time.monotonic() - t0
    print(f"\n60 connections from an untrusted source each claiming a new address: "
          f"{claimed_served} served in {spent:.1f} s")
    assert claimed_served == 0
    wait_for(lambda: untrusted() == before + 60, 10, what="60 untrusted headers counted")
    logged = _logged(p, "connection_closed", "proxy_header_untrusted_source")
    assert logged and logged[0]["client"].startswith("127.0.0.1:")
    assert len(logged) + sum(e.get("more_since_last_logged", 0) for e in logged) <= 61
    # the trusted load balancer: its header names the client
    wire = _served(port, source="127.0.0.2",
                   preamble=encode_v1(("203.0.113.200", 4000), ("127.0.0.1", port)))
    assert wire is not None
    wire.close()
    wait_for(lambda: any(e.get("client") == "203.0.113.200:4000"
                         for e in p.closed_connections()), 10,
             what="the connection logged under the header's address")
