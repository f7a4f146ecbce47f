"""The client side of the proxy's transport security, probed with raw frames: certificates
reloaded without a restart, PROXY protocol headers (v1, v2, with TLS after them), and bad input
on each (wrong protocol on a port, missing or lying headers, SASL out of order, a principal
that changes on re-authentication): each closes one connection with a logged reason."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
from kafka_quota_proxy.protocol.proxy_header import encode_v1, encode_v2
from testkit.certs import Certs
from testkit.e2e import KafkaWire, ProxyProcess, wait_for
from testkit.secure_front import SecureFront

pytestmark = pytest.mark.e2e

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"), "proxy")


TRUSTED = '    proxy_protocol_trusted_sources: ["127.0.0.1/32"]\n'  # the tests' load balancer


def _tls_yaml(certs: Certs, proxy_protocol: str = "none") -> str:
    server = certs.server()
    return f"""  security:
    protocol: SSL
    proxy_protocol: {proxy_protocol}
{TRUSTED if proxy_protocol != "none" else ""}    tls:
      cert_file: "{server.cert}"
      key_file: "{server.key}"
      reload_seconds: 0.2
"""


@pytest.fixture
def start(tansu: TansuBroker) -> Iterator[Any]:
    started: list[ProxyProcess] = []

    def make(listeners_yaml: str = "", upstream: str | None = None) -> ProxyProcess:
        p = ProxyProcess(upstream or tansu.bootstrap, listeners_yaml=listeners_yaml).start()
        started.append(p)
        if upstream is None:  # (a broker requiring SASL is learnt from clients' metadata)
            p.wait_broker_listener(111)
        return p

    yield make
    for p in started:
        p.stop()


def _port(p: ProxyProcess) -> int:
    return p.bootstrap_port


def _api_versions_ok(wire: KafkaWire) -> bool:
    return int(wire.request(18, 0).error_code) == 0


def _closed(p: ProxyProcess, reason: str) -> list[dict[str, Any]]:
    return [e for e in p.closed_connections() if e.get("reason") == reason]


def _serial(wire: KafkaWire) -> int:
    der = wire.sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


def test_certificate_files_reload_without_restart(start: Any, certs: Certs) -> None:
    p = start(_tls_yaml(certs))
    client = certs.client_context()
    old = KafkaWire("127.0.0.1", _port(p), ssl_context=client)
    assert _api_versions_ok(old)
    before = _serial(old)
    certs.server()  # new certificate and key written over the files
    wait_for(lambda: p.metrics().get('kafka_proxy_tls_reloads_total{result="success"}', 0) >= 1,
             10, what="the reload")
    with KafkaWire("127.0.0.1", _port(p), ssl_context=client) as new:
        assert _api_versions_ok(new)
        assert _serial(new) != before  # new handshakes get the new certificate
    assert _api_versions_ok(old)  # the open connection goes on with its own
    old.close()
    # a key that does not match: the reload fails, counted; new handshakes keep the last good
    current = certs.server("server-spare")
    (certs.directory / "proxy-server.key").write_bytes(current.key.read_bytes())
    wait_for(lambda: p.metrics().get('kafka_proxy_tls_reloads_total{result="failure"}', 0) >= 1,
             10, what="the failed reload")
    with KafkaWire("127.0.0.1", _port(p), ssl_context=client) as wire:
        assert _api_versions_ok(wire)
    assert p.alive


def test_wrong_protocol_on_each_port_closes_with_a_reason(start: Any, certs: Certs) -> None:
    tls = start(_tls_yaml(certs))
    plain = start()
    # a plaintext client on the TLS port
    with KafkaWire("127.0.0.1", _port(tls)) as wire:
        wire.send_raw(wire.encode(18, 0))
        assert wire.is_closed_by_peer()
    wait_for(lambda: _closed(tls, "tls_handshake_failed"), 10, what="the TLS close")
    # a TLS client on the plaintext port
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        KafkaWire("127.0.0.1", _port(plain), ssl_context=certs.client_context(), timeout=5)
    wait_for(lambda: _closed(plain, "tls_on_plaintext_listener"), 10, what="the plain close")
    # both proxies still serve
    with KafkaWire("127.0.0.1", _port(tls), ssl_context=certs.client_context()) as wire:
        assert _api_versions_ok(wire)
    with KafkaWire("127.0.0.1", _port(plain)) as wire:
        assert _api_versions_ok(wire)


def test_proxy_protocol_headers_name_the_client(start: Any, certs: Certs) -> None:
    p = start("""  security:
    proxy_protocol: any
    proxy_protocol_trusted_sources: ["127.0.0.1/32"]
""")
    port = _port(p)
    dst = ("127.0.0.1", port)
    with KafkaWire("127.0.0.1", port, preamble=encode_v1(("203.0.113.7", 40001), dst)) as wire:
        assert _api_versions_ok(wire)
    with KafkaWire("127.0.0.1", port,
                   preamble=encode_v2(("2001:db8::9", 40002), ("::1", port))) as wire:
        assert _api_versions_ok(wire)
    wait_for(lambda: {"203.0.113.7:40001", "2001:db8::9:40002"} <= {
        e.get("client") for e in p.closed_connections()}, 10, what="the named clients")
    # no header; a v2 header whose length is too short for its addresses
    with KafkaWire("127.0.0.1", port) as wire:
        wire.send_raw(wire.encode(18, 0))
        assert wire.is_closed_by_peer()
    lying = bytearray(encode_v2(("2001:db8::9", 40002), ("::1", port)))
    lying[14:16] = (12).to_bytes(2, "big")  # TCP6 needs 36 bytes of addresses
    with KafkaWire("127.0.0.1", port, preamble=bytes(lying[:16 + 12])) as wire:
        assert wire.is_closed_by_peer()
    wait_for(lambda: _closed(p, "proxy_header_missing") and _closed(p, "proxy_header_malformed"),
             10, what="both closes")


def test_proxy_protocol_v2_then_tls(start: Any, certs: Certs) -> None:
    p = start(_tls_yaml(certs, "v2"))
    port = _port(p)
    header = encode_v2(("198.51.100.4", 40100), ("127.0.0.1", port))
    with KafkaWire("127.0.0.1", port, preamble=header,
                   ssl_context=certs.client_context()) as wire:
        assert _api_versions_ok(wire)
    wait_for(lambda: any(e.get("client") == "198.51.100.4:40100"
                         for e in p.closed_connections()), 10, what="the named client")


def _sasl_plain(wire: KafkaWire, user: str) -> Any:
    assert int(wire.request(17, 1, mechanism="PLAIN").error_code) == 0
    token = b"\0" + user.encode() + b"\0" + USERS[user].encode()
    return wire.request(36, 1, auth_bytes=token)


def test_principal_changes_on_reauthentication(start: Any, tansu: TansuBroker,
                                               tmp_path: Path) -> None:
    front_port = free_port()
    own = TansuBroker(advertised_port=front_port, log_path=str(tmp_path / "t.log")).start()
    front = SecureFront(own.port, front_port, users=USERS).start()
    try:
        p = start("""  security:
    protocol: SASL_PLAINTEXT
""", upstream=front.bootstrap)
        with KafkaWire("127.0.0.1", _port(p)) as wire:
            assert _api_versions_ok(wire)
            assert int(_sasl_plain(wire, "alice").error_code) == 0
            assert wire.request(3, 1, topics=None).brokers  # Metadata, as alice
            assert int(_sasl_plain(wire, "bob").error_code) == 0  # KIP-368, as another user
            wire.request(3, 1, topics=None)
        events = p.events()
        assert [e["principal"] for e in events if e.get("event") == "client_authenticated"] == [
            "alice"]
        changed = [e for e in events if e.get("event") == "principal_changed"]
        assert [(e["previous"], e["principal"]) for e in changed] == [("alice", "bob")]
    finally:
        front.stop()
        own.stop()
