"""The files a configuration names, checked as the proxy will use them at start: each one
exists and is readable, and builds what the runtime builds from it (``proxy.tls``'s contexts:
the certificate chain and its key, which must match, the CA bundles, the cipher list; the
credentials of SASL termination; the JWKS of SASL inspection; the passwords).

``file_checks`` is what ``check-config`` and ``run`` pass to ``config.loading.load_config``
(config itself does no I/O): every problem comes back as (field path, message) and is
reported like the configuration's other errors, ``FILE:LINE:COLUMN: field.path: message``, at
the key naming the file. Only the files the runtime reads are checked (a JWKS named on a
listener that terminates SASL, which does not read it, is not). The runtime still reads them
again at start (``Proxy._load_security``, ``ListenerKind.load_security``): a file changed
between the two is refused there, naming its field.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, TypeVar

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from kafka_quota_proxy.config.schema import ListenerKindConfig, ProxyConfig
from kafka_quota_proxy.config.security import ClientTlsConfig, ServerTlsConfig
from kafka_quota_proxy.proxy.tls import TlsFileError, client_context, server_context
from kafka_quota_proxy.security.credentials import Credentials
from kafka_quota_proxy.security.sasl import Jwks

Loc = tuple[Any, ...]
Problem = tuple[Loc, str]

# Bigger than any certificate, key, credentials file or JWKS: a path naming something else
# (a device, a log) is refused without being read whole.
MAX_FILE_BYTES = 16 << 20


def file_checks(config: ProxyConfig) -> list[Problem]:
    """Every problem with the files ``config`` names, as (field path, message)."""
    problems: list[Problem] = []
    upstream = config.upstream
    if upstream.tls is not None:
        problems += _client_tls(upstream.tls, ("upstream", "tls"))
    if upstream.sasl is not None:
        loc = ("upstream", "sasl", "password_file")
        data = _read(upstream.sasl.password_file, loc, problems)
        if data is not None:
            _text(data, upstream.sasl.password_file, loc, problems)
    problems += _listener(config.listeners, ("listeners",))
    for i, extra in enumerate(config.listeners.extra):
        problems += _listener(extra, ("listeners", "extra", i))
    return problems


# ------------------------------------------------------------------ reading


def _read(path: str | None, loc: Loc, problems: list[Problem]) -> bytes | None:
    """The file's bytes, or None with its problem added (None for no path, too)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        problems.append((loc, f"cannot read {path}: {exc.strerror or exc}"))
        return None
    if len(data) > MAX_FILE_BYTES:
        problems.append((loc, f"{path}: larger than {MAX_FILE_BYTES} bytes"))
        return None
    return data


def _text(data: bytes, path: str, loc: Loc, problems: list[Problem]) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append((loc, f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})"))
        return None


# ------------------------------------------------------------------ listeners


def _listener(kind: ListenerKindConfig, at: Loc) -> list[Problem]:
    """What ``ListenerKind.load_security`` reads: TLS, then the credentials (SASL
    termination) or the JWKS (SASL inspection)."""
    problems: list[Problem] = []
    security = kind.security
    at = (*at, "security")
    if security.tls is not None:
        problems += _server_tls(security.tls, (*at, "tls"))
    sasl = security.sasl
    if security.terminates_sasl and sasl.credentials_file is not None:
        loc = (*at, "sasl", "credentials_file")
        data = _read(sasl.credentials_file, loc, problems)
        text = None if data is None else _text(data, sasl.credentials_file, loc, problems)
        if text is not None:
            try:
                Credentials.parse(text)
            except ValueError as exc:
                problems.append((loc, f"{sasl.credentials_file}: {exc}"))
    elif security.uses_sasl and sasl.oauthbearer_jwks_file is not None:
        loc = (*at, "sasl", "oauthbearer_jwks_file")
        data = _read(sasl.oauthbearer_jwks_file, loc, problems)
        text = None if data is None else _text(data, sasl.oauthbearer_jwks_file, loc, problems)
        if text is not None:
            try:
                Jwks.from_json(text)
            except ValueError as exc:
                problems.append((loc, f"{sasl.oauthbearer_jwks_file}: {exc}"))
    return problems


# ------------------------------------------------------------------ TLS


def _server_tls(cfg: ServerTlsConfig, at: Loc) -> list[Problem]:
    """The listeners' context (``proxy.tls.server_context``), from readable files."""
    problems: list[Problem] = []
    pair = _pair(cfg.cert_file, cfg.key_file, cfg.key_password_file, at, problems)
    if _read(cfg.client_ca_file, (*at, "client_ca_file"), problems) is None:
        cfg = cfg.model_copy(update={"client_ca_file": None})  # (reported, or none named)
    chain_loaded = pair is not None and _build(server_context, cfg, at, pair, problems)
    if not chain_loaded and cfg.client_ca_file is not None:  # (loaded after the chain)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(
                cafile=cfg.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            problems.append(((*at, "client_ca_file"),
                             f"{cfg.client_ca_file}: CA bundle unusable ({exc})"))
    return problems


def _client_tls(cfg: ClientTlsConfig, at: Loc) -> list[Problem]:
    """The brokers' context (``proxy.tls.client_context``), from readable files."""
    problems: list[Problem] = []
    if _read(cfg.ca_file, (*at, "ca_file"), problems) is None:
        cfg = cfg.model_copy(update={"ca_file": None})  # (reported, or none named)
    pair: _Pair | None = None
    if cfg.cert_file is not None and cfg.key_file is not None:
        pair = _pair(cfg.cert_file, cfg.key_file, cfg.key_password_file, at, problems)
        if pair is None:  # (reported: the CA bundle is still looked at)
            cfg = cfg.model_copy(update={"cert_file": None, "key_file": None})
    _build(client_context, cfg, at, pair, problems)
    return problems


_Tls = TypeVar("_Tls", ServerTlsConfig, ClientTlsConfig)

# what a context is built without once its problem is reported, to find the next one
_SKIPPABLE = ("ciphers", "client_ca_file", "ca_file")


def _build(build: Callable[[_Tls, str], ssl.SSLContext], cfg: _Tls, at: Loc,
           pair: _Pair | None, problems: list[Problem]) -> bool:
    """The context built as the runtime builds it; each problem it stops at added (the
    cipher list and the CA bundle are left out to look further). False: it stopped at the
    certificate chain and its key."""
    for _ in range(len(_SKIPPABLE) + 1):
        try:
            build(cfg, _dotted(at))
        except TlsFileError as exc:
            loc, message = _tls_problem(exc, at, pair, cfg)
            problems.append((loc, message))
            if loc[-1] not in _SKIPPABLE:
                return False
            cfg = cfg.model_copy(update={loc[-1]: None})
        else:
            break
    return True


class _Pair:
    """A certificate chain and its key as read (to tell which of them is wrong)."""

    def __init__(self, cert_file: str, cert: bytes, key_file: str, key: bytes,
                 password_file: str | None, password: bytes | None) -> None:
        self.cert_file, self.cert = cert_file, cert
        self.key_file, self.key = key_file, key
        self.password_file, self.password = password_file, password


def _pair(cert_file: str, key_file: str, password_file: str | None, at: Loc,
          problems: list[Problem]) -> _Pair | None:
    """The three files read, or None with their problems added. An encrypted key without a
    password is refused here: OpenSSL would ask for it on the terminal."""
    before = len(problems)
    password = _read(password_file, (*at, "key_password_file"), problems)
    cert = _read(cert_file, (*at, "cert_file"), problems)
    key = _read(key_file, (*at, "key_file"), problems)
    if len(problems) > before or cert is None or key is None:
        return None
    if password is None and _encrypted(key):
        problems.append(((*at, "key_file"), f"{key_file}: the key is encrypted and "
                         "key_password_file is not set"))
        return None
    return _Pair(cert_file, cert, key_file, key, password_file,
                 None if password is None else password.rstrip(b"\r\n"))


def _encrypted(key: bytes) -> bool:
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in key or b"Proc-Type: 4,ENCRYPTED" in key


def _tls_problem(exc: TlsFileError, at: Loc, pair: _Pair | None,
                 cfg: ServerTlsConfig | ClientTlsConfig) -> Problem:
    """Where a context that did not build went wrong: the field ``proxy.tls`` names, or, for
    a chain and key that do not load together, which of the files is wrong."""
    key = exc.field.removeprefix(_dotted(at) + ".")
    detail = str(exc).removeprefix(exc.field + " ")
    if key == "cert_file" and pair is not None:
        return _chain_problem(pair, at, detail)
    if key == "ciphers":
        return (*at, key), f"OpenSSL can select no cipher from {getattr(cfg, 'ciphers', '')!r}"
    return (*at, key), detail


def _chain_problem(pair: _Pair, at: Loc, detail: str) -> Problem:
    try:
        certs = x509.load_pem_x509_certificates(pair.cert)
    except ValueError:
        return (*at, "cert_file"), f"{pair.cert_file}: holds no readable PEM certificate"
    try:
        try:
            key = serialization.load_pem_private_key(pair.key, pair.password)
        except TypeError:  # a password for a key that is not encrypted (OpenSSL ignores it)
            key = serialization.load_pem_private_key(pair.key, None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        if pair.password is not None and _encrypted(pair.key):
            return ((*at, "key_password_file"),
                    f"{pair.password_file}: does not decrypt key_file {pair.key_file}")
        return (*at, "key_file"), f"{pair.key_file}: holds no readable PEM private key"
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if certs[0].public_key().public_bytes(der, spki) != key.public_key().public_bytes(der, spki):
        return ((*at, "key_file"), f"{pair.key_file}: the key does not match the certificate "
                f"in cert_file {pair.cert_file}")
    return (*at, "cert_file"), detail


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)
