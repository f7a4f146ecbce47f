"""The subject of a client certificate as Kafka names it: Java's ``X500Principal.getName()``.

Kafka's principal builder maps ``X500Principal.getName()`` (RFC 2253 format) through the
``ssl.principal.mapping.rules``; the proxy must write the name character for character the same,
or the rules would give another principal. The rules followed here are OpenJDK's
(``X500Name.getRFC2253Name``, ``RDN.toRFC2253String``, ``AVA.toRFC2253String``), read from the
subject's DER as the certificate holds it:

- the RDNs in reverse order of the certificate's sequence, joined by ``,`` without spaces; an
  empty subject is ``""``;
- the attributes of a multi-valued RDN in their DER order (a SET OF, sorted when encoded),
  joined by ``+``;
- the type as its RFC 2253 keyword, ``CN``, ``C``, ``L``, ``ST``, ``O``, ``OU``, ``STREET``,
  ``DC`` and ``UID`` only, any other type as its dotted OID (``emailAddress`` is
  ``1.2.840.113549.1.9.1``, ``serialNumber`` is ``2.5.4.5``);
- the value as ``#`` and the lowercase hex of its whole DER encoding (tag, length, content)
  when the type is an OID or the value is not one of PrintableString, T61String, IA5String,
  GeneralString, BMPString or UTF8String;
- otherwise the content bytes decoded by type (OpenJDK's ``AVA.getCharset``): UTF8String as
  UTF-8, BMPString as UTF-16BE, PrintableString, T61String, IA5String and GeneralString as
  ISO-8859-1, malformed bytes as U+FFFD; a BMPString holding a character beyond the BMP is
  refused (Java refuses the certificate); then escaped: a backslash before each of
  ``, = + < > # ; " \\`` wherever it stands (Java escapes ``=`` and every ``#``, more than
  RFC 2253 asks), NUL written ``\\00``, then a backslash before each leading and each trailing
  space or carriage return; every other character is kept as is.

These are the rules of OpenJDK 21 and later (checked against OpenJDK 25). OpenJDK 17 decodes
every string type as UTF-8 and accepts any BMPString: the names differ for a BMPString (``ab``
is ``\\00a\\00b`` there) and for non-ASCII bytes in the 8-bit types, and only there.
"""

from __future__ import annotations

from cryptography import x509

from kafka_quota_proxy.security.principal_mapping import PrincipalMapper

__all__ = ["distinguished_name", "subject_principal"]

_SEQUENCE, _SET, _OID, _VERSION = 0x30, 0x31, 0x06, 0xA0
_UTF8_STRING, _BMP_STRING = 0x0C, 0x1E
# Java's ``AVA.isDerString(value, false)`` and ``AVA.getCharset(value, false)``: PrintableString,
# T61String, IA5String, GeneralString, BMPString, UTF8String.
_CODECS = {
    0x13: "iso-8859-1",
    0x14: "iso-8859-1",
    0x16: "iso-8859-1",
    0x1B: "iso-8859-1",
    _BMP_STRING: "utf-16-be",
    _UTF8_STRING: "utf-8",
}
# Java's ``AVAKeyword`` entries that are RFC 2253 compliant.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
_ESCAPED = frozenset(',=+<>#;"\\')
_WHITE = frozenset(" \r")


def distinguished_name(der: bytes) -> str:
    """The subject of a DER certificate as Java's ``X500Principal.getName()`` writes it."""
    certificate = x509.load_der_x509_certificate(der)
    return _rfc2253(_subject(certificate.tbs_certificate_bytes))


def subject_principal(der: bytes | None, mapper: PrincipalMapper) -> str | None:
    """The principal name Kafka gives a client certificate; None when there is none.

    Without a certificate Kafka's principal is ``ANONYMOUS``, the caller's to say.
    Raises `security.principal_mapping.NoMatchingRule` when no rule applies.
    """
    if der is None:
        return None
    return mapper.name(distinguished_name(der))


def _rfc2253(name: bytes) -> str:
    """An X.501 ``Name`` (DER) in Java's RFC 2253 form."""
    rdns = [
        "+".join(_attribute(ava) for ava in _children(rdn, _SET))
        for rdn in _children(name, _SEQUENCE)
    ]
    return ",".join(reversed(rdns))


def _attribute(ava: bytes) -> str:
    oid, value = _children(ava, _SEQUENCE)
    oid_tag, oid_content, _ = _tlv(oid, 0)
    if oid_tag != _OID:
        raise ValueError("attribute type is not an OBJECT IDENTIFIER")
    dotted = _dotted(oid_content)
    keyword = _KEYWORDS.get(dotted, dotted)
    tag, content, _ = _tlv(value, 0)
    codec = _CODECS.get(tag)
    text = None if codec is None else content.decode(codec, "replace")
    if tag == _BMP_STRING and text is not None and any(ord(c) > 0xFFFF for c in text):
        raise ValueError("Illegal character in BMPString: beyond the Basic Multilingual Plane")
    if keyword[0].isdigit() or text is None:
        return f"{keyword}=#{value.hex()}"
    return f"{keyword}={_escape(text)}"


def _escape(value: str) -> str:
    """``AVA.toRFC2253String``'s escaping of a string value."""
    chars = "".join("\\" + c if c in _ESCAPED else "\\00" if c == "\0" else c for c in value)
    lead = 0
    while lead < len(chars) and chars[lead] in _WHITE:
        lead += 1
    trail = len(chars) - 1
    while trail >= 0 and chars[trail] in _WHITE:
        trail -= 1
    return "".join("\\" + c if i < lead or i > trail else c for i, c in enumerate(chars))


def _subject(tbs_certificate: bytes) -> bytes:
    """The subject ``Name`` of a TBSCertificate, as its DER bytes."""
    fields = _children(tbs_certificate, _SEQUENCE)
    if fields and fields[0][0] == _VERSION:
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if len(fields) < 5:
        raise ValueError("TBSCertificate has no subject")
    return fields[4]


def _children(element: bytes, tag: int) -> list[bytes]:
    """The encodings inside a constructed DER element of the given tag."""
    actual, content, end = _tlv(element, 0)
    if actual != tag or end != len(element):
        raise ValueError(f"expected one DER element of tag {tag:#04x}, found {actual:#04x}")
    children: list[bytes] = []
    offset = 0
    while offset < len(content):
        _, _, end = _tlv(content, offset)
        children.append(content[offset:end])
        offset = end
    return children


def _tlv(data: bytes, offset: int) -> tuple[int, bytes, int]:
    """The tag, the content and the end offset of the DER element at ``offset``."""
    if offset + 2 > len(data):
        raise ValueError("truncated DER")
    tag, length = data[offset], data[offset + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("DER tags of more than one byte are not supported")
    start = offset + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or start + count > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    end = start + length
    if end > len(data):
        raise ValueError("truncated DER")
    return tag, data[start:end], end


def _dotted(content: bytes) -> str:
    """An OBJECT IDENTIFIER's content as its dotted string."""
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = value << 7 | byte & 0x7F
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs or value:
        raise ValueError("bad OBJECT IDENTIFIER")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(arc) for arc in [first, arcs[0] - 40 * first, *arcs[1:]])
