"""Request headers v1/v2 and response headers v0/v1 (KIP-482 tagged fields in v2/v1)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import apis
from protocol.primitives import INT16, INT32, encode_tagged_fields, read_uvarint, skip_tagged_fields


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    size: int  # encoded size of the header in bytes


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    header_version: int
    size: int


def parse_request_header(buf: bytes | memoryview, pos: int, limit: int) -> RequestHeader:
    """Parse a request header starting at ``pos`` (just after the size prefix).

    Raises ``IndexError`` when the header does not fit in ``buf[pos:limit]``; raises
    ``KeyError`` for an API key the proxy does not know (the caller maps both).
    """
    start = pos
    if limit - pos < 10:
        raise IndexError("request header incomplete")
    api_key, api_version = INT16.unpack_from(buf, pos)[0], INT16.unpack_from(buf, pos + 2)[0]
    correlation_id = INT32.unpack_from(buf, pos + 4)[0]
    client_len = INT16.unpack_from(buf, pos + 8)[0]
    pos += 10
    client_id: str | None
    if client_len < 0:
        client_id = None
    else:
        if pos + client_len > limit:
            raise IndexError("client id incomplete")
        client_id = bytes(buf[pos : pos + client_len]).decode("utf-8", "replace")
        pos += client_len
    header_version = apis.request_header_version(api_key, api_version)
    if header_version >= 2:
        pos = skip_tagged_fields(buf, pos)
        if pos > limit:
            raise IndexError("header tagged fields incomplete")
    return RequestHeader(
        api_key, api_version, correlation_id, client_id, header_version, pos - start
    )


def encode_request_header(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    tagged_fields: list[tuple[int, bytes]] | None = None,
) -> bytes:
    parts = [INT16.pack(api_key), INT16.pack(api_version), INT32.pack(correlation_id)]
    if client_id is None:
        parts.append(INT16.pack(-1))
    else:
        raw = client_id.encode()
        parts.append(INT16.pack(len(raw)))
        parts.append(raw)
    if apis.request_header_version(api_key, api_version) >= 2:
        parts.append(encode_tagged_fields(tagged_fields or []))
    return b"".join(parts)


def parse_response_header(
    buf: bytes | memoryview, pos: int, limit: int, header_version: int
) -> ResponseHeader:
    start = pos
    correlation_id = INT32.unpack_from(buf, pos)[0]
    pos += 4
    if header_version >= 1:
        pos = skip_tagged_fields(buf, pos)
    if pos > limit:
        raise IndexError("response header incomplete")
    return ResponseHeader(correlation_id, header_version, pos - start)


def encode_response_header(
    correlation_id: int, header_version: int, tagged_fields: list[tuple[int, bytes]] | None = None
) -> bytes:
    out = INT32.pack(correlation_id)
    if header_version >= 1:
        out += encode_tagged_fields(tagged_fields or [])
    return out


def produce_acks(buf: bytes | memoryview, pos: int, limit: int, api_version: int) -> int:
    """Read ``acks`` from a Produce request body starting at ``pos``.

    v0-v2: acks is the first field; v3+: it follows ``transactional_id`` (a compact
    nullable string from v9, flexible). Raises ``IndexError`` when it does not fit.
    """
    if api_version >= 3:
        if api_version >= 9:
            n, pos = read_uvarint(buf, pos)
            pos += max(n - 1, 0)
        else:
            n = INT16.unpack_from(buf, pos)[0]
            pos += 2 + max(n, 0)
    if pos + 2 > limit:
        raise IndexError("acks incomplete")
    acks: int = INT16.unpack_from(buf, pos)[0]
    return acks
