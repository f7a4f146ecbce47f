"""Property: for random AlterClientQuotas requests, ``apply`` of the changes equals a simple
model of Kafka's quota map (user, client-id and ip entities), and ``resolve`` over the result
equals Kafka's 8-level precedence."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.client_quotas import (
    CLIENT_ID,
    IP,
    USER,
    AlterEntry,
    Entity,
    Op,
    alter,
    apply,
    byte_rate_quotas,
    decode_record,
    encode_record,
)
from kafka_quota_proxy.quota.entities import QuotaType, resolve

LONG_KEYS = {"producer_byte_rate", "consumer_byte_rate"}
DOUBLE_KEYS = {"request_percentage", "controller_mutation_rate"}
INT_KEYS = {"connection_creation_rate"}  # ip entities only
USERS = [None, "alice", "<default>"]
CLIENTS = [None, "app", "<default>"]
QUERY_USERS = ["alice", "bob", "<default>", "carol"]
QUERY_CLIENTS = ["app", "web", "<default>", "other"]

# The model's entity: a frozenset of (type, name) pairs, name None = the default.
ModelEntity = frozenset[tuple[str, str | None]]
Model = dict[ModelEntity, dict[str, float]]

T = TypeVar("T")


def mostly(good: st.SearchStrategy[T], odd: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``good`` four times in five, else ``odd``."""
    return st.integers(0, 4).flatmap(lambda i: odd if i == 4 else good)


names = {USER: USERS, CLIENT_ID: CLIENTS}
good_component = st.sampled_from([USER, CLIENT_ID]).flatmap(
    lambda t: st.tuples(st.just(t), st.sampled_from(names[t])))
odd_component = st.sampled_from([(USER, ""), (CLIENT_ID, ""), ("foo", "x"), (IP, "10.0.0.1"),
                                 (IP, None), (IP, ""), (IP, "not-an-ip")])
components = mostly(  # the odd ones: empty, a repeated type (last wins), invalid components
    st.lists(good_component, min_size=1, max_size=2, unique_by=lambda c: c[0]),
    st.lists(st.one_of(good_component, odd_component), max_size=3),
).map(tuple)
value = mostly(st.integers(1, 3).map(float),
               st.sampled_from([1.5, 0.0, -2.0, 5.0000001, 4.9999999, 2.0**64, math.nan,
                                math.inf]))
key = mostly(st.sampled_from(sorted(LONG_KEYS | DOUBLE_KEYS)),
             st.sampled_from(["connection_creation_rate", "bogus"]))
op = st.builds(Op, key=key, value=value, remove=st.integers(0, 2).map(lambda i: i == 2))
ops = mostly(st.lists(op, min_size=1, max_size=3, unique_by=lambda o: o.key),
             st.lists(op, max_size=3)).map(tuple)  # the odd ones: no op, a repeated key
entry = st.builds(AlterEntry, components=components, ops=ops)
requests = st.lists(st.lists(entry, min_size=1, max_size=3), min_size=1, max_size=10)


def valid_set(key: str, value: float, ip: bool) -> bool:
    if ip:
        return key in INT_KEYS and 0 < value <= 2147483647.0 and abs(math.fmod(value, 1.0)) <= 1e-6
    if key in DOUBLE_KEYS:
        return value > 0 and math.isfinite(value)
    if key in LONG_KEYS:  # NaN fails every comparison
        return 0 < value <= 2.0**63 and abs(math.fmod(value, 1.0)) <= 1e-6
    return False


def valid_entity(parts: dict[str, str | None]) -> bool:
    if not parts or "" in parts.values():
        return False
    if IP in parts:  # alone, and a literal address or the default
        return len(parts) == 1 and parts[IP] in (None, "10.0.0.1")
    return set(parts) <= {USER, CLIENT_ID}


def model_alter(state: Model, request: Sequence[AlterEntry]
                ) -> tuple[Model, dict[ModelEntity, int]]:
    """Kafka's map semantics, written plainly: an entity is altered at most once per request,
    all its ops or none, and it disappears when its last key goes."""
    new = {entity: dict(values) for entity, values in state.items()}
    codes: dict[ModelEntity, int] = {}
    for e in request:
        entity = frozenset(dict(e.components).items())
        keys = [o.key for o in e.ops]
        if entity in codes or len(set(keys)) != len(keys):
            codes[entity] = 42
            continue
        parts = dict(entity)
        ok = valid_entity(parts) and all(o.remove or valid_set(o.key, o.value, IP in parts)
                                          for o in e.ops)
        codes[entity] = 0 if ok else 42
        if not ok:
            continue
        values = new.pop(entity, {})
        for o in e.ops:
            if o.remove:
                values.pop(o.key, None)
            else:
                values[o.key] = o.value
        if values:
            new[entity] = values
    return new, codes


def model_precedence(state: Model, key: str, user: str, client: str) -> float | None:
    """/users/u/clients/c, /users/u/clients/<default>, /users/u, /users/<default>/clients/c,
    /users/<default>/clients/<default>, /users/<default>, /clients/c, /clients/<default>."""
    levels: list[dict[str, str | None]] = [
        {USER: user, CLIENT_ID: client}, {USER: user, CLIENT_ID: None}, {USER: user},
        {USER: None, CLIENT_ID: client}, {USER: None, CLIENT_ID: None}, {USER: None},
        {CLIENT_ID: client}, {CLIENT_ID: None},
    ]
    for level in levels:
        values = state.get(frozenset(level.items()), {})
        if key in values:
            return values[key]
    return None


def as_model(quotas: Mapping[Entity, Mapping[str, float]]) -> Model:
    return {frozenset(entity): dict(values) for entity, values in quotas.items()}


@settings(max_examples=300, deadline=None)
@given(requests)
def test_alter_apply_and_resolve_follow_kafka(reqs: list[list[AlterEntry]]) -> None:
    state: dict[Entity, dict[str, float]] = {}
    model: Model = {}
    for request in reqs:
        results, changes = alter(state, request)
        model, codes = model_alter(model, request)
        assert {frozenset(r.components): r.error_code for r in results} == codes
        assert len(results) == len(codes)
        # only real changes, each (entity, key) once, and each one storable
        assert len({(c.entity, c.key) for c in changes}) == len(changes)
        for c in changes:
            before = state.get(c.entity, {})
            assert c.key in before if c.value is None else before.get(c.key) != c.value
            assert decode_record(*encode_record(c)) == c
        state = apply(state, changes)
        assert as_model(state) == model

    by_type = byte_rate_quotas(state)
    for qt in QuotaType:
        for user in QUERY_USERS:
            for client in QUERY_CLIENTS:
                limit = resolve(by_type[qt], qt, user, client).limit
                assert limit == model_precedence(model, qt.value, user, client), (qt, user, client)
