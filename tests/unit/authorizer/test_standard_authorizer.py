"""The proxy's ACL decisions are Kafka's: held against a transcription of Kafka's matching rules
(``StandardAuthorizerData.findAclRule``/``findResult``, ``Authorizer.authorizeByResourceType``)
written here as plainly as Kafka states them, over random ACL sets, questions and changes; and
the rules one by one, by example."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.authorizer.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.authorizer.standard import StandardAuthorizer

Op = AclOperation
Allow, Deny = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
HOST = "10.0.0.1"

# ------------------------------------------------------------------ Kafka's rules, transcribed
_IMPLIES_DESCRIBE = {Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
_IMPLIES_DESCRIBE_CONFIGS = {Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}


def _pattern_matches(acl: AclBinding, resource_type: ResourceType, name: str) -> bool:
    """Whether the ACL's resource pattern matches the resource (the sections
    ``findAclRule`` scans: the name's own LITERAL and PREFIXED prefixes, and LITERAL ``*``)."""
    if acl.resource_type != resource_type:
        return False
    if acl.pattern_type == LITERAL:
        return acl.name == name or acl.name == "*"
    return name.startswith(acl.name)


def _find_result(acl: AclBinding, principal: str, host: str, op: AclOperation) -> str | None:
    """``StandardAuthorizerData.findResult``."""
    if acl.principal not in (principal, "User:*"):
        return None
    if acl.host != "*" and acl.host != host:
        return None
    if acl.operation != Op.ALL:
        if acl.permission == Allow:
            if op == Op.DESCRIBE:
                if acl.operation not in _IMPLIES_DESCRIBE:
                    return None
            elif op == Op.DESCRIBE_CONFIGS:
                if acl.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif op != acl.operation:
                return None
        elif op != acl.operation:
            return None
    return "ALLOWED" if acl.permission == Allow else "DENIED"


def kafka_authorize(acls: list[AclBinding], super_users: set[str], allow_if_none: bool,
                    principal: str, host: str, op: AclOperation, resource_type: ResourceType,
                    name: str) -> bool:
    """``StandardAuthorizerData.authorize``: super users; else DENY, ALLOW, no ACL, deny."""
    if principal in super_users:
        return True
    deny = allow = has_resource_acls = False
    for acl in acls:
        if not _pattern_matches(acl, resource_type, name):
            continue
        has_resource_acls = True
        result = _find_result(acl, principal, host, op)
        if result == "ALLOWED":
            allow = True
        elif result == "DENIED":
            deny = True
    if deny:
        return False
    if allow:
        return True
    if not has_resource_acls:
        return allow_if_none
    return False


def kafka_authorize_by_resource_type(acls: list[AclBinding], super_users: set[str],
                                     allow_if_none: bool, principal: str, host: str,
                                     op: AclOperation, resource_type: ResourceType) -> bool:
    """``Authorizer.authorizeByResourceType``'s default implementation."""
    if kafka_authorize(acls, super_users, allow_if_none, principal, host, op, resource_type,
                       "hardcode"):
        return True
    deny: dict[PatternType, set[str]] = {LITERAL: set(), PREFIXED: set()}
    allow: dict[PatternType, set[str]] = {LITERAL: set(), PREFIXED: set()}
    wildcard_allow = False
    for acl in acls:
        if acl.resource_type != resource_type:
            continue
        if acl.host != host and acl.host != "*":
            continue
        if acl.principal != principal and acl.principal != "User:*":
            continue
        if acl.operation != op and acl.operation != Op.ALL:
            continue
        if acl.permission == Deny:
            if acl.pattern_type == LITERAL and acl.name == "*":
                return False
            deny[acl.pattern_type].add(acl.name)
            continue
        if acl.pattern_type == LITERAL and acl.name == "*":
            wildcard_allow = True
            continue
        allow[acl.pattern_type].add(acl.name)
    if wildcard_allow:
        return True
    for kind, names in allow.items():
        for allowed in names:
            if kind == LITERAL and allowed in deny[LITERAL]:
                continue
            prefix = ""
            dominated = False
            for ch in allowed:
                prefix += ch
                if prefix in deny[PREFIXED]:
                    dominated = True
                    break
            if not dominated:
                return True
    return False


# ------------------------------------------------------------------ random ACL sets
_NAMES = ["a", "ab", "abc", "b", "*", "hardcode", "hard"]
_PRINCIPALS = ["User:alice", "User:bob", "User:*"]
_HOSTS = ["*", HOST, "10.0.0.2"]
_OPS = [op for op in Op if op not in (Op.UNKNOWN, Op.ANY)]
_ASKED = [op for op in _OPS if op is not Op.ALL]
_TYPES = [TOPIC, GROUP]

bindings = st.builds(
    AclBinding, st.sampled_from(_TYPES), st.sampled_from(_NAMES),
    st.sampled_from([LITERAL, PREFIXED]), st.sampled_from(_PRINCIPALS),
    st.sampled_from(_HOSTS), st.sampled_from(_OPS), st.sampled_from([Allow, Deny]))
questions = st.tuples(st.sampled_from(["User:alice", "User:bob", "User:carol"]),
                      st.sampled_from([HOST, "10.0.0.2"]), st.sampled_from(_ASKED),
                      st.sampled_from(_TYPES), st.sampled_from([*_NAMES, "abcd", "c", ""]))
settings_ = st.tuples(st.sets(st.sampled_from(["User:bob", "User:carol"]), max_size=1),
                      st.booleans())


@settings(max_examples=1500, deadline=None)
@given(acls=st.lists(bindings, max_size=12), asked=st.lists(questions, min_size=1, max_size=8),
       config=settings_)
def test_decisions_are_kafkas(acls: list[AclBinding],
                              asked: list[tuple[str, str, AclOperation, ResourceType, str]],
                              config: tuple[set[str], bool]) -> None:
    super_users, allow_if_none = config
    authorizer = StandardAuthorizer(acls, super_users=super_users,
                                    allow_everyone_if_no_acl_found=allow_if_none)
    unique = list(dict.fromkeys(acls))
    for principal, host, op, resource_type, name in asked:
        expected = kafka_authorize(unique, super_users, allow_if_none, principal, host, op,
                                   resource_type, name)
        assert authorizer.authorize(principal, host, op, resource_type, name) == expected
        assert authorizer.authorize(principal, host, op, resource_type, name) == expected
        by_type = kafka_authorize_by_resource_type(unique, super_users, allow_if_none,
                                                   principal, host, op, resource_type)
        assert authorizer.authorize_by_resource_type(principal, host, op,
                                                     resource_type) == by_type


@settings(max_examples=400, deadline=None)
@given(start=st.lists(bindings, max_size=8),
       changes=st.lists(st.tuples(st.booleans(), bindings), min_size=1, max_size=10),
       asked=st.lists(questions, min_size=1, max_size=5))
def test_decisions_follow_every_change(start: list[AclBinding],
                                       changes: list[tuple[bool, AclBinding]],
                                       asked: list[tuple[str, str, AclOperation, ResourceType,
                                                         str]]) -> None:
    """Cached decisions never outlive a change of the ACLs."""
    authorizer = StandardAuthorizer(start)
    current = set(start)
    for add, binding in changes:
        for question in asked:  # (cached before the change)
            authorizer.authorize(*question)
        if add:
            assert authorizer.add(binding) == (binding not in current)
            current.add(binding)
        else:
            assert authorizer.remove(binding) == (binding in current)
            current.discard(binding)
        for question in asked:
            assert authorizer.authorize(*question) == kafka_authorize(
                list(current), set(), False, *question)
    assert len(authorizer) == len(current)


# ------------------------------------------------------------------ the rules by example
def _acl(name: str, op: AclOperation, permission: AclPermissionType = Allow, *,
         principal: str = "User:alice", host: str = "*", kind: PatternType = LITERAL,
         resource_type: ResourceType = TOPIC) -> AclBinding:
    return AclBinding(resource_type, name, kind, principal, host, op, permission)


def test_read_write_delete_alter_imply_describe_only_when_allowed() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = StandardAuthorizer([_acl("t", op)])
        assert a.authorize("User:alice", HOST, Op.DESCRIBE, TOPIC, "t")
        assert not a.authorize("User:alice", HOST, Op.CREATE, TOPIC, "t")
    # a DENY READ does not deny DESCRIBE
    a = StandardAuthorizer([_acl("t", Op.DESCRIBE), _acl("t", Op.READ, Deny)])
    assert a.authorize("User:alice", HOST, Op.DESCRIBE, TOPIC, "t")
    assert not a.authorize("User:alice", HOST, Op.READ, TOPIC, "t")


def test_alter_configs_implies_describe_configs() -> None:
    a = StandardAuthorizer([_acl("kafka-cluster", Op.ALTER_CONFIGS, resource_type=CLUSTER)])
    assert a.authorize("User:alice", HOST, Op.DESCRIBE_CONFIGS, CLUSTER, "kafka-cluster")
    assert not a.authorize("User:alice", HOST, Op.DESCRIBE, CLUSTER, "kafka-cluster")


def test_deny_beats_allow_and_all_denies_everything() -> None:
    a = StandardAuthorizer([_acl("*", Op.ALL), _acl("secret-", Op.ALL, Deny, kind=PREFIXED)])
    assert a.authorize("User:alice", HOST, Op.WRITE, TOPIC, "public")
    assert not a.authorize("User:alice", HOST, Op.DESCRIBE, TOPIC, "secret-plans")
    assert a.authorize("User:alice", HOST, Op.WRITE, TOPIC, "secret")  # (not the prefix)


def test_wildcard_principal_hosts_and_super_users() -> None:
    a = StandardAuthorizer([_acl("t", Op.READ, principal="User:*", host="10.0.0.1")],
                           super_users=["User:admin"])
    assert a.authorize("User:bob", "10.0.0.1", Op.READ, TOPIC, "t")
    assert not a.authorize("User:bob", "10.0.0.2", Op.READ, TOPIC, "t")
    assert a.authorize("User:admin", "10.0.0.2", Op.ALTER, CLUSTER, "kafka-cluster")


def test_no_acl_found_is_denied_unless_allowed_for_everyone() -> None:
    a = StandardAuthorizer([_acl("t", Op.READ, principal="User:bob")])
    assert not a.authorize("User:alice", HOST, Op.READ, TOPIC, "t")  # ACLs exist: denied
    assert not a.authorize("User:alice", HOST, Op.READ, TOPIC, "u")  # none: Kafka's default
    b = StandardAuthorizer([_acl("t", Op.READ, principal="User:bob")],
                           allow_everyone_if_no_acl_found=True)
    assert not b.authorize("User:alice", HOST, Op.READ, TOPIC, "t")  # ACLs exist: denied
    assert b.authorize("User:alice", HOST, Op.READ, TOPIC, "u")


def test_hosts_are_compared_as_addresses() -> None:
    a = StandardAuthorizer([_acl("t", Op.READ, host="0:0:0:0:0:0:0:1")])  # (as Java writes it)
    assert a.authorize("User:alice", "::1", Op.READ, TOPIC, "t")


def test_write_on_some_topic_makes_a_producer_idempotent_by_resource_type() -> None:
    a = StandardAuthorizer([_acl("orders-", Op.WRITE, kind=PREFIXED)])
    assert a.authorize_by_resource_type("User:alice", HOST, Op.WRITE, TOPIC)
    assert not a.authorize_by_resource_type("User:bob", HOST, Op.WRITE, TOPIC)
    a.add(_acl("orders", Op.WRITE, Deny, kind=PREFIXED))  # covers every orders- topic
    assert not a.authorize_by_resource_type("User:alice", HOST, Op.WRITE, TOPIC)


def test_filters_match_as_kafkas() -> None:
    literal, prefixed, every = (_acl("abc", Op.READ), _acl("ab", Op.READ, kind=PREFIXED),
                                _acl("*", Op.READ))
    a = StandardAuthorizer([literal, prefixed, every, _acl("x", Op.WRITE, Deny)])
    match = AclBindingFilter(TOPIC, "abc", PatternType.MATCH)
    assert set(a.acls(match)) == {literal, prefixed, every}
    assert a.acls(AclBindingFilter(TOPIC, "abc", PatternType.ANY)) == [literal]
    assert a.acls(AclBindingFilter(name="ab", pattern_type=PREFIXED)) == [prefixed]
    assert len(a.acls(AclBindingFilter(permission=Deny))) == 1
    assert a.delete(AclBindingFilter(operation=Op.READ, principal="User:alice")) != []
    assert len(a) == 1


def test_bindings_kafka_would_refuse() -> None:
    assert _acl("t", Op.READ).problem() is None
    assert _acl("t", Op.ANY).problem() is not None
    assert _acl("", Op.READ).problem() is not None
    assert _acl("t", Op.READ, principal="alice").problem() is not None
    assert _acl("t", Op.READ, kind=PatternType.MATCH).problem() is not None
    assert _acl("other", Op.ALTER, resource_type=CLUSTER).problem() is not None
    assert _acl("kafka-cluster", Op.ALTER, resource_type=CLUSTER).problem() is None
