"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), v1-v3, answered by the proxy and
never forwarded (``docs/acls.md``, "The ACL admin APIs"), as Kafka's ``AclApis`` answers them
on a KRaft cluster (the controller's ``AclControlManager`` doing the changes):

- A request with a raw UNKNOWN code (0) in a resource type, pattern type, operation or
  permission type does not parse in Kafka (``CreateAclsRequest.validate``,
  ``DescribeAclsRequest``/``DeleteAclsRequest.normalizeAndValidate``): the broker closes the
  connection, before any authorization. So does the proxy. Other unknown codes read as
  UNKNOWN (``fromCode``) and go on.
- DescribeAcls needs DESCRIBE on the cluster: denied, the top-level error 31
  (CLUSTER_AUTHORIZATION_FAILED); else every binding in force (the config's and the dynamic
  ones) the filter matches, grouped by resource pattern. A filter matching nothing (an
  UNKNOWN field) answers no binding, without an error, as Kafka's does.
- CreateAcls and DeleteAcls need ALTER on the cluster: denied, 31 on every creation / filter
  result.
- CreateAcls: a creation Kafka cannot even make into an ``AclBinding`` (resource type ANY,
  pattern type ANY or MATCH, operation or permission ANY: ``ResourcePattern`` and
  ``AccessControlEntry`` throw) fails the whole request in Kafka: UNKNOWN_SERVER_ERROR on
  every creation, nothing created; so here. Then per creation, Kafka's checks in Kafka's
  order and words (``AclApis``: the cluster's name, an empty name; ``validateNewAcl``:
  UNKNOWN fields, the principal's colon), then the proxy's own (``AclBinding.problem``: a
  principal ``Type:name``, a host, the cluster LITERAL): INVALID_REQUEST (42) with the
  message. The valid ones are written (a binding already there is written again: creating
  is idempotent, and another proxy may have deleted it meanwhile) and answered 0.
- DeleteAcls: per filter, an UNKNOWN field answers INVALID_REQUEST ("Unknown patternFilter."
  / "Unknown entryFilter.", ``AclControlManager.validateFilter``); else every dynamic binding
  the filter matches is deleted and listed in its result (a binding two filters match is
  listed by both, as Kafka does). Bindings of the config (``acls.bindings``) are never
  deleted nor listed: they are the file's, as a YAML quota entity is (change the file).
- A change is answered once the cluster acknowledged its records (acks=all): meanwhile the
  connection's responses wait (``hold_responses``), so the answer keeps its place. A write
  that fails answers UNKNOWN_SERVER_ERROR on the creations, or the filter results, it
  concerned.

Versions other than v1-v3 (v0 is gone from Kafka 4.0) close the connection before any of
their bytes go upstream: with ACLs on, no ACL request reaches the broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import IntEnum
from typing import TypeVar

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    normal_host,
)
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.acl_frames import (
    ACL_APIS,
    ANSWERED_VERSIONS,
    CREATE_ACLS,
    DESCRIBE_ACLS,
    Acl,
    AclFilter,
    DeleteResult,
    create_response,
    decode_create,
    decode_delete,
    decode_describe,
    delete_response,
    describe_response,
)
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.proxy.features.acls.state import Access, Acls
from kafka_quota_proxy.proxy.features.acls.store import AclStore, AclWriteFailed
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.acls")

NONE = 0
UNKNOWN_SERVER_ERROR = -1
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
CLUSTER_AUTHORIZATION_MESSAGE = "Cluster authorization failed."  # Kafka's ``Errors`` message

_LO, _HI = ANSWERED_VERSIONS
_KEYS = frozenset(ACL_APIS)
E = TypeVar("E", bound=IntEnum)


class _Unparsable(Exception):
    """A request Kafka's broker does not parse (it closes the connection)."""


def _enum(kind: type[E], code: int) -> E:
    """``fromCode``: a code Kafka does not know reads as UNKNOWN."""
    try:
        return kind(code)
    except ValueError:
        return kind["UNKNOWN"]


def _raw_unknown(acl: Acl | AclFilter) -> bool:
    """A raw UNKNOWN (0) in a resource type, pattern type, operation or permission type."""
    return 0 in (acl[0], acl[2], acl[5], acl[6])


def binding_of(acl: Acl) -> AclBinding:
    rtype, name, pattern, principal, host, op, permission = acl
    return AclBinding(_enum(ResourceType, rtype), name, _enum(PatternType, pattern), principal,
                      host, _enum(AclOperation, op), _enum(AclPermissionType, permission))


def filter_of(f: AclFilter) -> AclBindingFilter:
    rtype, name, pattern, principal, host, op, permission = f
    return AclBindingFilter(_enum(ResourceType, rtype), name, _enum(PatternType, pattern),
                            principal, normal_host(host) if host is not None else None,
                            _enum(AclOperation, op), _enum(AclPermissionType, permission))


def wire(b: AclBinding) -> Acl:
    return (int(b.resource_type), b.name, int(b.pattern_type), b.principal, b.host,
            int(b.operation), int(b.permission))


def _order(b: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return wire(b)


def not_constructible(b: AclBinding) -> str | None:
    """Why Kafka's ``ResourcePattern`` / ``AccessControlEntry`` would not take this creation
    (a filter's value), or None."""
    if b.resource_type is ResourceType.ANY:
        return "resourceType must not be ANY"
    if b.pattern_type in (PatternType.MATCH, PatternType.ANY):
        return f"patternType must not be {b.pattern_type.name}"
    if b.operation is AclOperation.ANY:
        return "operation must not be ANY"
    if b.permission is AclPermissionType.ANY:
        return "permissionType must not be ANY"
    return None


def creation_problem(b: AclBinding) -> str | None:
    """Why a creation is refused with INVALID_REQUEST, in Kafka's order and words, then the
    proxy's own checks; None: it is created."""
    if b.resource_type is ResourceType.CLUSTER and b.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not b.name:
        return "Invalid empty resource name"
    if b.resource_type is ResourceType.UNKNOWN:
        return "Invalid resourceType UNKNOWN"
    if b.pattern_type is PatternType.UNKNOWN:
        return "Invalid patternType UNKNOWN"
    if b.operation is AclOperation.UNKNOWN:
        return "Invalid operation UNKNOWN"
    if b.permission is AclPermissionType.UNKNOWN:
        return "Invalid permissionType UNKNOWN"
    if ":" not in b.principal:
        return (f"Could not parse principal from `{b.principal}` (no colon is present "
                "separating the principal type from the principal name)")
    return b.problem()


def filter_problem(f: AclBindingFilter) -> str | None:
    """``AclControlManager.validateFilter``."""
    if f.resource_type is ResourceType.UNKNOWN or f.pattern_type is PatternType.UNKNOWN:
        return "Unknown patternFilter."
    if f.operation is AclOperation.UNKNOWN or f.permission is AclPermissionType.UNKNOWN:
        return "Unknown entryFilter."
    return None


class AclAdminFilter(Filter):
    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key in _KEYS and _LO <= api_version <= _HI:
            return Interest.ANSWERED
        return Interest.NONE

    def __init__(self, host: FilterHost, acls: Acls, store: AclStore) -> None:
        self.host = host
        self.acls = acls
        self.store = store
        self._writes: set[asyncio.Task[None]] = set()

    def _access(self) -> Access:
        client = self.host.client
        return self.acls.access(client.user, client.peer_ip)

    def request(self, entry: InFlight) -> None:
        if entry.api_key in _KEYS and not _LO <= entry.api_version <= _HI:
            # (before any of its bytes go upstream: the connection forwards after this hook)
            self.host.close("unsupported_version", side="client",
                            detail=f"{apis.api_name(entry.api_key)} v{entry.api_version}: the "
                                   f"proxy answers v{_LO}-{_HI}")

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        if entry.answer is not None or entry.api_key not in _KEYS or not (
                _LO <= entry.api_version <= _HI):
            return None  # (another filter answered it, or not one of these)
        if not patchable:  # (never: these frames are read whole) it must not reach the broker
            self.host.close("answered_request_split", detail=apis.api_name(entry.api_key),
                            side="client")
            return None
        try:  # (answered: the connection takes the frame out, the answer goes in its place)
            if entry.api_key == DESCRIBE_ACLS:
                entry.answer = self._describe(entry, frame)
            elif entry.api_key == CREATE_ACLS:
                entry.answer = self._create(entry, frame)
            else:
                entry.answer = self._delete(entry, frame)
        except MalformedFrame as exc:  # closed: nothing of this read goes upstream
            self.host.close("malformed_frame", detail=str(exc), side="client")
        except _Unparsable as exc:
            self.host.close("invalid_request", detail=str(exc), side="client")
        return None

    # ------------------------------------------------------------------ describe
    def _describe(self, entry: InFlight, frame: bytes) -> bytes:
        version, cid = entry.api_version, entry.correlation_id
        raw = decode_describe(frame, version)
        if _raw_unknown(raw):
            raise _Unparsable("DescribeAclsRequest contains UNKNOWN elements")
        store = self.store
        if not self._access().cluster(AclOperation.DESCRIBE, "DescribeAcls"):
            store.describes["refused"] += 1
            return describe_response(version, cid, 0, CLUSTER_AUTHORIZATION_FAILED,
                                     CLUSTER_AUTHORIZATION_MESSAGE, ())
        wanted = filter_of(raw)
        found = sorted((b for b in self.acls.bindings() if wanted.matches(b)), key=_order)
        store.describes["ok"] += 1
        return describe_response(version, cid, 0, NONE, None, [wire(b) for b in found])

    # ------------------------------------------------------------------ create
    def _create(self, entry: InFlight, frame: bytes) -> bytes:
        version, cid = entry.api_version, entry.correlation_id
        creations = decode_create(frame, version)
        if any(_raw_unknown(c) for c in creations):
            raise _Unparsable("CreatableAcls contain unknown elements")
        store = self.store
        user = self.host.client.user
        if not self._access().cluster(AclOperation.ALTER, "CreateAcls"):
            store.creates["refused"] += 1
            log.warning("acl_create_refused", principal=user, client_id=entry.client_id)
            return create_response(version, cid, 0, [
                (CLUSTER_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_MESSAGE)] * len(creations))
        bindings = [binding_of(c) for c in creations]
        whole = next((m for m in map(not_constructible, bindings) if m is not None), None)
        if whole is not None:  # Kafka: the request fails whole, nothing created
            return create_response(version, cid, 0,
                                   [(UNKNOWN_SERVER_ERROR, whole)] * len(creations))
        results: list[tuple[int, str | None]] = []
        valid: dict[AclBinding, None] = {}
        for b in bindings:
            problem = creation_problem(b)
            if problem is None:
                results.append((NONE, None))
                valid[b] = None
            else:
                results.append((INVALID_REQUEST, problem))
        response = create_response(version, cid, 0, results)
        if not valid:
            store.creates["ok"] += 1
            return response

        def failed(exc: AclWriteFailed) -> bytes:
            store.creates["failed"] += 1
            return create_response(version, cid, 0, [
                (UNKNOWN_SERVER_ERROR, f"the ACLs could not be stored: {exc}")
                if code == NONE else (code, message) for code, message in results])

        self._write(entry, list(valid), [], user, failed, store.creates)
        return response

    # ------------------------------------------------------------------ delete
    def _delete(self, entry: InFlight, frame: bytes) -> bytes:
        version, cid = entry.api_version, entry.correlation_id
        filters = decode_delete(frame, version)
        if any(_raw_unknown(f) for f in filters):
            raise _Unparsable("Filters contain UNKNOWN elements")
        store = self.store
        user = self.host.client.user
        if not self._access().cluster(AclOperation.ALTER, "DeleteAcls"):
            store.deletes["refused"] += 1
            log.warning("acl_delete_refused", principal=user, client_id=entry.client_id)
            return delete_response(version, cid, 0, [
                (CLUSTER_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_MESSAGE, ())] * len(filters))
        dynamic = sorted(self.acls.dynamic, key=_order)
        results: list[DeleteResult] = []
        deleted: dict[AclBinding, None] = {}
        kept = 0  # bindings of the config the filters match (never deleted)
        for raw in filters:
            wanted = filter_of(raw)
            problem = filter_problem(wanted)
            if problem is not None:
                results.append((INVALID_REQUEST, problem, ()))
                continue
            matched = [b for b in dynamic if wanted.matches(b)]
            results.append((NONE, None, [(NONE, None, wire(b)) for b in matched]))
            deleted.update(dict.fromkeys(matched))
            kept += sum(1 for b in self.acls.static if wanted.matches(b))
        if kept:
            log.info("acl_delete_config_kept", principal=user, bindings=kept)
        response = delete_response(version, cid, 0, results)
        if not deleted:
            store.deletes["ok"] += 1
            return response

        def failed(exc: AclWriteFailed) -> bytes:
            store.deletes["failed"] += 1
            return delete_response(version, cid, 0, [
                (UNKNOWN_SERVER_ERROR, f"the ACLs could not be deleted: {exc}", ())
                if code == NONE and matching else (code, message, matching)
                for code, message, matching in results])

        self._write(entry, [], list(deleted), user, failed, store.deletes)
        return response

    # ------------------------------------------------------------------ writing
    def _write(self, entry: InFlight, created: list[AclBinding], deleted: list[AclBinding],
               user: str, failed: Callable[[AclWriteFailed], bytes],
               counts: dict[str, int]) -> None:
        """The change written; the connection's responses wait until it is acknowledged
        (``entry.answer`` replaced by ``failed``'s when it is not)."""
        reason = f"acl_change:{entry.correlation_id}"
        self.host.hold_responses(reason)

        async def write() -> None:
            try:
                await self.store.write(created, deleted, f"User:{user}")
                counts["ok"] += 1
            except AclWriteFailed as exc:
                entry.answer = failed(exc)
            finally:
                self.host.release_responses(reason)

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def closed(self, reason: str) -> None:
        for task in list(self._writes):  # the write goes on: only the answer is not needed
            task.remove_done_callback(self._writes.discard)
