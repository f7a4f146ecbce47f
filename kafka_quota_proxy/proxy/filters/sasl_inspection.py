"""Principals from SASL exchanges passed through to the brokers (``listeners.security.sasl``
mode ``inspect``).

SaslHandshake and SaslAuthenticate go to the broker as the client sent them. The proxy reads
the identity in the client's first message (PLAIN: the authcid; SCRAM: ``n=``; OAUTHBEARER: a
claim of the token, verified when a JWKS is configured) and makes it the connection's principal
only when the broker answers that the exchange succeeded. Until then only ApiVersions,
SaslHandshake and SaslAuthenticate may be sent; anything else closes the connection, as a
Kafka broker does. Nothing of the exchange is recorded in a quota or captured (Kafka's
authenticator handles it, not its request handler).

Once the client is authenticated the filter leaves the per-request path: only SASL frames
(KIP-368 re-authentication) still reach it, through the interest table.
"""

from __future__ import annotations

import time

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.sasl_frames import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    authenticate_bytes,
    authenticate_result,
    handshake_error,
    handshake_mechanism,
)
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.security.sasl import Jwks, SaslError, identity

log = get_logger("kafka_quota_proxy.identity")

# Messages the client sends before the broker's verdict, per mechanism (None: unknown)
_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}


class SaslSettings:
    """What every connection of a SASL listener reads its principal with."""

    __slots__ = ("claim", "fallback", "jwks")

    def __init__(self, fallback: str, claim: str, jwks: Jwks | None) -> None:
        self.fallback = fallback
        self.claim = claim
        self.jwks = jwks


class SaslInspection(Filter):
    """One connection's SASL exchange, read as it passes."""

    def __init__(self, host: FilterHost, settings: SaslSettings) -> None:
        self.host = host
        self.client = host.client
        self.settings = settings
        self.authenticated = False
        self.mechanism: str | None = None  # of the handshake under way
        self.sent = 0  # SaslAuthenticate requests since the handshake
        self.candidate: str | None = None  # the identity read, until the broker's verdict
        self.unreadable: SaslError | None = None  # the identity could not be read

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return Interest.REQUEST_FRAME | Interest.RESPONSE_FRAME
        return Interest.NONE

    # ------------------------------------------------------------------ before authentication
    def serial(self) -> bool:
        return True  # one request at a time until authenticated (then retired)

    def request(self, entry: InFlight) -> None:
        """Before authentication: only the exchange and ApiVersions reach the broker."""
        key = entry.api_key
        if key in (SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS):
            entry.exempt = True
            return
        self.host.close("unauthenticated_request", side="client",
                        detail=f"{apis.api_name(key)} before SASL authentication")

    # ------------------------------------------------------------------ the exchange
    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        key = entry.api_key
        if key != SASL_HANDSHAKE and key != SASL_AUTHENTICATE:  # another filter's frame
            return None
        entry.exempt = True
        try:
            if key == SASL_HANDSHAKE:
                self._handshake(entry, frame)
            else:
                self._authenticate(entry, frame)
        except ProtocolError as exc:
            self.host.close(exc.reason, side="client", detail=str(exc))
        return None

    def _handshake(self, entry: InFlight, frame: bytes) -> None:
        if entry.api_version == 0:
            # v0: raw SASL tokens follow, outside Kafka's framing (KIP-152 replaced them)
            self.host.close("sasl_handshake_v0", side="client",
                            detail="SaslHandshake v0 (raw SASL tokens) is not supported; "
                            "clients since Kafka 1.0 use v1")
            return
        self.mechanism = handshake_mechanism(frame, entry.api_version)
        self.sent = 0
        self.candidate = None
        self.unreadable = None

    def _authenticate(self, entry: InFlight, frame: bytes) -> None:
        mechanism = self.mechanism
        if mechanism is None:
            self.host.close("sasl_out_of_order", side="client",
                            detail="SaslAuthenticate without a successful SaslHandshake")
            return
        self.sent += 1
        if self.sent != 1:
            return
        auth = authenticate_bytes(frame, entry.api_version)
        settings = self.settings
        try:
            name = identity(mechanism, auth, settings.claim, settings.jwks, time.time())
        except SaslError as exc:  # the broker will most likely refuse it too
            self.unreadable = exc
            return
        self.candidate = name if name is not None else settings.fallback

    def response_frame(self, entry: InFlight, frame: bytes | memoryview) -> None:
        key = entry.api_key
        if key != SASL_HANDSHAKE and key != SASL_AUTHENTICATE:  # held whole for another
            return
        try:
            if key == SASL_HANDSHAKE:
                if handshake_error(frame, entry.api_version):
                    self.mechanism = None  # refused: the broker closes or the client retries
                return
            result = authenticate_result(frame, entry.api_version)
        except ProtocolError as exc:
            self.host.close(exc.reason, side="upstream", detail=str(exc))
            return
        mechanism = self.mechanism
        if result.error_code or mechanism is None:
            if result.error_code:
                log.info("sasl_authentication_failed", connection=self.client.id,
                         client=self.client.peer, mechanism=mechanism,
                         error_code=result.error_code, error_message=result.error_message)
                self.mechanism = None
            return
        rounds = _ROUNDS.get(mechanism)
        if rounds is not None and self.sent < rounds:
            return  # SCRAM's server-first: the verdict comes with the next response
        if mechanism == "OAUTHBEARER" and result.auth_bytes:
            return  # an error challenge (RFC 7628 3.2.2): the failure follows
        self._authenticated(mechanism, result.session_lifetime_ms)

    def _authenticated(self, mechanism: str, session_lifetime_ms: int) -> None:
        if mechanism in _ROUNDS:
            self.mechanism = None
        elif self.authenticated and self.client.user == self.settings.fallback:
            return  # another round of a mechanism the proxy cannot read (GSSAPI)
        if self.unreadable is not None:
            exc, self.unreadable = self.unreadable, None
            self.host.close(exc.reason, side="client",
                            detail=f"the broker accepted a {mechanism} exchange whose identity "
                            f"the proxy cannot accept: {exc}")
            return
        principal = self.candidate or self.settings.fallback
        client = self.client
        before, client.user = client.user, principal
        fields = {"connection": client.id, "client": client.peer, "principal": principal,
                  "mechanism": mechanism, "session_lifetime_ms": session_lifetime_ms}
        if not self.authenticated:
            self.authenticated = True
            log.info("client_authenticated", **fields)
            self.host.retire(self, ("request", "serial"))  # off the per-request path
        elif before != principal:  # KIP-368 re-authentication as someone else
            log.warning("principal_changed", previous=before, **fields)
        else:
            log.debug("client_reauthenticated", **fields)
