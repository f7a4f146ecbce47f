"""The files a configuration names (``proxy/files.py``, passed to the loader as its ``checks``):
certificates and keys, CA bundles, the credentials of SASL termination, a JWKS, passwords.
Each is read and built as the proxy builds it at start, and each problem is reported as the
configuration's other errors are, ``FILE:LINE:COLUMN: field.path: message``, at the key that
names the file; ``check-config`` and ``run`` both check them (``run`` before starting)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kafka_quota_proxy.cli import main as cli
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_config, parse_config
from kafka_quota_proxy.proxy.files import file_checks
from kafka_quota_proxy.security.credentials import add_user
from testkit.certs import Certs

SOURCE = "files.yaml"

# Every file-naming key the proxy reads, on its own line (the line numbers are the tests'):
TEMPLATE = """\
listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "127.0.0.1"
  broker_ports: "9193-9292"
  security:
    protocol: SASL_SSL
    tls:
      cert_file: "{cert}"
      key_file: "{key}"
      client_ca_file: "{client_ca}"
      client_auth: requested
    sasl:
      mode: terminate
      credentials_file: "{credentials}"
  extra:
    - name: INTERNAL
      bootstrap: "127.0.0.1:9392"
      broker_ports: "9393-9492"
      security:
        protocol: SASL_PLAINTEXT
        sasl:
          oauthbearer_jwks_file: "{jwks}"
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
  tls:
    ca_file: "{kafka_ca}"
    cert_file: "{own_cert}"
    key_file: "{own_key}"
    key_password_file: "{own_key_password}"
  sasl:
    mechanism: SCRAM-SHA-512
    username: proxy
    password_file: "{password}"
"""

# each key: the file it names (a field of Files) and where it is, (line, column)
WHERE = {
    "listeners.security.tls.cert_file": ("cert", 8, 7),
    "listeners.security.tls.key_file": ("key", 9, 7),
    "listeners.security.tls.client_ca_file": ("client_ca", 10, 7),
    "listeners.security.sasl.credentials_file": ("credentials", 14, 7),
    "listeners.extra.0.security.sasl.oauthbearer_jwks_file": ("jwks", 22, 11),
    "upstream.tls.ca_file": ("kafka_ca", 26, 5),
    "upstream.tls.cert_file": ("own_cert", 27, 5),
    "upstream.tls.key_file": ("own_key", 28, 5),
    "upstream.tls.key_password_file": ("own_key_password", 29, 5),
    "upstream.sasl.password_file": ("password", 33, 5),
}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Files:
    cert: Path
    key: Path
    client_ca: Path
    credentials: Path
    jwks: Path
    kafka_ca: Path
    own_cert: Path
    own_key: Path  # encrypted, with own_key_password
    own_key_password: Path
    password: Path

    def text(self, **changes: Any) -> str:
        return TEMPLATE.format(**vars(replace(self, **changes)))


@pytest.fixture
def files(tmp_path: Path) -> Files:
    """A good set: every file exists and builds."""
    clients = Certs(tmp_path, "clients")
    server = clients.server()
    kafka = Certs(tmp_path, "kafka")
    own = kafka.client("proxy")
    key = serialization.load_pem_private_key(own.key.read_bytes(), None)
    own.key.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"key secret")))
    own_password = tmp_path / "own-key-password"
    own_password.write_text("key secret\n")
    password = tmp_path / "kafka-password"
    password.write_text("proxy-pw\n")
    credentials = tmp_path / "users.yaml"
    credentials.write_text(add_user("", "alice", "alice-pw", 4096))
    numbers = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{
        "kty": "EC", "kid": "k1", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
        "y": b64url(numbers.y.to_bytes(32, "big"))}]}))
    return Files(server.cert, server.key, clients.ca_file, credentials, jwks, kafka.ca_file,
                 own.cert, own.key, own_password, password)


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, SOURCE, checks=file_checks)
    return info.value.errors


def error_at(field: str, message: str) -> str:
    _, line, column = WHERE[field]
    return f"{SOURCE}:{line}:{column}: {field}: {message}"


def single(text: str) -> str:
    found = errors(text)
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------ a good set


def test_a_good_set_of_files_passes(files: Files) -> None:
    config = parse_config(files.text(), SOURCE, checks=file_checks)
    assert config.upstream.sasl is not None
    assert file_checks(config) == []


def test_the_loader_does_no_io_of_its_own(files: Files, tmp_path: Path) -> None:
    """Without ``checks`` (the what-if tools, the config reload) nothing is read; with them,
    the same text names a missing file."""
    text = files.text(cert=tmp_path / "absent.pem")
    assert parse_config(text, SOURCE).listeners.security.tls is not None
    assert len(errors(text)) == 1


# ------------------------------------------------------------------ each kind of problem


@pytest.mark.parametrize("field", sorted(WHERE))
def test_a_missing_file_is_named_at_its_key(files: Files, tmp_path: Path, field: str) -> None:
    name = WHERE[field][0]
    missing = tmp_path / "missing" / f"{name}.file"
    assert single(files.text(**{name: missing})) == error_at(
        field, f"cannot read {missing}: No such file or directory")


def test_a_missing_certificate(files: Files, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    assert single(files.text(cert=missing)) == error_at(
        "listeners.security.tls.cert_file", f"cannot read {missing}: No such file or directory")


def test_a_key_that_does_not_match_its_certificate(files: Files, tmp_path: Path) -> None:
    other = Certs(tmp_path, "other").server()
    assert single(files.text(key=other.key)) == error_at(
        "listeners.security.tls.key_file",
        f"{other.key}: the key does not match the certificate in cert_file {files.cert}")


def test_a_certificate_that_is_not_pem(files: Files, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    assert single(files.text(cert=bad)) == error_at(
        "listeners.security.tls.cert_file", f"{bad}: holds no readable PEM certificate")


def test_a_key_that_is_not_pem(files: Files, tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    assert single(files.text(key=bad)) == error_at(
        "listeners.security.tls.key_file", f"{bad}: holds no readable PEM private key")


@pytest.mark.parametrize(("name", "field"), [("client_ca", "listeners.security.tls.client_ca_file"),
                                             ("kafka_ca", "upstream.tls.ca_file")])
def test_a_ca_file_that_is_not_pem(files: Files, tmp_path: Path, name: str, field: str) -> None:
    bad = tmp_path / "ca.txt"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64 !\n-----END CERTIFICATE-----\n")
    line = single(files.text(**{name: bad}))
    assert line.startswith(error_at(field, f"{bad}: CA bundle unusable (")), line


def test_credentials_that_do_not_parse(files: Files) -> None:
    files.credentials.write_text("users:\n  alice:\n    SCRAM-SHA-1: x\n")
    assert single(files.text()) == error_at(
        "listeners.security.sasl.credentials_file",
        f"{files.credentials}: users.alice.SCRAM-SHA-1: unknown mechanism (expected "
        "SCRAM-SHA-512 or SCRAM-SHA-256)")


def test_a_jwks_that_holds_no_key(files: Files) -> None:
    files.jwks.write_text('{"keys": []}')
    assert single(files.text()) == error_at(
        "listeners.extra.0.security.sasl.oauthbearer_jwks_file",
        f"{files.jwks}: JWKS holds no RSA or EC (P-256/384/521) signature key")


def test_a_missing_password_file(files: Files, tmp_path: Path) -> None:
    missing = tmp_path / "secrets" / "kafka-password"
    assert single(files.text(password=missing)) == error_at(
        "upstream.sasl.password_file", f"cannot read {missing}: No such file or directory")


def test_a_missing_key_password_file(files: Files, tmp_path: Path) -> None:
    missing = tmp_path / "secrets" / "key-password"
    assert single(files.text(own_key_password=missing)) == error_at(
        "upstream.tls.key_password_file", f"cannot read {missing}: No such file or directory")


def test_a_wrong_key_password(files: Files) -> None:
    files.own_key_password.write_text("not it\n")
    assert single(files.text()) == error_at(
        "upstream.tls.key_password_file",
        f"{files.own_key_password}: does not decrypt key_file {files.own_key}")


def test_an_encrypted_key_without_its_password(files: Files) -> None:
    """Refused with its position, where OpenSSL would ask for the password on the terminal."""
    text = files.text().replace(f'    key_password_file: "{files.own_key_password}"\n', "")
    assert single(text) == error_at(
        "upstream.tls.key_file",
        f"{files.own_key}: the key is encrypted and key_password_file is not set")


def test_a_cipher_list_openssl_refuses(files: Files) -> None:
    """What the listeners' context is built with is checked whole, not only its files."""
    text = files.text().replace("      client_auth: requested\n",
                                "      client_auth: requested\n      ciphers: NO-SUCH-CIPHER\n")
    assert single(text) == (f"{SOURCE}:12:7: listeners.security.tls.ciphers: OpenSSL can "
                            "select no cipher from 'NO-SUCH-CIPHER'")


def test_every_problem_of_a_tls_section_is_reported(files: Files, tmp_path: Path) -> None:
    """The context stops at its first problem; the check looks further (a cipher list, a chain
    and a CA bundle all wrong: three errors)."""
    bad_cert, bad_ca = tmp_path / "bad.pem", tmp_path / "bad-ca.pem"
    bad_cert.write_text("not a certificate\n")
    bad_ca.write_text("not a CA\n")
    text = files.text(cert=bad_cert, client_ca=bad_ca).replace(
        "      client_auth: requested\n", "      client_auth: requested\n      ciphers: NOPE\n")
    found = errors(text)
    assert len(found) == 3, found
    assert found[0] == error_at("listeners.security.tls.cert_file",
                                f"{bad_cert}: holds no readable PEM certificate")
    assert found[1].startswith(error_at("listeners.security.tls.client_ca_file",
                                        f"{bad_ca}: CA bundle unusable (")), found
    assert found[2] == (f"{SOURCE}:12:7: listeners.security.tls.ciphers: OpenSSL can select no "
                        "cipher from 'NOPE'")


def test_every_problem_is_reported_in_line_order(files: Files, tmp_path: Path) -> None:
    """Missing files with the configuration's other errors, in line order."""
    gone = tmp_path / "gone"
    text = files.text(password=gone / "p", cert=gone / "c", kafka_ca=gone / "ca")
    text += 'metrics:\n  listen: "127.0.0.1:9192"\n'
    found = errors(text)
    assert found == [
        error_at("listeners.security.tls.cert_file",
                 f"cannot read {gone / 'c'}: No such file or directory"),
        error_at("upstream.tls.ca_file", f"cannot read {gone / 'ca'}: No such file or directory"),
        error_at("upstream.sasl.password_file",
                 f"cannot read {gone / 'p'}: No such file or directory"),
        f"{SOURCE}:35:3: metrics.listen: metrics.listen port 9192 collides with bootstrap "
        "port 9192",
    ], found


# ------------------------------------------------------------------ check-config and run


def test_check_config_reports_a_missing_file(files: Files, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "proxy.yaml"
    missing = tmp_path / "absent.key"
    path.write_text(files.text(key=missing))
    assert cli.main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "configuration is valid" not in out
    assert (f"  {path}:9:7: listeners.security.tls.key_file: cannot read {missing}: No such file "
            "or directory") in err, err
    path.write_text(files.text())
    assert cli.main(["check-config", str(path)]) == 0
    assert f"{path}: configuration is valid" in capsys.readouterr().out


def test_run_refuses_a_bad_file_before_starting(files: Files, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def started(coro: Any) -> int:
        coro.close()
        raise AssertionError("the proxy started")

    monkeypatch.setattr(cli, "_event_loop_runner", started)
    path = tmp_path / "proxy.yaml"
    files.credentials.write_text("users: [alice]\n")
    path.write_text(files.text())
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert (f"{path}:14:7: listeners.security.sasl.credentials_file: {files.credentials}: "
            "users: expected a mapping of user names") in err, err
    with pytest.raises(ConfigError):  # the same check as check-config's
        load_config(path, checks=file_checks)
