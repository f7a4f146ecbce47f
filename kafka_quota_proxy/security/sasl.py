"""What the proxy reads of a SASL exchange it passes through: who the client says it is.

Each parser follows the RFC and the Kafka class that implements it on the broker, so the name
returned is the one Kafka's ``DefaultKafkaPrincipalBuilder`` would put after ``User:``:

- PLAIN (RFC 4616, Kafka's ``PlainSaslServer``): the authcid;
- SCRAM-SHA-256/512 (RFC 5802, Kafka's ``ScramMessages.ClientFirstMessage`` and
  ``ScramSaslServer``): the unescaped username, unless the client authenticates with a
  delegation token (``tokenauth=true``), whose owner only the broker knows;
- OAUTHBEARER (RFC 7628, Kafka's ``OAuthBearerClientInitialResponse`` and
  ``OAuthBearerSaslServer``): a claim of the JWT, ``sub`` by default, read without verification
  (as Kafka's unsecured validator, ``OAuthBearerUnsecuredJws``) or verified against a JSON Web
  Key Set (RFC 7515/7517/7518, as Kafka's ``BrokerJwtValidator``).

Where Kafka is stricter than the RFC on character sets (ASCII-only names) or accepts what the
RFC forbids, the parsers follow the RFC; the broker still has the last word on the exchange.
Pure: no I/O, the clock is an argument.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

__all__ = [
    "Jwks",
    "SaslError",
    "ScramClientFirst",
    "identity",
    "jwt_claim",
    "oauthbearer_token",
    "plain_identity",
    "scram_client_first",
]


class SaslError(ValueError):
    """A SASL message that is malformed or that the broker would refuse.

    ``reason`` is short and stable (a log field, a metric label); the message says precisely
    what is wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- PLAIN (RFC 4616) -------------------------------------------------------------------------


def plain_identity(auth_bytes: bytes) -> str:
    """The authcid of a PLAIN message ``[authzid] NUL authcid NUL passwd`` (RFC 4616).

    As Kafka's ``PlainSaslServer``: the username and password must not be empty, and an authzid,
    if given, must equal the username.
    """
    try:
        text = auth_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SaslError("malformed_plain", f"PLAIN message is not UTF-8: {e}") from None
    parts = text.split("\x00")
    if len(parts) != 3:
        raise SaslError(
            "malformed_plain", f"PLAIN message has {len(parts) - 1} NUL separators, expected 2"
        )
    authzid, authcid, passwd = parts
    if not authcid:
        raise SaslError("malformed_plain", "PLAIN message has an empty username")
    if not passwd:
        raise SaslError("malformed_plain", "PLAIN message has an empty password")
    if authzid and authzid != authcid:
        raise SaslError(
            "authzid_mismatch",
            f"PLAIN authorization id {authzid!r} differs from the username {authcid!r}",
        )
    return authcid


# --- SCRAM client-first (RFC 5802 section 7) --------------------------------------------------

# saslname: value-safe-char (any UTF-8 but NUL, ',' and '=') or the escapes =2C and =3D.
_SASLNAME: Final = r"(?:[^\x00,=]|=2C|=3D)+"
_GS2_CBIND: Final = r"(?P<cbind>n|y|p=[A-Za-z0-9.-]+)"
_GS2_HEADER: Final = rf"(?P<gs2>{_GS2_CBIND},(?:a=(?P<authzid>{_SASLNAME}))?,)"
# Kafka's extension keys are words ("tokenauth"), where RFC 5802 has one ALPHA.
_SCRAM_CLIENT_FIRST: Final = re.compile(
    _GS2_HEADER
    + r"(?P<bare>(?:m=(?P<mext>[^\x00,]+),)?"
    + rf"n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
    + r"(?P<ext>(?:,[A-Za-z]+=[^\x00,]+)*))"
)
_ESCAPE: Final = re.compile(r"=2C|=3D")


def _unescape_saslname(name: str) -> str:
    """``=2C`` -> ``,`` and ``=3D`` -> ``=`` (RFC 5802 section 5.1); any other ``=`` is an error."""
    if "=" in _ESCAPE.sub("", name):
        raise SaslError("malformed_scram", f"invalid '=' escape in SCRAM name {name!r}")
    return _ESCAPE.sub(lambda m: "," if m.group() == "=2C" else "=", name)


def _extensions(text: str, sep: str, reason: str) -> dict[str, str]:
    """``k=v`` pairs joined by ``sep`` (already validated by a pattern); a repeated key is an
    error, as the meaning of ``tokenauth=false,tokenauth=true`` is not one to guess."""
    result: dict[str, str] = {}
    for pair in text.split(sep):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        if key in result:
            raise SaslError(reason, f"extension {key!r} given twice")
        result[key] = value
    return result


@dataclass(frozen=True)
class ScramClientFirst:
    """A parsed SCRAM client-first message (RFC 5802 section 7).

    ``gs2_header`` (``"n,,"``, ``"n,a=alice,"``) and ``bare`` (the client-first-message-bare,
    which the AuthMessage of the proof includes) are the exact text sent. ``reserved_mext`` is
    the ``m=`` attribute, which RFC 5802 says a server must fail on (Kafka ignores it).
    """

    username: str
    nonce: str
    authzid: str | None
    extensions: dict[str, str]
    gs2_header: str
    bare: str
    reserved_mext: str | None = field(default=None)

    @property
    def token_auth(self) -> bool:
        """Whether the client authenticates with a delegation token (Kafka's
        ``ScramExtensions.tokenAuthenticated``: ``tokenauth`` parses as Java's true)."""
        return self.extensions.get("tokenauth", "").lower() == "true"


def scram_client_first(auth_bytes: bytes) -> ScramClientFirst:
    """Parse a SCRAM client-first message ``gs2-header [m=..,] n=user,r=nonce[,ext]*``.

    Channel binding (``p=``) is refused: Kafka offers no -PLUS mechanism. ``y`` (client could
    bind, thinks the server cannot) is valid per RFC 5802 as no -PLUS is offered; Kafka's own
    parser accepts only ``n``, so the broker would fail such a client.
    """
    try:
        text = auth_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SaslError("malformed_scram", f"SCRAM client-first is not UTF-8: {e}") from None
    if text.startswith("p="):
        raise SaslError(
            "unsupported_channel_binding",
            "SCRAM client requires channel binding (p=), which Kafka does not offer",
        )
    m = _SCRAM_CLIENT_FIRST.fullmatch(text)
    if m is None:
        raise SaslError("malformed_scram", f"invalid SCRAM client-first message {text!r}")
    authzid = m.group("authzid")
    return ScramClientFirst(
        username=_unescape_saslname(m.group("saslname")),
        nonce=m.group("nonce"),
        authzid=None if authzid is None else _unescape_saslname(authzid),
        extensions=_extensions(m.group("ext"), ",", "malformed_scram"),
        gs2_header=m.group("gs2"),
        bare=m.group("bare"),
        reserved_mext=m.group("mext"),
    )


# --- OAUTHBEARER (RFC 7628 section 3.1) -------------------------------------------------------

_OAUTH_KVSEP: Final = "\x01"
_OAUTH_INITIAL: Final = re.compile(
    _GS2_HEADER + r"\x01(?P<kv>(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*)\x01"
)
# RFC 6750 section 2.1: "Bearer" 1*SP b64token; the scheme is case-insensitive (as Kafka).
_OAUTH_AUTH: Final = re.compile(r"(?P<scheme>[A-Za-z0-9_]+) +(?P<token>[A-Za-z0-9\-._~+/]+=*)")


def _oauthbearer(auth_bytes: bytes) -> tuple[str | None, str, dict[str, str]]:
    """(authzid, token, extensions) of an OAUTHBEARER client initial response."""
    try:
        text = auth_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SaslError(
            "malformed_oauthbearer", f"OAUTHBEARER response is not UTF-8: {e}"
        ) from None
    if text.startswith("p="):
        raise SaslError(
            "unsupported_channel_binding",
            "OAUTHBEARER client requires channel binding (p=), which Kafka does not offer",
        )
    m = _OAUTH_INITIAL.fullmatch(text)
    if m is None:
        raise SaslError("malformed_oauthbearer", "invalid OAUTHBEARER client initial response")
    kv = _extensions(m.group("kv"), _OAUTH_KVSEP, "malformed_oauthbearer")
    auth = kv.pop("auth", None)
    if auth is None:
        raise SaslError("malformed_oauthbearer", "OAUTHBEARER response has no 'auth' key")
    am = _OAUTH_AUTH.fullmatch(auth)
    if am is None:
        raise SaslError("malformed_oauthbearer", "OAUTHBEARER 'auth' is not '<scheme> <token>'")
    if am.group("scheme").lower() != "bearer":
        raise SaslError(
            "malformed_oauthbearer", f"OAUTHBEARER scheme is {am.group('scheme')!r}, not Bearer"
        )
    authzid = m.group("authzid")
    return (None if authzid is None else _unescape_saslname(authzid)), am.group("token"), kv


def oauthbearer_token(auth_bytes: bytes) -> str:
    """The bearer token of an OAUTHBEARER client initial response (RFC 7628 section 3.1):
    ``n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A]*^A``."""
    return _oauthbearer(auth_bytes)[1]


# --- JWS (RFC 7515, RFC 7518, RFC 7519) -------------------------------------------------------

_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


def _b64url_decode(part: str, what: str) -> bytes:
    """Unpadded base64url (RFC 7515 section 2)."""
    if _B64URL.fullmatch(part) is None or len(part) % 4 == 1:
        raise SaslError("invalid_token", f"JWT {what} is not unpadded base64url")
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _json_object(raw: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SaslError("invalid_token", f"JWT {what} is not JSON") from None
    if not isinstance(value, dict):
        raise SaslError("invalid_token", f"JWT {what} is not a JSON object")
    return value


def _split(token: str) -> tuple[str, str, str]:
    parts = token.split(".")
    if len(parts) != 3:
        raise SaslError(
            "invalid_token",
            f"JWT has {len(parts)} parts, a JWS compact serialization has 3 dot-separated parts",
        )
    return parts[0], parts[1], parts[2]


def _string_claim(claims: dict[str, object], claim: str) -> str:
    value = claims.get(claim)
    if value is None:
        raise SaslError("invalid_token", f"JWT has no {claim!r} claim")
    if not isinstance(value, str):
        raise SaslError("invalid_token", f"JWT claim {claim!r} is not a string")
    if not value.strip():
        # Kafka's OAuthBearerUnsecuredJws and ClaimValidationUtils refuse a blank principal.
        raise SaslError("invalid_token", f"JWT claim {claim!r} is blank")
    return value


def jwt_claim(token: str, claim: str = "sub") -> str:
    """The string ``claim`` of a JWS compact token's payload, decoded without verification
    (what Kafka's unsecured validator reads, ``OAuthBearerUnsecuredJws``)."""
    _, payload, _ = _split(token)
    return _string_claim(_json_object(_b64url_decode(payload, "payload"), "payload"), claim)


_RSA_HASHES: Final[dict[str, type[hashes.HashAlgorithm]]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
# RFC 7518 section 3.4: ES256 on P-256 with SHA-256, ES384 on P-384, ES512 on P-521.
_EC_ALGS: Final[dict[str, tuple[str, type[hashes.HashAlgorithm], int]]] = {
    "ES256": ("P-256", hashes.SHA256, 32),
    "ES384": ("P-384", hashes.SHA384, 48),
    "ES512": ("P-521", hashes.SHA512, 66),
}
_CURVES: Final[dict[str, tuple[type[ec.EllipticCurve], int]]] = {
    "P-256": (ec.SECP256R1, 32),
    "P-384": (ec.SECP384R1, 48),
    "P-521": (ec.SECP521R1, 66),
}
_MIN_RSA_BITS: Final = 2048  # RFC 7518 section 3.3 (jose4j, under Kafka, enforces it)
ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
)


@dataclass(frozen=True)
class _Jwk:
    kid: str | None
    alg: str | None
    curve: str | None  # None for RSA
    key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey


def _jwk_int(jwk: dict[str, object], name: str, size: int | None = None) -> int:
    value = jwk.get(name)
    if not isinstance(value, str):
        raise ValueError(f"JWK member {name!r} is missing or not a string")
    try:
        raw = _b64url_decode(value, f"JWK {name!r}")
    except SaslError as e:
        raise ValueError(str(e)) from None
    if not raw or (size is not None and len(raw) != size):
        raise ValueError(f"JWK member {name!r} has {len(raw)} bytes, expected {size}")
    return int.from_bytes(raw, "big")


def _parse_jwk(jwk: dict[str, object]) -> _Jwk | None:
    """One key of RFC 7517/7518; None for a key that cannot verify signatures here."""
    kid, alg, use = jwk.get("kid"), jwk.get("alg"), jwk.get("use")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("JWK 'kid' is not a string")
    if alg is not None and not isinstance(alg, str):
        raise ValueError("JWK 'alg' is not a string")
    if use is not None and use != "sig":
        return None
    kty = jwk.get("kty")
    if kty == "RSA":
        try:
            key = rsa.RSAPublicNumbers(_jwk_int(jwk, "e"), _jwk_int(jwk, "n")).public_key()
        except ValueError as e:
            raise ValueError(f"JWK {kid!r}: invalid RSA key: {e}") from None
        return _Jwk(kid, alg, None, key)
    if kty == "EC":
        crv = jwk.get("crv")
        if not isinstance(crv, str) or crv not in _CURVES:
            return None
        curve, size = _CURVES[crv]
        try:
            numbers = ec.EllipticCurvePublicNumbers(
                _jwk_int(jwk, "x", size), _jwk_int(jwk, "y", size), curve()
            )
            return _Jwk(kid, alg, crv, numbers.public_key())
        except ValueError as e:
            raise ValueError(f"JWK {kid!r}: invalid EC key: {e}") from None
    return None  # "oct" (symmetric), "OKP" and others: not for us


class Jwks:
    """A JSON Web Key Set (RFC 7517) of RSA and EC public keys, to verify JWS tokens.

    Verification follows Kafka's ``BrokerJwtValidator`` (jose4j): RS*, PS* and ES* only (no
    ``none``, no HMAC), the key chosen by ``kid``, ``exp`` required and checked, ``nbf`` checked
    when present.
    """

    def __init__(self, keys: list[_Jwk]) -> None:
        self._keys = keys

    @classmethod
    def from_json(cls, text: str) -> Jwks:
        """Parse ``{"keys": [...]}``; keys for encryption or of other types are skipped.
        Raises ValueError if the text is no key set or holds no usable key."""
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"JWKS is not JSON: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise ValueError("JWKS is not an object with a 'keys' array")
        keys: list[_Jwk] = []
        for jwk in doc["keys"]:
            if not isinstance(jwk, dict):
                raise ValueError("JWKS 'keys' holds a non-object")
            parsed = _parse_jwk(jwk)
            if parsed is not None:
                keys.append(parsed)
        if not keys:
            raise ValueError("JWKS holds no RSA or EC (P-256/384/521) signature key")
        return cls(keys)

    def _key_for(self, header: dict[str, object], alg: str) -> _Jwk:
        kid = header.get("kid")
        if kid is not None:
            if not isinstance(kid, str):
                raise SaslError("invalid_token", "JWT header 'kid' is not a string")
            found = [k for k in self._keys if k.kid == kid]
            if not found:
                raise SaslError("invalid_token", f"no key in the JWKS has kid {kid!r}")
            if len(found) > 1:
                found = [k for k in found if _fits(k, alg)] or found
            return found[0]
        if len(self._keys) == 1:
            return self._keys[0]
        fitting = [k for k in self._keys if _fits(k, alg)]
        if len(fitting) == 1:
            return fitting[0]
        raise SaslError(
            "invalid_token",
            f"JWT has no kid and {len(fitting)} keys of the JWKS could verify {alg}",
        )

    def verify(self, token: str, now_s: float, *, leeway_s: float = 0.0) -> dict[str, object]:
        """Verify the JWS signature and the time claims; return the claims.

        ``leeway_s`` allows for clock skew (Kafka's ``sasl.oauthbearer.clock.skew.seconds``).
        Any failure raises SaslError with reason ``invalid_token``.
        """
        head_b64, payload_b64, sig_b64 = _split(token)
        header = _json_object(_b64url_decode(head_b64, "header"), "header")
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise SaslError("invalid_token", "JWT header has no 'alg'")
        if alg.lower() == "none":
            raise SaslError("invalid_token", "JWT is unsigned (alg 'none')")
        if alg.startswith("HS"):
            raise SaslError("invalid_token", f"JWT algorithm {alg} (HMAC, symmetric) is refused")
        if alg not in ALGORITHMS:
            raise SaslError("invalid_token", f"JWT algorithm {alg!r} is not supported")
        if "crit" in header:
            raise SaslError("invalid_token", "JWT header has critical extensions ('crit')")
        key = self._key_for(header, alg)
        signature = _b64url_decode(sig_b64, "signature")
        _check_signature(key, alg, signature, f"{head_b64}.{payload_b64}".encode("ascii"))
        claims = _json_object(_b64url_decode(payload_b64, "payload"), "payload")
        _check_times(claims, now_s, leeway_s)
        return claims


def _fits(key: _Jwk, alg: str) -> bool:
    if key.alg is not None and key.alg != alg:
        return False
    if alg.startswith("ES"):
        return key.curve == _EC_ALGS[alg][0]
    return key.curve is None


def _check_signature(key: _Jwk, alg: str, signature: bytes, signed: bytes) -> None:
    if key.alg is not None and key.alg != alg:
        raise SaslError("invalid_token", f"JWT alg {alg} but key {key.kid!r} is for {key.alg}")
    try:
        if alg.startswith("ES"):
            curve, hash_cls, size = _EC_ALGS[alg]
            if not isinstance(key.key, ec.EllipticCurvePublicKey) or key.curve != curve:
                raise SaslError("invalid_token", f"JWT alg {alg} needs a {curve} key")
            if len(signature) != 2 * size:
                raise SaslError(
                    "invalid_token", f"{alg} signature has {len(signature)} bytes, not {2 * size}"
                )
            der = encode_dss_signature(
                int.from_bytes(signature[:size], "big"), int.from_bytes(signature[size:], "big")
            )
            key.key.verify(der, signed, ec.ECDSA(hash_cls()))
            return
        if not isinstance(key.key, rsa.RSAPublicKey):
            raise SaslError("invalid_token", f"JWT alg {alg} needs an RSA key")
        if key.key.key_size < _MIN_RSA_BITS:
            raise SaslError(
                "invalid_token", f"RSA key {key.kid!r} has {key.key.key_size} bits, under 2048"
            )
        rsa_hash = _RSA_HASHES[alg[2:]]()
        pad: padding.AsymmetricPadding
        if alg.startswith("PS"):
            # RFC 7518 section 3.5: MGF1 with the same hash, salt as long as the hash.
            pad = padding.PSS(mgf=padding.MGF1(rsa_hash), salt_length=rsa_hash.digest_size)
        else:
            pad = padding.PKCS1v15()
        key.key.verify(signature, signed, pad, rsa_hash)
    except InvalidSignature:
        raise SaslError("invalid_token", f"JWT {alg} signature does not verify") from None


def _numeric_date(claims: dict[str, object], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SaslError("invalid_token", f"JWT claim {name!r} is not a NumericDate")
    return float(value)


def _check_times(claims: dict[str, object], now_s: float, leeway_s: float) -> None:
    """RFC 7519 sections 4.1.4-5: valid while ``nbf <= now < exp``; ``exp`` is required (as
    Kafka's ``BrokerJwtValidator``)."""
    exp = _numeric_date(claims, "exp")
    if exp is None:
        raise SaslError("invalid_token", "JWT has no 'exp' claim")
    if now_s >= exp + leeway_s:
        raise SaslError("invalid_token", f"JWT expired at {exp:.0f} (now {now_s:.0f})")
    nbf = _numeric_date(claims, "nbf")
    if nbf is not None and now_s < nbf - leeway_s:
        raise SaslError("invalid_token", f"JWT not valid before {nbf:.0f} (now {now_s:.0f})")
    _numeric_date(claims, "iat")


# --- The principal ----------------------------------------------------------------------------


def identity(
    mechanism: str,
    auth_bytes: bytes,
    claim: str = "sub",
    jwks: Jwks | None = None,
    now_s: float = 0.0,
) -> str | None:
    """The principal name Kafka would give a client whose first SASL message is ``auth_bytes``.

    None when the message does not tell: a mechanism the proxy does not read (GSSAPI, ...),
    or SCRAM with a delegation token (the broker maps the token id to its owner). For
    OAUTHBEARER, ``claim`` names the principal claim (Kafka's ``sasl.oauthbearer.sub.claim.name``
    or ``unsecuredValidatorPrincipalClaimName``); with ``jwks`` the token is verified at
    ``now_s``, without it only decoded. An authzid different from the principal is refused, as
    Kafka refuses it.
    """
    if mechanism == "PLAIN":
        return plain_identity(auth_bytes)
    if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        first = scram_client_first(auth_bytes)
        if first.token_auth:
            return None
        if first.authzid and first.authzid != first.username:
            raise SaslError(
                "authzid_mismatch",
                f"SCRAM authorization id {first.authzid!r} differs from the username "
                f"{first.username!r}",
            )
        return first.username
    if mechanism == "OAUTHBEARER":
        authzid, token, _ = _oauthbearer(auth_bytes)
        if jwks is None:
            principal = jwt_claim(token, claim)
        else:
            principal = _string_claim(jwks.verify(token, now_s), claim)
        if authzid and authzid != principal:
            raise SaslError(
                "authzid_mismatch",
                f"OAUTHBEARER authorization id {authzid!r} differs from the token's principal "
                f"{principal!r}",
            )
        return principal
    return None
