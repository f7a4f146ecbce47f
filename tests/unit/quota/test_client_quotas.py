"""DescribeClientQuotas / AlterClientQuotas as Kafka's ClientQuotasImage and
ClientQuotaControlManager: one test per rule D2-D14, A2-A17 of the issue-17 spec, then the
bridge to quota.entities and the quota-topic records."""

from __future__ import annotations

import math

import pytest

from kafka_quota_proxy.quota.client_quotas import (
    CLIENT_ID,
    IP,
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    USER,
    AlterEntry,
    AlterResult,
    Change,
    ClientQuotaError,
    Entity,
    FilterComponent,
    Op,
    alter,
    apply,
    byte_rate_quotas,
    decode_record,
    describe,
    encode_record,
    entity_key,
    from_entity_key,
    keys_for,
)
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType

PBR = "producer_byte_rate"
CBR = "consumer_byte_rate"
CCR = "connection_creation_rate"

ALICE: Entity = ((USER, "alice"),)
BOB: Entity = ((USER, "bob"),)
USER_DEFAULT: Entity = ((USER, None),)
APP: Entity = ((CLIENT_ID, "app"),)
CLIENT_DEFAULT: Entity = ((CLIENT_ID, None),)
ALICE_APP: Entity = ((CLIENT_ID, "app"), (USER, "alice"))
ALICE_ANY_CLIENT: Entity = ((CLIENT_ID, None), (USER, "alice"))
DEFAULT_APP: Entity = ((CLIENT_ID, "app"), (USER, None))
IP_HOST: Entity = ((IP, "10.0.0.1"),)
IP_DEFAULT: Entity = ((IP, None),)

QUOTAS: dict[Entity, dict[str, float]] = {
    ALICE: {PBR: 100.0},
    BOB: {PBR: 200.0},
    USER_DEFAULT: {PBR: 300.0},
    APP: {CBR: 400.0},
    CLIENT_DEFAULT: {CBR: 500.0},
    ALICE_APP: {PBR: 600.0, CBR: 601.0},
    ALICE_ANY_CLIENT: {PBR: 700.0},
    DEFAULT_APP: {PBR: 800.0},
}
IP_QUOTAS: dict[Entity, dict[str, float]] = {IP_HOST: {CCR: 10.0}, IP_DEFAULT: {CCR: 20.0}}


def fc(entity_type: str, match_type: int, match: str | None = None) -> FilterComponent:
    return FilterComponent(entity_type, match_type, match)


def describe_error(components: list[FilterComponent]) -> tuple[int, str]:
    with pytest.raises(ClientQuotaError) as info:
        describe(QUOTAS, components, False)
    return info.value.code, info.value.message


def entities(found: list[tuple[Entity, dict[str, float]]]) -> list[Entity]:
    return [entity for entity, _ in found]


def one(components: tuple[tuple[str, str | None], ...], *ops: Op,
        quotas: dict[Entity, dict[str, float]] | None = None
        ) -> tuple[AlterResult, list[Change]]:
    results, changes = alter(QUOTAS if quotas is None else quotas,
                             [AlterEntry(components, ops)])
    assert len(results) == 1
    return results[0], changes


def set_(key: str, value: float) -> Op:
    return Op(key, value)


def remove(key: str) -> Op:
    return Op(key, 0.0, remove=True)


# --- DescribeClientQuotas (ClientQuotasImage.describe) -------------------------------------

def test_d2_empty_entity_type() -> None:
    assert describe_error([fc("", MATCH_EXACT, "x")]) == (42, "Invalid empty entity type.")


def test_d3_same_type_twice() -> None:
    assert describe_error([fc(USER, MATCH_EXACT, "alice"), fc(USER, MATCH_ANY)]) == (
        42, "Entity type user cannot appear more than once in the filter.")


def test_d4_unsupported_entity_type() -> None:
    assert describe_error([fc("foo", MATCH_ANY)]) == (35, "Unsupported entity type foo")


def test_d4_ip_is_a_supported_entity_type() -> None:
    """KIP-612: ``ip`` is one of Kafka's three entity types (connection_creation_rate)."""
    found = describe(IP_QUOTAS, [fc(IP, MATCH_ANY)], False)
    assert entities(found) == [IP_DEFAULT, IP_HOST]
    found = describe(IP_QUOTAS, [fc(IP, MATCH_DEFAULT)], True)
    assert found == [(IP_DEFAULT, {CCR: 20.0})]
    found = describe({**QUOTAS, **IP_QUOTAS}, [fc(IP, MATCH_EXACT, "10.0.0.1")], False)
    assert found == [(IP_HOST, {CCR: 10.0})]


def test_d5_exact_without_match() -> None:
    assert describe_error([fc(USER, MATCH_EXACT, None)]) == (
        42, "Request specified MATCH_TYPE_EXACT, but set match string to null.")


def test_d6_default_with_match() -> None:
    assert describe_error([fc(USER, MATCH_DEFAULT, "x")]) == (
        42, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")


def test_d7_any_with_match() -> None:
    assert describe_error([fc(USER, MATCH_ANY, "x")]) == (
        42, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")


def test_d8_unknown_match_type() -> None:
    assert describe_error([fc(USER, 3)]) == (42, "Unknown match type 3")


@pytest.mark.parametrize("other", [fc(USER, MATCH_EXACT, "alice"), fc(CLIENT_ID, MATCH_ANY)])
def test_d9_ip_with_user_or_client_id(other: FilterComponent) -> None:
    message = ("Invalid entity filter component combination. IP filter component should not be "
               "used with user or clientId filter component.")
    assert describe_error([fc(IP, MATCH_ANY), other]) == (42, message)
    assert describe_error([other, fc(IP, MATCH_DEFAULT)]) == (42, message)


def test_d10_validation_error_is_request_level() -> None:
    # A valid component first: no partial result, the error carries its code and message.
    with pytest.raises(ClientQuotaError) as info:
        describe(QUOTAS, [fc(USER, MATCH_EXACT, "alice"), fc(CLIENT_ID, 7)], True)
    assert (info.value.code, info.value.message) == (42, "Unknown match type 7")
    assert str(info.value) == "Unknown match type 7"


def test_d11_no_components() -> None:
    found = describe(QUOTAS, [], False)
    assert found == sorted(found, key=lambda item: [(t, n is not None, n or "")
                                                    for t, n in item[0]])
    assert {entity: values for entity, values in found} == QUOTAS
    assert describe(QUOTAS, [], True) == []


def test_d12_exact_non_strict_and_strict() -> None:
    alice = [fc(USER, MATCH_EXACT, "alice")]
    assert entities(describe(QUOTAS, alice, False)) == [ALICE_ANY_CLIENT, ALICE_APP, ALICE]
    assert describe(QUOTAS, alice, True) == [(ALICE, {PBR: 100.0})]
    both = [fc(USER, MATCH_EXACT, "alice"), fc(CLIENT_ID, MATCH_EXACT, "app")]
    assert describe(QUOTAS, both, True) == [(ALICE_APP, {PBR: 600.0, CBR: 601.0})]


def test_d13_default_matches_only_the_default_name() -> None:
    found = describe(QUOTAS, [fc(USER, MATCH_DEFAULT)], False)
    assert entities(found) == [DEFAULT_APP, USER_DEFAULT]
    assert describe(QUOTAS, [fc(USER, MATCH_DEFAULT)], True) == [(USER_DEFAULT, {PBR: 300.0})]
    # an exact match on the literal name "<default>" is not the default entity
    assert describe(QUOTAS, [fc(USER, MATCH_EXACT, "<default>")], False) == []


def test_d14_any_includes_the_default_name() -> None:
    found = describe(QUOTAS, [fc(CLIENT_ID, MATCH_ANY)], False)
    assert entities(found) == [CLIENT_DEFAULT, ALICE_ANY_CLIENT, APP, DEFAULT_APP, ALICE_APP]
    strict = describe(QUOTAS, [fc(CLIENT_ID, MATCH_ANY)], True)
    assert entities(strict) == [CLIENT_DEFAULT, APP]


# --- AlterClientQuotas (ClientQuotaControlManager.alterClientQuotas) -----------------------

def test_a2_empty_entity() -> None:
    result, changes = one((), set_(PBR, 1.0))
    assert result == AlterResult((), 42, "Invalid empty client quota entity")
    assert changes == []


def test_a3_unknown_entity_type() -> None:
    result, changes = one((("foo", "x"),), set_(PBR, 1.0))
    assert result == AlterResult((("foo", "x"),), 42, "Unhandled client quota entity type: foo")
    assert changes == []


def test_a3_ip_is_a_handled_entity_type() -> None:
    """KIP-612: an ``ip`` entity takes connection_creation_rate."""
    result, changes = one(((IP, "10.0.0.1"),), set_(CCR, 5.0))
    assert (result.error_code, result.error_message, changes) == (
        0, None, [Change(IP_HOST, CCR, 5.0)])
    result, changes = one(IP_DEFAULT, set_(CCR, 2.0))
    assert (result.error_code, changes) == (0, [Change(IP_DEFAULT, CCR, 2.0)])


@pytest.mark.parametrize("entity_type", [USER, CLIENT_ID, IP])
def test_a4_empty_name(entity_type: str) -> None:
    key = CCR if entity_type == IP else PBR
    result, changes = one(((entity_type, ""),), set_(key, 1.0))
    assert (result.error_code, result.error_message) == (42, f"Empty {entity_type} not supported")
    assert changes == []
    # the null name is the default entity, and valid
    result, changes = one(((entity_type, None),), set_(key, 1.0))
    assert (result.error_code, changes) == (0, [Change(((entity_type, None),), key, 1.0)])


def test_a5_ip_with_user() -> None:
    result, changes = one(((IP, "10.0.0.1"), (USER, "alice")), set_(CCR, 1.0))
    assert (result.error_code, result.error_message) == (
        42, "Invalid quota entity combination, IP entity should"  # sic: "shouldnot"
        "not be combined with User or ClientId")
    assert result.components == ((IP, "10.0.0.1"), (USER, "alice"))
    assert changes == []


def test_a6_invalid_ip() -> None:
    result, changes = one(((IP, "not an ip!"),), set_(CCR, 1.0))
    assert (result.error_code, result.error_message) == (
        42, "not an ip! is not a valid IP or resolvable host.")
    assert changes == []
    for name in (None, "10.0.0.1", "::1", "2001:db8::7"):
        result, _ = one(((IP, name),), set_(CCR, 1.0))
        assert result.error_code == 0, name


def test_a6_host_names_are_not_resolved() -> None:
    # Kafka would resolve "localhost"; this module accepts literal addresses only.
    result, _ = one(((IP, "localhost"),), set_(CCR, 1.0))
    assert (result.error_code, result.error_message) == (
        42, "localhost is not a valid IP or resolvable host.")


def test_a7_key_not_valid_for_the_entity() -> None:
    result, changes = one(ALICE, set_(CCR, 1.0))
    assert (result.error_code, result.error_message) == (
        42, "Invalid configuration key connection_creation_rate")
    result, changes2 = one(IP_HOST, set_(PBR, 1.0))
    assert (result.error_code, result.error_message) == (
        42, "Invalid configuration key producer_byte_rate")
    assert changes == changes2 == []


@pytest.mark.parametrize("key", [PBR, "request_percentage"])
@pytest.mark.parametrize("value", [0.0, -0.0, -5.0])
def test_a8_value_not_greater_than_zero(key: str, value: float) -> None:
    result, changes = one(APP, set_(key, value))
    assert (result.error_code, result.error_message) == (42, f"Quota {key} must be greater than 0")
    assert changes == []


def test_a9_fractional_value_for_integral_keys() -> None:
    result, _ = one(ALICE, set_(PBR, 1.5))
    assert (result.error_code, result.error_message) == (
        42, "producer_byte_rate cannot be a fractional value.")
    result, _ = one(IP_DEFAULT, set_(CCR, 1.5))
    assert (result.error_code, result.error_message) == (
        42, "connection_creation_rate cannot be a fractional value.")
    # getErrorForIntegralQuotaValue: abs(value % 1.0) > 1e-6, so the tolerance is one-sided
    result, changes = one(BOB, set_(CBR, 5.0000001))
    assert (result.error_code, changes) == (0, [Change(BOB, CBR, 5.0000001)])
    result, _ = one(BOB, set_(CBR, 4.9999999))
    assert result.error_message == "consumer_byte_rate cannot be a fractional value."


def test_a10_too_large() -> None:
    result, _ = one(IP_DEFAULT, set_(CCR, 3e9))
    assert (result.error_code, result.error_message) == (
        42, "Proposed value for connection_creation_rate is too large for an INT.")
    result, _ = one(IP_DEFAULT, set_(CCR, 2147483647.0))
    assert result.error_code == 0
    result, _ = one(ALICE, set_(PBR, 2.0**64))
    assert (result.error_code, result.error_message) == (
        42, "Proposed value for producer_byte_rate is too large for a LONG.")
    result, _ = one(ALICE, set_(PBR, 2.0**63))  # Long.MAX_VALUE as a double
    assert result.error_code == 0


@pytest.mark.parametrize("key", ["request_percentage", "controller_mutation_rate"])
def test_a11_double_keys_take_fractions(key: str) -> None:
    result, changes = one(ALICE_APP, set_(key, 1.5))
    assert (result.error_code, result.error_message) == (0, None)
    assert changes == [Change(ALICE_APP, key, 1.5)]


def test_a12_one_bad_op_rejects_the_whole_entity() -> None:
    results, changes = alter(QUOTAS, [
        # request_percentage is the last key Kafka's HashMap visits: the others passed first
        AlterEntry(ALICE, (set_("request_percentage", -1.0), set_(PBR, 1.0), set_(CBR, 5.0),
                           set_("controller_mutation_rate", 3.0))),
        AlterEntry(BOB, (set_(CBR, 5.0),)),
    ])
    assert results == [AlterResult(ALICE, 42, "Quota request_percentage must be greater than 0"),
                       AlterResult(BOB, 0, None)]
    assert changes == [Change(BOB, CBR, 5.0)]


def test_a13_remove_of_unset_or_unknown_key() -> None:
    result, changes = one(ALICE, remove(CBR), remove("no_such_key"), remove(CCR))
    assert (result.error_code, result.error_message, changes) == (0, None, [])
    result, changes = one(ALICE, remove(PBR))
    assert changes == [Change(ALICE, PBR, None)]


@pytest.mark.parametrize(("components", "printed"), [
    (ALICE, "{user=alice}"),
    (USER_DEFAULT, "{user=null}"),
    # java.util.HashMap order: client-id comes first, whatever the request order
    (((USER, "alice"), (CLIENT_ID, "app")), "{client-id=app, user=alice}"),
    (((CLIENT_ID, "app"), (USER, "alice")), "{client-id=app, user=alice}"),
])
def test_a14_duplicate_key(components: tuple[tuple[str, str | None], ...], printed: str) -> None:
    result, changes = one(components, set_(CBR, 5.0), set_(PBR, 1.0), set_(CBR, 6.0))
    assert (result.error_code, result.error_message) == (
        42, f"Ignoring duplicate entity ClientQuotaEntity(entries={printed})")
    assert changes == []


def test_a15_same_entity_twice() -> None:
    results, changes = alter(QUOTAS, [
        AlterEntry(((USER, "alice"), (CLIENT_ID, "app")), (set_(PBR, 1.0),)),
        AlterEntry(BOB, (set_(PBR, 2.0),)),
        AlterEntry(ALICE_APP, (set_(CBR, 3.0),)),
    ])
    assert results == [
        AlterResult(ALICE_APP, 42, "Ignoring duplicate entity "
                    "ClientQuotaEntity(entries={client-id=app, user=alice})"),
        AlterResult(BOB, 0, None),
    ]
    # the first entry's change is still applied, the second entry's is not
    assert changes == [Change(ALICE_APP, PBR, 1.0), Change(BOB, PBR, 2.0)]


def test_a15_a_rejected_first_entry_still_counts() -> None:
    results, changes = alter(QUOTAS, [AlterEntry(BOB, (set_(PBR, -1.0),)),
                                      AlterEntry(BOB, (set_(PBR, 2.0),))])
    assert results == [AlterResult(BOB, 42, "Ignoring duplicate entity "
                                            "ClientQuotaEntity(entries={user=bob})")]
    assert changes == []


def test_a16_validate_only_is_not_applying() -> None:
    before = {entity: dict(values) for entity, values in QUOTAS.items()}
    entries = [AlterEntry(ALICE, (set_(PBR, 1.0),)), AlterEntry(APP, (remove(CBR),))]
    results, changes = alter(QUOTAS, entries)
    assert results == [AlterResult(ALICE, 0, None), AlterResult(APP, 0, None)]
    assert changes == [Change(ALICE, PBR, 1.0), Change(APP, CBR, None)]
    # alter itself changes nothing: the same results again, describe shows no change
    assert before == QUOTAS
    assert alter(QUOTAS, entries) == (results, changes)
    assert describe(QUOTAS, [fc(USER, MATCH_EXACT, "alice")], True) == [(ALICE, {PBR: 100.0})]
    after = apply(QUOTAS, changes)
    assert after[ALICE] == {PBR: 1.0} and APP not in after
    assert before == QUOTAS


def test_a17_success_and_no_entries() -> None:
    result, changes = one(((USER, "carol"),), set_(PBR, 1024.0))
    assert result == AlterResult(((USER, "carol"),), 0, None)
    assert changes == [Change(((USER, "carol"),), PBR, 1024.0)]
    assert alter(QUOTAS, []) == ([], [])


# --- Alter: further Kafka details ------------------------------------------------------------

def test_setting_the_current_value_is_no_change() -> None:
    result, changes = one(ALICE_APP, set_(PBR, 600.0), set_(CBR, 602.0))
    assert result.error_code == 0
    assert changes == [Change(ALICE_APP, CBR, 602.0)]


def test_zero_ops_still_validates_the_entity() -> None:
    assert one(ALICE)[0] == AlterResult(ALICE, 0, None)
    assert one(((USER, ""),))[0].error_message == "Empty user not supported"


def test_repeated_type_in_one_entry_last_wins() -> None:
    result, changes = one(((USER, ""), (USER, "alice")), set_(PBR, 5.0))
    assert result == AlterResult(ALICE, 0, None)
    assert changes == [Change(ALICE, PBR, 5.0)]


@pytest.mark.parametrize("reverse", [False, True])
def test_first_error_in_java_hash_map_order(reverse: bool) -> None:
    # HashMap buckets: consumer_byte_rate before producer_byte_rate; user before foo.
    ops = [set_(PBR, 1.5), set_(CBR, -1.0)]
    result, _ = one(ALICE, *(reversed(ops) if reverse else ops))
    assert result.error_message == "Quota consumer_byte_rate must be greater than 0"
    components = [("foo", "x"), (USER, "")]
    result, _ = one(tuple(reversed(components) if reverse else components), set_(PBR, 1.0))
    assert result.error_message == "Empty user not supported"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("request_percentage", math.nan, "Quota request_percentage must be a finite number"),
    ("controller_mutation_rate", math.inf,
     "Quota controller_mutation_rate must be a finite number"),
    (PBR, math.nan, "Quota producer_byte_rate must be a finite number"),
    # Kafka's own checks come first
    (PBR, math.inf, "Proposed value for producer_byte_rate is too large for a LONG."),
    (PBR, -math.inf, "Quota producer_byte_rate must be greater than 0"),
])
def test_non_finite_values_are_rejected(key: str, value: float, message: str) -> None:
    result, changes = one(ALICE, set_(key, value))
    assert (result.error_code, result.error_message, changes) == (42, message, [])


def test_apply() -> None:
    changes = [Change(ALICE, PBR, None), Change(ALICE_APP, PBR, None),
               Change(((USER, "carol"),), CBR, 9.0), Change(BOB, PBR, 201.0),
               Change(((USER, "nobody"),), PBR, None)]
    after = apply(QUOTAS, changes)
    assert ALICE not in after  # its last key went
    assert after[ALICE_APP] == {CBR: 601.0}
    assert after[((USER, "carol"),)] == {CBR: 9.0}
    assert after[BOB] == {PBR: 201.0}
    assert ((USER, "nobody"),) not in after
    assert QUOTAS[ALICE] == {PBR: 100.0} and QUOTAS[BOB] == {PBR: 200.0}


def test_keys_for() -> None:
    client = {PBR, CBR, "request_percentage", "controller_mutation_rate"}
    assert keys_for(ALICE) == keys_for(APP) == keys_for(ALICE_APP) == keys_for(USER_DEFAULT) \
        == client
    assert keys_for(IP_HOST) == keys_for(IP_DEFAULT) == {CCR}
    for bad in [(), (("foo", "x"),), ((IP, None), (USER, None)), ((USER, "a"), (CLIENT_ID, "b"))]:
        with pytest.raises(ValueError):
            keys_for(bad)


# --- The bridge to quota.entities -----------------------------------------------------------

@pytest.mark.parametrize(("entity", "key"), [
    (ALICE, EntityKey("alice", None)),
    (USER_DEFAULT, EntityKey(DEFAULT, None)),
    (APP, EntityKey(None, "app")),
    (CLIENT_DEFAULT, EntityKey(None, DEFAULT)),
    (ALICE_APP, EntityKey("alice", "app")),
    (ALICE_ANY_CLIENT, EntityKey("alice", DEFAULT)),
    (DEFAULT_APP, EntityKey(DEFAULT, "app")),
    (((CLIENT_ID, None), (USER, None)), EntityKey(DEFAULT, DEFAULT)),
    (((USER, "<default>"),), EntityKey("<default>", None)),
])
def test_entity_key_round_trip(entity: Entity, key: EntityKey) -> None:
    assert entity_key(entity) == key
    assert from_entity_key(key) == entity


def test_entity_key_of_ip_and_invalid_entities() -> None:
    assert entity_key(IP_HOST) is None and entity_key(IP_DEFAULT) is None
    for bad in [(), ((USER, ""),), ((USER, "a"), (USER, "b")), (("foo", "x"),)]:
        with pytest.raises(ValueError):
            entity_key(bad)


def test_byte_rate_quotas() -> None:
    quotas = {**QUOTAS, **IP_QUOTAS,
              ALICE: {PBR: 100.0, "request_percentage": 50.0, "controller_mutation_rate": 3.0}}
    by_type = byte_rate_quotas(quotas)
    assert set(by_type) == set(QuotaType)
    assert by_type[QuotaType.REQUEST] == {EntityKey("alice", None): 50.0}
    assert by_type[QuotaType.FETCH] == {EntityKey(None, "app"): 400.0,
                                        EntityKey(None, DEFAULT): 500.0,
                                        EntityKey("alice", "app"): 601.0}
    assert by_type[QuotaType.PRODUCE][EntityKey("alice", DEFAULT)] == 700.0
    assert len(by_type[QuotaType.PRODUCE]) == 6
    assert byte_rate_quotas({}) == {qt: {} for qt in QuotaType}


# --- Quota-topic records ----------------------------------------------------------------------

def test_record_format() -> None:
    assert encode_record(Change(ALICE_ANY_CLIENT, PBR, 100.0)) == (
        b'{"entity":[["client-id",null],["user","alice"]],"key":"producer_byte_rate"}',
        b'{"value":100.0}')
    assert encode_record(Change(ALICE, PBR, None)) == (
        b'{"entity":[["user","alice"]],"key":"producer_byte_rate"}', None)


@pytest.mark.parametrize("change", [
    Change(ALICE, PBR, 100.0),
    Change(ALICE, PBR, None),
    Change(USER_DEFAULT, CBR, 1.0),
    Change(((CLIENT_ID, None), (USER, None)), "request_percentage", 0.1 + 0.2),
    Change(((CLIENT_ID, "app \"x\"\\"), (USER, "jos\u00e9 \U0001f600")), PBR, 2.0**63),
    Change(((USER, "<default>"),), "controller_mutation_rate", 5e-324),
    Change(APP, CBR, 1.7976931348623157e308),
    Change(IP_HOST, CCR, 5.0),
    Change(((IP, "2001:db8::1"),), CCR, None),
    Change(IP_DEFAULT, CCR, 2147483647.0),
    Change(ALICE, "a_key_from_an_older_version", None),  # a tombstone may remove any key
])
def test_record_round_trip(change: Change) -> None:
    key, value = encode_record(change)
    decoded = decode_record(key, value)
    assert decoded == change
    assert type(decoded.entity) is tuple and all(type(c) is tuple for c in decoded.entity)
    assert encode_record(decoded) == (key, value)


K = b'{"entity":[["user","alice"]],"key":"producer_byte_rate"}'


@pytest.mark.parametrize(("key", "value", "error"), [
    (b"not json", b'{"value":1.0}', "key is not valid JSON"),
    (b"\xff\xfe", None, "key is not valid JSON"),
    (b"[]", None, "expected fields entity and key"),
    (b'{"entity":[["user","alice"]]}', None, "expected fields entity and key"),
    (b'{"entity":[["user","alice"]],"key":"producer_byte_rate","x":1}', None,
     "expected fields entity and key"),
    (b'{"entity":[["user","alice"]],"key":"a","key":"b"}', None, "duplicate field"),
    (b'{"entity":"user","key":"producer_byte_rate"}', None, "entity is not [[type, name], ...]"),
    (b'{"entity":[["user"]],"key":"producer_byte_rate"}', None, "entity is not"),
    (b'{"entity":[],"key":"producer_byte_rate"}', None, "empty"),
    (b'{"entity":[["group","g"]],"key":"producer_byte_rate"}', None, "unknown type 'group'"),
    (b'{"entity":[[1,"g"]],"key":"producer_byte_rate"}', None, "bad component"),
    (b'{"entity":[["user",""]],"key":"producer_byte_rate"}', None, "bad user name"),
    (b'{"entity":[["user",5]],"key":"producer_byte_rate"}', None, "bad user name"),
    (b'{"entity":[["user","a"],["client-id","b"]],"key":"producer_byte_rate"}', None,
     "types not sorted or repeated"),
    (b'{"entity":[["user","a"],["user","b"]],"key":"producer_byte_rate"}', None,
     "types not sorted or repeated"),
    (b'{"entity":[["ip",null],["user","a"]],"key":"connection_creation_rate"}', None,
     "ip with user/client-id"),
    (b'{"entity":[["ip","example.com"]],"key":"connection_creation_rate"}', None, "not an IP"),
    (b'{"entity":[["user","alice"]],"key":""}', None, "invalid quota key"),
    (b'{"entity":[["user","alice"]],"key":7}', None, "invalid quota key"),
    (b'{"entity":[["user","alice"]],"key":"connection_creation_rate"}', b'{"value":1.0}',
     "not valid for entity"),
    (b'{"entity": [["user", "alice"]], "key": "producer_byte_rate"}', None, "canonical form"),
    (b'{"key":"producer_byte_rate","entity":[["user","alice"]]}', None, "canonical form"),
    (b'{"entity":[["user","alice"]],"key":"producer_byte_rate"}\n', None, "canonical form"),
    (K, b"1.0", "expected field value only"),
    (K, b'{"value":1.0,"x":2}', "expected field value only"),
    (K, b"{", "value is not valid JSON"),
    (K, b'{"value":"1.0"}', "value is not a number"),
    (K, b'{"value":true}', "value is not a number"),
    (K, b'{"value":null}', "value is not a number"),
    (K, b'{"value":NaN}', "not a finite number greater than 0"),
    (K, b'{"value":Infinity}', "not a finite number greater than 0"),
    (K, b'{"value":1e999}', "not a finite number greater than 0"),
    (K, b'{"value":' + b"9" * 400 + b"}", "value too large"),
    (K, b'{"value":0}', "not a finite number greater than 0"),
    (K, b'{"value":-1.0}', "not a finite number greater than 0"),
])
def test_malformed_records(key: bytes, value: bytes | None, error: str) -> None:
    with pytest.raises(ValueError) as info:
        decode_record(key, value)
    assert error in str(info.value)


def test_integral_json_value_decodes_as_float() -> None:
    change = decode_record(K, b'{"value":100}')
    assert change == Change(ALICE, PBR, 100.0) and type(change.value) is float


@pytest.mark.parametrize("change", [
    Change(((USER, "a"), (CLIENT_ID, "b")), PBR, 1.0),
    Change(ALICE, PBR, math.nan),
    Change(ALICE, PBR, math.inf),
    Change(ALICE, PBR, 0.0),
    Change(ALICE, CCR, 1.0),
    Change(((IP, "localhost"),), CCR, 1.0),
])
def test_encode_rejects_what_decode_would_reject(change: Change) -> None:
    with pytest.raises(ValueError):
        encode_record(change)
