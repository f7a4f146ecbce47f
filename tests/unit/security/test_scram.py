"""SCRAM maths, server and client: RFC 7677's exchange byte for byte, round trips, failures."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.security.sasl import SaslError
from kafka_quota_proxy.security.scram import (
    ScramClient,
    ScramCredential,
    ScramServer,
    format_credential,
    make_credential,
    parse_credential,
)

# RFC 7677 section 3: SCRAM-SHA-256, user "user", password "pencil".
RFC7677_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC7677_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _users(mechanism: str, **passwords: str) -> dict[str, ScramCredential]:
    return {u: make_credential(mechanism, p, b"salt-" + u.encode()) for u, p in passwords.items()}


def test_rfc7677_exchange_reproduced_byte_for_byte() -> None:
    credential = make_credential("SCRAM-SHA-256", "pencil", RFC7677_SALT, 4096)
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", RFC7677_CLIENT_NONCE)
    server = ScramServer("SCRAM-SHA-256", {"user": credential}.get, RFC7677_SERVER_NONCE)
    assert client.first() == RFC7677_CLIENT_FIRST
    assert server.first(client.first()) == RFC7677_SERVER_FIRST
    assert server.username == "user"
    assert client.final(RFC7677_SERVER_FIRST) == RFC7677_CLIENT_FINAL
    assert server.final(RFC7677_CLIENT_FINAL) == RFC7677_SERVER_FINAL
    assert server.complete
    client.verify(RFC7677_SERVER_FINAL)


def test_rfc7677_server_accepts_the_rfc_client_messages() -> None:
    credential = make_credential("SCRAM-SHA-256", "pencil", RFC7677_SALT)
    server = ScramServer("SCRAM-SHA-256", lambda u: credential, RFC7677_SERVER_NONCE)
    server.first(RFC7677_CLIENT_FIRST)
    assert server.final(RFC7677_CLIENT_FINAL) == RFC7677_SERVER_FINAL


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_round_trip(mechanism: str) -> None:
    users = _users(mechanism, alice="alice-secret", bob="bob-secret")
    client = ScramClient(mechanism, "alice", "alice-secret", "clientnonce123")
    server = ScramServer(mechanism, users.get, "servernonce456")
    server_first = server.first(client.first())
    server_final = server.final(client.final(server_first))
    client.verify(server_final)
    assert server.complete and server.username == "alice"


def test_sha512_signatures_have_sha512_size() -> None:
    users = _users("SCRAM-SHA-512", alice="pw")
    client = ScramClient("SCRAM-SHA-512", "alice", "pw", "cn")
    server = ScramServer("SCRAM-SHA-512", users.get, "sn")
    final = server.final(client.final(server.first(client.first())))
    assert len(base64.b64decode(final[2:])) == 64
    assert len(users["alice"].stored_key) == len(users["alice"].server_key) == 64


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_fails(mechanism: str) -> None:
    users = _users(mechanism, alice="alice-secret")
    client = ScramClient(mechanism, "alice", "not-her-password", "cn")
    server = ScramServer(mechanism, users.get, "sn")
    client_final = client.final(server.first(client.first()))
    with pytest.raises(SaslError) as e:
        server.final(client_final)
    assert e.value.reason == "authentication_failed"
    assert not server.complete
    with pytest.raises(SaslError) as again:
        server.final(client_final)
    assert again.value.reason == "illegal_sasl_state"


def test_unknown_user_fails_at_first() -> None:
    server = ScramServer("SCRAM-SHA-256", lambda u: None, "sn")
    with pytest.raises(SaslError) as e:
        server.first(b"n,,n=mallory,r=cn")
    assert e.value.reason == "authentication_failed"
    assert server.username == "mallory"


def test_mechanism_mismatch_fails() -> None:
    """A SHA-512 credential offered to a SHA-256 client: the proofs differ."""
    users = _users("SCRAM-SHA-512", alice="pw")
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    server = ScramServer("SCRAM-SHA-256", users.get, "sn")
    client_final = client.final(server.first(client.first()))
    with pytest.raises(SaslError, match="Invalid client credentials"):
        server.final(client_final)


def test_escaped_usernames_round_trip() -> None:
    name = "a,b=c"
    users = {name: make_credential("SCRAM-SHA-256", "pw", b"s")}
    client = ScramClient("SCRAM-SHA-256", name, "pw", "cn")
    assert client.first() == b"n,,n=a=2Cb=3Dc,r=cn"
    server = ScramServer("SCRAM-SHA-256", users.get, "sn")
    client.verify(server.final(client.final(server.first(client.first()))))
    assert server.username == name


def _exchange_first(client_first: bytes, password: str = "pw") -> tuple[ScramServer, bytes]:
    credential = make_credential("SCRAM-SHA-256", password, b"salt")
    server = ScramServer("SCRAM-SHA-256", lambda u: credential, "sn")
    return server, server.first(client_first)


def test_tampered_channel_binding_fails() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    server, server_first = _exchange_first(client.first())
    final = client.final(server_first).replace(b"c=biws", b"c=eSws")  # "y,,"
    with pytest.raises(SaslError, match="channel binding"):
        server.final(final)


def test_tampered_nonce_fails() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    server, server_first = _exchange_first(client.first())
    final = client.final(server_first).replace(b"r=cnsn", b"r=cnsX")
    with pytest.raises(SaslError, match="nonce"):
        server.final(final)


def test_malformed_client_final_fails() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    server, _ = _exchange_first(client.first())
    with pytest.raises(SaslError) as e:
        server.final(b"c=biws,r=cnsn")
    assert e.value.reason == "authentication_failed"


def test_proof_of_wrong_length_fails() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    server, _ = _exchange_first(client.first())
    with pytest.raises(SaslError, match="Invalid client credentials"):
        server.final(b"c=biws,r=cnsn,p=AAAA")


def test_authzid_must_equal_username() -> None:
    server, _ = _exchange_first(b"n,a=alice,n=alice,r=cn")
    with pytest.raises(SaslError) as e:
        _exchange_first(b"n,a=admin,n=alice,r=cn")
    assert e.value.reason == "authentication_failed"
    assert server.username == "alice"


def test_authzid_in_gs2_header_is_bound() -> None:
    """The channel binding c= is the base64 of the whole gs2 header, authzid included."""
    credential = make_credential("SCRAM-SHA-256", "pw", b"salt")
    server = ScramServer("SCRAM-SHA-256", lambda u: credential, "sn")
    server.first(b"n,a=alice,n=alice,r=cn")
    # A client that binds "n,," instead of "n,a=alice," fails.
    with pytest.raises(SaslError, match="channel binding"):
        server.final(b"c=biws,r=cnsn,p=" + base64.b64encode(b"x" * 32))


def test_reserved_mext_and_token_auth_refused() -> None:
    for message in (b"n,,m=x,n=alice,r=cn", b"n,,n=alice,r=cn,tokenauth=true"):
        with pytest.raises(SaslError) as e:
            _exchange_first(message)
        assert e.value.reason == "authentication_failed"


def test_malformed_client_first_and_channel_binding() -> None:
    with pytest.raises(SaslError) as e:
        _exchange_first(b"n,,n=alice")
    assert e.value.reason == "malformed_scram"
    with pytest.raises(SaslError) as e:
        _exchange_first(b"p=tls-unique,,n=alice,r=cn")
    assert e.value.reason == "unsupported_channel_binding"


def test_stored_credential_below_minimum_iterations_fails() -> None:
    weak = ScramCredential(b"s", b"k" * 32, b"k" * 32, 1000)
    server = ScramServer("SCRAM-SHA-256", lambda u: weak, "sn")
    with pytest.raises(SaslError, match="less than the minimum"):
        server.first(b"n,,n=alice,r=cn")


def test_out_of_order_calls() -> None:
    server = ScramServer("SCRAM-SHA-256", lambda u: None, "sn")
    with pytest.raises(SaslError) as e:
        server.final(b"c=biws,r=x,p=AAAA")
    assert e.value.reason == "illegal_sasl_state"
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    with pytest.raises(SaslError) as e:
        client.verify(b"v=AAAA")
    assert e.value.reason == "illegal_sasl_state"


def test_client_checks_server() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", "cn")
    with pytest.raises(SaslError, match="nonce"):
        client.final(b"r=other,s=c2FsdA==,i=4096")
    with pytest.raises(SaslError, match="nonce"):
        client.final(b"r=cn,s=c2FsdA==,i=4096")
    with pytest.raises(SaslError, match="minimum"):
        client.final(b"r=cnsn,s=c2FsdA==,i=4095")
    with pytest.raises(SaslError) as e:
        client.final(b"r=cnsn,s=%%%,i=4096")
    assert e.value.reason == "malformed_scram"
    credential = make_credential("SCRAM-SHA-256", "other", b"salt")
    server = ScramServer("SCRAM-SHA-256", lambda u: credential, "sn")
    client_final = client.final(server.first(client.first()))
    with pytest.raises(SaslError):
        server.final(client_final)
    with pytest.raises(SaslError, match="server error: invalid-proof"):
        client.verify(b"e=invalid-proof")
    with pytest.raises(SaslError, match="does not verify"):
        client.verify(b"v=" + base64.b64encode(b"\x00" * 32))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unsupported SCRAM mechanism"):
        make_credential("SCRAM-SHA-1", "pw", b"salt")
    with pytest.raises(ValueError, match="at least 4096"):
        make_credential("SCRAM-SHA-256", "pw", b"salt", 4095)
    with pytest.raises(ValueError, match="nonce"):
        ScramServer("SCRAM-SHA-256", lambda u: None, "a,b")
    with pytest.raises(ValueError, match="nonce"):
        ScramClient("SCRAM-SHA-256", "u", "p", "")


def test_credential_text_round_trip_kafka_format() -> None:
    c = make_credential("SCRAM-SHA-256", "pencil", RFC7677_SALT, 8192)
    text = format_credential(c)
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=")
    assert text.endswith(",iterations=8192")
    assert parse_credential(text) == c
    reordered = ",".join(reversed(text.split(",")))
    assert parse_credential(reordered) == c


@pytest.mark.parametrize(
    "text",
    [
        "",
        "salt=AA==,stored_key=AA==,server_key=AA==",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096,extra=1",
        "salt=AA==,salt=AA==,server_key=AA==,iterations=4096",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=-1",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=x",
        "salt=!!,stored_key=AA==,server_key=AA==,iterations=4096",
        "salt=,stored_key=AA==,server_key=AA==,iterations=4096",
        "=AA==,stored_key=AA==,server_key=AA==,iterations=4096",
    ],
)
def test_parse_credential_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_credential(text)


@settings(max_examples=25, deadline=None)
@given(
    username=st.text(
        st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20
    ),
    password=st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
)
def test_any_username_and_password_round_trip(username: str, password: str) -> None:
    credential = make_credential("SCRAM-SHA-256", password, b"salt")
    client = ScramClient("SCRAM-SHA-256", username, password, "cn")
    server = ScramServer("SCRAM-SHA-256", {username: credential}.get, "sn")
    client.verify(server.final(client.final(server.first(client.first()))))
    assert server.username == username
