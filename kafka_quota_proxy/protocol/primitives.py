"""The handful of Kafka primitive readers and writers the header and skim code needs.

Readers take ``(buffer, offset)`` and return ``(value, new_offset)``; they raise
``IndexError`` or ``struct.error`` when the buffer ends early, which callers turn into
"need more bytes" or ``MalformedFrame`` depending on whether the frame is complete.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

Buffer: TypeAlias = bytes | bytearray | memoryview

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 varint, at most 5 bytes (Kafka's unsigned varint is 32-bit)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("varint is longer than 5 bytes")


def write_uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError("unsigned varint cannot be negative")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """Skip a tagged-fields section; return the offset just past it."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    return pos


def read_tagged_fields(buf: Buffer, pos: int) -> tuple[list[tuple[int, int, int]], int]:
    """Read a tagged-fields section as ``[(tag, payload_start, payload_end)]``."""
    count, pos = read_uvarint(buf, pos)
    fields = []
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        fields.append((tag, pos, pos + size))
        pos += size
    return fields, pos


def encode_tagged_fields(fields: list[tuple[int, bytes]]) -> bytes:
    """Encode ``[(tag, payload)]`` (sorted by tag, as the spec requires)."""
    out = [write_uvarint(len(fields))]
    for tag, payload in sorted(fields, key=lambda f: f[0]):
        out.append(write_uvarint(tag))
        out.append(write_uvarint(len(payload)))
        out.append(payload)
    return b"".join(out)
