"""The proxy authenticating clients itself (``listeners.security.sasl.mode: terminate``).

Until a client has authenticated, the connection hands what it reads to ``SaslTermination.
intercept`` instead of the request stream: whole frames are taken one at a time; ApiVersions
goes to the broker (the proxy caps the SASL APIs at what it reads: SaslHandshake v1,
SaslAuthenticate up to v2), SaslHandshake and SaslAuthenticate are answered here as a Kafka
broker's authenticator answers them (PLAIN and SCRAM-SHA-256/512 against the credentials file;
errors 33 unsupported mechanism, 34 illegal state, 58 authentication failed, the last two
followed by the connection closing), and any other request closes the connection. Once
authenticated the connection reads as usual (the filter leaves the per-request path) and
everything it forwards reaches the broker on an upstream connection authenticated as the
proxy's own identity (``upstream.sasl``).

Sessions do not expire (``session_lifetime_ms`` 0, Kafka's default
``connections.max.reauth.ms``): clients never re-authenticate with the proxy.
"""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import FrameTooLarge, MalformedFrame, NegativeFrameSize
from kafka_quota_proxy.protocol.headers import parse_request_header
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
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.security.credentials import Credentials
from kafka_quota_proxy.security.sasl import SaslError, plain_identity
from kafka_quota_proxy.security.scram import ScramCredential, ScramServer

log = get_logger("kafka_quota_proxy.sasl_server")


@dataclass
class SaslServerSettings:
    """Shared by the connections of a terminating listener; ``credentials`` is replaced when
    the file changes (a connection checks against what is live when it authenticates)."""

    mechanisms: tuple[str, ...]
    credentials: Credentials
    max_frame_bytes: int


class AuthenticationEnded(Exception):
    """The exchange failed: ``answer`` (may be empty) is sent, then the connection closes with
    ``reason``."""

    def __init__(self, reason: str, detail: str, answer: bytes = b"") -> None:
        super().__init__(detail)
        self.reason = reason
        self.answer = answer


@dataclass
class Intercepted:
    """What one ``intercept`` call made of the bytes: frames for the request path (size
    prefixes included), answers for the client, and whether the exchange ended (``failed``:
    the reason the connection closes after the answers)."""

    forward: bytes = b""
    answers: tuple[bytes, ...] = ()
    failed: AuthenticationEnded | None = None


class SaslTermination(Filter):
    """One connection's SASL exchange, answered by the proxy."""

    intercepts = True

    def __init__(self, host: FilterHost, settings: SaslServerSettings) -> None:
        self.host = host
        self.client = host.client
        self.settings = settings
        self.authenticated = False
        self._buffer = bytearray()
        self._mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._waiting = False  # a request went to the broker: the next frame waits for it

    # ------------------------------------------------------------------ the request path
    def serial(self) -> bool:
        return True

    def headroom(self) -> bool:
        return False  # one request at a time until authenticated

    def request(self, entry: InFlight) -> None:
        entry.exempt = True  # ApiVersions before authentication: the authenticator's

    def response_done(self, entry: InFlight) -> None:
        self._waiting = False
        if self._buffer:  # frames read while ApiVersions was with the broker
            self.host.resume_interception()

    @property
    def rest(self) -> bytes:
        """What the client sent after the exchange (handed to the request stream)."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return rest

    # ------------------------------------------------------------------ frames
    def intercept(self, data: bytes) -> Intercepted:
        """Take what the client sent; raises ProtocolError for a frame that cannot be read."""
        if data:
            self._buffer += data
        answers: list[bytes] = []
        buf = self._buffer
        while not self.authenticated and not self._waiting and len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big", signed=True)
            if size < 0:
                raise NegativeFrameSize(f"frame size {size}")
            if size > self.settings.max_frame_bytes:
                raise FrameTooLarge(f"frame of {size} bytes before authentication")
            if len(buf) < 4 + size:
                break
            frame = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            try:
                header = parse_request_header(frame, 0, size)
            except (IndexError, ValueError, UnicodeDecodeError) as exc:
                raise MalformedFrame(f"request header does not parse: {exc!r}") from None
            key = header.api_key
            if key == API_VERSIONS:
                self._waiting = True
                return Intercepted(size.to_bytes(4, "big") + frame, tuple(answers))
            if key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                return Intercepted(answers=tuple(answers), failed=AuthenticationEnded(
                    "unauthenticated_request",
                    f"{apis.api_name(key)} before SASL authentication"))
            try:
                answers.append(self._answer(key, header.api_version, header.correlation_id,
                                            frame))
            except AuthenticationEnded as ended:
                if ended.answer:
                    answers.append(ended.answer)
                return Intercepted(answers=tuple(answers), failed=ended)
        return Intercepted(answers=tuple(answers))

    def _answer(self, key: int, version: int, correlation_id: int, frame: bytes) -> bytes:
        if not apis.accepts_request_version(key, version):
            raise AuthenticationEnded("unsupported_version",
                                      f"{apis.api_name(key)} v{version}")
        if key == SASL_HANDSHAKE:
            return self._handshake(version, correlation_id, frame)
        return self._authenticate(version, correlation_id, frame)

    def _handshake(self, version: int, correlation_id: int, frame: bytes) -> bytes:
        mechanism = handshake_mechanism(frame, version)
        offered = self.settings.mechanisms
        if mechanism not in offered:
            answer = encode_response(SASL_HANDSHAKE, version, correlation_id,
                                     error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=offered)
            raise AuthenticationEnded(
                "sasl_mechanism_unsupported",
                f"client asked for {mechanism}; offered {', '.join(offered)}", answer)
        self._mechanism = mechanism
        self._scram = None
        return encode_response(SASL_HANDSHAKE, version, correlation_id, error_code=NONE,
                               mechanisms=offered)

    def _authenticate(self, version: int, correlation_id: int, frame: bytes) -> bytes:
        def reply(error: int, message: str | None, auth: bytes) -> bytes:
            fields: dict[str, object] = {"error_code": error, "error_message": message,
                                         "auth_bytes": auth}
            if version >= 1:
                fields["session_lifetime"] = datetime.timedelta(0)
            return encode_response(SASL_AUTHENTICATE, version, correlation_id, **fields)

        mechanism = self._mechanism
        if mechanism is None:
            raise AuthenticationEnded(
                "sasl_out_of_order", "SaslAuthenticate without a SaslHandshake",
                reply(ILLEGAL_SASL_STATE,
                      "Unexpected SaslAuthenticate request before SaslHandshake", b""))
        auth = authenticate_bytes(frame, version)
        credentials = self.settings.credentials
        try:
            if mechanism == "PLAIN":
                user = plain_identity(auth)
                password = auth.split(b"\0", 2)[2].decode("utf-8")
                if not credentials.check_plain(user, password):
                    raise SaslError("authentication_failed", f"wrong password for {user}")
                self._authenticated(user, mechanism)
                return reply(NONE, None, b"")
            if self._scram is None:
                scram = self._scram = ScramServer(
                    mechanism, _lookup(credentials, mechanism), secrets.token_urlsafe(24))
                return reply(NONE, None, scram.first(auth))
            scram, self._scram = self._scram, None
            server_final = scram.final(auth)
            assert scram.username is not None
            self._authenticated(scram.username, mechanism)
            return reply(NONE, None, server_final)
        except (ValueError, IndexError) as exc:  # SaslError, UnicodeDecodeError among them
            log.info("sasl_authentication_failed", connection=self.client.id,
                     client=self.client.peer, mechanism=mechanism, error=str(exc))
            raise AuthenticationEnded(
                "sasl_authentication_failed", str(exc),
                reply(SASL_AUTHENTICATION_FAILED,
                      f"Authentication failed during authentication due to invalid "
                      f"credentials with SASL mechanism {mechanism}", b"")) from None

    def _authenticated(self, user: str, mechanism: str) -> None:
        self.authenticated = True
        self._mechanism = None
        self.client.user = user
        log.info("client_authenticated", connection=self.client.id, client=self.client.peer,
                 principal=user, mechanism=mechanism, session_lifetime_ms=0, terminated=True)
        self.host.retire(self, ("request", "serial", "headroom", "response_done"))


def _lookup(credentials: Credentials, mechanism: str
            ) -> Callable[[str], ScramCredential | None]:
    return lambda user: credentials.scram(mechanism, user)
