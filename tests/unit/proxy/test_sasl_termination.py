"""The proxy answering SASL itself (``proxy/filters/sasl_termination.py``,
``sasl.mode: terminate``).

``SaslTermination.intercept`` driven with real request frames and a fake filter host:
SaslHandshake and SaslAuthenticate answered as Kafka's authenticator answers them (PLAIN,
SCRAM-SHA-256/512), every way the exchange ends. A real connection with the filter
(``testkit.connection``), the client's bytes in and what reaches the broker and the client
out: ApiVersions sent on (the next frame waits for its response), what follows the exchange
read as requests, a request of another API closing the connection, and the same result
whatever the split of the byte stream."""

from __future__ import annotations

import asyncio
import base64
import datetime
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import FrameTooLarge, MalformedFrame, NegativeFrameSize
from kafka_quota_proxy.protocol.headers import parse_response_header
from kafka_quota_proxy.protocol.sasl_frames import (
    API_VERSIONS,
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    UNSUPPORTED_SASL_MECHANISM,
    AuthenticateResult,
    authenticate_result,
)
from kafka_quota_proxy.proxy.filters import sasl_termination as sasl_server_module
from kafka_quota_proxy.proxy.filters.base import Filter
from kafka_quota_proxy.proxy.filters.sasl_termination import (
    Intercepted,
    SaslServerSettings,
    SaslTermination,
)
from kafka_quota_proxy.security.credentials import Credentials, add_user
from kafka_quota_proxy.security.sasl import SaslError
from kafka_quota_proxy.security.scram import ScramClient, parse_credential
from testkit.connection import DrivenConnection
from testkit.filter_host import FakeFilterHost, RecordingLog
from testkit.frames import (
    kio_decode,
    kio_request,
    response_class,
    response_frame,
    sasl_plain,
    split,
)

METADATA = 3
ALL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
RETIRED_HOOKS = ("request", "serial", "headroom", "response_done")
MAX_FRAME = 64 * 1024

CREDENTIALS = Credentials.parse(
    add_user(add_user("", "alice", "alice-pw", 4096), "bob", "bob-pw", 4096))


# ------------------------------------------------------------------ frames


def sized(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame


def api_versions(cid: int, version: int = 3) -> bytes:
    return sized(kio_request(API_VERSIONS, version, cid, client_software_name="test",
                         client_software_version="1.0"))


def handshake(cid: int, mechanism: str, version: int = 1) -> bytes:
    return sized(kio_request(SASL_HANDSHAKE, version, cid, mechanism=mechanism))


def authenticate(cid: int, auth: bytes, version: int = 2) -> bytes:
    return sized(kio_request(SASL_AUTHENTICATE, version, cid, auth_bytes=auth))


def metadata(cid: int) -> bytes:
    return sized(kio_request(METADATA, 12, cid, topics=None, allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False))


def api_versions_answer(cid: int, version: int = 3) -> bytes:
    """The broker's answer to ApiVersions (its body opaque: the proxy passes it on)."""
    return response_frame(API_VERSIONS, version, cid, b"\x00\x00\x00")


def unsized(answer: bytes) -> bytes:
    """The answer without its size prefix, after checking that prefix."""
    assert int.from_bytes(answer[:4], "big") == len(answer) - 4
    return answer[4:]


def correlation_of(answer: bytes) -> int:
    return int.from_bytes(unsized(answer)[:4], "big")


def handshake_answer(answer: bytes, version: int = 1) -> tuple[int, list[str]]:
    """(error code, mechanisms) of a SaslHandshake answer."""
    frame = unsized(answer)
    header = parse_response_header(frame, 0, len(frame),
                                   apis.response_header_version(SASL_HANDSHAKE, version))
    body = kio_decode(response_class(SASL_HANDSHAKE, version), frame[header.size:])
    return int(body.error_code), list(body.mechanisms)


def authenticate_answer(answer: bytes, version: int = 2) -> AuthenticateResult:
    return authenticate_result(unsized(answer), version)


def authenticate_body(answer: bytes, version: int) -> Any:
    """The kio entity of a SaslAuthenticate answer (to see which fields it has)."""
    frame = unsized(answer)
    header = parse_response_header(frame, 0, len(frame),
                                   apis.response_header_version(SASL_AUTHENTICATE, version))
    return kio_decode(response_class(SASL_AUTHENTICATE, version), frame[header.size:])


# ------------------------------------------------------------------ a fake connection


def make(mechanisms: tuple[str, ...] = ALL, credentials: Credentials = CREDENTIALS,
         max_frame_bytes: int = MAX_FRAME) -> tuple[SaslTermination, FakeFilterHost]:
    host = FakeFilterHost(conn_id=7, listener="bootstrap", scope=-1, peer="192.0.2.10:50000")
    f = SaslTermination(host, SaslServerSettings(mechanisms, credentials,
                                                 max_frame_bytes))
    return f, host


def entry_of(frame: bytes) -> InFlight:
    """The ``InFlight`` the request stream would make of a forwarded frame."""
    body = frame[4:]
    return InFlight(int.from_bytes(body[:2], "big"), int.from_bytes(body[2:4], "big"),
                    int.from_bytes(body[4:8], "big"), "client-1", len(frame), True)


def only_answer(result: Intercepted) -> bytes:
    assert result.failed is None, result.failed
    assert result.forward == b""
    (answer,) = result.answers
    return answer


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> RecordingLog:
    recording = RecordingLog()
    monkeypatch.setattr(sasl_server_module, "log", recording)
    return recording


def test_host_satisfies_what_the_filter_uses() -> None:
    f, host = make()
    assert f.client is host.client and f.client.user == "ANONYMOUS"
    assert isinstance(f, Filter) and SaslTermination.intercepts is True
    assert f.serial() is True and f.headroom() is False  # one request at a time
    assert not f.authenticated


# ------------------------------------------------------------------ ApiVersions


async def terminating(mechanisms: tuple[str, ...] = ALL) -> DrivenConnection:
    """A connection of a terminating listener (its filter first, the only one here)."""
    settings = SaslServerSettings(mechanisms, CREDENTIALS, MAX_FRAME)
    return await DrivenConnection.open([partial(SaslTermination, settings=settings)],
                                       listener="bootstrap", scope=-1)


def test_api_versions_goes_on_and_the_next_frame_waits_for_its_response() -> None:
    async def main() -> None:
        h = await terminating()
        f = h.filter(SaslTermination)
        av = api_versions(1)
        h.client_sends(av + handshake(2, "PLAIN"))
        assert h.upstream_got() == av  # with its size prefix, as the client sent it
        assert h.client_got() == b"" and h.closed_reason is None
        (entry,) = h.conn.table.entries()
        assert entry.exempt is True  # not counted in any quota
        assert not h.client.reading  # one request at a time: it waits for the answer
        # the handshake waits, whatever else arrives meanwhile
        auth = authenticate(3, sasl_plain("alice", "alice-pw"))
        h.client_sends(auth[:5])
        await h.settle()
        assert h.upstream_got() == av and h.client_got() == b""
        h.upstream_sends(api_versions_answer(1))
        await h.settle()  # the connection goes on with the held frames
        answered = h.client_got()
        assert answered.startswith(api_versions_answer(1))
        answer = answered[len(api_versions_answer(1)):]
        assert correlation_of(answer) == 2
        assert handshake_answer(answer) == (0, list(ALL))
        assert not f.authenticated and h.client.reading and not h.conn.table
        h.client_sends(auth[5:])  # the held start of the frame with the rest of it
        verdict = authenticate_answer(h.client_got()[len(answered):])
        assert verdict.error_code == 0 and f.authenticated
        assert h.conn.client.user == "alice" and h.upstream_got() == av
        assert h.closed_reason is None

    asyncio.run(main())


def test_api_versions_response_without_held_bytes_does_not_resume() -> None:
    f, host = make()
    result = f.intercept(api_versions(1, version=0))
    assert result.forward == api_versions(1, version=0)
    f.response_done(entry_of(result.forward))
    assert host.resumed == 0
    # later bytes are read as usual
    (answer,) = f.intercept(handshake(2, "SCRAM-SHA-256")).answers
    assert handshake_answer(answer)[0] == 0


def test_answers_before_api_versions_come_with_it() -> None:
    f, _ = make()
    av = api_versions(2)
    result = f.intercept(handshake(1, "PLAIN") + av + handshake(3, "PLAIN"))
    assert result.forward == av
    (answer,) = result.answers
    assert correlation_of(answer) == 1


# ------------------------------------------------------------------ SaslHandshake


@pytest.mark.parametrize("mechanism", ALL)
def test_handshake_offered_mechanism_answers_0_with_the_list(mechanism: str) -> None:
    f, host = make()
    answer = only_answer(f.intercept(handshake(41, mechanism)))
    assert correlation_of(answer) == 41
    assert handshake_answer(answer) == (0, list(ALL))
    assert not f.authenticated and host.retired == []


def test_handshake_lists_the_configured_mechanisms_in_order() -> None:
    f, _ = make(mechanisms=("SCRAM-SHA-512", "PLAIN"))
    answer = only_answer(f.intercept(handshake(1, "PLAIN")))
    assert handshake_answer(answer) == (0, ["SCRAM-SHA-512", "PLAIN"])


@pytest.mark.parametrize("mechanism", ["PLAIN", "GSSAPI", "OAUTHBEARER", "scram-sha-512"])
def test_handshake_unoffered_mechanism_answers_33_and_fails(mechanism: str) -> None:
    f, host = make(mechanisms=("SCRAM-SHA-512",))
    result = f.intercept(handshake(5, mechanism) + authenticate(6, sasl_plain("alice", "alice-pw")))
    (answer,) = result.answers
    assert correlation_of(answer) == 5
    assert handshake_answer(answer) == (UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-512"])
    assert result.failed is not None
    assert result.failed.reason == "sasl_mechanism_unsupported"
    assert mechanism in str(result.failed)
    assert result.forward == b""
    assert not f.authenticated and host.client.user == "ANONYMOUS"


def test_handshake_v0_is_not_offered() -> None:
    f, _ = make()
    result = f.intercept(handshake(1, "PLAIN", version=0))
    assert result.failed is not None and result.failed.reason == "unsupported_version"
    assert result.answers == ()


# ------------------------------------------------------------------ PLAIN


def test_plain_right_password_authenticates_and_retires(log: RecordingLog) -> None:
    f, host = make()
    after = metadata(3) + api_versions(4)
    result = f.intercept(handshake(1, "PLAIN") + authenticate(2, sasl_plain("alice", "alice-pw"))
                         + after)
    assert result.failed is None and result.forward == b""
    shake, auth = result.answers
    assert handshake_answer(shake)[0] == 0
    assert correlation_of(auth) == 2
    verdict = authenticate_answer(auth)
    assert (verdict.error_code, verdict.error_message, verdict.auth_bytes,
            verdict.session_lifetime_ms) == (0, None, b"", 0)
    assert f.authenticated
    assert host.client.user == "alice"
    assert host.retired == [(f, RETIRED_HOOKS)]
    assert f.rest == after  # the request stream reads on from here
    assert f.rest == b""  # handed over once
    assert "client_authenticated" in log.names()
    (fields,) = [fl for _, name, fl in log.events if name == "client_authenticated"]
    assert fields["principal"] == "alice" and fields["mechanism"] == "PLAIN"


def test_plain_with_matching_authzid() -> None:
    f, host = make()
    f.intercept(handshake(1, "PLAIN"))
    verdict = authenticate_answer(only_answer(f.intercept(authenticate(2, b"bob\0bob\0bob-pw"))))
    assert verdict.error_code == 0 and host.client.user == "bob"


def test_no_bytes_after_the_exchange_leave_no_rest() -> None:
    f, _ = make()
    f.intercept(handshake(1, "PLAIN"))
    f.intercept(authenticate(2, sasl_plain("bob", "bob-pw")))
    assert f.authenticated and f.rest == b""


@pytest.mark.parametrize("auth", [
    sasl_plain("alice", "wrong"),
    sasl_plain("alice", "bob-pw"),  # another user's password
    sasl_plain("mallory", "alice-pw"),  # unknown user
    sasl_plain("alice", "alice-pwX"),
    b"alice\0alice-pw",  # one NUL
    b"\0alice\0",  # empty password
    b"carol\0alice\0alice-pw",  # authzid differs
    b"\0alice\0\xff\xfe",  # not UTF-8
])
def test_plain_wrong_credentials_answer_58_and_fail(log: RecordingLog, auth: bytes) -> None:
    f, host = make()
    f.intercept(handshake(1, "PLAIN"))
    result = f.intercept(authenticate(2, auth) + metadata(3))
    (answer,) = result.answers
    assert correlation_of(answer) == 2
    verdict = authenticate_answer(answer)
    assert verdict.error_code == SASL_AUTHENTICATION_FAILED
    assert verdict.error_message is not None and "PLAIN" in verdict.error_message
    assert verdict.auth_bytes == b""
    assert result.failed is not None
    assert result.failed.reason == "sasl_authentication_failed"
    assert not f.authenticated
    assert host.client.user == "ANONYMOUS"
    assert host.retired == []
    assert "sasl_authentication_failed" in log.names()
    assert "client_authenticated" not in log.names()


def test_a_wrong_password_is_neither_logged_nor_in_the_failure(log: RecordingLog) -> None:
    f, _ = make()
    f.intercept(handshake(1, "PLAIN"))
    result = f.intercept(authenticate(2, sasl_plain("alice", "Typo-Of-Alices-Secret")))
    assert result.failed is not None
    assert "Typo-Of-Alices-Secret" not in str(result.failed)
    assert "Typo-Of-Alices-Secret" not in repr(log.events)
    assert b"Typo-Of-Alices-Secret" not in b"".join(result.answers)


def test_plain_checks_the_credentials_live_now() -> None:
    """The listener replaces ``settings.credentials`` when the file changes."""
    f, host = make()
    f.settings.credentials = Credentials.parse(add_user("", "alice", "rotated", 4096))
    f.intercept(handshake(1, "PLAIN"))
    result = f.intercept(authenticate(2, sasl_plain("alice", "alice-pw")))
    assert result.failed is not None
    g, other = make()
    g.settings.credentials = Credentials.parse(add_user("", "alice", "rotated", 4096))
    g.intercept(handshake(1, "PLAIN"))
    assert authenticate_answer(only_answer(
        g.intercept(authenticate(2, sasl_plain("alice", "rotated"))))).error_code == 0
    assert other.client.user == "alice" and host.client.user == "ANONYMOUS"


def test_plain_against_a_weak_stored_credential_fails_cleanly() -> None:
    weak = Credentials({"alice": {"SCRAM-SHA-256": parse_credential(
        "salt=c2FsdA==,stored_key=AAAA,server_key=AAAA,iterations=100")}})
    f, _ = make(credentials=weak)
    f.intercept(handshake(1, "PLAIN"))
    result = f.intercept(authenticate(2, sasl_plain("alice", "x")))
    assert result.failed is not None
    assert result.failed.reason == "sasl_authentication_failed"


# ------------------------------------------------------------------ SCRAM


def scram_exchange(f: SaslTermination, mechanism: str, user: str, password: str,
                   version: int = 2) -> tuple[ScramClient, AuthenticateResult, Intercepted]:
    """Handshake and the first SCRAM round; returns the client, the server-first verdict and
    what the client-final brought."""
    assert handshake_answer(only_answer(f.intercept(handshake(1, mechanism))))[0] == 0
    client = ScramClient(mechanism, user, password, "fyko+d2lbbFgONRv9qkxdawL")
    first = only_answer(f.intercept(authenticate(2, client.first(), version)))
    assert correlation_of(first) == 2
    server_first = authenticate_answer(first, version)
    assert server_first.error_code == 0
    assert not f.authenticated
    client_final = client.final(server_first.auth_bytes)
    return client, server_first, f.intercept(authenticate(3, client_final, version))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_scram_full_exchange(log: RecordingLog, mechanism: str) -> None:
    f, host = make()
    client, server_first, result = scram_exchange(f, mechanism, "bob", "bob-pw")
    assert server_first.auth_bytes.startswith(b"r=fyko+d2lbbFgONRv9qkxdawL")
    stored = CREDENTIALS.scram(mechanism, "bob")
    assert stored is not None
    assert server_first.auth_bytes.endswith(
        b",s=" + base64.b64encode(stored.salt) + b",i=4096")
    answer = only_answer(result)
    assert correlation_of(answer) == 3
    verdict = authenticate_answer(answer)
    assert verdict.error_code == 0 and verdict.session_lifetime_ms == 0
    client.verify(verdict.auth_bytes)  # the server knew bob's credential
    assert f.authenticated
    assert host.client.user == "bob"
    assert host.retired == [(f, RETIRED_HOOKS)]
    assert [fl["mechanism"] for _, name, fl in log.events
            if name == "client_authenticated"] == [mechanism]


def test_scram_server_nonce_differs_per_connection() -> None:
    nonces = set()
    for _ in range(2):
        f, _host = make()
        f.intercept(handshake(1, "SCRAM-SHA-512"))
        client = ScramClient("SCRAM-SHA-512", "alice", "alice-pw", "clientnonce")
        verdict = authenticate_answer(only_answer(f.intercept(authenticate(2, client.first()))))
        nonces.add(verdict.auth_bytes.split(b",")[0])
    assert len(nonces) == 2


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_scram_wrong_password_fails_at_the_final_step(mechanism: str) -> None:
    f, host = make()
    client, _, result = scram_exchange(f, mechanism, "alice", "not-alices")
    (answer,) = result.answers
    assert correlation_of(answer) == 3
    verdict = authenticate_answer(answer)
    assert verdict.error_code == SASL_AUTHENTICATION_FAILED
    assert verdict.error_message is not None and mechanism in verdict.error_message
    assert verdict.auth_bytes == b""  # no server signature
    with pytest.raises(SaslError):
        client.verify(verdict.auth_bytes)
    assert result.failed is not None and result.failed.reason == "sasl_authentication_failed"
    assert not f.authenticated and host.client.user == "ANONYMOUS" and host.retired == []


def test_scram_unknown_user_fails_at_the_first_step() -> None:
    f, host = make()
    f.intercept(handshake(1, "SCRAM-SHA-512"))
    client = ScramClient("SCRAM-SHA-512", "mallory", "x", "nonce")
    result = f.intercept(authenticate(2, client.first()))
    (answer,) = result.answers
    assert authenticate_answer(answer).error_code == SASL_AUTHENTICATION_FAILED
    assert result.failed is not None and result.failed.reason == "sasl_authentication_failed"
    assert host.client.user == "ANONYMOUS"


def test_scram_malformed_first_message_fails() -> None:
    f, _ = make()
    f.intercept(handshake(1, "SCRAM-SHA-256"))
    result = f.intercept(authenticate(2, b"not a scram message"))
    (answer,) = result.answers
    assert authenticate_answer(answer).error_code == SASL_AUTHENTICATION_FAILED
    assert result.failed is not None and result.failed.reason == "sasl_authentication_failed"


def test_scram_user_without_that_mechanism_fails() -> None:
    both = Credentials.parse(add_user("", "dave", "d", 4096))
    held = {"dave": {"SCRAM-SHA-256": both.users["dave"]["SCRAM-SHA-256"]}}
    f, _ = make(credentials=Credentials(held))
    _, _, ok = scram_exchange(f, "SCRAM-SHA-256", "dave", "d")
    assert ok.failed is None and f.authenticated
    g, _ = make(credentials=Credentials(held))
    g.intercept(handshake(1, "SCRAM-SHA-512"))
    client = ScramClient("SCRAM-SHA-512", "dave", "d", "nonce")
    result = g.intercept(authenticate(2, client.first()))
    assert result.failed is not None and result.failed.reason == "sasl_authentication_failed"


# ------------------------------------------------------------------ out of order, other APIs


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_before_handshake_answers_34(version: int) -> None:
    f, host = make()
    result = f.intercept(authenticate(9, sasl_plain("alice", "alice-pw"), version))
    (answer,) = result.answers
    assert correlation_of(answer) == 9
    verdict = authenticate_answer(answer, version)
    assert verdict.error_code == ILLEGAL_SASL_STATE
    assert verdict.error_message is not None and "SaslHandshake" in verdict.error_message
    assert result.failed is not None and result.failed.reason == "sasl_out_of_order"
    assert not f.authenticated and host.client.user == "ANONYMOUS"


@pytest.mark.parametrize("before", ["nothing", "handshake", "api_versions"])
def test_other_api_before_authentication_closes_without_answer(before: str) -> None:
    async def main() -> None:
        h = await terminating()
        f = h.filter(SaslTermination)
        if before == "handshake":
            h.client_sends(handshake(1, "PLAIN"))
            assert handshake_answer(h.client_got())[0] == 0
        elif before == "api_versions":
            h.client_sends(api_versions(1))
            h.upstream_sends(api_versions_answer(1))
            await h.settle()
            assert h.client_got() == api_versions_answer(1)
        forwarded, answered = h.upstream_got(), h.client_got()
        with capture_logs() as logs:
            h.client_sends(metadata(2) + handshake(3, "PLAIN"))
            await h.settle()
        assert h.client_got() == answered and h.upstream_got() == forwarded  # nothing more
        assert h.closed_reason == "unauthenticated_request" and h.client.closing
        [closed] = [e for e in logs if e["event"] == "connection_closed"]
        assert "metadata" in closed["detail"].lower()
        assert not f.authenticated and h.conn.client.user == "ANONYMOUS"
        assert h.conn.chain.serial == (f.serial,)  # not retired

    asyncio.run(main())


def test_answers_before_a_refused_request_still_go() -> None:
    f, _ = make()
    result = f.intercept(handshake(1, "PLAIN") + metadata(2))
    (answer,) = result.answers
    assert handshake_answer(answer)[0] == 0
    assert result.failed is not None and result.failed.reason == "unauthenticated_request"


# ------------------------------------------------------------------ framing


def test_frame_larger_than_max_raises_before_it_arrives() -> None:
    f, _ = make(max_frame_bytes=100)
    big = handshake(1, "P" * 200)
    with pytest.raises(FrameTooLarge):
        f.intercept(big[:4])  # the size alone is enough


def test_frame_of_exactly_max_is_read() -> None:
    frame = handshake(1, "PLAIN")
    f, _ = make(max_frame_bytes=len(frame) - 4)
    assert handshake_answer(only_answer(f.intercept(frame)))[0] == 0
    g, _ = make(max_frame_bytes=len(frame) - 5)
    with pytest.raises(FrameTooLarge):
        g.intercept(frame)


def test_negative_size_and_unreadable_header_raise() -> None:
    f, _ = make()
    with pytest.raises(NegativeFrameSize):
        f.intercept((-1).to_bytes(4, "big", signed=True))
    g, _ = make()
    with pytest.raises(MalformedFrame):
        g.intercept(sized(b"\x00\x11"))  # two bytes: no header


def test_partial_frame_waits() -> None:
    f, _ = make()
    frame = handshake(7, "PLAIN")
    assert f.intercept(frame[:3]) == Intercepted()
    assert f.intercept(frame[3:-1]) == Intercepted()
    assert correlation_of(only_answer(f.intercept(frame[-1:]))) == 7


Outcome = tuple[bytes, bytes, str, str | None]


async def drive(chunks: list[bytes], respond_late: bool) -> Outcome:
    """The client's reads ``chunks`` through a terminating connection, the broker answering
    ApiVersions once it has it, at once or only before the client's next read (or after the
    last). Returns (what reached the broker, what the client got, the user, the reason the
    connection closed)."""
    h = await terminating()
    answered = False

    async def respond() -> None:
        nonlocal answered
        if not answered and h.upstream_got().startswith(api_versions(1)):
            answered = True
            h.upstream_sends(api_versions_answer(1))
            await h.settle()

    for chunk in chunks:
        if respond_late:
            await respond()
        h.client_sends(chunk)
        if not respond_late:
            await respond()
    await respond()
    return h.upstream_got(), h.client_got(), h.conn.client.user, h.closed_reason


def drive_all(chunks: list[bytes], respond_late: bool) -> Outcome:
    return asyncio.run(drive(chunks, respond_late))


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int, bool]:
    version = draw(st.integers(0, 2))
    password = draw(st.sampled_from(["alice-pw", "wrong"]))
    data = (api_versions(1) + handshake(2, "PLAIN")
            + authenticate(3, sasl_plain("alice", password), version) + metadata(4))
    return data, version, password == "alice-pw"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), cuts=st.lists(st.integers(0, 400), max_size=12),
       respond_late=st.booleans())
def test_any_split_gives_the_same_result(stream: tuple[bytes, int, bool], cuts: list[int],
                                         respond_late: bool) -> None:
    data, version, right = stream
    whole = drive_all([data], respond_late=False)
    assert drive_all(split(data, cuts), respond_late) == whole
    forwarded, answers, user, failed = whole
    if right:  # what follows the exchange is read as requests
        assert (forwarded, user, failed) == (api_versions(1) + metadata(4), "alice", None)
    else:
        assert (forwarded, user, failed) == (api_versions(1), "ANONYMOUS",
                                             "sasl_authentication_failed")
    av_answer = api_versions_answer(1)
    assert answers.startswith(av_answer)
    shake_len = len(av_answer) + int.from_bytes(answers[len(av_answer):][:4], "big") + 4
    assert handshake_answer(answers[len(av_answer):shake_len])[0] == 0
    verdict = authenticate_answer(answers[shake_len:], version)
    assert verdict.error_code == (0 if right else SASL_AUTHENTICATION_FAILED)


@pytest.mark.parametrize("password", ["alice-pw", "wrong"])
def test_byte_at_a_time_gives_the_same_result(password: str) -> None:
    data = (api_versions(1) + handshake(2, "PLAIN")
            + authenticate(3, sasl_plain("alice", password)) + metadata(4))
    whole = drive_all([data], respond_late=False)
    one_by_one = [data[i:i + 1] for i in range(len(data))]
    assert drive_all(one_by_one, respond_late=False) == whole
    assert drive_all(one_by_one, respond_late=True) == whole
    assert whole[2] == ("alice" if password == "alice-pw" else "ANONYMOUS")


def test_scram_byte_at_a_time() -> None:
    f, host = make()
    client = ScramClient("SCRAM-SHA-512", "alice", "alice-pw", "nonce-1")
    replies: list[bytes] = []

    def drip(data: bytes) -> None:
        for i in range(len(data)):
            result = f.intercept(data[i:i + 1])
            assert result.failed is None and result.forward == b""
            replies.extend(result.answers)

    drip(handshake(1, "SCRAM-SHA-512"))
    drip(authenticate(2, client.first()))
    assert len(replies) == 2
    drip(authenticate(3, client.final(authenticate_answer(replies[1]).auth_bytes)))
    assert len(replies) == 3
    client.verify(authenticate_answer(replies[2]).auth_bytes)
    assert f.authenticated and host.client.user == "alice"


# ------------------------------------------------------------------ SaslAuthenticate versions


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_versions_plain(version: int) -> None:
    f, host = make()
    f.intercept(handshake(1, "PLAIN"))
    answer = only_answer(f.intercept(authenticate(2, sasl_plain("alice", "alice-pw"), version)))
    body = authenticate_body(answer, version)
    assert int(body.error_code) == 0
    if version == 0:
        assert not hasattr(body, "session_lifetime")
    else:
        assert body.session_lifetime == datetime.timedelta(0)  # sessions do not expire
    assert authenticate_answer(answer, version).session_lifetime_ms == 0
    assert host.client.user == "alice"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_versions_failure(version: int) -> None:
    f, _ = make()
    f.intercept(handshake(1, "PLAIN"))
    result = f.intercept(authenticate(2, sasl_plain("alice", "nope"), version))
    (answer,) = result.answers
    body = authenticate_body(answer, version)
    assert int(body.error_code) == SASL_AUTHENTICATION_FAILED
    assert hasattr(body, "session_lifetime") == (version >= 1)
    assert result.failed is not None


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_versions_scram(version: int) -> None:
    f, host = make()
    client, _, result = scram_exchange(f, "SCRAM-SHA-256", "alice", "alice-pw", version)
    verdict = authenticate_answer(only_answer(result), version)
    client.verify(verdict.auth_bytes)
    assert host.client.user == "alice"


def test_authenticate_v3_is_refused() -> None:
    g, _ = make()
    g.intercept(handshake(1, "PLAIN"))
    frame = bytearray(authenticate(2, sasl_plain("alice", "alice-pw"), version=2))
    frame[6:8] = (3).to_bytes(2, "big")  # claim v3, which the proxy does not offer
    result = g.intercept(bytes(frame))
    assert result.failed is not None and result.failed.reason == "unsupported_version"
    assert not g.authenticated
