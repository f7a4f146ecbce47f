"""Kafka's ``StandardAuthorizer`` (KIP-801) decisions over a set of ACL bindings, indexed for
speed and cached per question.

A decision, as ``StandardAuthorizerData.authorize`` makes it:

1. a super user (``super_users``, principals as ``User:name``) may do anything;
2. the bindings that match the resource are those of its type that are LITERAL with its name,
   LITERAL ``*``, or PREFIXED with a prefix of its name (the whole name included);
3. of those, a binding applies when its principal is the client's or ``User:*``, its host is
   ``*`` or the client's address, and its operation is ``ALL``, the one asked, or (ALLOW
   bindings only) one that implies it: READ, WRITE, DELETE and ALTER imply DESCRIBE,
   ALTER_CONFIGS implies DESCRIBE_CONFIGS;
4. an applying DENY decides: denied; else an applying ALLOW: allowed; else, when no binding
   matched the resource at all (whoever it names), ``allow_everyone_if_no_acl_found``
   (false by default, as Kafka's ``allow.everyone.if.no.acl.found``); else denied.

``authorize_by_resource_type`` is Kafka's ``Authorizer.authorizeByResourceType`` (KIP-679:
whether the client may do an operation on at least one resource of a type; WRITE on some
topic is how a producer without IDEMPOTENT_WRITE on the cluster may still be idempotent).

Speed: bindings are indexed by resource type, then by LITERAL name, with the PREFIXED ones by
prefix and the set of prefix lengths in use, so a decision looks up a few dictionary keys
whatever the number of bindings; decisions are cached per (principal, host, operation,
resource type, name) and the cache is dropped on every change.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from kafka_quota_proxy.authorizer.acls import (
    IMPLIES_DESCRIBE,
    IMPLIES_DESCRIBE_CONFIGS,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    normal_host,
)

_ALL = AclOperation.ALL
_ALLOW = AclPermissionType.ALLOW
_DENY = AclPermissionType.DENY
_DESCRIBE = AclOperation.DESCRIBE
_DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
CACHE_MAX = 100_000  # decisions kept (the cache is dropped whole when it is full)


class _TypeIndex:
    """The bindings of one resource type."""

    __slots__ = ("_length_counts", "literal", "prefix_lengths", "prefixed")

    def __init__(self) -> None:
        self.literal: dict[str, list[AclBinding]] = {}  # (``*`` among them)
        self.prefixed: dict[str, list[AclBinding]] = {}
        self.prefix_lengths: list[int] = []  # the lengths of the prefixes in ``prefixed``, sorted
        self._length_counts: dict[int, int] = {}  # how many prefixes have each length

    def add(self, binding: AclBinding) -> None:
        name = binding.name
        if binding.pattern_type is PatternType.PREFIXED:
            found = self.prefixed.get(name)
            if found is None:
                found = self.prefixed[name] = []
                counts = self._length_counts
                counts[len(name)] = counts.get(len(name), 0) + 1
                if counts[len(name)] == 1:
                    bisect.insort(self.prefix_lengths, len(name))
            found.append(binding)
        else:
            self.literal.setdefault(name, []).append(binding)

    def remove(self, binding: AclBinding) -> None:
        name = binding.name
        table = self.prefixed if binding.pattern_type is PatternType.PREFIXED else self.literal
        found = table[name]
        found.remove(binding)
        if not found:
            del table[name]
            if table is self.prefixed:
                counts = self._length_counts
                counts[len(name)] -= 1
                if not counts[len(name)]:
                    del counts[len(name)]
                    self.prefix_lengths.remove(len(name))

    def matching(self, name: str) -> list[list[AclBinding]]:
        """The lists of bindings whose pattern matches the resource ``name``."""
        found = []
        literal = self.literal
        exact = literal.get(name)
        if exact is not None:
            found.append(exact)
        if name != WILDCARD:
            every = literal.get(WILDCARD)
            if every is not None:
                found.append(every)
        prefixed = self.prefixed
        if prefixed:
            size = len(name)
            for length in self.prefix_lengths:
                if length > size:
                    break
                hit = prefixed.get(name[:length])
                if hit is not None:
                    found.append(hit)
        return found


def applies(binding: AclBinding, principals: tuple[str, str], host: str,
            operation: AclOperation) -> bool:
    """Whether ``binding`` (whose pattern matches the resource) applies to the question
    (``StandardAuthorizerData.findResult`` returning a result)."""
    if binding.principal not in principals:
        return False
    if binding.host != WILDCARD and binding.host != host:
        return False
    op = binding.operation
    if op is _ALL or op is operation:
        return True
    if binding.permission is not _ALLOW:
        return False
    if operation is _DESCRIBE:
        return op in IMPLIES_DESCRIBE
    if operation is _DESCRIBE_CONFIGS:
        return op in IMPLIES_DESCRIBE_CONFIGS
    return False


class StandardAuthorizer:
    """The ACL bindings and the decisions made over them (see the module's docstring)."""

    def __init__(self, bindings: Iterable[AclBinding] = (), *,
                 super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._bindings: set[AclBinding] = set()
        self._types: dict[ResourceType, _TypeIndex] = {}
        self._cache: dict[tuple[str, str, AclOperation, ResourceType, str], bool] = {}
        self.generation = 0  # raised on every change
        for binding in bindings:
            self.add(binding)

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, binding: object) -> bool:
        return binding in self._bindings

    # ------------------------------------------------------------------ changes
    def add(self, binding: AclBinding) -> bool:
        """Add a binding (its host in the form clients' addresses are compared in); False
        when it was there already (as Kafka, creating it again changes nothing)."""
        host = normal_host(binding.host)
        if host != binding.host:
            binding = AclBinding(binding.resource_type, binding.name, binding.pattern_type,
                                 binding.principal, host, binding.operation, binding.permission)
        if binding in self._bindings:
            return False
        self._bindings.add(binding)
        index = self._types.get(binding.resource_type)
        if index is None:
            index = self._types[binding.resource_type] = _TypeIndex()
        index.add(binding)
        self._changed()
        return True

    def remove(self, binding: AclBinding) -> bool:
        """Remove a binding; False when it was not there."""
        if binding not in self._bindings:
            return False
        self._bindings.remove(binding)
        self._types[binding.resource_type].remove(binding)
        self._changed()
        return True

    def delete(self, matching: AclBindingFilter) -> list[AclBinding]:
        """Remove every binding the filter matches (DeleteAcls); the bindings removed."""
        gone = [b for b in self._bindings if matching.matches(b)]
        for binding in gone:
            self.remove(binding)
        return gone

    def acls(self, matching: AclBindingFilter) -> list[AclBinding]:
        """The bindings the filter matches (DescribeAcls)."""
        return [b for b in self._bindings if matching.matches(b)]

    def cached(self) -> int:
        """Decisions held in the cache (at most ``CACHE_MAX``)."""
        return len(self._cache)

    def _changed(self) -> None:
        self.generation += 1
        if self._cache:
            self._cache = {}

    # ------------------------------------------------------------------ decisions
    def authorize(self, principal: str, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        """Whether ``principal`` connected from ``host`` (an address, in the form
        ``normal_host`` gives) may do ``operation`` on the resource."""
        key = (principal, host, operation, resource_type, name)
        cache = self._cache
        decided = cache.get(key)
        if decided is None:
            decided = self._decide(principal, host, operation, resource_type, name)
            if len(cache) >= CACHE_MAX:
                cache.clear()
            cache[key] = decided
        return decided

    def _decide(self, principal: str, host: str, operation: AclOperation,
                resource_type: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        index = self._types.get(resource_type)
        found = index.matching(name) if index is not None else []
        if not found:
            return self.allow_everyone_if_no_acl_found
        principals = (principal, WILDCARD_PRINCIPAL)
        allowed = False
        for bindings in found:
            for binding in bindings:
                if applies(binding, principals, host, operation):
                    if binding.permission is _DENY:
                        return False
                    allowed = True
        return allowed

    def authorize_by_resource_type(self, principal: str, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on at least one resource of
        ``resource_type`` (Kafka's ``Authorizer.authorizeByResourceType``): a resource named
        ``hardcode`` is asked first (super users, and a wildcard or prefix ALLOW that covers
        it); else some ALLOW naming exactly this operation (or ALL) whose resources are not all
        denied: a LITERAL ``*`` ALLOW, or a LITERAL or PREFIXED ALLOW that no DENY of the same
        LITERAL name, and no PREFIXED DENY of a prefix of its name, covers. A LITERAL ``*``
        DENY denies."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        index = self._types.get(resource_type)
        if index is None:
            return False
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[tuple[PatternType, str]] = []
        wildcard_allow = False
        for table in (index.literal, index.prefixed):
            for bindings in table.values():
                for b in bindings:
                    if b.host != host and b.host != WILDCARD:
                        continue
                    if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                        continue
                    if b.operation is not operation and b.operation is not _ALL:
                        continue
                    literal = b.pattern_type is PatternType.LITERAL
                    if b.permission is _DENY:
                        if literal and b.name == WILDCARD:
                            return False
                        (deny_literal if literal else deny_prefixed).add(b.name)
                    elif literal and b.name == WILDCARD:
                        wildcard_allow = True
                    else:
                        allow.append((b.pattern_type, b.name))
        if wildcard_allow:
            return True
        for kind, name in allow:
            if kind is PatternType.LITERAL and name in deny_literal:
                continue
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False
