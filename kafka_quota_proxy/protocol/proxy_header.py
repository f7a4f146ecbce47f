"""PROXY protocol v1 and v2 headers (HAProxy's proxy-protocol.txt), sans-IO.

A load balancer in front of the proxy may open each connection with a PROXY header that names
the client it relays. ``ProxyHeaderParser`` reads it, fed any split of the bytes, and never
asks for a byte past the header (``needed()``), so a caller can read exactly the header from
a socket and hand the connection on (to TLS, to the Kafka framing) untouched. ``encode_v1`` and
``encode_v2`` write headers, for tests and for clients of the proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from kafka_quota_proxy.protocol.errors import ProtocolError

__all__ = [
    "V1_MAX_LENGTH",
    "V2_SIGNATURE",
    "ProxyHeader",
    "ProxyHeaderError",
    "ProxyHeaderParser",
    "encode_v1",
    "encode_v2",
]

V1_PREFIX: Final = b"PROXY "
V1_MAX_LENGTH: Final = 107  # "PROXY TCP6 <39> <39> 65535 65535\r\n" is the longest line
V1_MIN_LENGTH: Final = 15  # "PROXY UNKNOWN\r\n"
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED: Final = 16  # signature, version and command, family and transport, length
V2_MAX_LENGTH: Final = V2_FIXED + 0xFFFF

# v2 address families: (address block bytes, source/destination kind)
_AF_UNSPEC: Final = 0x0
_AF_INET: Final = 0x1
_AF_INET6: Final = 0x2
_AF_UNIX: Final = 0x3
_ADDRESS_BLOCK: Final = {_AF_UNSPEC: 0, _AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}
_TRANSPORT_STREAM: Final = 0x1
_TRANSPORT_DGRAM: Final = 0x2

PP2_TYPE_ALPN: Final = 0x01
PP2_TYPE_AUTHORITY: Final = 0x02
PP2_TYPE_CRC32C: Final = 0x03
PP2_TYPE_NOOP: Final = 0x04
PP2_TYPE_UNIQUE_ID: Final = 0x05
PP2_TYPE_SSL: Final = 0x20
PP2_TYPE_NETNS: Final = 0x30

Address = tuple[str, int]


class ProxyHeaderError(ProtocolError):
    """A connection that should start with a PROXY header and does not, or a broken one.

    ``reason``: ``proxy_header_missing`` (no signature of an accepted version),
    ``proxy_header_malformed``, ``proxy_header_too_long``.
    """

    reason = "proxy_header_malformed"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _malformed(message: str) -> ProxyHeaderError:
    return ProxyHeaderError("proxy_header_malformed", message)


@dataclass(frozen=True)
class ProxyHeader:
    """What a PROXY header says: the relayed client (``source``) and the address it connected
    to (``destination``), or None when the header does not tell (v1 UNKNOWN, v2 LOCAL, v2
    UNSPEC, AF_UNIX). ``tlvs``: v2 type-length-values by type (NOOP dropped; CRC32C checked)."""

    version: int
    command: Literal["PROXY", "LOCAL"]
    source: Address | None
    destination: Address | None
    tlvs: dict[int, bytes] = field(default_factory=dict)


class ProxyHeaderParser:
    """Reads one PROXY header off the start of a connection.

    ``feed(data)`` returns the header once complete, None while more bytes are needed; bytes
    after the header (in that feed or later ones) collect in ``rest``. Broken input raises
    ProxyHeaderError, again on every later feed.

    ``needed()`` is how many bytes the parser needs at least before it can decide; reading
    exactly that many never reads past the header. For v2 that is the 16 fixed bytes, then the
    length they give. A v1 line ends at its CRLF, which only reading finds: ``needed()`` is the
    bytes up to the shortest possible line (15) and then 1 at a time up to the CRLF. A caller
    that can peek (``MSG_PEEK``) or that keeps what it over-reads (asyncio's StreamReader,
    passing ``rest`` on) may feed larger chunks instead.
    """

    def __init__(
        self, accept: Literal["v1", "v2", "any"], *, max_v2_length: int = V2_MAX_LENGTH
    ) -> None:
        if accept not in ("v1", "v2", "any"):
            raise ValueError(f"accept must be 'v1', 'v2' or 'any', not {accept!r}")
        self._accept = accept
        self._max_v2 = max_v2_length
        self._buf = bytearray()
        self._version = 0  # 0 while unknown
        self._header: ProxyHeader | None = None
        self._error: ProxyHeaderError | None = None
        self.rest = b""

    @property
    def header(self) -> ProxyHeader | None:
        """The header once complete, else None."""
        return self._header

    def needed(self) -> int:
        """Bytes still to read before the parser can decide (0 once decided)."""
        if self._header is not None or self._error is not None:
            return 0
        have = len(self._buf)
        if self._version == 2:
            if have < V2_FIXED:
                return V2_FIXED - have
            return V2_FIXED + int.from_bytes(self._buf[14:16], "big") - have
        if self._version == 1 or self._accept == "v1":
            return max(V1_MIN_LENGTH - have, 1)
        if self._accept == "v2":
            return V2_FIXED - have
        return max(V1_MIN_LENGTH - have, 1)  # "any": both are at least 15 bytes long

    def feed(self, data: bytes) -> ProxyHeader | None:
        if self._error is not None:
            raise self._error
        if self._header is not None:
            self.rest += data
            return self._header
        self._buf += data
        try:
            header = self._parse()
        except ProxyHeaderError as e:
            self._error = e
            raise
        if header is not None:
            self._header = header
        return header

    def _parse(self) -> ProxyHeader | None:
        if self._version == 0:
            self._version = self._detect()
            if self._version == 0:
                return None
        return self._parse_v1() if self._version == 1 else self._parse_v2()

    def _detect(self) -> int:
        """1 or 2 once the buffer starts with a whole signature, 0 while it may still."""
        buf = bytes(self._buf)
        if self._accept != "v2":
            n = min(len(buf), len(V1_PREFIX))
            if buf[:n] == V1_PREFIX[:n]:
                return 1 if n == len(V1_PREFIX) else 0
        if self._accept != "v1":
            n = min(len(buf), len(V2_SIGNATURE))
            if buf[:n] == V2_SIGNATURE[:n]:
                return 2 if n == len(V2_SIGNATURE) else 0
        if self._accept == "v1" and buf[:1] == V2_SIGNATURE[:1]:
            message = "no PROXY v1 header (a v2 header, or no header) where v1 is required"
        elif self._accept == "v2" and buf[:1] == V1_PREFIX[:1]:
            message = "no PROXY v2 header (a v1 header, or no header) where v2 is required"
        else:
            message = f"connection does not start with a PROXY header: {buf[:16]!r}"
        raise ProxyHeaderError("proxy_header_missing", message)

    # --- v1 ---------------------------------------------------------------------------------

    def _parse_v1(self) -> ProxyHeader | None:
        end = self._buf.find(b"\n")
        if end < 0:
            if self._buf.endswith(b"\r"):
                if len(self._buf) >= V1_MAX_LENGTH:
                    raise ProxyHeaderError(
                        "proxy_header_too_long", "PROXY v1 line is longer than 107 bytes"
                    )
            elif len(self._buf) >= V1_MAX_LENGTH - 1:
                raise ProxyHeaderError(
                    "proxy_header_too_long", "PROXY v1 line has no CRLF within 107 bytes"
                )
            if b"\r" in self._buf[:-1]:
                raise _malformed("PROXY v1 line has a CR not followed by LF")
            return None
        if end + 1 > V1_MAX_LENGTH:
            raise ProxyHeaderError(
                "proxy_header_too_long", "PROXY v1 line is longer than 107 bytes"
            )
        if end == 0 or self._buf[end - 1] != 0x0D or b"\r" in self._buf[: end - 1]:
            raise _malformed("PROXY v1 line does not end with CRLF")
        line = bytes(self._buf[: end - 1])
        self.rest = bytes(self._buf[end + 1 :])
        self._buf.clear()
        return _parse_v1_line(line)

    # --- v2 ---------------------------------------------------------------------------------

    def _parse_v2(self) -> ProxyHeader | None:
        buf = self._buf
        if len(buf) < V2_FIXED:
            return None
        ver_cmd, fam = buf[12], buf[13]
        if ver_cmd >> 4 != 2:
            raise _malformed(f"PROXY v2 header has version {ver_cmd >> 4}, not 2")
        command = ver_cmd & 0x0F
        if command > 1:
            raise _malformed(f"PROXY v2 header has unknown command {command}")
        length = int.from_bytes(buf[14:16], "big")
        if V2_FIXED + length > self._max_v2:
            raise ProxyHeaderError(
                "proxy_header_too_long",
                f"PROXY v2 header of {V2_FIXED + length} bytes, more than {self._max_v2}",
            )
        family, transport = fam >> 4, fam & 0x0F
        if family not in _ADDRESS_BLOCK or transport > _TRANSPORT_DGRAM:
            raise _malformed(f"PROXY v2 header has unknown address family/transport {fam:#04x}")
        if command == 1 and length < _ADDRESS_BLOCK[family]:
            raise _malformed(
                f"PROXY v2 length {length} is shorter than the {_ADDRESS_BLOCK[family]} bytes "
                "of its address family"
            )
        if len(buf) < V2_FIXED + length:
            return None
        whole = bytes(buf[: V2_FIXED + length])
        self.rest = bytes(buf[V2_FIXED + length :])
        buf.clear()
        if command == 0:
            # LOCAL: the proxy's own connection (a health check); the block is to be discarded.
            return ProxyHeader(2, "LOCAL", None, None, {})
        if transport == _TRANSPORT_DGRAM:
            raise _malformed("PROXY v2 header relays a datagram (UDP) flow onto a stream")
        block = whole[V2_FIXED:]
        size = _ADDRESS_BLOCK[family]
        source, destination = _v2_addresses(family, block[:size])
        tlvs = _parse_tlvs(block[size:], whole) if family != _AF_UNSPEC else {}
        return ProxyHeader(2, "PROXY", source, destination, tlvs)


def _port(text: bytes) -> int:
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[:1] == b"0"):
        raise _malformed(f"PROXY v1 port {text!r} is not a decimal in 0-65535")
    port = int(text)
    if port > 0xFFFF:
        raise _malformed(f"PROXY v1 port {port} is beyond 65535")
    return port


def _v1_address(text: bytes, family: bytes) -> str:
    if b"%" in text:
        raise _malformed(f"PROXY v1 address {text!r} has a scope id")
    try:
        address = ipaddress.ip_address(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise _malformed(f"PROXY v1 address {text!r} is not an IP address") from None
    if (family == b"TCP4") != (address.version == 4):
        raise _malformed(f"PROXY v1 address {text!r} is not of family {family.decode()}")
    return str(address)


def _parse_v1_line(line: bytes) -> ProxyHeader:
    """``PROXY TCP4|TCP6 <src> <dst> <sport> <dport>`` or ``PROXY UNKNOWN[ <anything>]``."""
    parts = line.split(b" ")
    if len(parts) >= 2 and parts[1] == b"UNKNOWN":
        return ProxyHeader(1, "PROXY", None, None, {})  # the rest of the line is ignored
    if len(parts) != 6:
        raise _malformed(f"PROXY v1 line {line!r} is not 'PROXY <family> <src> <dst> <sp> <dp>'")
    family = parts[1]
    if family not in (b"TCP4", b"TCP6"):
        raise _malformed(f"PROXY v1 family {family!r} is not TCP4, TCP6 or UNKNOWN")
    source = (_v1_address(parts[2], family), _port(parts[4]))
    destination = (_v1_address(parts[3], family), _port(parts[5]))
    return ProxyHeader(1, "PROXY", source, destination, {})


def _v2_addresses(family: int, block: bytes) -> tuple[Address | None, Address | None]:
    if family == _AF_INET:
        return (
            (str(ipaddress.IPv4Address(block[0:4])), int.from_bytes(block[8:10], "big")),
            (str(ipaddress.IPv4Address(block[4:8])), int.from_bytes(block[10:12], "big")),
        )
    if family == _AF_INET6:
        return (
            (str(ipaddress.IPv6Address(block[0:16])), int.from_bytes(block[32:34], "big")),
            (str(ipaddress.IPv6Address(block[16:32])), int.from_bytes(block[34:36], "big")),
        )
    return None, None  # AF_UNSPEC, AF_UNIX


def _parse_tlvs(data: bytes, whole: bytes) -> dict[int, bytes]:
    tlvs: dict[int, bytes] = {}
    crc_at = -1
    pos = 0
    while pos < len(data):
        if len(data) - pos < 3:
            raise _malformed(f"PROXY v2 TLV header cut short ({len(data) - pos} bytes left)")
        kind = data[pos]
        size = int.from_bytes(data[pos + 1 : pos + 3], "big")
        if pos + 3 + size > len(data):
            raise _malformed(
                f"PROXY v2 TLV {kind:#04x} of {size} bytes overruns the header by "
                f"{pos + 3 + size - len(data)}"
            )
        value = data[pos + 3 : pos + 3 + size]
        if kind != PP2_TYPE_NOOP:
            if kind in tlvs:
                raise _malformed(f"PROXY v2 TLV {kind:#04x} appears twice")
            tlvs[kind] = value
            if kind == PP2_TYPE_CRC32C:
                crc_at = len(whole) - len(data) + pos + 3
        pos += 3 + size
    if crc_at >= 0:
        crc = tlvs[PP2_TYPE_CRC32C]
        if len(crc) != 4:
            raise _malformed("PROXY v2 CRC32C TLV is not 4 bytes")
        zeroed = whole[:crc_at] + b"\x00\x00\x00\x00" + whole[crc_at + 4 :]
        if _crc32c(zeroed) != int.from_bytes(crc, "big"):
            raise _malformed("PROXY v2 CRC32C checksum does not match the header")
    return tlvs


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE: Final = _crc32c_table()


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, RFC 4960 appendix B), as the PP2_TYPE_CRC32C TLV carries."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# --- encoding -------------------------------------------------------------------------------


def _ip(address: Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    host, port = address
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port} is not in 0-65535")
    return ipaddress.ip_address(host)


def encode_v1(src: Address | None, dst: Address | None) -> bytes:
    """A v1 line; ``PROXY UNKNOWN`` when either address is None."""
    if src is None or dst is None:
        return b"PROXY UNKNOWN\r\n"
    s, d = _ip(src), _ip(dst)
    if s.version != d.version:
        raise ValueError("source and destination are of different IP versions")
    family = "TCP4" if s.version == 4 else "TCP6"
    return f"PROXY {family} {s} {d} {src[1]} {dst[1]}\r\n".encode("ascii")


def encode_v2(
    src: Address | None,
    dst: Address | None,
    tlvs: Mapping[int, bytes] | None = None,
    *,
    crc32c: bool = False,
) -> bytes:
    """A v2 header: PROXY over TCP with the TLVs, or LOCAL when either address is None.
    ``crc32c`` appends a PP2_TYPE_CRC32C TLV with the header's checksum."""
    body = b""
    if src is None or dst is None:
        command, fam = 0x20, 0x00
    else:
        s, d = _ip(src), _ip(dst)
        if s.version != d.version:
            raise ValueError("source and destination are of different IP versions")
        command, fam = 0x21, (0x11 if s.version == 4 else 0x21)
        body = s.packed + d.packed + src[1].to_bytes(2, "big") + dst[1].to_bytes(2, "big")
    for kind, value in (tlvs or {}).items():
        if not 0 <= kind <= 0xFF or len(value) > 0xFFFF:
            raise ValueError(f"TLV {kind} does not fit (type 0-255, value up to 65535 bytes)")
        body += bytes([kind]) + len(value).to_bytes(2, "big") + value
    if crc32c:
        body += bytes([PP2_TYPE_CRC32C]) + (4).to_bytes(2, "big") + b"\x00" * 4
    if len(body) > 0xFFFF:
        raise ValueError(f"PROXY v2 body of {len(body)} bytes exceeds 65535")
    header = V2_SIGNATURE + bytes([command, fam]) + len(body).to_bytes(2, "big") + body
    if crc32c:
        header = header[:-4] + _crc32c(header).to_bytes(4, "big")
    return header
