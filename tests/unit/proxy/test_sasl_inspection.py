"""SASL passthrough inspection (``proxy/filters/sasl_inspection.py`` over
``protocol/sasl_frames.py``):
requests refused before authentication, the exchange's order, the principal taken from the
client's first message only on the broker's success, re-authentication, and the filter retired
from the per-request path (``FilterChain.retire``)."""

from __future__ import annotations

import base64
import datetime
import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kio.static.primitive import i64Timedelta

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.sasl_frames import (
    API_VERSIONS,
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    UNSUPPORTED_SASL_MECHANISM,
    authenticate_bytes,
    authenticate_result,
    encode_response,
    handshake_error,
    handshake_mechanism,
)
from kafka_quota_proxy.proxy.filters import sasl_inspection as identity_module
from kafka_quota_proxy.proxy.filters.base import Filter, FilterChain
from kafka_quota_proxy.proxy.filters.sasl_inspection import SaslInspection, SaslSettings
from kafka_quota_proxy.security.sasl import Jwks
from testkit.filter_host import FakeFilterHost, RecordingLog
from testkit.frames import kio_request, sasl_plain

METADATA = 3
PRODUCE = 0

# ------------------------------------------------------------------ frames


def authenticate_response(version: int, correlation_id: int, error_code: int = 0,
                          auth_bytes: bytes = b"", error_message: str | None = None,
                          lifetime_ms: int = 0) -> bytes:
    fields: dict[str, Any] = {"error_code": error_code, "error_message": error_message,
                              "auth_bytes": auth_bytes}
    if version >= 1:
        fields["session_lifetime"] = i64Timedelta.parse(
            datetime.timedelta(milliseconds=lifetime_ms))
    return encode_response(SASL_AUTHENTICATE, version, correlation_id, **fields)[4:]


def handshake_response(version: int, correlation_id: int, error_code: int = 0,
                       mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256")) -> bytes:
    return encode_response(SASL_HANDSHAKE, version, correlation_id, error_code=error_code,
                           mechanisms=mechanisms)[4:]


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_json(value: object) -> str:
    return b64url(json.dumps(value).encode())


def unsigned_jwt(claims: dict[str, Any]) -> str:
    return f"{b64url_json({'alg': 'none'})}.{b64url_json(claims)}."


def es256_jwt(key: ec.EllipticCurvePrivateKey, claims: dict[str, Any], kid: str = "k1") -> str:
    signing_input = f"{b64url_json({'alg': 'ES256', 'kid': kid})}.{b64url_json(claims)}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def jwks_of(key: ec.EllipticCurvePrivateKey, kid: str = "k1") -> Jwks:
    numbers = key.public_key().public_numbers()
    jwk = {"kty": "EC", "kid": kid, "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
           "y": b64url(numbers.y.to_bytes(32, "big"))}
    return Jwks.from_json(json.dumps({"keys": [jwk]}))


def oauthbearer(token: str) -> bytes:
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


# ------------------------------------------------------------------ a fake connection


def fake_host(chain: FilterChain | None = None) -> FakeFilterHost:
    """What ``SaslInspection`` uses of its connection (it never mutes)."""
    return FakeFilterHost(conn_id=7, listener="bootstrap", scope=-1, peer="192.0.2.10:50000",
                          chain=chain, may_mute=False)


class Session:
    """A client's exchange through one ``SaslInspection``, as the connection calls it: the
    ``request`` hook (while not retired), then ``request_frame`` for SASL frames, then
    ``response_frame`` for their responses."""

    def __init__(self, settings: SaslSettings | None = None) -> None:
        self.host = fake_host()
        self.settings = settings or SaslSettings("ANONYMOUS", "sub", None)
        self.filter = SaslInspection(self.host, self.settings)  # type: ignore[arg-type]
        self.correlation = 0

    @property
    def user(self) -> str:
        return self.host.client.user

    def send(self, api_key: int, version: int, **fields: Any) -> InFlight:
        self.correlation += 1
        frame = kio_request(api_key, version, self.correlation, **fields)
        entry = InFlight(api_key, version, self.correlation, "client-1", len(frame) + 4, True)
        if not self.host.retired:
            self.filter.request(entry)
        if SaslInspection.interests(api_key, version) & Interest.REQUEST_FRAME:
            assert self.filter.request_frame(entry, frame, True) is None  # never patched
        return entry

    def handshake(self, mechanism: str, version: int = 1, error_code: int = 0) -> InFlight:
        entry = self.send(SASL_HANDSHAKE, version, mechanism=mechanism)
        if not self.host.closes:
            self.filter.response_frame(
                entry, handshake_response(version, entry.correlation_id, error_code))
        return entry

    def authenticate(self, auth_bytes: bytes, version: int = 2) -> InFlight:
        return self.send(SASL_AUTHENTICATE, version, auth_bytes=auth_bytes)

    def answer(self, entry: InFlight, error_code: int = 0, auth_bytes: bytes = b"",
               lifetime_ms: int = 0, error_message: str | None = None) -> None:
        frame = authenticate_response(entry.api_version, entry.correlation_id, error_code,
                                      auth_bytes, error_message, lifetime_ms)
        self.filter.response_frame(entry, memoryview(frame))

    def login(self, mechanism: str, auth_bytes: bytes, error_code: int = 0,
              lifetime_ms: int = 0) -> InFlight:
        self.handshake(mechanism)
        entry = self.authenticate(auth_bytes)
        self.answer(entry, error_code, lifetime_ms=lifetime_ms)
        return entry


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> RecordingLog:
    recording = RecordingLog()
    monkeypatch.setattr(identity_module, "log", recording)
    return recording


# ------------------------------------------------------------------ sasl_frames


def test_sasl_frames_read_what_was_encoded() -> None:
    assert handshake_mechanism(kio_request(SASL_HANDSHAKE, 1, 1, mechanism="SCRAM-SHA-512"),
                               1) == "SCRAM-SHA-512"
    assert handshake_error(handshake_response(1, 1, UNSUPPORTED_SASL_MECHANISM), 1) == 33
    for version in (0, 1, 2):
        frame = kio_request(SASL_AUTHENTICATE, version, 9, auth_bytes=b"\x00u\x00p")
        assert authenticate_bytes(frame, version) == b"\x00u\x00p"
    result = authenticate_result(
        authenticate_response(2, 3, ILLEGAL_SASL_STATE, b"xy", "bad state", 60_000), 2)
    assert (result.error_code, result.error_message, result.auth_bytes,
            result.session_lifetime_ms) == (34, "bad state", b"xy", 60_000)
    assert authenticate_result(authenticate_response(0, 3), 0).session_lifetime_ms == 0


# ------------------------------------------------------------------ before authentication


def test_interests_are_the_sasl_frames_both_ways() -> None:
    both = Interest.REQUEST_FRAME | Interest.RESPONSE_FRAME
    assert SaslInspection.interests(SASL_HANDSHAKE, 1) == both
    assert SaslInspection.interests(SASL_AUTHENTICATE, 2) == both
    assert SaslInspection.interests(METADATA, 12) == Interest.NONE
    assert SaslInspection.interests(API_VERSIONS, 3) == Interest.NONE


def test_serial_until_authenticated() -> None:
    assert Session().filter.serial() is True


def test_request_before_authentication_closes() -> None:
    s = Session()
    entry = s.send(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)
    assert s.host.close_reasons == ["unauthenticated_request"]
    _, side, detail = s.host.closes[0]
    assert side == "client"
    assert detail is not None and "metadata" in detail.lower()
    assert entry.exempt is False


@pytest.mark.parametrize("api_key,version,fields", [
    (API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}),
    (SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}),
])
def test_exchange_requests_are_exempt_before_authentication(api_key: int, version: int,
                                                            fields: dict[str, Any]) -> None:
    s = Session()
    entry = s.send(api_key, version, **fields)
    assert s.host.closes == []
    assert entry.exempt is True


def test_authenticate_after_a_handshake_is_exempt() -> None:
    s = Session()
    s.handshake("PLAIN")
    entry = s.authenticate(sasl_plain("alice"))
    assert entry.exempt is True
    assert s.host.closes == []


def test_authenticate_without_a_handshake_is_out_of_order() -> None:
    s = Session()
    s.authenticate(sasl_plain("alice"))
    assert s.host.close_reasons == ["sasl_out_of_order"]
    assert s.host.closes[0][1] == "client"


def test_handshake_v0_is_refused() -> None:
    s = Session()
    entry = s.send(SASL_HANDSHAKE, 0, mechanism="PLAIN")
    assert s.host.close_reasons == ["sasl_handshake_v0"]
    assert s.host.closes[0][1] == "client"
    assert s.filter.mechanism is None
    assert entry.exempt is True


def test_a_refused_handshake_forgets_the_mechanism() -> None:
    s = Session()
    s.handshake("GSSAPI", error_code=UNSUPPORTED_SASL_MECHANISM)
    assert s.filter.mechanism is None
    s.authenticate(b"token")
    assert s.host.close_reasons == ["sasl_out_of_order"]


def test_malformed_authenticate_request_closes_on_the_client_side() -> None:
    s = Session()
    s.handshake("PLAIN")
    frame = kio_request(SASL_AUTHENTICATE, 2, 5, auth_bytes=sasl_plain("alice"))[:-4]  # truncated
    entry = InFlight(SASL_AUTHENTICATE, 2, 5, "client-1", len(frame), True)
    s.filter.request_frame(entry, frame, True)
    assert s.host.close_reasons == ["malformed_frame"]
    assert s.host.closes[0][1] == "client"


def test_malformed_authenticate_response_closes_on_the_upstream_side() -> None:
    s = Session()
    s.handshake("PLAIN")
    entry = s.authenticate(sasl_plain("alice"))
    s.filter.response_frame(entry, authenticate_response(2, entry.correlation_id)[:-3])
    assert s.host.close_reasons == ["malformed_frame"]
    assert s.host.closes[0][1] == "upstream"
    assert s.user == "ANONYMOUS"


# ------------------------------------------------------------------ PLAIN


def test_plain_success_sets_the_authcid(log: RecordingLog) -> None:
    s = Session()
    s.handshake("PLAIN")
    entry = s.authenticate(sasl_plain("alice"))
    assert s.user == "ANONYMOUS"  # not before the broker's verdict
    s.answer(entry, lifetime_ms=3_600_000)
    assert s.user == "alice"
    assert s.host.closes == []
    assert s.filter.authenticated is True
    (event,) = [e for e in log.events if e[1] == "client_authenticated"]
    assert event[2]["principal"] == "alice"
    assert event[2]["mechanism"] == "PLAIN"
    assert event[2]["session_lifetime_ms"] == 3_600_000


def test_plain_failure_leaves_anonymous_and_logs(log: RecordingLog) -> None:
    s = Session()
    s.handshake("PLAIN")
    entry = s.authenticate(sasl_plain("mallory"))
    s.answer(entry, SASL_AUTHENTICATION_FAILED, error_message="Authentication failed")
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []
    assert s.filter.authenticated is False
    assert s.filter.mechanism is None  # a new handshake is needed
    (event,) = [e for e in log.events if e[1] == "sasl_authentication_failed"]
    assert event[2]["error_code"] == SASL_AUTHENTICATION_FAILED
    assert event[2]["mechanism"] == "PLAIN"
    assert event[2]["error_message"] == "Authentication failed"
    # still unauthenticated: other requests close
    s.send(METADATA, 12, topics=None, allow_auto_topic_creation=False,
           include_topic_authorized_operations=False)
    assert s.host.close_reasons == ["unauthenticated_request"]


def test_plain_failure_then_success_as_someone_else() -> None:
    s = Session()
    s.login("PLAIN", sasl_plain("mallory"), SASL_AUTHENTICATION_FAILED)
    s.login("PLAIN", sasl_plain("alice"))
    assert s.user == "alice"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_plain_every_authenticate_version(version: int) -> None:
    s = Session()
    s.handshake("PLAIN")
    entry = s.authenticate(sasl_plain("alice"), version=version)
    s.answer(entry)
    assert s.user == "alice"


def test_unreadable_plain_accepted_by_the_broker_closes() -> None:
    s = Session()
    s.login("PLAIN", b"no separators")
    assert s.host.close_reasons == ["malformed_plain"]
    assert s.host.closes[0][1] == "client"
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []


def test_unreadable_plain_refused_by_the_broker_does_not_close() -> None:
    s = Session()
    s.login("PLAIN", b"no separators", SASL_AUTHENTICATION_FAILED)
    assert s.host.closes == []
    s.login("PLAIN", sasl_plain("alice"))  # the next handshake starts afresh
    assert s.host.closes == []
    assert s.user == "alice"


# ------------------------------------------------------------------ after authentication


def test_authentication_retires_request_and_serial() -> None:
    s = Session()
    s.login("PLAIN", sasl_plain("alice"))
    assert s.host.retired == [(s.filter, ("request", "serial"))]


def test_reauthentication_as_another_user_changes_the_principal(log: RecordingLog) -> None:
    s = Session()
    s.login("PLAIN", sasl_plain("alice"))
    s.login("PLAIN", sasl_plain("bob"))
    assert s.user == "bob"
    assert len(s.host.retired) == 1  # retired once
    (event,) = [e for e in log.events if e[1] == "principal_changed"]
    assert event[0] == "warning"
    assert (event[2]["previous"], event[2]["principal"]) == ("alice", "bob")


def test_reauthentication_as_the_same_user(log: RecordingLog) -> None:
    s = Session()
    s.login("PLAIN", sasl_plain("alice"))
    s.login("PLAIN", sasl_plain("alice"))
    assert s.user == "alice"
    assert "principal_changed" not in log.names()
    assert log.names().count("client_reauthenticated") == 1
    assert log.names().count("client_authenticated") == 1


def test_failed_reauthentication_keeps_the_principal() -> None:
    s = Session()
    s.login("PLAIN", sasl_plain("alice"))
    s.login("PLAIN", sasl_plain("bob"), SASL_AUTHENTICATION_FAILED)
    assert s.user == "alice"
    assert s.host.closes == []


def test_other_response_frames_are_ignored() -> None:
    s = Session()
    s.handshake("PLAIN")
    auth = s.authenticate(sasl_plain("alice"))
    versions = InFlight(API_VERSIONS, 0, 99, "client-1", 20, True)
    # an ApiVersions response with error 0: not the verdict of the exchange under way
    s.filter.response_frame(versions, encode_response(API_VERSIONS, 0, 99, error_code=0,
                                                      api_keys=())[4:])
    s.filter.response_frame(InFlight(METADATA, 12, 100, "c", 20, True), b"\xff" * 3)
    assert s.host.closes == []
    assert s.user == "ANONYMOUS"
    assert s.filter.mechanism == "PLAIN"
    s.answer(auth)
    assert s.user == "alice"


def test_other_request_frames_are_not_touched() -> None:
    s = Session()
    entry = InFlight(PRODUCE, 9, 1, "c", 10, True)
    assert s.filter.request_frame(entry, b"\x00" * 10, True) is None
    assert entry.exempt is False
    assert s.host.closes == []


# ------------------------------------------------------------------ SCRAM


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_principal_only_after_the_second_response(mechanism: str) -> None:
    s = Session()
    s.handshake(mechanism)
    first = s.authenticate(b"n,,n=bob,r=fyko+d2lbbFgONRv9qkxdawL")
    s.answer(first, auth_bytes=b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,"
                               b"i=4096")  # server-first: not the verdict
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []
    final = s.authenticate(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=proof")
    assert s.user == "ANONYMOUS"
    s.answer(final, auth_bytes=b"v=signature")
    assert s.user == "bob"
    assert s.host.retired == [(s.filter, ("request", "serial"))]


def test_scram_failure_at_the_final_message() -> None:
    s = Session()
    s.handshake("SCRAM-SHA-256")
    first = s.authenticate(b"n,,n=bob,r=abc")
    s.answer(first, auth_bytes=b"r=abcdef,s=c2FsdA==,i=4096")
    final = s.authenticate(b"c=biws,r=abcdef,p=wrong")
    s.answer(final, SASL_AUTHENTICATION_FAILED)
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []


def test_scram_escaped_username() -> None:
    s = Session()
    s.handshake("SCRAM-SHA-512")
    first = s.authenticate(b"n,,n=ops=2Cteam=3Dblue,r=abc")
    s.answer(first, auth_bytes=b"r=abcdef,s=c2FsdA==,i=4096")
    s.answer(s.authenticate(b"c=biws,r=abcdef,p=p"), auth_bytes=b"v=v")
    assert s.user == "ops,team=blue"


def test_scram_delegation_token_gives_the_fallback() -> None:
    s = Session(SaslSettings("token-owner-unknown", "sub", None))
    s.handshake("SCRAM-SHA-256")
    first = s.authenticate(b"n,,n=tokenid,r=abc,tokenauth=true")
    s.answer(first, auth_bytes=b"r=abcdef,s=c2FsdA==,i=4096")
    s.answer(s.authenticate(b"c=biws,r=abcdef,p=p"), auth_bytes=b"v=v")
    assert s.user == "token-owner-unknown"


# ------------------------------------------------------------------ OAUTHBEARER


def test_oauthbearer_unsigned_token_sub() -> None:
    s = Session()
    s.login("OAUTHBEARER", oauthbearer(unsigned_jwt({"sub": "carol"})))
    assert s.user == "carol"
    assert s.host.closes == []


def test_oauthbearer_principal_claim() -> None:
    s = Session(SaslSettings("ANONYMOUS", "client_id", None))
    s.login("OAUTHBEARER", oauthbearer(unsigned_jwt({"sub": "carol", "client_id": "svc-42"})))
    assert s.user == "svc-42"


def test_oauthbearer_error_challenge_is_not_the_verdict() -> None:
    s = Session()
    s.handshake("OAUTHBEARER")
    entry = s.authenticate(oauthbearer(unsigned_jwt({"sub": "carol"})))
    # RFC 7628 3.2.2: the server's error JSON comes with error 0; the failure follows
    s.answer(entry, auth_bytes=b'{"status":"invalid_token"}')
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []
    s.answer(s.authenticate(b"\x01"), SASL_AUTHENTICATION_FAILED)
    assert s.user == "ANONYMOUS"


@pytest.fixture(scope="module")
def signing_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_oauthbearer_verified_token_with_jwks(signing_key: ec.EllipticCurvePrivateKey) -> None:
    s = Session(SaslSettings("ANONYMOUS", "sub", jwks_of(signing_key)))
    token = es256_jwt(signing_key, {"sub": "dave", "exp": time.time() + 3600})
    s.login("OAUTHBEARER", oauthbearer(token))
    assert s.user == "dave"
    assert s.host.closes == []


@pytest.mark.parametrize("case", ["unsigned", "other-key", "expired"])
def test_oauthbearer_token_failing_verification_closes_on_success(
        signing_key: ec.EllipticCurvePrivateKey, case: str) -> None:
    s = Session(SaslSettings("ANONYMOUS", "sub", jwks_of(signing_key)))
    if case == "unsigned":
        token = unsigned_jwt({"sub": "eve", "exp": time.time() + 3600})
    elif case == "other-key":
        token = es256_jwt(ec.generate_private_key(ec.SECP256R1()),
                          {"sub": "eve", "exp": time.time() + 3600})
    else:
        token = es256_jwt(signing_key, {"sub": "eve", "exp": time.time() - 3600})
    s.login("OAUTHBEARER", oauthbearer(token))
    assert s.host.close_reasons == ["invalid_token"]
    _, side, detail = s.host.closes[0]
    assert side == "client"
    assert detail is not None and "OAUTHBEARER" in detail
    assert s.user == "ANONYMOUS"
    assert s.host.retired == []
    assert s.filter.authenticated is False


def test_oauthbearer_token_failing_verification_refused_by_the_broker(
        signing_key: ec.EllipticCurvePrivateKey) -> None:
    s = Session(SaslSettings("ANONYMOUS", "sub", jwks_of(signing_key)))
    s.login("OAUTHBEARER", oauthbearer(unsigned_jwt({"sub": "eve"})),
            SASL_AUTHENTICATION_FAILED)
    assert s.host.closes == []
    assert s.user == "ANONYMOUS"


# ------------------------------------------------------------------ other mechanisms


def test_unknown_mechanism_gives_the_fallback_principal() -> None:
    s = Session(SaslSettings("kerberos-client", "sub", None))
    s.login("GSSAPI", b"\x60\x82opaque-kerberos-token")
    assert s.user == "kerberos-client"
    assert s.host.retired == [(s.filter, ("request", "serial"))]


def test_unknown_mechanism_with_several_rounds_is_not_closed() -> None:
    """GSSAPI answers each intermediate round with error 0 and a challenge: every round goes
    through, the principal is the fallback from the first success on."""
    s = Session(SaslSettings("kerberos-client", "sub", None))
    s.handshake("GSSAPI")
    s.answer(s.authenticate(b"AP-REQ"), auth_bytes=b"AP-REP")  # a challenge, error 0
    s.answer(s.authenticate(b""), auth_bytes=b"wrapped security layer")
    s.answer(s.authenticate(b"wrapped reply"))
    assert s.host.closes == []
    assert s.user == "kerberos-client"


def test_unknown_mechanism_failure_keeps_anonymous() -> None:
    s = Session(SaslSettings("kerberos-client", "sub", None))
    s.login("GSSAPI", b"token", SASL_AUTHENTICATION_FAILED)
    assert s.user == "ANONYMOUS"


# ------------------------------------------------------------------ FilterChain.retire


class Other(Filter):
    def request(self, entry: InFlight) -> None:
        pass

    def serial(self) -> bool:
        return False

    def response_frame(self, entry: InFlight, frame: bytes | memoryview) -> None:
        pass


def hooks(chain: FilterChain, name: str) -> list[Any]:
    """The bound methods the chain calls for hook ``name``."""
    return list(getattr(chain, name))


def test_retire_removes_only_the_filters_hooks() -> None:
    host = fake_host()
    sasl = SaslInspection(host, SaslSettings("ANONYMOUS", "sub", None))  # type: ignore[arg-type]
    before, after = Other(), Other()
    chain = FilterChain([before, sasl, after])
    assert hooks(chain, "request") == [before.request, sasl.request, after.request]
    chain.retire(sasl, ("request", "serial"))
    assert hooks(chain, "request") == [before.request, after.request]
    assert hooks(chain, "serial") == [before.serial, after.serial]
    # hooks not retired still reach it (re-authentication)
    assert hooks(chain, "request_frame") == [sasl.request_frame]
    assert hooks(chain, "response_frame") == [before.response_frame, sasl.response_frame,
                                              after.response_frame]


def test_retire_one_instance_keeps_another_of_the_same_class() -> None:
    one, two = Other(), Other()
    chain = FilterChain([one, two])
    chain.retire(one, ("request",))
    assert hooks(chain, "request") == [two.request]
    assert hooks(chain, "serial") == [one.serial, two.serial]
    chain.retire(two, ("request",))
    assert hooks(chain, "request") == []


def test_authentication_takes_the_filter_off_the_request_path() -> None:
    chain_host = fake_host()
    sasl = SaslInspection(chain_host, SaslSettings("ANONYMOUS", "sub", None))  # type: ignore[arg-type]
    chain = FilterChain([sasl])
    chain_host.chain = chain
    assert hooks(chain, "request") == [sasl.request]
    assert hooks(chain, "serial") == [sasl.serial]
    entry = InFlight(SASL_HANDSHAKE, 1, 1, "c", 0, True)
    for hook in chain.request:
        hook(entry)
    for frame_hook in chain.request_frame:
        frame_hook(entry, kio_request(SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"), True)
    for response_hook in chain.response_frame:
        response_hook(entry, handshake_response(1, 1))
    auth = InFlight(SASL_AUTHENTICATE, 2, 2, "c", 0, True)
    for frame_hook in chain.request_frame:
        frame_hook(auth, kio_request(SASL_AUTHENTICATE, 2, 2, auth_bytes=sasl_plain("alice")), True)
    for response_hook in chain.response_frame:
        response_hook(auth, authenticate_response(2, 2))
    assert chain_host.client.user == "alice"
    assert hooks(chain, "request") == [] and hooks(chain, "serial") == []
    assert hooks(chain, "request_frame") == [sasl.request_frame]
    assert hooks(chain, "response_frame") == [sasl.response_frame]
