"""One process's ACLs (``docs/acls.md``): the bindings of the config and the dynamic ones
(CreateAcls and DeleteAcls, kept in the ACL topic), one ``StandardAuthorizer`` over both,
the topic ids learnt (requests naming topics by id are authorized by name), and the figures.

``Access`` is one principal connected from one address: what a connection's filters ask.
Decisions are the authorizer's, cached there per (principal, host, operation, resource) and
dropped on every change; denials are counted per resource type and operation and logged at
most once a second per (principal, resource).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    ResourceType,
    normal_host,
)
from kafka_quota_proxy.authorizer.standard import StandardAuthorizer
from kafka_quota_proxy.config.acls import AclsConfig
from kafka_quota_proxy.proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.acls")

_Op = AclOperation
# The operations each resource type supports (Kafka's ``AclEntry.supportedOperations``): the
# bits of the ``*_authorized_operations`` fields (bit = the operation's code)
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (_Op.READ, _Op.WRITE, _Op.CREATE, _Op.DESCRIBE, _Op.DELETE, _Op.ALTER,
                         _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS),
    ResourceType.GROUP: (_Op.READ, _Op.DESCRIBE, _Op.DELETE, _Op.DESCRIBE_CONFIGS,
                         _Op.ALTER_CONFIGS),
    ResourceType.CLUSTER: (_Op.CREATE, _Op.CLUSTER_ACTION, _Op.DESCRIBE_CONFIGS,
                           _Op.ALTER_CONFIGS, _Op.IDEMPOTENT_WRITE, _Op.ALTER, _Op.DESCRIBE),
}
NOT_ASKED = -2147483648  # Kafka's Int32.MinValue: authorized operations not asked for

LOG_EVERY_S = 1.0
LOGGED_MAX = 10_000  # (principal, resource) pairs remembered for the log's rate limit
TOPIC_IDS_MAX = 1_000_000


class Acls:
    """The ACLs in force in this process."""

    def __init__(self, config: AclsConfig) -> None:
        self.config = config
        self.static: frozenset[AclBinding] = frozenset(config.all_bindings())
        self.dynamic: set[AclBinding] = set()
        self.authorizer = self._authorizer()
        self.topic_names: dict[uuid.UUID, str] = {}
        # called when a request names an id not learnt (the proxy refreshes its topics)
        self.on_unknown_id: Callable[[], None] | None = None
        # figures
        self.denied: dict[tuple[str, str], int] = {}
        self._logged: dict[tuple[str, str, str, str], float] = {}
        log.info("acls", bindings=len(self.static), super_users=config.super_users,
                 allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found)

    def _authorizer(self) -> StandardAuthorizer:
        return StandardAuthorizer(
            self.static | self.dynamic, super_users=self.config.super_users,
            allow_everyone_if_no_acl_found=self.config.allow_everyone_if_no_acl_found)

    @property
    def generation(self) -> tuple[int, int]:
        """Changes whenever a decision may (connections drop what they cached)."""
        return id(self.authorizer), self.authorizer.generation

    # ------------------------------------------------------------------ changes
    def reload(self, config: AclsConfig) -> None:
        """The config's bindings and super users replaced (a reload)."""
        if config == self.config:
            return
        self.config = config
        self.static = frozenset(config.all_bindings())
        self.authorizer = self._authorizer()
        log.info("acls_reloaded", bindings=len(self.static), dynamic=len(self.dynamic))

    def add_dynamic(self, binding: AclBinding) -> bool:
        """A binding created through CreateAcls (here or through another proxy); False when
        it was there already."""
        binding = _normal(binding)
        if binding in self.dynamic:
            return False
        self.dynamic.add(binding)
        self.authorizer.add(binding)
        return True

    def remove_dynamic(self, binding: AclBinding) -> bool:
        """A dynamic binding deleted through DeleteAcls; one the config also holds stays in
        force (the config is the base)."""
        binding = _normal(binding)
        if binding not in self.dynamic:
            return False
        self.dynamic.discard(binding)
        if binding not in self.static:
            self.authorizer.remove(binding)
        return True

    def bindings(self) -> Iterable[AclBinding]:
        """Every binding in force (DescribeAcls)."""
        return self.static | self.dynamic

    # ------------------------------------------------------------------ topic ids
    def learn_topic(self, name: str | None, topic_id: uuid.UUID | None) -> None:
        if name is None or topic_id is None or topic_id.int == 0:
            return
        names = self.topic_names
        if names.get(topic_id) != name:
            if len(names) >= TOPIC_IDS_MAX:
                names.clear()
            names[topic_id] = name

    def unknown_id(self) -> None:
        if self.on_unknown_id is not None:
            self.on_unknown_id()

    def observe_metadata(self, response: Any) -> None:
        for t in response.topics:
            if not t.error_code:
                self.learn_topic(t.name, getattr(t, "topic_id", None))

    # ------------------------------------------------------------------ decisions
    def access(self, user: str, peer_ip: str | None) -> Access:
        return Access(self, f"User:{user}", normal_host(peer_ip) if peer_ip else "*")

    def denial(self, access: Access, operation: AclOperation, resource_type: ResourceType,
               name: str, api: str) -> None:
        """Counted, and logged at most once a second per (principal, resource)."""
        key = (resource_type.name, operation.name)
        self.denied[key] = self.denied.get(key, 0) + 1
        now = time.monotonic()
        logged = self._logged
        seen = (access.principal, access.host, resource_type.name, name)
        last = logged.get(seen)
        if last is not None and now - last < LOG_EVERY_S:
            return
        if len(logged) >= LOGGED_MAX:
            logged.clear()
        logged[seen] = now
        log.warning("acl_denied", principal=access.principal, host=access.host,
                    operation=operation.name, resource_type=resource_type.name,
                    resource=name[:300], api=api)

    # ------------------------------------------------------------------ figures
    def state_entries(self) -> dict[str, int]:
        """The structures keyed by names clients choose (``docs/security.md``)."""
        return {"acl_decisions": self.authorizer.cached(), "acl_denial_logs": len(self._logged),
                "acl_topic_ids": len(self.topic_names)}

    def metric_families(self) -> Iterator[Any]:
        g = GaugeMetricFamily("kafka_proxy_acls", "ACL bindings in force, by source",
                              labels=["source"])
        g.add_metric(["config"], len(self.static))
        g.add_metric(["dynamic"], len(self.dynamic))
        yield g
        c = CounterMetricFamily("kafka_proxy_acl_denials",
                                "Authorization checks denied, by resource type and operation",
                                labels=["resource_type", "operation"])
        for (resource_type, operation), n in sorted(self.denied.items()):
            c.add_metric([resource_type, operation], n)
        yield c


class Access:
    """What one principal, connected from one address, may do."""

    __slots__ = ("acls", "host", "principal", "super_user")

    def __init__(self, acls: Acls, principal: str, host: str) -> None:
        self.acls = acls
        self.principal = principal
        self.host = host
        self.super_user = principal in acls.config.super_users

    def allowed(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        return self.acls.authorizer.authorize(self.principal, self.host, operation,
                                              resource_type, name)

    def check(self, operation: AclOperation, resource_type: ResourceType, name: str,
              api: str) -> bool:
        """``allowed``, with a denial counted and logged."""
        if self.acls.authorizer.authorize(self.principal, self.host, operation,
                                          resource_type, name):
            return True
        self.acls.denial(self, operation, resource_type, name, api)
        return False

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """Kafka's bit field of the operations this client may do on the resource (the
        ``authorized_operations`` fields of Metadata, DescribeGroups, DescribeCluster...)."""
        return sum(1 << int(op) for op in SUPPORTED_OPERATIONS[resource_type]
                   if self.allowed(op, resource_type, name))

    def cluster(self, operation: AclOperation, api: str) -> bool:
        return self.check(operation, ResourceType.CLUSTER, CLUSTER_NAME, api)

    def any_of_type(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        return self.acls.authorizer.authorize_by_resource_type(
            self.principal, self.host, operation, resource_type)


def _normal(binding: AclBinding) -> AclBinding:
    host = normal_host(binding.host)
    if host == binding.host:
        return binding
    return AclBinding(binding.resource_type, binding.name, binding.pattern_type,
                      binding.principal, host, binding.operation, binding.permission)
