"""The ``acls:`` section: bindings written as ``kafka-acls.sh`` takes them, read into Kafka's
model, and the mistakes an operator makes refused with the field named."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from kafka_quota_proxy.authorizer.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.config.acls import AclsConfig, operation

Op = AclOperation


def _acls(text: str) -> AclsConfig:
    return AclsConfig.model_validate(yaml.safe_load(text))


def test_bindings_as_kafka_acls_writes_them() -> None:
    acls = _acls("""
super_users: [User:admin]
bindings:
  - {principal: User:alice, operation: [Write, describe], topic: orders-, pattern_type: Prefixed}
  - {principal: "User:*", host: 10.0.0.1, operation: IdempotentWrite, cluster: true}
  - {principal: User:eve, operation: ALL, permission: Deny, group: "*"}
  - {principal: User:bob, operation: DESCRIBE_CONFIGS, transactional-id: tx}
""")
    assert acls.super_users == ["User:admin"] and not acls.allow_everyone_if_no_acl_found
    assert acls.all_bindings() == [
        AclBinding(ResourceType.TOPIC, "orders-", PatternType.PREFIXED, "User:alice", "*",
                   Op.WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "orders-", PatternType.PREFIXED, "User:alice", "*",
                   Op.DESCRIBE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:*",
                   "10.0.0.1", Op.IDEMPOTENT_WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "*", PatternType.LITERAL, "User:eve", "*", Op.ALL,
                   AclPermissionType.DENY),
        AclBinding(ResourceType.TRANSACTIONAL_ID, "tx", PatternType.LITERAL, "User:bob", "*",
                   Op.DESCRIBE_CONFIGS, AclPermissionType.ALLOW),
    ]


@pytest.mark.parametrize(("entry", "says"), [
    ("{principal: alice, operation: Read, topic: t}", "Type:name"),
    ("{principal: User:alice, operation: Reed, topic: t}", "unknown operation 'Reed'"),
    ("{principal: User:alice, operation: Any, topic: t}", "unknown operation 'Any'"),
    ("{principal: User:alice, operation: Read}", "name one resource"),
    ("{principal: User:alice, operation: Read, topic: t, group: g}", "not topic, group"),
    ("{principal: User:alice, operation: Read, topic: ''}", "resource name is empty"),
    ("{principal: User:alice, operation: Alter, cluster: true, pattern_type: prefixed}",
     "its pattern type is literal"),
    ("{principal: User:alice, operation: Read, topic: t, pattern_type: match}", "pattern_type"),
    ("{principal: User:alice, operation: Read, topic: t, permission: maybe}", "permission"),
    ("{principal: User:alice, operation: [], topic: t}", "at least one operation"),
    ("{principal: User:alice, operation: Read, topik: t}", "topik"),
])
def test_mistakes_are_refused_naming_what_is_wrong(entry: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _acls(f"bindings:\n  - {entry}\n")
    assert says in str(caught.value)


def test_super_users_are_principals() -> None:
    with pytest.raises(ValidationError, match="Type:name"):
        _acls("super_users: [admin]")


def test_operations_by_either_name() -> None:
    assert operation("IdempotentWrite") is operation("IDEMPOTENT_WRITE") is Op.IDEMPOTENT_WRITE
    assert operation("describe-configs") is Op.DESCRIBE_CONFIGS
    assert operation("All") is Op.ALL
