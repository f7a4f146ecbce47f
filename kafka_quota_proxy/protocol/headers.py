"""Request headers v1/v2 and response headers v0/v1 (KIP-482 tagged fields in v2/v1)."""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.primitives import (
    INT16,
    INT32,
    encode_tagged_fields,
    read_uvarint,
    skip_tagged_fields,
)


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


class HeaderProgress:
    """How far parsing the request header of one frame has got, kept between attempts while
    the header is still arriving so that each attempt goes on where the last one stopped
    instead of walking every byte so far again (a header whose tagged fields trickle in would
    otherwise cost time quadratic in its length). Offsets are from the start of the header.
    Only valid for the one frame it was used with, and only as that frame grows.
    """

    __slots__ = ("header", "tags_at", "tags_left")

    def __init__(self) -> None:
        self.tags_at = -1  # offset of the next tagged field to read (-1: count not read yet)
        self.tags_left = 0  # tagged fields still to read
        self.header: RequestHeader | None = None  # once it has parsed


def parse_request_header(
    buf: bytes | bytearray | memoryview,
    pos: int,
    limit: int,
    progress: HeaderProgress | None = None,
) -> RequestHeader:
    """Parse a request header starting at ``pos`` (just after the size prefix).

    Raises ``IndexError`` (or ``ValueError`` / ``struct.error``) when the header does not fit
    in ``buf[pos:limit]``. With ``progress`` (the same object on every attempt at the same
    header, ``buf[pos:limit]`` growing between them) an attempt resumes where the previous
    one stopped and gives the same result as a fresh parse, at a cost proportional to the
    bytes not examined before (plus a constant).
    """
    if progress is not None and progress.header is not None:
        return progress.header
    start = pos
    if limit - pos < 10:
        raise IndexError("request header incomplete")
    api_key, api_version = INT16.unpack_from(buf, pos)[0], INT16.unpack_from(buf, pos + 2)[0]
    correlation_id = INT32.unpack_from(buf, pos + 4)[0]
    client_len = INT16.unpack_from(buf, pos + 8)[0]
    pos += 10
    client_at = pos
    if client_len >= 0:
        if pos + client_len > limit:
            raise IndexError("client id incomplete")
        pos += client_len
    header_version = apis.request_header_version(api_key, api_version)
    if header_version >= 2:
        if progress is None:
            pos = skip_tagged_fields(buf, pos)
        else:
            pos = _skip_header_tags(buf, start, pos, progress)
        if pos > limit:
            raise IndexError("header tagged fields incomplete")
    client_id = (
        None if client_len < 0
        else bytes(buf[client_at : client_at + client_len]).decode("utf-8", "replace")
    )
    header = RequestHeader(
        api_key, api_version, correlation_id, client_id, header_version, pos - start
    )
    if progress is not None:
        progress.header = header
    return header


def _skip_header_tags(
    buf: bytes | bytearray | memoryview, start: int, pos: int, progress: HeaderProgress
) -> int:
    """``skip_tagged_fields(buf, pos)``, resumed from and recorded in ``progress`` (whose
    offsets count from ``start``): a field counts as read once its tag and size are."""
    if progress.tags_at >= 0:
        pos, left = start + progress.tags_at, progress.tags_left
    else:
        left, pos = read_uvarint(buf, pos)
    try:
        while left:
            _tag, at = read_uvarint(buf, pos)
            size, at = read_uvarint(buf, at)
            pos = at + size
            left -= 1
    finally:
        progress.tags_at, progress.tags_left = pos - start, left
    return pos


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


def produce_acks(
    buf: bytes | bytearray | memoryview, pos: int, limit: int, api_version: int
) -> int:
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
