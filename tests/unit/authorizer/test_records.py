"""ACL bindings as records of the compacted ACL topic: one canonical key per binding, a JSON
object for a creation, a tombstone for a deletion; anything else refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.authorizer.records import decode_record, encode_record, normal

R, P, Op, Perm = ResourceType, PatternType, AclOperation, AclPermissionType
ALICE = AclBinding(R.TOPIC, "orders-", P.PREFIXED, "User:alice", "*", Op.WRITE, Perm.ALLOW)


def test_a_creation_and_a_deletion() -> None:
    key, value = encode_record(ALICE, True)
    assert key == b'["TOPIC","orders-","PREFIXED","User:alice","*","WRITE","ALLOW"]'
    assert value == b'{"v":1}'
    assert decode_record(key, value) == (ALICE, True)
    key2, tombstone = encode_record(ALICE, False)
    assert (key2, tombstone) == (key, None)
    assert decode_record(key, None) == (ALICE, False)


def test_the_host_is_normalised_so_that_one_binding_is_one_key() -> None:
    java = AclBinding(R.GROUP, "g", P.LITERAL, "User:bob", "0:0:0:0:0:0:0:1", Op.READ,
                      Perm.DENY)
    short = AclBinding(R.GROUP, "g", P.LITERAL, "User:bob", "::1", Op.READ, Perm.DENY)
    assert encode_record(java, True) == encode_record(short, True)
    assert decode_record(*encode_record(java, True)) == (short, True)


def test_names_are_kept_as_they_are_non_ascii_included() -> None:
    b = AclBinding(R.TOPIC, 'naïve "quoted" \\ name', P.LITERAL, "User:zoë", "*", Op.ALL,
                   Perm.ALLOW)
    key, value = encode_record(b, True)
    assert "zoë".encode() in key
    assert decode_record(key, value) == (b, True)


def test_a_binding_that_cannot_be_created_is_not_encoded() -> None:
    for bad in (AclBinding(R.ANY, "t", P.LITERAL, "User:a", "*", Op.READ, Perm.ALLOW),
                AclBinding(R.TOPIC, "t", P.MATCH, "User:a", "*", Op.READ, Perm.ALLOW),
                AclBinding(R.TOPIC, "", P.LITERAL, "User:a", "*", Op.READ, Perm.ALLOW),
                AclBinding(R.TOPIC, "t", P.LITERAL, "alice", "*", Op.READ, Perm.ALLOW),
                AclBinding(R.CLUSTER, "c", P.LITERAL, "User:a", "*", Op.ALTER, Perm.ALLOW)):
        with pytest.raises(ValueError):
            encode_record(bad, True)


@pytest.mark.parametrize("key", [
    None,
    b"",
    b"\xff\xfe",
    b"not json",
    b'{"resource_type":"TOPIC"}',
    b'["TOPIC","t","LITERAL","User:a","*","READ"]',
    b'["TOPIC","t","LITERAL","User:a","*","READ","ALLOW","extra"]',
    b'["topic","t","LITERAL","User:a","*","READ","ALLOW"]',  # not Kafka's name
    b'[2,"t",3,"User:a","*",3,3]',  # codes, not names
    b'["TOPIC",1,"LITERAL","User:a","*","READ","ALLOW"]',
    b'["TOPIC","t","LITERAL",null,"*","READ","ALLOW"]',
    b'["ANY","t","LITERAL","User:a","*","READ","ALLOW"]',  # a filter's value
    b'["TOPIC","t","MATCH","User:a","*","READ","ALLOW"]',
    b'["TOPIC","t","LITERAL","User:a","*","ANY","ALLOW"]',
    b'["TOPIC","t","LITERAL","User:a","*","READ","UNKNOWN"]',
    b'["TOPIC","","LITERAL","User:a","*","READ","ALLOW"]',  # a problem()
    b'["TOPIC","t","LITERAL","alice","*","READ","ALLOW"]',
    b'["TOPIC", "t","LITERAL","User:a","*","READ","ALLOW"]',  # not canonical: a space
    b'["TOPIC","t","LITERAL","User:a","0:0:0:0:0:0:0:1","READ","ALLOW"]',  # host not normal
    b'["TOPIC","\\u0074","LITERAL","User:a","*","READ","ALLOW"]',  # an escape for "t"
])
def test_keys_that_are_not_a_canonical_binding_are_refused(key: bytes | None) -> None:
    with pytest.raises(ValueError):
        decode_record(key, b'{"v":1}')


@pytest.mark.parametrize("value", [b"", b"[]", b'"v"', b"1", b"null", b"{", b"\xff"])
def test_values_that_are_not_a_json_object_are_refused(value: bytes) -> None:
    key, _ = encode_record(ALICE, True)
    with pytest.raises(ValueError):
        decode_record(key, value)


def test_a_later_versions_fields_are_read_as_a_creation() -> None:
    key, _ = encode_record(ALICE, True)
    assert decode_record(key, b'{"v":2,"by":"User:admin"}') == (ALICE, True)


def _host() -> st.SearchStrategy[str]:
    """``*``, addresses (IPv6 also written out in full, as Java writes them) and any text."""
    return st.one_of(st.just("*"), st.ip_addresses().map(str),
                     st.ip_addresses(v=6).map(lambda a: a.exploded),
                     st.text(min_size=1, max_size=20))


@st.composite
def bindings(draw: st.DrawFn) -> AclBinding:
    rtype = draw(st.sampled_from([t for t in R if t not in (R.UNKNOWN, R.ANY)]))
    if rtype is R.CLUSTER:
        name, pattern = CLUSTER_NAME, P.LITERAL
    else:
        name = draw(st.text(min_size=1, max_size=40))
        pattern = draw(st.sampled_from([P.LITERAL, P.PREFIXED]))
    principal = (draw(st.text(min_size=1, max_size=10).filter(lambda s: ":" not in s)) + ":"
                 + draw(st.text(min_size=1, max_size=20)))
    return AclBinding(rtype, name, pattern, principal, draw(_host()),
                      draw(st.sampled_from([o for o in Op if o not in (Op.UNKNOWN, Op.ANY)])),
                      draw(st.sampled_from([Perm.ALLOW, Perm.DENY])))


@given(bindings(), st.booleans())
def test_every_binding_round_trips(binding: AclBinding, present: bool) -> None:
    key, value = encode_record(binding, present)
    assert decode_record(key, value) == (normal(binding), present)
    # one key per binding: encoding what was decoded gives the same bytes
    assert encode_record(normal(binding), present) == (key, value)


@given(bindings(), bindings())
def test_different_bindings_have_different_keys(a: AclBinding, b: AclBinding) -> None:
    if normal(a) != normal(b):
        assert encode_record(a, True)[0] != encode_record(b, True)[0]
