"""Kafka's ACL vocabulary: resource types, pattern types, operations, permission types (with
Kafka's wire codes), an ACL binding and the filters DescribeAcls and DeleteAcls take.

The codes are those of ``org.apache.kafka.common.acl.AclOperation``,
``AclPermissionType``, ``org.apache.kafka.common.resource.ResourceType`` and ``PatternType``,
as they travel in CreateAcls, DescribeAcls and DeleteAcls. A binding is one flat record, as
Kafka's ``StandardAcl`` is: the resource pattern (type, name, pattern type) and the entry
(principal, host, operation, permission type). Filters match as
``ResourcePatternFilter.matches`` and ``AccessControlEntryFilter.matches`` do.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

WILDCARD = "*"  # a resource name matching every resource of its type, or every host
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # (filters only) any pattern type, the name compared exactly
    MATCH = 2  # (filters only) every pattern that would match the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # (filters only)
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # (filters only)
    DENY = 2
    ALLOW = 3


# Kafka's cluster resource has this one name
CLUSTER_NAME = "kafka-cluster"

# In an ALLOW binding, these operations imply DESCRIBE (and these DESCRIBE_CONFIGS); a DENY
# binding denies only its own operation (or every one: ALL).
IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                              AclOperation.DELETE, AclOperation.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS,
                                      AclOperation.ALTER_CONFIGS})


def normal_host(host: str) -> str:
    """A binding's host as the proxy compares it with a client's address: ``*``, or an IP
    address in Python's canonical form (``::1`` and ``0:0:0:0:0:0:0:1``, Java's form of it,
    are one host). A host that is not an address is kept as written (it matches no client,
    as in Kafka, which compares the client's address as text)."""
    if host == WILDCARD:
        return host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def normal_principal(principal: str) -> str:
    """``Type:name`` as Kafka's ``SecurityUtils.parseKafkaPrincipal`` reads it (split at the
    first colon); ValueError when there is no colon or either side is empty."""
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise ValueError(f"principal {principal!r} is not of the form Type:name (User:alice)")
    return principal


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: who (``principal``, from ``host``) may or may not (``permission``) do
    ``operation`` on the resources ``pattern_type`` ``name`` of ``resource_type`` names."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def problem(self) -> str | None:
        """Why this binding cannot be created (CreateAcls answers INVALID_REQUEST), or None.
        Kafka's checks (``AclControlManager.validateNewAcl``: no UNKNOWN, ANY or MATCH field,
        a name) and the proxy's: a principal ``Type:name`` (which Kafka's request parsing
        requires), a host, and the cluster resource as the LITERAL ``kafka-cluster`` (the only
        cluster name any check asks about)."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            return f"resource type {self.resource_type.name} is not a resource type"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"pattern type {self.pattern_type.name} is only for filters"
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            return f"operation {self.operation.name} is only for filters"
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            return f"permission type {self.permission.name} is only for filters"
        if not self.name:
            return "the resource name is empty"
        if self.resource_type is ResourceType.CLUSTER and (
                self.name != CLUSTER_NAME or self.pattern_type is not PatternType.LITERAL):
            return f"the cluster resource is the LITERAL {CLUSTER_NAME!r}"
        try:
            normal_principal(self.principal)
        except ValueError as exc:
            return str(exc)
        if not self.host:
            return "the host is empty (* is every host)"
        return None


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls ask for: None (a name, principal or host) and ANY
    match everything; ``PatternType.MATCH`` every binding whose pattern would match ``name``
    (LITERAL of that name or ``*``, PREFIXED of a prefix of it)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding) and self.matches_entry(binding)

    def matches_pattern(self, binding: AclBinding) -> bool:
        """``ResourcePatternFilter.matches``."""
        if self.resource_type is not ResourceType.ANY and (
                self.resource_type is not binding.resource_type):
            return False
        kind = self.pattern_type
        if kind not in (PatternType.ANY, PatternType.MATCH) and kind is not binding.pattern_type:
            return False
        name = self.name
        if name is None:
            return True
        if kind is PatternType.ANY or kind is binding.pattern_type:
            return name == binding.name
        if binding.pattern_type is PatternType.LITERAL:
            return name == binding.name or binding.name == WILDCARD
        return name.startswith(binding.name)  # PREFIXED

    def matches_entry(self, binding: AclBinding) -> bool:
        """``AccessControlEntryFilter.matches``."""
        return ((self.principal is None or self.principal == binding.principal)
                and (self.host is None or self.host == binding.host)
                and (self.operation is AclOperation.ANY or self.operation is binding.operation)
                and (self.permission is AclPermissionType.ANY
                     or self.permission is binding.permission))

    def problem(self) -> str | None:
        """Why Kafka would refuse this filter (an UNKNOWN field), or None."""
        for field, value in (("resource type", self.resource_type),
                             ("pattern type", self.pattern_type),
                             ("operation", self.operation), ("permission type", self.permission)):
            if value.name == "UNKNOWN":
                return f"{field} is UNKNOWN"
        return None
