"""TLS contexts (``proxy/tls.py``): what the listeners' and the brokers' contexts are built
with, the field named when a file cannot be used, the reload of the listeners' files (an
in-memory handshake shows which certificate a new connection gets), and aiokafka's options."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kafka_quota_proxy.config.schema import HostPort, UpstreamConfig
from kafka_quota_proxy.config.security import ClientTlsConfig, ServerTlsConfig, UpstreamSaslConfig
from kafka_quota_proxy.proxy.tls import (
    ServerTls,
    TlsFileError,
    client_context,
    kafka_client_options,
    read_secret,
    server_context,
)
from testkit.certs import Certs, Pem

# ------------------------------------------------------------------ helpers


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(tmp_path)


def serial_of(pem_file: Path) -> int:
    """The serial number of the first certificate (the leaf) of a PEM chain file."""
    return x509.load_pem_x509_certificate(pem_file.read_bytes()).serial_number


def server_cfg(pem: Pem, **kw: object) -> ServerTlsConfig:
    return ServerTlsConfig(cert_file=str(pem.cert), key_file=str(pem.key), **kw)  # type: ignore[arg-type]


def bump_mtime(*paths: Path, seconds: int = 5) -> None:
    """Move the files' mtime clearly forward: a rewrite within the filesystem's timestamp
    granularity, with the same size, would otherwise look unchanged."""
    for path in paths:
        st = path.stat()
        later = st.st_mtime_ns + seconds * 1_000_000_000
        os.utime(path, ns=(later, later))


def replace_pair(target: Pem, source: Pem, seconds: int = 5) -> None:
    """Overwrite ``target``'s files with ``source``'s (a renewed certificate) and move their
    mtime forward."""
    target.cert.write_bytes(source.cert.read_bytes())
    target.key.write_bytes(source.key.read_bytes())
    bump_mtime(target.cert, target.key, seconds=seconds)


class Handshake:
    """A TLS handshake between two ``SSLObject``s over memory BIOs, no socket."""

    def __init__(self, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                 server_hostname: str | None = "localhost") -> None:
        self.c_in, self.c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.s_in, self.s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = server_ctx.wrap_bio(self.s_in, self.s_out, server_side=True)
        self.client = client_ctx.wrap_bio(self.c_in, self.c_out, server_hostname=server_hostname)

    @staticmethod
    def _step(obj: ssl.SSLObject) -> bool:
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        return True

    def run(self, rounds: int = 20) -> None:
        client_done = server_done = False
        for _ in range(rounds):
            client_done = self._step(self.client)
            self.s_in.write(self.c_out.read())
            server_done = self._step(self.server)
            self.c_in.write(self.s_out.read())
            if client_done and server_done:
                # the client reads what the server sent last (TLS 1.3 session tickets)
                self._step(self.client)
                return
        raise AssertionError("the handshake did not finish")

    def peer_serial(self) -> int:
        peer = self.client.getpeercert()
        assert peer, "the client saw no certificate"
        return int(str(peer["serialNumber"]), 16)


def common_name(peer: Any) -> str:
    """The commonName of a ``getpeercert()`` subject."""
    return next(str(value) for rdn in peer["subject"] for key, value in rdn
                if key == "commonName")


def handshake_serial(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                     server_hostname: str | None = "localhost") -> int:
    hs = Handshake(server_ctx, client_ctx, server_hostname)
    hs.run()
    return hs.peer_serial()


def encrypted_key(pem: Pem, password: bytes, path: Path) -> Path:
    key = serialization.load_pem_private_key(pem.key.read_bytes(), password=None)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(password)))
    return path


# ------------------------------------------------------------------ server_context


def test_server_context_serves_the_configured_certificate(certs: Certs) -> None:
    pem = certs.server()
    ctx = server_context(server_cfg(pem))
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert handshake_serial(ctx, certs.client_context()) == serial_of(pem.cert)


@pytest.mark.parametrize("mode,expected", [("requested", ssl.CERT_OPTIONAL),
                                           ("required", ssl.CERT_REQUIRED)])
def test_server_context_client_auth_modes(certs: Certs, mode: str,
                                          expected: ssl.VerifyMode) -> None:
    ctx = server_context(server_cfg(certs.server(), client_auth=mode,
                                    client_ca_file=str(certs.ca_file)))
    assert ctx.verify_mode == expected


def test_server_context_with_client_auth_reads_the_client_certificate(certs: Certs) -> None:
    ctx = server_context(server_cfg(certs.server(), client_auth="required",
                                    client_ca_file=str(certs.ca_file)))
    hs = Handshake(ctx, certs.client_context(certs.client("alice")))
    hs.run()
    peer = hs.server.getpeercert()
    assert peer, "the server saw no client certificate"
    assert common_name(peer) == "alice"


def test_server_context_min_version_1_3(certs: Certs) -> None:
    ctx = server_context(server_cfg(certs.server(), min_version="1.3"))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    client = certs.client_context()
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        Handshake(ctx, client).run()


def test_server_context_with_an_encrypted_key(certs: Certs, tmp_path: Path) -> None:
    pem = certs.server()
    key = encrypted_key(pem, b"s3cret", tmp_path / "enc.key")
    password = tmp_path / "password"
    password.write_text("s3cret\n")  # the trailing newline is not part of the password
    ctx = server_context(ServerTlsConfig(cert_file=str(pem.cert), key_file=str(key),
                                         key_password_file=str(password)))
    assert handshake_serial(ctx, certs.client_context()) == serial_of(pem.cert)


def test_wrong_key_password_names_the_cert_file(certs: Certs, tmp_path: Path) -> None:
    pem = certs.server()
    key = encrypted_key(pem, b"s3cret", tmp_path / "enc.key")
    password = tmp_path / "password"
    password.write_text("wrong")
    with pytest.raises(TlsFileError) as info:
        server_context(ServerTlsConfig(cert_file=str(pem.cert), key_file=str(key),
                                       key_password_file=str(password)))
    assert info.value.field == "listeners.security.tls.cert_file"


def test_missing_password_file_names_its_field(certs: Certs, tmp_path: Path) -> None:
    pem = certs.server()
    with pytest.raises(TlsFileError) as info:
        server_context(server_cfg(pem, key_password_file=str(tmp_path / "absent")))
    assert info.value.field == "listeners.security.tls.key_password_file"
    assert str(tmp_path / "absent") in str(info.value)


@pytest.mark.parametrize("which", ["cert_file", "key_file"])
def test_missing_cert_or_key_names_its_field(certs: Certs, tmp_path: Path, which: str) -> None:
    pem = certs.server()
    absent = tmp_path / "absent.pem"
    cfg = ServerTlsConfig(cert_file=str(absent if which == "cert_file" else pem.cert),
                          key_file=str(absent if which == "key_file" else pem.key))
    with pytest.raises(TlsFileError) as info:
        server_context(cfg)
    assert info.value.field == f"listeners.security.tls.{which}"
    assert "no such file" in str(info.value)
    assert str(absent) in str(info.value)


def test_key_of_another_certificate_names_the_cert_file(certs: Certs) -> None:
    one, other = certs.server("one"), certs.server("other")
    with pytest.raises(TlsFileError) as info:
        server_context(ServerTlsConfig(cert_file=str(one.cert), key_file=str(other.key)))
    assert info.value.field == "listeners.security.tls.cert_file"
    assert "unusable" in str(info.value)


def test_garbage_certificate_names_the_cert_file(certs: Certs, tmp_path: Path) -> None:
    pem = certs.server()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsFileError) as info:
        server_context(ServerTlsConfig(cert_file=str(garbage), key_file=str(pem.key)))
    assert info.value.field == "listeners.security.tls.cert_file"


def test_unusable_client_ca_names_its_field(certs: Certs, tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("no CA here\n")
    with pytest.raises(TlsFileError) as info:
        server_context(server_cfg(certs.server(), client_auth="required",
                                  client_ca_file=str(garbage)))
    assert info.value.field == "listeners.security.tls.client_ca_file"


def test_bad_cipher_list_names_the_ciphers_field(certs: Certs) -> None:
    with pytest.raises(TlsFileError) as info:
        server_context(server_cfg(certs.server(), ciphers="NO-SUCH-CIPHER"))
    assert info.value.field == "listeners.security.tls.ciphers"


def test_cipher_list_is_applied(certs: Certs) -> None:
    ctx = server_context(server_cfg(certs.server(), ciphers="ECDHE+AESGCM"))
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 and all("GCM" in name and "ECDHE" in name for name in tls12)


def test_prefix_names_the_field_of_another_section(certs: Certs, tmp_path: Path) -> None:
    cfg = ServerTlsConfig(cert_file=str(tmp_path / "absent"), key_file=str(tmp_path / "x"))
    with pytest.raises(TlsFileError) as info:
        server_context(cfg, prefix="elsewhere.tls")
    assert info.value.field == "elsewhere.tls.cert_file"


# ------------------------------------------------------------------ client_context


def test_client_context_verifies_brokers_with_the_ca_file(certs: Certs) -> None:
    pem = certs.server()
    ctx = client_context(ClientTlsConfig(ca_file=str(certs.ca_file)))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname is True
    assert handshake_serial(certs.server_context(pem), ctx) == serial_of(pem.cert)


def test_client_context_refuses_a_broker_of_another_ca(certs: Certs, tmp_path: Path) -> None:
    other = Certs(tmp_path, name="other")
    ctx = client_context(ClientTlsConfig(ca_file=str(certs.ca_file)))
    with pytest.raises(ssl.SSLCertVerificationError):
        Handshake(other.server_context(other.server()), ctx).run()


def test_client_context_checks_the_host_name(certs: Certs) -> None:
    ctx = client_context(ClientTlsConfig(ca_file=str(certs.ca_file)))
    with pytest.raises(ssl.SSLCertVerificationError):
        Handshake(certs.server_context(certs.server()), ctx,
                  server_hostname="broker-9.elsewhere").run()


def test_client_context_without_hostname_check_still_verifies_the_chain(certs: Certs) -> None:
    ctx = client_context(ClientTlsConfig(ca_file=str(certs.ca_file), check_hostname=False))
    assert ctx.check_hostname is False
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    pem = certs.server()
    assert handshake_serial(certs.server_context(pem), ctx,
                            server_hostname="broker-9.elsewhere") == serial_of(pem.cert)


def test_client_context_presents_the_proxy_certificate(certs: Certs) -> None:
    me = certs.client("proxy")
    ctx = client_context(ClientTlsConfig(ca_file=str(certs.ca_file), cert_file=str(me.cert),
                                         key_file=str(me.key), min_version="1.3"))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    hs = Handshake(certs.server_context(certs.server(), client_auth=True), ctx)
    hs.run()
    peer = hs.server.getpeercert()
    assert peer and int(str(peer["serialNumber"]), 16) == serial_of(me.cert)


def test_client_context_default_cas(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(ssl.SSLContext, "load_default_certs",
                        lambda self, purpose=None: calls.append(purpose))
    client_context(ClientTlsConfig())
    assert calls == [ssl.Purpose.SERVER_AUTH]


def test_client_context_unusable_ca_names_its_field(tmp_path: Path) -> None:
    with pytest.raises(TlsFileError) as info:
        client_context(ClientTlsConfig(ca_file=str(tmp_path / "absent.pem")))
    assert info.value.field == "upstream.tls.ca_file"


def test_client_context_missing_key_names_upstream_key_file(certs: Certs,
                                                            tmp_path: Path) -> None:
    me = certs.client("proxy")
    with pytest.raises(TlsFileError) as info:
        client_context(ClientTlsConfig(ca_file=str(certs.ca_file), cert_file=str(me.cert),
                                       key_file=str(tmp_path / "absent.key")))
    assert info.value.field == "upstream.tls.key_file"


# ------------------------------------------------------------------ kafka_client_options


def upstream(**kw: object) -> UpstreamConfig:
    return UpstreamConfig(bootstrap_servers=[HostPort("127.0.0.1", 9092)], **kw)  # type: ignore[arg-type]


def password_file(tmp_path: Path, text: str = "hunter2\n") -> Path:
    path = tmp_path / "password"
    path.write_text(text)
    return path


def test_kafka_client_options_plaintext_is_empty() -> None:
    assert kafka_client_options(upstream()) == {}


def test_kafka_client_options_tls(certs: Certs) -> None:
    options = kafka_client_options(upstream(tls=ClientTlsConfig(ca_file=str(certs.ca_file))))
    assert set(options) == {"ssl_context", "security_protocol"}
    assert options["security_protocol"] == "SSL"
    ctx = options["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED


def test_kafka_client_options_sasl_plaintext(tmp_path: Path) -> None:
    sasl = UpstreamSaslConfig(mechanism="SCRAM-SHA-256", username="proxy",
                              password_file=str(password_file(tmp_path)))
    options = kafka_client_options(upstream(sasl=sasl))
    assert options == {"sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "proxy",
                       "sasl_plain_password": "hunter2",
                       "security_protocol": "SASL_PLAINTEXT"}


def test_kafka_client_options_sasl_ssl(certs: Certs, tmp_path: Path) -> None:
    sasl = UpstreamSaslConfig(mechanism="PLAIN", username="proxy",
                              password_file=str(password_file(tmp_path, "pw\r\n")))
    options = kafka_client_options(upstream(tls=ClientTlsConfig(ca_file=str(certs.ca_file)),
                                            sasl=sasl))
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_plain_password"] == "pw"
    assert isinstance(options["ssl_context"], ssl.SSLContext)


def test_kafka_client_options_missing_password_names_the_field(tmp_path: Path) -> None:
    sasl = UpstreamSaslConfig(mechanism="PLAIN", username="proxy",
                              password_file=str(tmp_path / "absent"))
    with pytest.raises(TlsFileError) as info:
        kafka_client_options(upstream(sasl=sasl))
    assert info.value.field == "upstream.sasl.password_file"


def test_read_secret_keeps_inner_whitespace(tmp_path: Path) -> None:
    assert read_secret(str(password_file(tmp_path, " a b \n")), "f") == " a b "


# ------------------------------------------------------------------ ServerTls: reload


class Reloads:
    def __init__(self) -> None:
        self.results: list[str] = []

    def __call__(self, result: str) -> None:
        self.results.append(result)


def test_reload_without_changes_is_none(certs: Certs) -> None:
    reloads = Reloads()
    tls = ServerTls(server_cfg(certs.server()), on_reload=reloads)
    assert tls.current is tls.front
    assert tls.reload_if_changed() is None
    assert tls.reload_if_changed() is None
    assert tls.current is tls.front
    assert reloads.results == []


def test_reload_after_files_change_builds_a_new_context(certs: Certs) -> None:
    reloads = Reloads()
    live = certs.server("live")
    tls = ServerTls(server_cfg(live), on_reload=reloads)
    replace_pair(live, certs.server("renewed"))
    assert tls.reload_if_changed() is True
    assert tls.current is not tls.front
    assert reloads.results == ["success"]
    assert tls.reload_if_changed() is None  # seen: no second reload
    assert reloads.results == ["success"]


def test_a_touch_alone_reloads(certs: Certs) -> None:
    live = certs.server("live")
    tls = ServerTls(server_cfg(live))
    bump_mtime(live.cert)
    assert tls.reload_if_changed() is True


def test_failed_reload_keeps_the_previous_context(certs: Certs) -> None:
    reloads = Reloads()
    live = certs.server("live")
    tls = ServerTls(server_cfg(live), on_reload=reloads)
    replace_pair(live, certs.server("renewed"))
    assert tls.reload_if_changed() is True
    good = tls.current
    live.cert.write_text("half-written\n")
    bump_mtime(live.cert, seconds=10)
    assert tls.reload_if_changed() is False
    assert tls.current is good
    assert reloads.results == ["success", "failure"]
    # the broken files are not retried until they change again
    assert tls.reload_if_changed() is None
    assert reloads.results == ["success", "failure"]


def test_a_half_replaced_pair_fails_then_loads_when_complete(certs: Certs) -> None:
    live = certs.server("live")
    renewed = certs.server("renewed")
    tls = ServerTls(server_cfg(live))
    live.cert.write_bytes(renewed.cert.read_bytes())  # the new certificate, the old key
    bump_mtime(live.cert)
    assert tls.reload_if_changed() is False
    assert tls.current is tls.front
    live.key.write_bytes(renewed.key.read_bytes())
    bump_mtime(live.key)
    assert tls.reload_if_changed() is True
    assert tls.current is not tls.front


def test_a_removed_key_fails_the_reload(certs: Certs) -> None:
    live = certs.server("live")
    tls = ServerTls(server_cfg(live))
    live.key.unlink()
    assert tls.reload_if_changed() is False
    assert tls.current is tls.front


def test_the_client_ca_file_is_watched(certs: Certs) -> None:
    tls = ServerTls(server_cfg(certs.server(), client_auth="required",
                               client_ca_file=str(certs.ca_file)))
    bump_mtime(certs.ca_file)
    assert tls.reload_if_changed() is True


def test_the_key_password_file_is_watched(certs: Certs, tmp_path: Path) -> None:
    pem = certs.server()
    key = encrypted_key(pem, b"pw", tmp_path / "enc.key")
    password = tmp_path / "password"
    password.write_text("pw")
    tls = ServerTls(ServerTlsConfig(cert_file=str(pem.cert), key_file=str(key),
                                    key_password_file=str(password)))
    password.write_text("no")
    bump_mtime(password)
    assert tls.reload_if_changed() is False  # the changed password no longer opens the key


# ------------------------------------------------------------------ ServerTls: handshakes


@pytest.mark.parametrize("server_hostname", ["localhost", None], ids=["sni", "no-sni"])
def test_handshakes_present_the_new_certificate_after_a_reload(
        certs: Certs, server_hostname: str | None) -> None:
    live = certs.server("live")
    old_serial = serial_of(live.cert)
    tls = ServerTls(server_cfg(live))
    client = certs.client_context()
    if server_hostname is None:
        client.check_hostname = False  # without SNI: the callback still picks the context

    assert handshake_serial(tls.front, client, server_hostname) == old_serial

    renewed = certs.server("renewed")
    new_serial = serial_of(renewed.cert)
    assert new_serial != old_serial
    replace_pair(live, renewed)
    # the files changed, nothing reloaded yet: still the old certificate
    assert handshake_serial(tls.front, client, server_hostname) == old_serial

    assert tls.reload_if_changed() is True
    hs = Handshake(tls.front, client, server_hostname)
    hs.run()
    assert hs.peer_serial() == new_serial
    assert hs.server.context is tls.current  # the SNI callback handed over the newest


def test_a_connection_made_before_the_reload_keeps_its_certificate(certs: Certs) -> None:
    live = certs.server("live")
    old_serial = serial_of(live.cert)
    tls = ServerTls(server_cfg(live))
    client = certs.client_context()
    before = Handshake(tls.front, client)
    before.run()
    replace_pair(live, certs.server("renewed"))
    assert tls.reload_if_changed() is True
    assert before.peer_serial() == old_serial
    assert before.server.context is tls.front
    assert handshake_serial(tls.front, client) == serial_of(live.cert) != old_serial


def test_after_a_failed_reload_handshakes_keep_the_last_good_certificate(certs: Certs) -> None:
    live = certs.server("live")
    tls = ServerTls(server_cfg(live))
    client = certs.client_context()
    renewed = certs.server("renewed")
    replace_pair(live, renewed)
    assert tls.reload_if_changed() is True
    live.key.write_text("broken\n")
    bump_mtime(live.key, seconds=10)
    assert tls.reload_if_changed() is False
    assert handshake_serial(tls.front, client) == serial_of(renewed.cert)


def test_a_reloaded_client_ca_verifies_new_client_certificates(certs: Certs,
                                                               tmp_path: Path) -> None:
    """The client CA file rotates to another CA: after the reload, a client certificate of the
    new CA is accepted and one of the old CA refused."""
    ca_file = tmp_path / "clients-ca.pem"
    ca_file.write_bytes(certs.ca_file.read_bytes())
    tls = ServerTls(server_cfg(certs.server(), client_auth="required",
                               client_ca_file=str(ca_file)))
    other = Certs(tmp_path, name="other", ca=trustme.CA(organization_name="Other CA"))
    # a client of the new CA that trusts the server's CA
    bob = other.client("bob")
    new_client = certs.client_context()
    new_client.load_cert_chain(str(bob.cert), str(bob.key))
    old_client = certs.client_context(certs.client("alice"))

    Handshake(tls.front, old_client).run()  # accepted before the rotation

    ca_file.write_bytes(other.ca_file.read_bytes())
    bump_mtime(ca_file)
    assert tls.reload_if_changed() is True
    hs = Handshake(tls.front, new_client)
    hs.run()
    peer = hs.server.getpeercert()
    assert peer and common_name(peer) == "bob"
    with pytest.raises(ssl.SSLError):
        Handshake(tls.front, old_client).run()


# ------------------------------------------------------------------ ServerTls.watch


async def test_watch_with_zero_interval_returns_at_once(certs: Certs) -> None:
    tls = ServerTls(server_cfg(certs.server(), reload_seconds=0))
    await asyncio.wait_for(tls.watch(), timeout=1)


async def test_watch_reloads_changed_files(certs: Certs) -> None:
    reloads = Reloads()
    live = certs.server("live")
    tls = ServerTls(server_cfg(live, reload_seconds=0.01), on_reload=reloads)
    task = asyncio.create_task(tls.watch())
    try:
        replace_pair(live, certs.server("renewed"))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if reloads.results:
                break
        assert reloads.results == ["success"]
        assert tls.current is not tls.front
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
