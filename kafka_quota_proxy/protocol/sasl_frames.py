"""What the proxy reads of the SASL exchange's frames (KIP-43, KIP-152): the mechanism a
client asks for, the bytes it authenticates with, and the broker's verdict.

Frames are whole, without their size prefix, header included. Anything that does not decode
raises ``MalformedFrame`` (the connection closes with that reason).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import request_body, response_body
from kafka_quota_proxy.protocol.headers import (
    encode_response_header,
)

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
# Kafka's error codes of the exchange
NONE = 0
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58


@dataclass(frozen=True, slots=True)
class AuthenticateResult:
    """A SaslAuthenticate response."""

    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int  # KIP-368 (v1+): 0 when none


def handshake_mechanism(frame: bytes | memoryview, version: int) -> str:
    """The mechanism of a SaslHandshake request."""
    return str(request_body(frame, SASL_HANDSHAKE, version).mechanism)


def handshake_error(frame: bytes | memoryview, version: int) -> int:
    """The error code of a SaslHandshake response."""
    return int(response_body(frame, SASL_HANDSHAKE, version).error_code)


def authenticate_bytes(frame: bytes | memoryview, version: int) -> bytes:
    """The auth bytes of a SaslAuthenticate request."""
    return bytes(request_body(frame, SASL_AUTHENTICATE, version).auth_bytes)


def authenticate_result(frame: bytes | memoryview, version: int) -> AuthenticateResult:
    """A SaslAuthenticate response."""
    body = response_body(frame, SASL_AUTHENTICATE, version)
    lifetime = getattr(body, "session_lifetime", None)  # a timedelta in kio (v1+)
    lifetime_ms = round(lifetime.total_seconds() * 1000) if lifetime is not None else 0
    return AuthenticateResult(int(body.error_code), body.error_message, bytes(body.auth_bytes),
                              lifetime_ms)


def encode_response(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    """A whole response frame, size prefix included (for the proxy's own answers and tests)."""
    from kio.schema.errors import ErrorCode

    cls = load_response_schema(api_key, version)
    if "error_code" in fields and not isinstance(fields["error_code"], ErrorCode):
        fields["error_code"] = ErrorCode(fields["error_code"])
    buf = io.BytesIO()
    entity_writer(cls)(buf, cls(**fields))
    frame = encode_response_header(correlation_id, apis.response_header_version(api_key, version))
    frame += buf.getvalue()
    return len(frame).to_bytes(4, "big") + frame
