"""The subject of a certificate as Java's ``X500Principal.getName()`` writes it; the expected
strings are what OpenJDK 25 prints for the same certificates."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.security.principal_mapping import NoMatchingRule, PrincipalMapper
from kafka_quota_proxy.security.x500 import distinguished_name, subject_principal

_KEY = ed25519.Ed25519PrivateKey.generate()
_ISSUER = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")])
_START = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


def _certificate(subject: x509.Name) -> bytes:
    """A DER certificate of ``subject``, signed by a throwaway key."""
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(_ISSUER)
        .public_key(_KEY.public_key())
        .serial_number(1)
        .not_valid_before(_START)
        .not_valid_after(_START + datetime.timedelta(days=1))
        .sign(_KEY, None)
    )
    return certificate.public_bytes(serialization.Encoding.DER)


def _name(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])


def test_rdns_in_reverse_order_with_rfc2253_keywords() -> None:
    subject = _name(
        (NameOID.COUNTRY_NAME, "US"),
        (NameOID.STATE_OR_PROVINCE_NAME, "MD"),
        (NameOID.LOCALITY_NAME, "Fulton"),
        (NameOID.ORGANIZATION_NAME, "mycp"),
        (NameOID.ORGANIZATIONAL_UNIT_NAME, "SME"),
        (NameOID.COMMON_NAME, "Duke"),
    )
    assert distinguished_name(_certificate(subject)) == "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US"


def test_an_email_address_is_its_oid_and_the_hex_of_its_der() -> None:
    subject = _name(
        (NameOID.ORGANIZATION_NAME, "Acme"),
        (NameOID.COMMON_NAME, "Duke"),
        (NameOID.EMAIL_ADDRESS, "duke@example.com"),
    )
    assert distinguished_name(_certificate(subject)) == (
        "1.2.840.113549.1.9.1=#161064756b65406578616d706c652e636f6d,CN=Duke,O=Acme"
    )


def test_types_without_an_rfc2253_keyword_are_oids_in_hex() -> None:
    subject = _name(
        (NameOID.STREET_ADDRESS, "1 Main St"),
        (NameOID.SERIAL_NUMBER, "42"),
        (NameOID.TITLE, "Dr"),
        (NameOID.COMMON_NAME, "x"),
    )
    assert distinguished_name(_certificate(subject)) == (
        "CN=x,2.5.4.12=#0c024472,2.5.4.5=#13023432,STREET=1 Main St"
    )


def test_a_comma_and_a_plus_are_escaped() -> None:
    subject = _name(
        (NameOID.ORGANIZATION_NAME, "Acme, Inc."), (NameOID.ORGANIZATIONAL_UNIT_NAME, "R+D")
    )
    assert distinguished_name(_certificate(subject)) == r"OU=R\+D,O=Acme\, Inc."


def test_special_characters_and_leading_and_trailing_spaces_are_escaped() -> None:
    subject = _name((NameOID.COMMON_NAME, ' #a=b;<>"\\ '))
    assert distinguished_name(_certificate(subject)) == r"CN=\ \#a\=b\;\<\>\"\\\ "
    # Java escapes every "#" and "=", not only a leading "#"; inner spaces stay
    subject = _name((NameOID.COMMON_NAME, "a#b c  "))
    assert distinguished_name(_certificate(subject)) == r"CN=a\#b c\ \ "


def test_nul_and_carriage_returns() -> None:
    subject = _name((NameOID.COMMON_NAME, "\ra\x00b\r"))
    assert distinguished_name(_certificate(subject)) == "CN=\\\ra\\00b\\\r"


def test_a_multi_valued_rdn_is_joined_by_plus_in_der_order() -> None:
    for attributes in (
        [(NameOID.USER_ID, "u1"), (NameOID.COMMON_NAME, "duke")],
        [(NameOID.COMMON_NAME, "duke"), (NameOID.USER_ID, "u1")],
    ):
        subject = x509.Name(
            [
                x509.RelativeDistinguishedName(
                    [x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "com")]
                ),
                x509.RelativeDistinguishedName(
                    [x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "example")]
                ),
                x509.RelativeDistinguishedName(
                    [x509.NameAttribute(oid, value) for oid, value in attributes]
                ),
            ]
        )
        # a SET OF is sorted when encoded: CN's encoding sorts before UID's
        assert distinguished_name(_certificate(subject)) == "CN=duke+UID=u1,DC=example,DC=com"


def test_values_are_decoded_by_string_type() -> None:
    def subject(value: str, kind: _ASN1Type) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, value, kind)])

    assert distinguished_name(_certificate(_name((NameOID.COMMON_NAME, "José 日本")))) == (
        "CN=José 日本"
    )
    assert distinguished_name(_certificate(subject("ab", _ASN1Type.BMPString))) == "CN=ab"
    # the 8-bit types are ISO-8859-1 to Java: the two UTF-8 bytes of "é" are two characters
    assert distinguished_name(_certificate(subject("é", _ASN1Type.T61String))) == "CN=Ã©"


def test_a_bmpstring_beyond_the_bmp_is_refused_as_java_does() -> None:
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, "a\U0001f600", _ASN1Type.BMPString)]
    )
    with pytest.raises(ValueError, match="BMPString"):
        distinguished_name(_certificate(subject))


def test_an_empty_subject_is_an_empty_name() -> None:
    assert distinguished_name(_certificate(x509.Name([]))) == ""


def test_subject_principal() -> None:
    der = _certificate(
        _name((NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers"), (NameOID.COMMON_NAME, "Duke"))
    )
    mapper = PrincipalMapper.parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L")
    assert subject_principal(der, mapper) == "duke"
    assert subject_principal(der, PrincipalMapper.parse()) == "CN=Duke,OU=ServiceUsers"
    assert subject_principal(None, mapper) is None
    with pytest.raises(NoMatchingRule):
        subject_principal(_certificate(_name((NameOID.COMMON_NAME, "x"))), mapper)


def test_not_a_certificate() -> None:
    with pytest.raises(ValueError):
        distinguished_name(b"\x30\x03\x02\x01\x01")


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=16))
def test_an_rfc4514_parser_reads_the_value_back(value: str) -> None:
    # An independent reader of RFC 2253/4514 strings (cryptography's) finds the same value.
    written = distinguished_name(_certificate(_name((NameOID.COMMON_NAME, value))))
    read = x509.Name.from_rfc4514_string(written)
    assert read.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == value
