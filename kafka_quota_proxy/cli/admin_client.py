"""A small Kafka admin client for ``kafka-quota-proxy quotas describe|alter`` and ``acls``:
one connection to the first reachable bootstrap server (plaintext or TLS, SASL PLAIN or
SCRAM), ApiVersions to pick each API's version, then one request at a time.

The connection settings come from a ``--command-config`` file in Kafka's client properties
(``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config``, ``ssl.truststore.*``...),
as ``kafka-configs.sh`` and ``kafka-acls.sh`` read them. Failures raise ``KafkaError``, named
as Kafka's Java client names them (``org.apache.kafka.common.errors.*``), which is how Kafka's
tools print them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import re
import secrets
import ssl
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.security.sasl import SaslError
from kafka_quota_proxy.security.scram import ScramClient

CLIENT_ID = "kafka-quota-proxy-admin"
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# Kafka's error codes as its Java client raises them: (exception class, default message)
ERRORS: dict[int, tuple[str, str]] = {
    -1: ("UnknownServerException",
         "The server experienced an unexpected error when processing the request."),
    7: ("TimeoutException", "The request timed out."),
    29: ("TopicAuthorizationException", "Topic authorization failed."),
    30: ("GroupAuthorizationException", "Group authorization failed."),
    31: ("ClusterAuthorizationException", "Cluster authorization failed."),
    33: ("UnsupportedSaslMechanismException",
         "The broker does not support the requested SASL mechanism."),
    34: ("IllegalSaslStateException", "Request is not valid given the current SASL state."),
    35: ("UnsupportedVersionException", "The version of API is not supported."),
    40: ("InvalidConfigurationException", "Configuration is invalid."),
    41: ("NotControllerException", "This is not the correct controller for this cluster."),
    42: ("InvalidRequestException",
         "This most likely occurs because of a request being malformed by the client library "
         "or the message was sent to an incompatible broker. See the broker logs for more "
         "details."),
    44: ("PolicyViolationException", "Request parameters do not satisfy the configured policy."),
    46: ("SecurityDisabledException", "Security features are disabled."),
    58: ("SaslAuthenticationException", "SASL Authentication failed."),
    87: ("ApiException", "This API is not available."),
}


class KafkaError(Exception):
    """A failure as Kafka's Java client reports it: ``org.apache.kafka.common.errors.<name>:
    <message>``; ``cause``, when given, is printed as a ``Caused by:`` line of its own (a
    connection failure, which Kafka's tools report only as a timeout)."""

    def __init__(self, name: str, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.message = message
        self.cause = cause

    def __str__(self) -> str:
        return f"org.apache.kafka.common.errors.{self.name}: {self.message}"


def error_for(code: int, message: str | None) -> KafkaError:
    """``Errors.forCode(code).exception(message)``."""
    name, default = ERRORS.get(code, ("UnknownServerException",
                                      f"Unexpected error code: {code}."))
    return KafkaError(name, message if message else default)


class CommandConfigError(ValueError):
    """A ``--command-config`` file this client cannot use (the message names the property)."""


# ---------------------------------------------------------------- the command-config file
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """A Java ``.properties`` file as ``java.util.Properties.load`` reads it: ``#`` and ``!``
    comments, ``key=value``, ``key: value`` or ``key value``, lines continued by a trailing
    backslash, backslash escapes (``\\uXXXX`` too); the last of a repeated key wins."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # continued on the next line
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    props: dict[str, str] = {}
    for line in lines:
        line = line.lstrip()
        i = 0
        while i < len(line):
            if line[i] == "\\":
                i += 2
                continue
            if line[i] in "=: \t\f":
                break
            i += 1
        key = line[:i]
        rest = line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":") and (i < len(line) and line[i] not in "=:"):
            rest = rest[1:].lstrip(" \t\f")
        elif i < len(line) and line[i] in "=:":
            rest = line[i + 1:].lstrip(" \t\f")
        props[_unescape(key)] = _unescape(rest)
    return props


_JAAS = re.compile(r'(\w[\w.]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;]+))')


def jaas_credentials(jaas: str) -> tuple[str, str]:
    """The username and password of a ``sasl.jaas.config`` line (``...PlainLoginModule
    required username="alice" password="secret";`` or ``ScramLoginModule``)."""
    module, _, options = jaas.strip().partition(" ")
    if not module.endswith(("PlainLoginModule", "ScramLoginModule")):
        raise CommandConfigError(
            f"sasl.jaas.config: login module {module or '(none)'} is not supported here "
            "(PlainLoginModule or ScramLoginModule)")
    found = {m.group(1): (m.group(2).replace('\\"', '"').replace("\\\\", "\\")
                          if m.group(2) is not None else m.group(3))
             for m in _JAAS.finditer(options)}
    if "username" not in found or "password" not in found:
        raise CommandConfigError("sasl.jaas.config: a username and a password are needed "
                                 '(username="..." password="...")')
    return found["username"], found["password"]


@dataclass(frozen=True)
class ClientSettings:
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca_pem: str | None = None  # trusted certificates (None: the system's)
    cert_file: str | None = None  # the client's own certificate chain and key (PEM)
    key_file: str | None = None
    key_password: str | None = None
    check_hostname: bool = True
    timeout: float = 30.0

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        if self.ca_pem is not None:
            ctx = ssl.create_default_context(cadata=self.ca_pem)
        ctx.check_hostname = self.check_hostname
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file, self.key_password)
        return ctx


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CommandConfigError(f"{what} {path}: {exc.strerror or exc}") from None


def _trusted_pem(props: dict[str, str]) -> str | None:
    if "ssl.truststore.certificates" in props:  # Kafka's PEM truststore given inline
        return props["ssl.truststore.certificates"]
    location = props.get("ssl.truststore.location") or props.get("ssl.ca.location")
    if not location:
        return None
    data = _read(location, "ssl.truststore.location")
    if b"-----BEGIN CERTIFICATE-----" in data:
        return data.decode("ascii", "replace")
    try:  # a PKCS12 trust store (keytool's -storetype PKCS12)
        from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

        password = props.get("ssl.truststore.password")
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except Exception:
        raise CommandConfigError(
            f"ssl.truststore.location {location}: neither PEM certificates nor a PKCS12 store "
            "this tool can read (a JKS store: convert it with keytool -importkeystore "
            "-deststoretype PKCS12, or export its certificates as PEM)") from None
    certs = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certs.append(store.cert.certificate)
    if not certs:
        raise CommandConfigError(f"ssl.truststore.location {location}: no certificate")
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certs)


def client_settings(props: dict[str, str]) -> ClientSettings:
    """Kafka's client properties as this client uses them (other properties are ignored, as
    Kafka's admin client only warns about unknown ones)."""
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise CommandConfigError(f"security.protocol {protocol}: not one of "
                                 + ", ".join(PROTOCOLS))
    mechanism = username = password = None
    if protocol.startswith("SASL_"):
        mechanism = props.get("sasl.mechanism", "GSSAPI").strip().upper()
        if mechanism not in SASL_MECHANISMS:
            raise CommandConfigError(f"sasl.mechanism {mechanism}: not supported here ("
                                     + ", ".join(SASL_MECHANISMS) + ")")
        if "sasl.jaas.config" in props:
            username, password = jaas_credentials(props["sasl.jaas.config"])
        elif "sasl.username" in props and "sasl.password" in props:
            username, password = props["sasl.username"], props["sasl.password"]
        else:
            raise CommandConfigError(
                f"security.protocol {protocol} needs sasl.jaas.config (or sasl.username and "
                "sasl.password)")
    cert_file = props.get("ssl.keystore.location") or props.get("ssl.certificate.location")
    key_file = props.get("ssl.key.location")
    timeout_ms = props.get("request.timeout.ms", props.get("default.api.timeout.ms", "30000"))
    try:
        timeout = int(timeout_ms) / 1000.0
    except ValueError:
        raise CommandConfigError(f"request.timeout.ms {timeout_ms}: not a number") from None
    return ClientSettings(
        security_protocol=protocol, sasl_mechanism=mechanism, username=username,
        password=password,
        ca_pem=_trusted_pem(props) if protocol in ("SSL", "SASL_SSL") else None,
        cert_file=cert_file, key_file=key_file,
        key_password=props.get("ssl.key.password") or props.get("ssl.keystore.password"),
        check_hostname=props.get("ssl.endpoint.identification.algorithm", "https").strip()
        .lower() == "https",
        timeout=timeout)


def load_command_config(path: str | None) -> ClientSettings:
    if path is None:
        return ClientSettings()
    text = _read(path, "--command-config").decode("utf-8", "replace")
    return client_settings(parse_properties(text))


# ---------------------------------------------------------------- the connection
def _host_port(server: str) -> tuple[str, int]:
    host, sep, port = server.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise CommandConfigError(f"Invalid url in bootstrap.servers: {server}")
    return host.strip("[]"), int(port)


class AdminConnection:
    """One connection, authenticated, with the versions its broker offers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.versions: dict[int, tuple[int, int]] = {}
        self._correlation = 0

    @classmethod
    async def open(cls, bootstrap: str, settings: ClientSettings,
                   call: str) -> AdminConnection:
        """Connected to the first server of ``bootstrap`` (``host:port,...``) that answers;
        ``call`` names the admin call in the timeout Kafka's client would report."""
        servers = [_host_port(s) for s in bootstrap.split(",") if s.strip()]
        if not servers:
            raise CommandConfigError("No resolvable bootstrap urls given in bootstrap.servers")
        try:
            tls = settings.ssl_context() if settings.tls else None
        except (ssl.SSLError, OSError) as exc:
            raise CommandConfigError(f"the TLS settings of --command-config do not load: "
                                     f"{exc}") from None
        failure = ""
        for host, port in servers:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None),
                    settings.timeout)
            except ssl.SSLError as exc:  # what Kafka's client reports of a failed handshake
                raise KafkaError("SslAuthenticationException", "SSL handshake failed",
                                 f"javax.net.ssl.SSLHandshakeException: "
                                 f"{exc.reason or exc}") from None
            except (OSError, TimeoutError) as exc:
                failure = f"java.net.ConnectException: {exc.strerror or exc or 'timed out'}" \
                    if isinstance(exc, OSError) else "java.net.ConnectException: timed out"
                continue
            conn = cls(reader, writer, settings.timeout)
            try:
                async with asyncio.timeout(settings.timeout):
                    if settings.sasl:
                        await conn._authenticate(settings)
                    await conn._api_versions()
            except (OSError, asyncio.IncompleteReadError, MalformedFrame) as exc:
                conn.close()
                failure = f"java.io.IOException: {exc!r}"
                continue
            except TimeoutError:
                conn.close()
                failure = "java.io.IOException: no answer from the server"
                continue
            except BaseException:
                conn.close()
                raise
            return conn
        raise KafkaError("TimeoutException",
                         f"Timed out waiting for a node assignment. Call: {call}", failure)

    def close(self) -> None:
        self.writer.close()

    async def aclose(self) -> None:
        """Closed, TLS shut down (errors of a peer already gone ignored)."""
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)

    async def roundtrip(self, api_key: int, version: int, **fields: Any) -> Any:
        """The decoded response to one request (``fields`` left out when not in
        ``version``)."""
        cls = load_request_schema(api_key, version)
        names = {f.name for f in dataclasses.fields(cls)}
        body = io.BytesIO()
        entity_writer(cls)(body, cls(**{k: v for k, v in fields.items() if k in names}))
        self._correlation += 1
        frame = encode_request_header(api_key, version, self._correlation,
                                      CLIENT_ID) + body.getvalue()
        async with asyncio.timeout(self.timeout):
            self.writer.write(INT32.pack(len(frame)) + frame)
            await self.writer.drain()
            size = INT32.unpack(await self.reader.readexactly(4))[0]
            answer = await self.reader.readexactly(size)
        return response_body(answer, api_key, version)

    async def _authenticate(self, settings: ClientSettings) -> None:
        """SASL as Kafka's clients (KIP-152: SaslHandshake v1, then SaslAuthenticate v1)."""
        mechanism = settings.sasl_mechanism or "PLAIN"
        assert settings.username is not None and settings.password is not None
        handshake = await self.roundtrip(SASL_HANDSHAKE, 1, mechanism=mechanism)
        if int(handshake.error_code):
            raise KafkaError("UnsupportedSaslMechanismException",
                             f"Client SASL mechanism '{mechanism}' not enabled in the server, "
                             f"enabled mechanisms are [{', '.join(handshake.mechanisms)}]")

        async def send(token: bytes) -> bytes:
            result = await self.roundtrip(SASL_AUTHENTICATE, 1, auth_bytes=token)
            if int(result.error_code):
                raise error_for(int(result.error_code), result.error_message)
            return bytes(result.auth_bytes)

        if mechanism == "PLAIN":
            await send(b"\0" + settings.username.encode() + b"\0" + settings.password.encode())
            return
        scram = ScramClient(mechanism, settings.username, settings.password,
                            secrets.token_urlsafe(18))
        server_first = await send(scram.first())
        try:
            final = scram.final(server_first)
            scram.verify(await send(final))
        except (ValueError, SaslError) as exc:
            raise KafkaError("SaslAuthenticationException", str(exc)) from None

    async def _api_versions(self) -> None:
        response = await self.roundtrip(API_VERSIONS, 0)
        if int(response.error_code):
            raise error_for(int(response.error_code), None)
        self.versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                         for k in response.api_keys}

    def version(self, api_key: int) -> int:
        """The highest version of ``api_key`` both the broker and kio know (Kafka's
        UnsupportedVersionException when there is none)."""
        name = apis.api_name(api_key).upper()  # as Java's ApiKeys name it
        offered = self.versions.get(api_key)
        if offered is None:
            raise KafkaError("UnsupportedVersionException",
                             f"The broker does not support {name}")
        low, high = apis.kio_version_range(api_key)
        if offered[1] < low or offered[0] > high:
            raise KafkaError(
                "UnsupportedVersionException",
                f"The broker does not support {name} with version in range [{low},{high}]. "
                f"The supported range is [{offered[0]},{offered[1]}].")
        return min(offered[1], high)
