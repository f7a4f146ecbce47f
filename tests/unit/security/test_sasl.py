"""SASL messages the proxy reads: PLAIN, SCRAM client-first, OAUTHBEARER and JWS verification."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.security.sasl import (
    Jwks,
    SaslError,
    identity,
    jwt_claim,
    oauthbearer_token,
    plain_identity,
    scram_client_first,
)

NOW = 1_700_000_000.0


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_json(value: object) -> str:
    return b64url(json.dumps(value).encode())


def unsigned_token(claims: dict[str, Any]) -> str:
    return f"{b64url_json({'alg': 'none'})}.{b64url_json(claims)}."


_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
_EC_SIZES = {"ES256": 32, "ES384": 48, "ES512": 66}


def sign(alg: str, key: Any, claims: dict[str, Any], kid: str | None = "k1") -> str:
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = f"{b64url_json(header)}.{b64url_json(claims)}".encode()
    h = _HASHES[alg[2:]]()
    if alg.startswith("RS"):
        signature = key.sign(signing_input, padding.PKCS1v15(), h)
    elif alg.startswith("PS"):
        pss = padding.PSS(mgf=padding.MGF1(h), salt_length=h.digest_size)
        signature = key.sign(signing_input, pss, h)
    else:
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(h)))
        size = _EC_SIZES[alg]
        signature = r.to_bytes(size, "big") + s.to_bytes(size, "big")
    return f"{signing_input.decode()}.{b64url(signature)}"


def rsa_jwk(key: rsa.RSAPrivateKey, kid: str, **extra: str) -> dict[str, str]:
    numbers = key.public_key().public_numbers()
    n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
    e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
    return {"kty": "RSA", "kid": kid, "n": b64url(n), "e": b64url(e), **extra}


def ec_jwk(key: ec.EllipticCurvePrivateKey, kid: str, **extra: str) -> dict[str, str]:
    crv, size = {
        "secp256r1": ("P-256", 32),
        "secp384r1": ("P-384", 48),
        "secp521r1": ("P-521", 66),
    }[key.curve.name]
    numbers = key.public_key().public_numbers()
    return {
        "kty": "EC",
        "kid": kid,
        "crv": crv,
        "x": b64url(numbers.x.to_bytes(size, "big")),
        "y": b64url(numbers.y.to_bytes(size, "big")),
        **extra,
    }


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_keys() -> dict[str, ec.EllipticCurvePrivateKey]:
    return {
        "ES256": ec.generate_private_key(ec.SECP256R1()),
        "ES384": ec.generate_private_key(ec.SECP384R1()),
        "ES512": ec.generate_private_key(ec.SECP521R1()),
    }


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "iat": NOW - 10, "exp": NOW + 3600, **extra}


def oauth_message(token: str, authzid: str = "", extensions: str = "") -> bytes:
    a = f"a={authzid}" if authzid else ""
    return f"n,{a},\x01auth=Bearer {token}\x01{extensions}\x01".encode()


# --- PLAIN ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (b"\x00alice\x00secret", "alice"),
        (b"alice\x00alice\x00secret", "alice"),
        ("\x00j\u00f6rg\x00p\u00e4ss".encode(), "j\u00f6rg"),
        (b"\x00User:with spaces,and=signs\x00pw", "User:with spaces,and=signs"),
    ],
)
def test_plain_identity(message: bytes, expected: str) -> None:
    assert plain_identity(message) == expected
    assert identity("PLAIN", message) == expected


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"", "malformed_plain"),
        (b"alice", "malformed_plain"),
        (b"\x00alice", "malformed_plain"),
        (b"\x00alice\x00", "malformed_plain"),
        (b"\x00\x00secret", "malformed_plain"),
        (b"\x00alice\x00secret\x00more", "malformed_plain"),
        (b"\x00al\xffice\x00secret", "malformed_plain"),
        (b"admin\x00alice\x00secret", "authzid_mismatch"),
    ],
)
def test_plain_rejects(message: bytes, reason: str) -> None:
    with pytest.raises(SaslError) as e:
        plain_identity(message)
    assert e.value.reason == reason
    assert isinstance(e.value, ValueError)


# --- SCRAM client-first -----------------------------------------------------------------------


def test_scram_client_first_rfc5802_and_rfc7677_examples() -> None:
    first = scram_client_first(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL")  # RFC 5802 section 5
    assert (first.username, first.nonce, first.authzid) == (
        "user",
        "fyko+d2lbbFgONRv9qkxdawL",
        None,
    )
    assert first.gs2_header == "n,,"
    assert first.bare == "n=user,r=fyko+d2lbbFgONRv9qkxdawL"
    assert first.extensions == {}
    first = scram_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")  # RFC 7677 section 3
    assert first.nonce == "rOprNGfwEbeRWgbNEkqO"


def test_scram_client_first_all_parts() -> None:
    first = scram_client_first(b"n,a=a=2Cb,m=ext,n=a=2Cb=3Dc,r=nonce,tokenauth=true,x=1")
    assert first.username == "a,b=c"
    assert first.authzid == "a,b"
    assert first.reserved_mext == "ext"
    assert first.extensions == {"tokenauth": "true", "x": "1"}
    assert first.token_auth
    assert first.gs2_header == "n,a=a=2Cb,"
    assert first.bare == "m=ext,n=a=2Cb=3Dc,r=nonce,tokenauth=true,x=1"
    assert scram_client_first(b"y,,n=u,r=n").gs2_header == "y,,"
    assert scram_client_first("n,,n=j\u00f6rg,r=n".encode()).username == "j\u00f6rg"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"p=tls-unique,,n=user,r=nonce", "unsupported_channel_binding"),
        (b"n,,n=us=2Der,r=nonce", "malformed_scram"),  # =2D is no escape
        (b"n,,n=us=er,r=nonce", "malformed_scram"),
        (b"n,,n=us=3,r=nonce", "malformed_scram"),
        (b"n,,n=,r=nonce", "malformed_scram"),
        (b"n,,n=user", "malformed_scram"),
        (b"n,,n=user,r=", "malformed_scram"),
        (b"n,,n=user,r=non ce", "malformed_scram"),
        (b"n,,r=nonce,n=user", "malformed_scram"),
        (b"x,,n=user,r=nonce", "malformed_scram"),
        (b"n,n=user,r=nonce", "malformed_scram"),
        (b"n,,n=user,r=nonce,", "malformed_scram"),
        (b"n,,n=user,r=nonce,1=2", "malformed_scram"),
        (b"n,,n=user,r=nonce,k=", "malformed_scram"),
        (b"n,,n=user,r=nonce,k=1,k=2", "malformed_scram"),
        (b"n,,n=us\x00er,r=nonce", "malformed_scram"),
        (b"n,,n=\xff,r=nonce", "malformed_scram"),
    ],
)
def test_scram_client_first_rejects(message: bytes, reason: str) -> None:
    with pytest.raises(SaslError) as e:
        scram_client_first(message)
    assert e.value.reason == reason


def test_scram_identity() -> None:
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert identity(mechanism, b"n,,n=alice=2C=3D,r=abc") == "alice,="
        assert identity(mechanism, b"n,a=alice,n=alice,r=abc") == "alice"
        # A delegation token: the broker maps the token id to its owner.
        assert identity(mechanism, b"n,,n=tokenid,r=abc,tokenauth=TRUE") is None
        assert identity(mechanism, b"n,,n=alice,r=abc,tokenauth=false") == "alice"
        with pytest.raises(SaslError) as e:
            identity(mechanism, b"n,a=admin,n=alice,r=abc")
        assert e.value.reason == "authzid_mismatch"


@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30))
def test_scram_username_escapes_round_trip(name: str) -> None:
    escaped = name.replace("=", "=3D").replace(",", "=2C")
    assert scram_client_first(f"n,,n={escaped},r=x".encode()).username == name


# --- OAUTHBEARER ------------------------------------------------------------------------------


def test_oauthbearer_token_and_unsigned_identity() -> None:
    token = unsigned_token(claims())
    assert oauthbearer_token(oauth_message(token)) == token
    assert identity("OAUTHBEARER", oauth_message(token)) == "alice"
    with_ext = oauth_message(
        token, authzid="alice", extensions="traceId=123\x01logicalCluster=lc\x01"
    )
    assert oauthbearer_token(with_ext) == token
    assert identity("OAUTHBEARER", with_ext) == "alice"
    assert (
        identity(
            "OAUTHBEARER", oauth_message(unsigned_token(claims(client_id="app"))), claim="client_id"
        )
        == "app"
    )
    # The scheme is case-insensitive, as Kafka's.
    assert oauthbearer_token(f"n,,\x01auth=bearer {token}\x01\x01".encode()) == token
    # Kafka's client writes its extensions after auth; any order is valid.
    reordered = f"n,,\x01k=v\x01auth=Bearer {token}\x01\x01".encode()
    assert oauthbearer_token(reordered) == token


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"n,,\x01auth=Bearer abc\x01", "malformed_oauthbearer"),  # one final ^A missing
        (b"n,,auth=Bearer abc\x01\x01", "malformed_oauthbearer"),
        (b"n,,\x01k=v\x01\x01", "malformed_oauthbearer"),  # no auth
        (b"n,,\x01auth=Basic abc\x01\x01", "malformed_oauthbearer"),
        (b"n,,\x01auth=Bearer\x01\x01", "malformed_oauthbearer"),
        (b"n,,\x01auth=Bearer a b\x01\x01", "malformed_oauthbearer"),
        (b"n,,\x01auth=Bearer abc\x01auth=Bearer def\x01\x01", "malformed_oauthbearer"),
        (b"p=tls-unique,,\x01auth=Bearer abc\x01\x01", "unsupported_channel_binding"),
        (b"\x01", "malformed_oauthbearer"),
        (b"n,,\x01auth=Bearer \xff\x01\x01", "malformed_oauthbearer"),
    ],
)
def test_oauthbearer_rejects(message: bytes, reason: str) -> None:
    with pytest.raises(SaslError) as e:
        oauthbearer_token(message)
    assert e.value.reason == reason


def test_oauthbearer_authzid_must_match_principal() -> None:
    with pytest.raises(SaslError) as e:
        identity("OAUTHBEARER", oauth_message(unsigned_token(claims()), authzid="admin"))
    assert e.value.reason == "authzid_mismatch"


@pytest.mark.parametrize(
    ("token", "match"),
    [
        ("abc", "has 1 parts"),
        ("a.b.c.d", "has 4 parts"),
        (f"{b64url_json({'alg': 'none'})}.***.", "base64url"),
        (f"{b64url_json({'alg': 'none'})}.{b64url(b'not json')}.", "not JSON"),
        (f"{b64url_json({'alg': 'none'})}.{b64url_json([1])}.", "not a JSON object"),
        (unsigned_token({"exp": 1}), "no 'sub' claim"),
        (unsigned_token({"sub": 42}), "not a string"),
        (unsigned_token({"sub": "  "}), "blank"),
    ],
)
def test_jwt_claim_rejects(token: str, match: str) -> None:
    with pytest.raises(SaslError, match=match) as e:
        jwt_claim(token)
    assert e.value.reason == "invalid_token"


def test_jwt_claim_reads_padded_free_base64url() -> None:
    token = unsigned_token({"sub": "\u00e9\u00e8?>", "exp": 1})
    assert jwt_claim(token) == "\u00e9\u00e8?>"


# --- JWKS verification ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jwks(rsa_key: rsa.RSAPrivateKey, ec_keys: dict[str, ec.EllipticCurvePrivateKey]) -> Jwks:
    keys = [rsa_jwk(rsa_key, "k1")] + [ec_jwk(k, alg) for alg, k in ec_keys.items()]
    keys.append({"kty": "oct", "kid": "hmac", "k": b64url(b"secret")})
    keys.append({**rsa_jwk(rsa_key, "enc"), "use": "enc"})
    return Jwks.from_json(json.dumps({"keys": keys}))


@pytest.mark.parametrize("alg", ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"])
def test_rsa_tokens_verify(alg: str, rsa_key: rsa.RSAPrivateKey, jwks: Jwks) -> None:
    token = sign(alg, rsa_key, claims())
    assert jwks.verify(token, NOW)["sub"] == "alice"
    assert identity("OAUTHBEARER", oauth_message(token), jwks=jwks, now_s=NOW) == "alice"


@pytest.mark.parametrize("alg", ["ES256", "ES384", "ES512"])
def test_ec_tokens_verify(
    alg: str, ec_keys: dict[str, ec.EllipticCurvePrivateKey], jwks: Jwks
) -> None:
    token = sign(alg, ec_keys[alg], claims(), kid=alg)
    assert jwks.verify(token, NOW)["sub"] == "alice"
    assert identity("OAUTHBEARER", oauth_message(token), jwks=jwks, now_s=NOW) == "alice"


def test_single_key_set_needs_no_kid(ec_keys: dict[str, ec.EllipticCurvePrivateKey]) -> None:
    only = Jwks.from_json(json.dumps({"keys": [ec_jwk(ec_keys["ES256"], "only")]}))
    assert only.verify(sign("ES256", ec_keys["ES256"], claims(), kid=None), NOW)["sub"] == "alice"


def test_no_kid_picks_the_one_key_that_fits(
    rsa_key: rsa.RSAPrivateKey, ec_keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    two = Jwks.from_json(
        json.dumps({"keys": [rsa_jwk(rsa_key, "r"), ec_jwk(ec_keys["ES256"], "e")]})
    )
    assert two.verify(sign("RS256", rsa_key, claims(), kid=None), NOW)["sub"] == "alice"
    assert two.verify(sign("ES256", ec_keys["ES256"], claims(), kid=None), NOW)["sub"] == "alice"


def test_no_kid_with_several_fitting_keys_fails(
    jwks: Jwks, ec_keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    two = Jwks.from_json(json.dumps({"keys": [ec_jwk(ec_keys["ES256"], "a"), ec_jwk(other, "b")]}))
    with pytest.raises(SaslError, match="no kid and 2 keys"):
        two.verify(sign("ES256", other, claims(), kid=None), NOW)


def _verify_fails(jwks: Jwks, token: str, match: str, now: float = NOW) -> None:
    with pytest.raises(SaslError, match=match) as e:
        jwks.verify(token, now)
    assert e.value.reason == "invalid_token"


def test_expired_and_not_yet_valid(rsa_key: rsa.RSAPrivateKey, jwks: Jwks) -> None:
    token = sign("RS256", rsa_key, claims(exp=NOW))
    _verify_fails(jwks, token, "expired")
    assert jwks.verify(token, NOW - 1)["sub"] == "alice"
    assert jwks.verify(token, NOW, leeway_s=30)["sub"] == "alice"
    future = sign("RS256", rsa_key, claims(nbf=NOW + 60))
    _verify_fails(jwks, future, "not valid before")
    assert jwks.verify(future, NOW + 60)["sub"] == "alice"
    _verify_fails(jwks, sign("RS256", rsa_key, {"sub": "alice"}), "no 'exp'")
    _verify_fails(jwks, sign("RS256", rsa_key, claims(exp="soon")), "NumericDate")
    _verify_fails(jwks, sign("RS256", rsa_key, claims(exp=True)), "NumericDate")
    with pytest.raises(SaslError, match="expired"):
        identity("OAUTHBEARER", oauth_message(token), jwks=jwks, now_s=NOW)


def test_wrong_kid(rsa_key: rsa.RSAPrivateKey, jwks: Jwks) -> None:
    _verify_fails(jwks, sign("RS256", rsa_key, claims(), kid="nope"), "no key in the JWKS has kid")
    _verify_fails(jwks, sign("RS256", rsa_key, claims(), kid="enc"), "no key in the JWKS has kid")


def test_key_of_the_wrong_type_or_curve(
    rsa_key: rsa.RSAPrivateKey, ec_keys: dict[str, ec.EllipticCurvePrivateKey], jwks: Jwks
) -> None:
    _verify_fails(jwks, sign("ES256", ec_keys["ES256"], claims(), kid="k1"), "needs a P-256 key")
    _verify_fails(jwks, sign("ES256", ec_keys["ES256"], claims(), kid="ES384"), "needs a P-256")
    _verify_fails(jwks, sign("RS256", rsa_key, claims(), kid="ES256"), "needs an RSA key")


def test_signature_by_another_key_fails(jwks: Jwks) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    _verify_fails(jwks, sign("ES256", other, claims(), kid="ES256"), "does not verify")


def test_tampered_payload_fails(rsa_key: rsa.RSAPrivateKey, jwks: Jwks) -> None:
    head, _, sig = sign("RS256", rsa_key, claims()).split(".")
    forged = f"{head}.{b64url_json(claims(sub='admin'))}.{sig}"
    _verify_fails(jwks, forged, "does not verify")
    assert jwt_claim(forged) == "admin"  # unverified reading believes anything


def test_alg_none_and_hmac_refused(jwks: Jwks) -> None:
    _verify_fails(jwks, unsigned_token(claims()), "unsigned")
    hs_head = b64url_json({"alg": "HS256", "kid": "hmac"})
    _verify_fails(jwks, f"{hs_head}.{b64url_json(claims())}.{b64url(b'x' * 32)}", "HMAC")
    none_head = b64url_json({"alg": "None", "kid": "k1"})
    _verify_fails(jwks, f"{none_head}.{b64url_json(claims())}.", "unsigned")
    with pytest.raises(SaslError, match="unsigned"):
        identity("OAUTHBEARER", oauth_message(unsigned_token(claims())), jwks=jwks, now_s=NOW)


def test_malformed_tokens(rsa_key: rsa.RSAPrivateKey, jwks: Jwks) -> None:
    good = sign("RS256", rsa_key, claims())
    head, payload, sig = good.split(".")
    _verify_fails(jwks, f"{head}.{payload}", "has 2 parts")
    _verify_fails(jwks, f"{head}.{payload}.{sig}=", "base64url")
    _verify_fails(jwks, f"{b64url_json({'kid': 'k1'})}.{payload}.{sig}", "no 'alg'")
    _verify_fails(jwks, f"{b64url_json({'alg': 'XX1'})}.{payload}.{sig}", "not supported")
    crit = b64url_json({"alg": "RS256", "kid": "k1", "crit": ["exp"]})
    _verify_fails(jwks, f"{crit}.{payload}.{sig}", "crit")
    _verify_fails(jwks, f"{head}.{payload}.", "does not verify")


def test_es_signature_of_wrong_length(
    ec_keys: dict[str, ec.EllipticCurvePrivateKey], jwks: Jwks
) -> None:
    head, payload, _ = sign("ES256", ec_keys["ES256"], claims(), kid="ES256").split(".")
    _verify_fails(jwks, f"{head}.{payload}.{b64url(b'x' * 70)}", "70 bytes, not 64")


def test_short_rsa_key_refused() -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    keys = Jwks.from_json(json.dumps({"keys": [rsa_jwk(weak, "k1")]}))
    _verify_fails(keys, sign("RS256", weak, claims()), "1024 bits")


def test_jwk_alg_restricts(rsa_key: rsa.RSAPrivateKey) -> None:
    keys = Jwks.from_json(json.dumps({"keys": [rsa_jwk(rsa_key, "k1", alg="RS512")]}))
    _verify_fails(keys, sign("RS256", rsa_key, claims()), "is for RS512")
    assert keys.verify(sign("RS512", rsa_key, claims()), NOW)["sub"] == "alice"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not JSON"),
        ("[]", "'keys' array"),
        ('{"keys": {}}', "'keys' array"),
        ('{"keys": [1]}', "non-object"),
        ('{"keys": []}', "no RSA or EC"),
        ('{"keys": [{"kty": "oct", "k": "AA"}]}', "no RSA or EC"),
        ('{"keys": [{"kty": "EC", "crv": "P-256K", "x": "AA", "y": "AA"}]}', "no RSA or EC"),
        ('{"keys": [{"kty": "RSA", "n": "AQAB"}]}', "'e'"),
        ('{"keys": [{"kty": "RSA", "n": "!!", "e": "AQAB"}]}', "base64url"),
        ('{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}', "expected 32"),
        ('{"keys": [{"kty": "RSA", "kid": 5, "n": "AQAB", "e": "AQAB"}]}', "'kid'"),
    ],
)
def test_jwks_from_json_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Jwks.from_json(text)


def test_ec_point_not_on_curve_rejected() -> None:
    x = b64url((1).to_bytes(32, "big"))
    text = json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "x": x, "y": x}]})
    with pytest.raises(ValueError, match="invalid EC key"):
        Jwks.from_json(text)


def test_identity_other_mechanisms() -> None:
    assert identity("GSSAPI", b"\x60\x82") is None
    assert identity("plain", b"\x00alice\x00pw") is None  # mechanism names are case-sensitive
