"""TLS contexts: toward clients (reloaded when their files change) and toward brokers.

The listeners' context is rebuilt from its files when they change; every new handshake takes
the newest through the context's SNI callback (called for every ClientHello, with or without a
server name), so a renewed certificate needs no restart and open connections keep theirs.
A file that cannot be used keeps the previous context, logged and counted.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka_quota_proxy.config.schema import UpstreamConfig
from kafka_quota_proxy.config.security import ClientTlsConfig, ServerTlsConfig
from kafka_quota_proxy.proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.tls")

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                "required": ssl.CERT_REQUIRED}


class TlsFileError(Exception):
    """A TLS file cannot be used; ``field`` names the configuration key."""

    def __init__(self, field: str, path: str, problem: str) -> None:
        super().__init__(f"{field} {path}: {problem}")
        self.field = field


def _password(path: str | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise TlsFileError(field, path, exc.strerror or str(exc)) from None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, password_file: str | None,
                prefix: str) -> None:
    password = _password(password_file, f"{prefix}.key_password_file")
    for field, path in ((f"{prefix}.cert_file", cert), (f"{prefix}.key_file", key)):
        if not os.path.isfile(path):
            raise TlsFileError(field, path, "no such file")
    try:
        ctx.load_cert_chain(cert, key, password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsFileError(f"{prefix}.cert_file", cert,
                           f"certificate and key unusable ({exc})") from None


def _load_ca(ctx: ssl.SSLContext, path: str, field: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(field, path, f"CA bundle unusable ({exc})") from None


def server_context(cfg: ServerTlsConfig, prefix: str = "listeners.security.tls"
                   ) -> ssl.SSLContext:
    """A context for the client listeners, from the files as they are now."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[cfg.min_version]
    if cfg.ciphers:
        try:
            ctx.set_ciphers(cfg.ciphers)
        except ssl.SSLError as exc:
            raise TlsFileError(f"{prefix}.ciphers", cfg.ciphers, str(exc)) from None
    _load_chain(ctx, cfg.cert_file, cfg.key_file, cfg.key_password_file, prefix)
    ctx.verify_mode = _CLIENT_AUTH[cfg.client_auth]
    if cfg.client_ca_file is not None:
        _load_ca(ctx, cfg.client_ca_file, f"{prefix}.client_ca_file")
    return ctx


def client_context(cfg: ClientTlsConfig, prefix: str = "upstream.tls") -> ssl.SSLContext:
    """A context for connections to the brokers."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = _VERSIONS[cfg.min_version]
    if cfg.ca_file is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_ca(ctx, cfg.ca_file, f"{prefix}.ca_file")
    if cfg.cert_file is not None and cfg.key_file is not None:
        _load_chain(ctx, cfg.cert_file, cfg.key_file, cfg.key_password_file, prefix)
    ctx.check_hostname = cfg.check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def read_secret(path: str, field: str) -> str:
    """A password from its file (trailing newline dropped)."""
    try:
        return Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise TlsFileError(field, path, exc.strerror or str(exc)) from None


def kafka_client_options(upstream: UpstreamConfig) -> dict[str, Any]:
    """aiokafka's options for the proxy's own clients of the cluster (the volume-usage reader,
    the volume agent): TLS and the proxy's SASL identity as ``upstream`` configures them."""
    options: dict[str, Any] = {}
    tls = upstream.tls
    if tls is not None:
        options["ssl_context"] = client_context(tls)
    sasl = upstream.sasl
    if sasl is not None:
        options.update(sasl_mechanism=sasl.mechanism, sasl_plain_username=sasl.username,
                       sasl_plain_password=read_secret(sasl.password_file,
                                                       "upstream.sasl.password_file"))
    if options:
        options["security_protocol"] = (("SASL_SSL" if tls is not None else "SASL_PLAINTEXT")
                                        if sasl is not None else "SSL")
    return options


def _signature(paths: list[str]) -> tuple[tuple[int, int, int] | None, ...]:
    """What tells a file changed: its inode (a file renamed over it), mtime and size."""
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class ServerTls:
    """The client listeners' TLS: ``front`` is the context handshakes start with; its SNI
    callback hands each handshake the newest context built from the files."""

    def __init__(self, cfg: ServerTlsConfig,
                 on_reload: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self._files = [p for p in (cfg.cert_file, cfg.key_file, cfg.key_password_file,
                                   cfg.client_ca_file) if p is not None]
        self._seen = _signature(self._files)  # (before reading: a change meanwhile is seen)
        self.front = server_context(cfg)
        self.current = self.front
        self.front.sni_callback = self._pick
        self._on_reload = on_reload or (lambda result: None)

    def _pick(self, obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
              ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not ctx:
            obj.context = current
        return None

    def reload_if_changed(self) -> bool | None:
        """Rebuild the context if a file changed: True (reloaded), False (a file is unusable:
        the previous context stays), None (nothing changed)."""
        seen = _signature(self._files)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            self.current = server_context(self.cfg)
        except TlsFileError as exc:
            log.error("tls_reload_failed", field=exc.field, error=str(exc))
            self._on_reload("failure")
            return False
        log.info("tls_reloaded", cert_file=self.cfg.cert_file)
        self._on_reload("success")
        return True

    async def watch(self) -> None:
        """Check the files every ``reload_seconds`` (a certificate is replaced by writing new
        files: a half-written pair fails to load and is tried again at the next change)."""
        interval = self.cfg.reload_seconds
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
