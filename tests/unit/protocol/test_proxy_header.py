"""PROXY protocol v1/v2 parser: every form of the spec, any split of the bytes, lying headers."""

from __future__ import annotations

import ipaddress
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.proxy_header import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    ProxyHeaderParser,
    _crc32c,
    encode_v1,
    encode_v2,
)

Accept = Literal["v1", "v2", "any"]
KAFKA = b"\x00\x00\x00\x14\x00\x12\x00\x03"  # the start of a Kafka request after the header


def parse(data: bytes, accept: Accept = "any") -> tuple[ProxyHeader, bytes]:
    parser = ProxyHeaderParser(accept)
    header = parser.feed(data)
    assert header is not None
    return header, parser.rest


def parse_exactly(data: bytes, accept: Accept = "any") -> tuple[ProxyHeader, int]:
    """Read as a socket caller would: exactly needed() bytes at a time."""
    parser = ProxyHeaderParser(accept)
    pos = 0
    while True:
        n = parser.needed()
        assert n > 0
        header = parser.feed(data[pos : pos + n])
        pos += n
        if header is not None:
            assert parser.needed() == 0 and parser.rest == b""
            return header, pos


def fails(data: bytes, reason: str, accept: Accept = "any") -> ProxyHeaderError:
    parser = ProxyHeaderParser(accept)
    with pytest.raises(ProxyHeaderError) as e:
        parser.feed(data)
    assert e.value.reason == reason
    assert isinstance(e.value, ProtocolError)
    with pytest.raises(ProxyHeaderError):
        parser.feed(b"more")  # a broken parser stays broken
    return e.value


# --- v1 ---------------------------------------------------------------------------------------


def test_v1_tcp4() -> None:
    header, rest = parse(b"PROXY TCP4 192.168.0.1 10.0.0.2 56324 9092\r\n" + KAFKA)
    assert header == ProxyHeader(1, "PROXY", ("192.168.0.1", 56324), ("10.0.0.2", 9092), {})
    assert rest == KAFKA


def test_v1_tcp6() -> None:
    header, rest = parse(b"PROXY TCP6 2001:DB8::1 ::ffff:10.0.0.2 65535 0\r\n")
    assert header.source == ("2001:db8::1", 65535)
    assert header.destination == ("::ffff:a00:2", 0)
    assert rest == b""


@pytest.mark.parametrize(
    "line", [b"PROXY UNKNOWN\r\n", b"PROXY UNKNOWN ffff:: 1.2.3.4 whatever goes here\r\n"]
)
def test_v1_unknown(line: bytes) -> None:
    header, rest = parse(line + KAFKA)
    assert header == ProxyHeader(1, "PROXY", None, None, {})
    assert rest == KAFKA


def test_v1_longest_line_is_accepted() -> None:
    addr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0"
    line = f"PROXY TCP6 {addr} {addr} 65535 65535\r\n".encode()
    assert len(line) == 104
    header, _ = parse(line)
    assert header.source == (addr, 65535)
    padded = b"PROXY UNKNOWN " + b"x" * (107 - 16) + b"\r\n"
    assert len(padded) == 107
    assert parse(padded)[0].source is None


def test_v1_line_too_long() -> None:
    line = b"PROXY UNKNOWN " + b"x" * (108 - 16) + b"\r\n"
    assert len(line) == 108
    fails(line, "proxy_header_too_long")
    # Fed a byte at a time, it fails at the 107th byte without a CRLF, not later.
    parser = ProxyHeaderParser("v1")
    for i, byte in enumerate(line):
        try:
            parser.feed(bytes([byte]))
        except ProxyHeaderError as e:
            assert e.reason == "proxy_header_too_long"
            assert i == 105  # the 106th byte is no CR: a CRLF cannot end by the 107th
            break
    else:
        pytest.fail("no error")
    fails(b"PROXY UNKNOWN " + b"x" * 200, "proxy_header_too_long")


@pytest.mark.parametrize(
    "line",
    [
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",  # LF without CR
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n",
        b"PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n",
        b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 08 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 +8 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n",  # an Arabic-Indic digit
        b"PROXY TCP4 1.2.3.\xff 5.6.7.8 1 2\r\n",
        b"PROXY \r\n",
        b"PROXY TCP4\r\n",
    ],
)
def test_v1_malformed(line: bytes) -> None:
    fails(line, "proxy_header_malformed")


# --- v2 ---------------------------------------------------------------------------------------


def test_v2_tcp4_with_tlvs() -> None:
    tlvs = {0x01: b"kafka", 0x02: b"broker.example.com", 0x05: b"\x01\x02", 0xE0: b""}
    data = encode_v2(("192.0.2.1", 40000), ("198.51.100.7", 9093), tlvs)
    assert data[:12] == V2_SIGNATURE and data[12] == 0x21 and data[13] == 0x11
    header, rest = parse(data + KAFKA)
    assert header == ProxyHeader(2, "PROXY", ("192.0.2.1", 40000), ("198.51.100.7", 9093), tlvs)
    assert rest == KAFKA


def test_v2_tcp6() -> None:
    data = encode_v2(("2001:db8::1", 1), ("2001:db8::2", 65535))
    assert data[13] == 0x21 and len(data) == 16 + 36
    header, _ = parse(data, "v2")
    assert header.source == ("2001:db8::1", 1)
    assert header.destination == ("2001:db8::2", 65535)
    assert header.tlvs == {}


def test_v2_local() -> None:
    data = encode_v2(None, None)
    assert data == V2_SIGNATURE + b"\x20\x00\x00\x00"
    header, rest = parse(data + KAFKA)
    assert header == ProxyHeader(2, "LOCAL", None, None, {})
    assert rest == KAFKA
    # LOCAL with an address block (a health check) still names nobody.
    block = bytes(12)
    local_inet = V2_SIGNATURE + b"\x20\x11\x00\x0c" + block
    assert parse(local_inet)[0] == ProxyHeader(2, "LOCAL", None, None, {})


def test_v2_unix_with_tlvs() -> None:
    paths = b"/run/client.sock".ljust(108, b"\x00") + b"/run/kafka.sock".ljust(108, b"\x00")
    tlv = b"\x02\x00\x04host"
    data = V2_SIGNATURE + b"\x21\x31" + (216 + len(tlv)).to_bytes(2, "big") + paths + tlv
    header, rest = parse(data + KAFKA)
    assert header == ProxyHeader(2, "PROXY", None, None, {0x02: b"host"})
    assert rest == KAFKA


def test_v2_unspec_proxy() -> None:
    header, _ = parse(V2_SIGNATURE + b"\x21\x00\x00\x03abc")
    assert header == ProxyHeader(2, "PROXY", None, None, {})


def test_v2_ssl_tlv_is_kept_whole_and_noop_dropped() -> None:
    ssl = b"\x07\x00\x00\x00\x00" + b"\x21\x00\x07TLSv1.3"  # client bits, verify, VERSION
    data = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0x20: ssl, 0x04: b"\x00" * 5})
    header, _ = parse(data)
    assert header.tlvs == {0x20: ssl}


def test_v2_crc32c() -> None:
    assert _crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    data = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0x01: b"h2"}, crc32c=True)
    header, _ = parse(data)
    assert set(header.tlvs) == {0x01, 0x03}
    corrupt = data[:20] + bytes([data[20] ^ 1]) + data[21:]
    fails(corrupt, "proxy_header_malformed")
    bad_size = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0x03: b"\x00\x00"})
    fails(bad_size, "proxy_header_malformed")


def _v2(ver_cmd: int, fam: int, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return V2_SIGNATURE + bytes([ver_cmd, fam]) + size.to_bytes(2, "big") + body


@pytest.mark.parametrize(
    "data",
    [
        _v2(0x11, 0x11, bytes(12)),  # version 1 in the v2 format
        _v2(0x31, 0x11, bytes(12)),  # version 3
        _v2(0x22, 0x11, bytes(12)),  # command 2
        _v2(0x21, 0x41, bytes(12)),  # family 4
        _v2(0x21, 0x13, bytes(12)),  # transport 3
        _v2(0x21, 0x12, bytes(12)),  # UDP over a stream
        _v2(0x21, 0x11, bytes(11)),  # shorter than AF_INET's 12 bytes
        _v2(0x21, 0x21, bytes(12)),  # shorter than AF_INET6's 36 bytes
        _v2(0x21, 0x31, bytes(108)),  # shorter than AF_UNIX's 216 bytes
        _v2(0x21, 0x11, bytes(12) + b"\x01\x00"),  # TLV header cut short
        _v2(0x21, 0x11, bytes(12) + b"\x01\x00\x05abc"),  # TLV longer than the header says
        _v2(0x21, 0x11, bytes(12) + b"\x01\x00\x01a\x01\x00\x01b"),  # TLV twice
    ],
)
def test_v2_malformed(data: bytes) -> None:
    fails(data, "proxy_header_malformed")


def test_v2_length_that_lies_long_swallows_no_more_than_it_says() -> None:
    """A length beyond the address block makes the parser wait for that many bytes; what it
    then reads as TLVs must be TLVs, or the header is malformed."""
    data = _v2(0x21, 0x11, bytes(12), length=12 + len(KAFKA))
    parser = ProxyHeaderParser("v2")
    assert parser.feed(data) is None
    assert parser.needed() == len(KAFKA)
    with pytest.raises(ProxyHeaderError) as e:
        parser.feed(KAFKA)
    assert e.value.reason == "proxy_header_malformed"


def test_v2_length_cap() -> None:
    data = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0xE0: b"x" * 1000})
    assert ProxyHeaderParser("v2").feed(data) is not None
    parser = ProxyHeaderParser("v2", max_v2_length=512)
    with pytest.raises(ProxyHeaderError) as e:
        parser.feed(data[:16])  # refused as soon as the length is known
    assert e.value.reason == "proxy_header_too_long"
    biggest = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0xE0: b"x" * (0xFFFF - 12 - 3)})
    assert len(biggest) == 16 + 0xFFFF
    header, _ = parse(biggest)
    assert len(header.tlvs[0xE0]) == 0xFFFF - 15


# --- which version, missing headers, garbage -------------------------------------------------


@pytest.mark.parametrize(
    ("data", "accept"),
    [
        (KAFKA, "any"),
        (b"GET / HTTP/1.1\r\n", "any"),
        (b"PROXZ TCP4", "any"),
        (b"\x16\x03\x01\x02\x00", "any"),  # a TLS ClientHello
        (b"\r\n\r\n\x00\r\nQUIT\r", "any"),  # v2 signature with its last byte wrong
        (b"proxy TCP4", "any"),
        (encode_v2(None, None), "v1"),
        (encode_v1(("1.2.3.4", 1), ("5.6.7.8", 2)), "v2"),
        (b"", "any"),
    ],
)
def test_missing(data: bytes, accept: Accept) -> None:
    if not data:
        parser = ProxyHeaderParser(accept)
        assert parser.feed(b"") is None
        return
    fails(data, "proxy_header_missing", accept)


def test_missing_is_seen_at_the_first_wrong_byte() -> None:
    parser = ProxyHeaderParser("any")
    assert parser.feed(b"PROX") is None
    with pytest.raises(ProxyHeaderError) as e:
        parser.feed(b"I")
    assert e.value.reason == "proxy_header_missing"


@pytest.mark.parametrize("accept", ["v1", "any"])
def test_accepted_versions_v1(accept: Accept) -> None:
    assert parse(b"PROXY UNKNOWN\r\n", accept)[0].version == 1


@pytest.mark.parametrize("accept", ["v2", "any"])
def test_accepted_versions_v2(accept: Accept) -> None:
    assert parse(encode_v2(None, None), accept)[0].version == 2


def test_bad_accept() -> None:
    with pytest.raises(ValueError):
        ProxyHeaderParser("v3")  # type: ignore[arg-type]


# --- needed(): reading exactly the header ----------------------------------------------------


def test_needed_v2_reads_fixed_part_then_length() -> None:
    data = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), {0x01: b"abc"})
    parser = ProxyHeaderParser("v2")
    assert parser.needed() == 16
    assert parser.feed(data[:10]) is None
    assert parser.needed() == 6
    assert parser.feed(data[10:16]) is None
    assert parser.needed() == len(data) - 16
    assert parser.feed(data[16:]) is not None
    assert parser.needed() == 0


def test_needed_v1_never_over_reads() -> None:
    parser = ProxyHeaderParser("v1")
    assert parser.needed() == 15
    assert parser.feed(b"PROXY UNKNOWN\r\n") is not None


@pytest.mark.parametrize("accept", ["v1", "v2", "any"])
@pytest.mark.parametrize(
    "data",
    [
        b"PROXY UNKNOWN\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        encode_v2(None, None),
        encode_v2(("2001:db8::1", 1), ("2001:db8::2", 2), {0x01: b"x"}),
    ],
)
def test_reading_needed_bytes_stops_exactly_at_the_header_end(data: bytes, accept: Accept) -> None:
    v2 = data.startswith(V2_SIGNATURE)
    if (accept == "v1" and v2) or (accept == "v2" and not v2):
        return
    header, consumed = parse_exactly(data + KAFKA, accept)
    assert consumed == len(data)
    assert header == parse(data)[0]


# --- encoders ---------------------------------------------------------------------------------


def test_encode_v1() -> None:
    assert encode_v1(("1.2.3.4", 5), ("6.7.8.9", 10)) == b"PROXY TCP4 1.2.3.4 6.7.8.9 5 10\r\n"
    assert encode_v1(("::1", 5), ("::2", 10)) == b"PROXY TCP6 ::1 ::2 5 10\r\n"
    assert encode_v1(None, None) == b"PROXY UNKNOWN\r\n"
    with pytest.raises(ValueError):
        encode_v1(("1.2.3.4", 5), ("::2", 10))
    with pytest.raises(ValueError):
        encode_v1(("1.2.3.4", 70000), ("6.7.8.9", 10))
    with pytest.raises(ValueError):
        encode_v2(("1.2.3.4", 5), ("::2", 10))
    with pytest.raises(ValueError):
        encode_v2(("1.2.3.4", 5), ("6.7.8.9", 10), {256: b""})
    with pytest.raises(ValueError):
        encode_v2(("1.2.3.4", 5), ("6.7.8.9", 10), {1: b"x" * 0xFFFF})


# --- any split of a valid header ------------------------------------------------------------

ports = st.integers(0, 0xFFFF)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
endpoints = st.one_of(
    st.tuples(st.tuples(ipv4, ports), st.tuples(ipv4, ports)),
    st.tuples(st.tuples(ipv6, ports), st.tuples(ipv6, ports)),
    st.just((None, None)),
)
tlv_maps = st.dictionaries(
    st.integers(0, 255).filter(lambda t: t not in (0x03, 0x04)), st.binary(max_size=40), max_size=4
)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, ProxyHeader]:
    src, dst = draw(endpoints)
    if draw(st.booleans()):
        data = encode_v1(src, dst)
        expected = ProxyHeader(1, "PROXY", src, dst, {})
    else:
        tlvs = draw(tlv_maps) if src is not None else {}
        data = encode_v2(src, dst, tlvs)
        command: Literal["PROXY", "LOCAL"] = "PROXY" if src is not None else "LOCAL"
        expected = ProxyHeader(2, command, src, dst, tlvs)
    if src is not None and dst is not None:
        norm = (
            (str(ipaddress.ip_address(src[0])), src[1]),
            (str(ipaddress.ip_address(dst[0])), dst[1]),
        )
        expected = ProxyHeader(expected.version, expected.command, norm[0], norm[1], expected.tlvs)
    return data, expected


@given(
    header=headers(),
    rest=st.binary(max_size=30),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_any_split_gives_the_same_header_and_rest(
    header: tuple[bytes, ProxyHeader], rest: bytes, cuts: list[int]
) -> None:
    data, expected = header
    stream = data + rest
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    parser = ProxyHeaderParser("any")
    results = [parser.feed(chunk) for chunk in chunks]
    assert results[-1] == expected
    assert parser.rest == rest
    first_done = next(i for i, r in enumerate(results) if r is not None)
    assert all(r == expected for r in results[first_done:])


@given(header=headers(), rest=st.binary(max_size=8))
def test_byte_at_a_time(header: tuple[bytes, ProxyHeader], rest: bytes) -> None:
    data, expected = header
    parser = ProxyHeaderParser("any")
    for i, byte in enumerate(data + rest):
        result = parser.feed(bytes([byte]))
        assert (result is not None) == (i >= len(data) - 1)
    assert parser.header == expected
    assert parser.rest == rest


@given(garbage=st.binary(min_size=1, max_size=200))
def test_garbage_never_crashes(garbage: bytes) -> None:
    accepts: tuple[Accept, ...] = ("v1", "v2", "any")
    for accept in accepts:
        parser = ProxyHeaderParser(accept)
        try:
            parser.feed(garbage)
        except ProxyHeaderError as e:
            assert e.reason in (
                "proxy_header_missing",
                "proxy_header_malformed",
                "proxy_header_too_long",
            )


@given(header=headers(), data=st.data())
def test_garbage_after_a_valid_prefix(
    header: tuple[bytes, ProxyHeader], data: st.DataObject
) -> None:
    raw, _ = header
    cut = data.draw(st.integers(0, len(raw) - 1))
    tail = data.draw(st.binary(min_size=1, max_size=300))
    parser = ProxyHeaderParser("any")
    try:
        result = parser.feed(raw[:cut] + tail)
    except ProxyHeaderError:
        return
    if result is not None:
        assert isinstance(result, ProxyHeader)
