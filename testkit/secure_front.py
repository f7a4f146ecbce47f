"""A test-only secured broker: TLS and/or SASL in front of one real tansu broker.

tansu 0.6.0's own TLS does not handshake (it reads the ClientHello as a Kafka frame) and its
SASL accepts no user with memory storage, so tests that need a broker speaking TLS or SASL put
this front before it. tansu advertises the front's port, so every connection a client (or the
proxy) makes to "the broker" goes through the front:

- with ``tls``: the front terminates TLS (optionally requiring client certificates);
- with ``users``: it answers SaslHandshake and SaslAuthenticate as a Kafka broker does (PLAIN,
  SCRAM-SHA-256, SCRAM-SHA-512 against its own users; OAUTHBEARER with unsecured tokens whose
  ``sub`` is one of its users, as Kafka's OAuthBearerUnsecuredValidator; Kafka's error codes:
  33 unsupported mechanism, 34 illegal state, 58 authentication failed, then the connection
  closes), refuses
  any other request before authentication by closing the connection (Kafka's
  IllegalSaslStateException), sets ``session_lifetime_ms`` (KIP-368) when asked, and accepts
  re-authentication; everything else goes to tansu unchanged.

``authenticated`` lists who authenticated, in order. The front runs on an asyncio loop in a
daemon thread; the public methods are called from the test thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import secrets
import ssl
import threading
from collections.abc import Callable
from typing import Any

from kafka_quota_proxy.demo.embedded_broker import free_port
from kafka_quota_proxy.protocol.headers import parse_request_header, produce_acks
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.sasl_frames import (
    API_VERSIONS,
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    UNSUPPORTED_SASL_MECHANISM,
    authenticate_bytes,
    encode_response,
    handshake_mechanism,
)
from kafka_quota_proxy.security.sasl import SaslError, jwt_claim, oauthbearer_token, plain_identity
from kafka_quota_proxy.security.scram import ScramServer, make_credential

HOST = "127.0.0.1"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class SecureFront:
    def __init__(self, tansu_port: int, port: int = 0, *, tls: ssl.SSLContext | None = None,
                 users: dict[str, str] | None = None,
                 mechanisms: tuple[str, ...] = MECHANISMS,
                 session_lifetime_ms: int = 0) -> None:
        self.tansu_port = tansu_port
        self.port = port or free_port()
        self.tls = tls
        self.users = users
        self.mechanisms = mechanisms
        self.session_lifetime_ms = session_lifetime_ms
        self.authenticated: list[str] = []
        self.failures: list[str] = []  # why exchanges failed
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        salt = b"front-salt-0001"
        self._scram = {(m, u): make_credential(m, p, salt, 4096)
                       for m in MECHANISMS if m.startswith("SCRAM") for u, p in
                       (users or {}).items()}

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> SecureFront:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="secure-front",
                                        daemon=True)
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._close(), 10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = None
        loop.close()

    def __enter__(self) -> SecureFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- the loop side -----------------------------------------------------------------------
    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, HOST, self.port, ssl=self.tls,
                                                  reuse_address=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.tansu_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        conn = _FrontConnection(self, writer, up_writer)
        pump = asyncio.get_running_loop().create_task(conn.pump_responses(up_reader))
        try:
            await conn.read_requests(reader)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception as exc:  # never let one connection's failure escape
            self.failures.append(repr(exc))
        finally:
            pump.cancel()
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)


class _FrontConnection:
    def __init__(self, front: SecureFront, client: asyncio.StreamWriter,
                 upstream: asyncio.StreamWriter) -> None:
        self.front = front
        self.client = client
        self.upstream = upstream
        self.sasl = front.users is not None
        self.authenticated = not self.sasl
        self.mechanism: str | None = None
        self.scram: ScramServer | None = None
        self.user: str | None = None
        self.in_flight = 0  # forwarded requests awaiting tansu's response
        self.drained = asyncio.Event()
        self.drained.set()

    async def pump_responses(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, OSError):
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(INT32.unpack(size)[0])
                self.client.write(size + body)
                self.in_flight -= 1
                if not self.in_flight:
                    self.drained.set()
        self.client.transport.abort()

    async def read_requests(self, reader: asyncio.StreamReader) -> None:
        while True:
            size = await reader.readexactly(4)
            frame = await reader.readexactly(INT32.unpack(size)[0])
            header = parse_request_header(frame, 0, len(frame))
            key, version = header.api_key, header.api_version
            if self.sasl and key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                await self.drained.wait()  # answered in order with tansu's responses
                answer = self._sasl(key, version, header.correlation_id, frame)
                self.client.write(answer)
                if self._closing:
                    await self.client.drain()
                    return
                continue
            if not self.authenticated and key != API_VERSIONS:
                self.front.failures.append(f"api {key} before authentication")
                return  # Kafka: IllegalSaslStateException, the connection closes
            expects = True
            if key == 0:
                expects = produce_acks(frame, header.size, len(frame), version) != 0
            if expects:
                self.in_flight += 1
                self.drained.clear()
            self.upstream.write(size + frame)

    _closing = False

    def _fail(self, key: int, version: int, correlation_id: int, code: int,
              message: str, **fields: Any) -> bytes:
        self.front.failures.append(message)
        self._closing = True
        if key == SASL_HANDSHAKE:
            return encode_response(key, version, correlation_id, error_code=code,
                                   mechanisms=self.front.mechanisms)
        return encode_response(key, version, correlation_id, error_code=code,
                               error_message=message, auth_bytes=b"",
                               session_lifetime=datetime.timedelta(0), **fields)

    def _sasl(self, key: int, version: int, correlation_id: int, frame: bytes) -> bytes:
        if key == SASL_HANDSHAKE:
            mechanism = handshake_mechanism(frame, version)
            if mechanism not in self.front.mechanisms:
                return self._fail(key, version, correlation_id, UNSUPPORTED_SASL_MECHANISM,
                                  f"Unsupported SASL mechanism {mechanism}")
            self.mechanism = mechanism
            self.scram = None
            return encode_response(key, version, correlation_id, error_code=NONE,
                                   mechanisms=self.front.mechanisms)
        if self.mechanism is None:
            return self._fail(key, version, correlation_id, ILLEGAL_SASL_STATE,
                              "Unexpected SaslAuthenticate before SaslHandshake")
        auth = authenticate_bytes(frame, version)
        try:
            reply, done = self._step(auth)
        except SaslError:
            return self._fail(key, version, correlation_id, SASL_AUTHENTICATION_FAILED,
                              "Authentication failed: Invalid username or password")
        if done:
            assert self.user is not None
            self.authenticated = True
            self.mechanism = None
            self.front.authenticated.append(self.user)
        return encode_response(
            key, version, correlation_id, error_code=NONE, error_message=None,
            auth_bytes=reply,
            session_lifetime=datetime.timedelta(
                milliseconds=self.front.session_lifetime_ms if done else 0))

    def _step(self, auth: bytes) -> tuple[bytes, bool]:
        users = self.front.users or {}
        if self.mechanism == "PLAIN":
            user = plain_identity(auth)
            password = auth.split(b"\0")[2].decode()
            if users.get(user) != password:
                raise SaslError("authentication_failed", "wrong password")
            self.user = user
            return b"", True
        if self.mechanism == "OAUTHBEARER":
            user = jwt_claim(oauthbearer_token(auth), "sub")
            if user not in users:
                raise SaslError("invalid_token", f"unknown principal {user}")
            self.user = user
            return b"", True
        assert self.mechanism is not None
        if self.scram is None:
            mechanism = self.mechanism
            lookup: Callable[[str], Any] = lambda u: self.front._scram.get((mechanism, u))  # noqa: E731
            self.scram = ScramServer(mechanism, lookup, secrets.token_urlsafe(18))
            return self.scram.first(auth), False
        reply = self.scram.final(auth)
        self.user = self.scram.username
        self.scram = None
        return reply, True
