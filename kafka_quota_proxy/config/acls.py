"""The ``acls:`` section: authorization at the proxy, with Kafka's standard authorizer's
semantics (``kafka_quota_proxy.authorizer``; ``docs/acls.md``).

A binding is written as ``kafka-acls.sh`` takes one: a principal (``User:alice``, or ``User:*``
for everyone), a host (``*`` by default), one or more operations (``Read``, ``Write``,
``IdempotentWrite``, ``DESCRIBE_CONFIGS``... any case, ``_`` or ``-`` optional), ``allow``
(default) or ``deny``, and the resource as one key of ``topic``, ``group``,
``transactional_id``, ``delegation_token``, ``user`` or ``cluster: true``, with
``pattern_type: literal`` (default) or ``prefixed``::

    acls:
      super_users: [User:admin]
      bindings:
        - {principal: User:alice, operation: [Write, Describe], topic: orders-, pattern_type: prefixed}
        - {principal: User:bob, operation: Read, group: "*"}
        - {principal: User:eve, operation: All, permission: deny, topic: "*"}
"""  # noqa: E501

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    normal_host,
)

DEFAULT_TOPIC = "__kafka_quota_proxy_acls"

_RESOURCES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
    "delegation_token": ResourceType.DELEGATION_TOKEN,
    "user": ResourceType.USER,
}
_OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation
               if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}


def operation(name: str) -> AclOperation:
    """An operation as ``kafka-acls.sh`` names it (``IdempotentWrite``) or as Kafka's enum
    does (``IDEMPOTENT_WRITE``), in any case."""
    found = _OPERATIONS.get(name.replace("_", "").replace("-", "").lower())
    if found is None:
        known = ", ".join(op.name for op in _OPERATIONS.values())
        raise ValueError(f"unknown operation {name!r} (one of {known})")
    return found


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AclBindingConfig(_Model):
    """One or more ACL bindings (one per operation) for one principal, host and resource."""

    principal: str = Field(description="Type:name, as User:alice; User:* is every principal.")
    host: str = Field(default="*", description="The client's address (the PROXY protocol's "
                      "where trusted), or * for every host.")
    operation: list[str] = Field(description="One operation or a list of them.")
    permission: Literal["allow", "deny"] = "allow"
    topic: str | None = None
    group: str | None = None
    transactional_id: str | None = Field(
        default=None, validation_alias=AliasChoices("transactional_id", "transactional-id"))
    delegation_token: str | None = Field(
        default=None, validation_alias=AliasChoices("delegation_token", "delegation-token"))
    user: str | None = None
    cluster: bool = False
    pattern_type: Literal["literal", "prefixed"] = Field(
        default="literal", validation_alias=AliasChoices("pattern_type", "pattern-type",
                                                         "resource_pattern_type"))

    @field_validator("operation", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("operation")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one operation")
        for name in value:
            operation(name)
        return value

    @field_validator("permission", "pattern_type", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _valid(self) -> AclBindingConfig:
        named = [key for key in (*_RESOURCES, "cluster") if getattr(self, key) not in (None, False)]
        if len(named) != 1:
            raise ValueError("name one resource: topic, group, transactional_id, "
                             "delegation_token, user or cluster: true"
                             + (f" (not {', '.join(named)})" if named else ""))
        if self.cluster and self.pattern_type != "literal":
            raise ValueError(f"the cluster is one resource ({CLUSTER_NAME}): its pattern type "
                             "is literal")
        for binding in self.bindings():
            problem = binding.problem()
            if problem is not None:
                raise ValueError(problem)
        return self

    def bindings(self) -> list[AclBinding]:
        if self.cluster:
            kind, name = ResourceType.CLUSTER, CLUSTER_NAME
            pattern = PatternType.LITERAL
        else:
            key = next(k for k in _RESOURCES if getattr(self, k) is not None)
            kind, name = _RESOURCES[key], str(getattr(self, key))
            pattern = PatternType[self.pattern_type.upper()]
        permission = AclPermissionType[self.permission.upper()]
        host = normal_host(self.host)
        return [AclBinding(kind, name, pattern, self.principal, host, operation(op), permission)
                for op in self.operation]


class AclsConfig(_Model):
    """Authorization at the proxy: on when the section is there."""

    super_users: list[str] = Field(
        default=[], description="Principals (User:name) allowed everything, as Kafka's "
        "super.users.")
    allow_everyone_if_no_acl_found: bool = Field(
        default=False, description="Kafka's allow.everyone.if.no.acl.found: a resource no "
        "binding names is open to everyone (default: closed).")
    bindings: list[AclBindingConfig] = Field(
        default=[], description="The base ACLs; CreateAcls and DeleteAcls change the "
        "dynamic ones kept in the cluster.")
    topic: str = Field(
        default=DEFAULT_TOPIC, min_length=1, max_length=249, pattern=r"^[a-zA-Z0-9._-]+$",
        description="The compacted topic holding the ACLs created and deleted through the "
        "Admin API (CreateAcls, DeleteAcls), read by every proxy; refused to every client.")
    create_topic: bool = Field(
        default=True, description="Create the ACL topic (compacted) when it does not exist.")

    @field_validator("super_users")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        out = []
        for principal in value:
            kind, sep, name = principal.partition(":")
            if not sep or not kind or not name:
                raise ValueError(f"super user {principal!r} is not of the form Type:name "
                                 "(User:admin)")
            out.append(principal)
        return out

    def all_bindings(self) -> list[AclBinding]:
        return [binding for entry in self.bindings for binding in entry.bindings()]
