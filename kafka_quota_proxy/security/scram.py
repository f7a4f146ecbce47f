"""SCRAM-SHA-256/512 maths and a sans-IO server and client (RFC 5802, RFC 7677).

As Kafka's ``ScramFormatter``, ``ScramSaslServer``, ``ScramSaslClient`` and
``ScramCredentialUtils``: the password is taken as its UTF-8 bytes (Kafka does no SASLprep),
credentials need at least 4096 iterations, and a stored credential is the text
``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=N``. Pure: no I/O; nonces and salts
are arguments.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kafka_quota_proxy.security.sasl import SaslError, ScramClientFirst, scram_client_first

__all__ = [
    "MECHANISMS",
    "MIN_ITERATIONS",
    "ScramClient",
    "ScramCredential",
    "ScramServer",
    "format_credential",
    "make_credential",
    "parse_credential",
]

# Kafka's ScramMechanism: the mechanisms and the hashes behind them.
MECHANISMS: Final[Mapping[str, str]] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384  # what Kafka's AlterUserScramCredentials accepts

_FAILED: Final = "authentication_failed"
_PRINTABLE: Final = r"[\x21-\x2b\x2d-\x7e]+"  # printable ASCII but ','
_BASE64: Final = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)?"
_EXTENSIONS: Final = r"(?:,[A-Za-z]+=[^\x00,]+)*"
_SERVER_FIRST: Final = re.compile(
    rf"(?:m=[^\x00,]+,)?r=(?P<nonce>{_PRINTABLE}),s=(?P<salt>{_BASE64}),i=(?P<i>[0-9]+)"
    + _EXTENSIONS
)
_CLIENT_FINAL: Final = re.compile(
    rf"(?P<without_proof>c=(?P<c>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_BASE64})"
)
_SERVER_FINAL: Final = re.compile(rf"(?:e=(?P<error>[^\x00,=]+)|v=(?P<v>{_BASE64})){_EXTENSIONS}")
_NONCE: Final = re.compile(_PRINTABLE)


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(
            f"unsupported SCRAM mechanism {mechanism!r}; Kafka offers {sorted(MECHANISMS)}"
        ) from None


def _hmac(digest: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, digest).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _salted_password(digest: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802 section 2.2, which is PBKDF2 with HMAC."""
    return hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)


def _escape_saslname(name: str) -> str:
    """RFC 5802 section 5.1: ``=`` -> ``=3D`` then ``,`` -> ``=2C`` (Kafka's saslName)."""
    return name.replace("=", "=3D").replace(",", "=2C")


@dataclass(frozen=True)
class ScramCredential:
    """What a server stores of a SCRAM password (RFC 5802 section 3, Kafka's ScramCredential)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def make_credential(
    mechanism: str, password: str, salt: bytes, iterations: int = MIN_ITERATIONS
) -> ScramCredential:
    """The credential of ``password`` (Kafka's ``ScramFormatter.generateCredential``):
    SaltedPassword = Hi(password, salt, i), StoredKey = H(HMAC(SaltedPassword, "Client Key")),
    ServerKey = HMAC(SaltedPassword, "Server Key")."""
    digest = _digest(mechanism)
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"{iterations} iterations, {mechanism} needs at least {MIN_ITERATIONS}")
    if not salt:
        raise ValueError("empty salt")
    salted = _salted_password(digest, password, salt, iterations)
    client_key = _hmac(digest, salted, b"Client Key")
    return ScramCredential(
        salt=salt,
        stored_key=hashlib.new(digest, client_key).digest(),
        server_key=_hmac(digest, salted, b"Server Key"),
        iterations=iterations,
    )


def format_credential(c: ScramCredential) -> str:
    """Kafka's ``ScramCredentialUtils.credentialToString``."""
    return (
        f"salt={_b64(c.salt)},stored_key={_b64(c.stored_key)},"
        f"server_key={_b64(c.server_key)},iterations={c.iterations}"
    )


def parse_credential(text: str) -> ScramCredential:
    """Kafka's ``ScramCredentialUtils.credentialFromString``: exactly the four keys, in any
    order; ValueError otherwise."""
    fields: dict[str, str] = {}
    for token in text.strip().split(","):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"SCRAM credential: {token!r} is not key=value")
        if key in fields:
            raise ValueError(f"SCRAM credential: {key!r} given twice")
        fields[key] = value
    expected = {"salt", "stored_key", "server_key", "iterations"}
    if set(fields) != expected:
        raise ValueError(f"SCRAM credential has keys {sorted(fields)}, expected {sorted(expected)}")

    def b64(key: str) -> bytes:
        value = fields[key]
        padded = value + "=" * (-len(value) % 4)
        if not re.fullmatch(_BASE64, padded) or not value:
            raise ValueError(f"SCRAM credential: {key} is not base64")
        return base64.b64decode(padded, validate=True)

    if not re.fullmatch(r"[0-9]{1,9}", fields["iterations"]) or int(fields["iterations"]) < 1:
        raise ValueError(f"SCRAM credential: iterations {fields['iterations']!r} is not a count")
    return ScramCredential(
        salt=b64("salt"),
        stored_key=b64("stored_key"),
        server_key=b64("server_key"),
        iterations=int(fields["iterations"]),
    )


def _decode(message: bytes, what: str) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("malformed_scram", f"SCRAM {what} is not UTF-8") from None


class ScramServer:
    """One SCRAM exchange, server side, sans-IO (Kafka's ``ScramSaslServer``).

    ``first`` takes the client-first message and returns the server-first; ``final`` takes the
    client-final and returns the server-final once the proof is right. ``nonce`` is the server's
    part of the nonce (printable ASCII but ','; Kafka draws 130 random bits). ``lookup`` maps a
    username to its credential, None if unknown. Any failure raises SaslError (reason
    ``authentication_failed``, or ``malformed_scram`` for unparseable messages) and ends the
    exchange; calls out of order raise SaslError ``illegal_sasl_state``.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], ScramCredential | None],
        nonce: str,
    ) -> None:
        self._digest = _digest(mechanism)
        self.mechanism = mechanism
        if _NONCE.fullmatch(nonce) is None:
            raise ValueError("SCRAM server nonce must be printable ASCII without ','")
        self._lookup = lookup
        self._server_nonce = nonce
        self._state = "first"
        self.username: str | None = None
        self._client_first: ScramClientFirst | None = None
        self._server_first = ""
        self._credential: ScramCredential | None = None

    @property
    def complete(self) -> bool:
        """Whether the client has proven it knows the password."""
        return self._state == "complete"

    def _expect(self, state: str) -> None:
        if self._state != state:
            raise SaslError(
                "illegal_sasl_state", f"SCRAM message in state {self._state}, expected {state}"
            )

    def _fail(self, message: str) -> SaslError:
        self._state = "failed"
        self._credential = None
        return SaslError(_FAILED, message)

    def first(self, client_first: bytes) -> bytes:
        """Client-first -> server-first ``r=<client+server nonce>,s=<salt>,i=<iterations>``."""
        self._expect("first")
        try:
            parsed = scram_client_first(client_first)
        except SaslError:
            self._state = "failed"
            raise
        self.username = parsed.username
        if parsed.reserved_mext is not None:
            raise self._fail("SCRAM client sent the reserved 'm' attribute (RFC 5802 5.1)")
        if parsed.token_auth:
            raise self._fail("SCRAM delegation tokens (tokenauth) are not supported here")
        if parsed.authzid and parsed.authzid != parsed.username:
            raise self._fail("Client requested an authorization id different from username")
        credential = self._lookup(parsed.username)
        if credential is None:
            raise self._fail("Invalid user credentials")
        if credential.iterations < MIN_ITERATIONS:
            raise self._fail(
                f"Iterations {credential.iterations} is less than the minimum {MIN_ITERATIONS}"
            )
        self._client_first = parsed
        self._credential = credential
        self._server_first = (
            f"r={parsed.nonce}{self._server_nonce},s={_b64(credential.salt)},"
            f"i={credential.iterations}"
        )
        self._state = "final"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Client-final -> server-final ``v=<server signature>`` after checking the channel
        binding (the gs2 header, base64), the nonce and the proof."""
        self._expect("final")
        assert self._client_first is not None and self._credential is not None
        text = _decode(client_final, "client-final")
        m = _CLIENT_FINAL.fullmatch(text)
        if m is None:
            raise self._fail("Invalid SCRAM client final message format")
        if base64.b64decode(m.group("c")) != self._client_first.gs2_header.encode("utf-8"):
            raise self._fail("SCRAM channel binding does not match the gs2 header")
        if m.group("nonce") != self._client_first.nonce + self._server_nonce:
            raise self._fail("Invalid client nonce in the final client message")
        proof = base64.b64decode(m.group("proof"))
        credential = self._credential
        if len(proof) != len(credential.stored_key):
            raise self._fail("Invalid client credentials")
        auth_message = ",".join(
            (self._client_first.bare, self._server_first, m.group("without_proof"))
        ).encode("utf-8")
        client_signature = _hmac(self._digest, credential.stored_key, auth_message)
        client_key = _xor(proof, client_signature)
        if not hmac.compare_digest(
            hashlib.new(self._digest, client_key).digest(), credential.stored_key
        ):
            raise self._fail("Invalid client credentials")
        server_signature = _hmac(self._digest, credential.server_key, auth_message)
        self._credential = None
        self._state = "complete"
        return f"v={_b64(server_signature)}".encode("ascii")


class ScramClient:
    """One SCRAM exchange, client side, sans-IO (Kafka's ``ScramSaslClient``), for tests."""

    def __init__(
        self,
        mechanism: str,
        username: str,
        password: str,
        nonce: str,
        extensions: Mapping[str, str] | None = None,
    ) -> None:
        self._digest = _digest(mechanism)
        if _NONCE.fullmatch(nonce) is None:
            raise ValueError("SCRAM client nonce must be printable ASCII without ','")
        self._password = password
        self._nonce = nonce
        ext = "".join(f",{k}={v}" for k, v in (extensions or {}).items())
        self._gs2_header = "n,,"
        self._bare = f"n={_escape_saslname(username)},r={nonce}{ext}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        """The client-first message ``n,,n=<user>,r=<nonce>[,ext]``."""
        return (self._gs2_header + self._bare).encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        """Server-first -> client-final ``c=biws,r=<nonce>,p=<proof>``."""
        text = _decode(server_first, "server-first")
        m = _SERVER_FIRST.fullmatch(text)
        if m is None:
            raise SaslError("malformed_scram", f"invalid SCRAM server-first message {text!r}")
        nonce = m.group("nonce")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError(_FAILED, "SCRAM server nonce does not extend the client nonce")
        iterations = int(m.group("i"))
        if iterations < MIN_ITERATIONS:
            raise SaslError(_FAILED, f"Requested iterations {iterations} is less than the minimum")
        salted = _salted_password(
            self._digest, self._password, base64.b64decode(m.group("salt")), iterations
        )
        channel = _b64(self._gs2_header.encode("utf-8"))
        without_proof = f"c={channel},r={nonce}"
        auth_message = ",".join((self._bare, text, without_proof)).encode("utf-8")
        client_key = _hmac(self._digest, salted, b"Client Key")
        stored_key = hashlib.new(self._digest, client_key).digest()
        proof = _xor(client_key, _hmac(self._digest, stored_key, auth_message))
        server_key = _hmac(self._digest, salted, b"Server Key")
        self._server_signature = _hmac(self._digest, server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature (the server knew the credential); SaslError if not."""
        if self._server_signature is None:
            raise SaslError("illegal_sasl_state", "SCRAM server-final before server-first")
        text = _decode(server_final, "server-final")
        m = _SERVER_FINAL.fullmatch(text)
        if m is None:
            raise SaslError("malformed_scram", f"invalid SCRAM server-final message {text!r}")
        if m.group("error") is not None:
            raise SaslError(_FAILED, f"SCRAM server error: {m.group('error')}")
        if not hmac.compare_digest(base64.b64decode(m.group("v")), self._server_signature):
            raise SaslError(_FAILED, "SCRAM server signature does not verify")
