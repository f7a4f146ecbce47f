"""DescribeClientQuotas (48) and AlterClientQuotas (49) answered by the proxy (KIP-546), never
forwarded: the connection takes each request's frame out of what goes upstream and sends the
answer in its place among the broker's responses (``protocol.response_stream``).

Describe answers from the merged view (YAML entities and altered overrides) with Kafka's
filter rules; Alter validates as Kafka's controller does, writes the accepted changes to the
overrides topic and answers once the cluster has them: until then the connection's responses
wait (the answer, and the broker's after it). Who may: with ACLs on (``acls:``), as Kafka
asks, ALTER_CONFIGS on the cluster to alter and DESCRIBE_CONFIGS on it to describe; without
them, ``quotas.admin_principals`` may alter and ``describe_principals`` may also describe.
Others get CLUSTER_AUTHORIZATION_FAILED, per entry for an alter and as the top-level error for
a describe, as Kafka answers.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from kafka_quota_proxy.authorizer.acls import AclOperation
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.client_quota_frames import (
    DESCRIBE_CLIENT_QUOTAS,
    AlterRequest,
    alter_response,
    decode_alter,
    decode_describe,
    describe_response,
)
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.proxy.features.quota_admin.admin import AlterFailed, ClientQuotaAdmin
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.quota.client_quotas import (
    AlterEntry,
    Change,
    ClientQuotaError,
    FilterComponent,
    Op,
    alter,
    describe,
)

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.features.acls.state import Acls

log = structlog.get_logger("kafka_quota_proxy.quota_admin")

CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
UNKNOWN_SERVER_ERROR = -1
_CLUSTER_AUTHORIZATION_MESSAGE = "Cluster authorization failed."


class QuotaAdminFilter(Filter):
    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        versions = apis.ANSWERED_BY_PROXY.get(api_key)
        if versions is not None and versions[0] <= api_version <= versions[1]:
            return Interest.ANSWERED
        return Interest.NONE

    def __init__(self, host: FilterHost, admin: ClientQuotaAdmin, acls: Acls | None = None
                 ) -> None:
        self.host = host
        self.admin = admin
        self.acls = acls  # with ACLs on, they say who may (else the quotas' principals)
        self._writes: set[asyncio.Task[None]] = set()

    def _may(self, operation: AclOperation, api: str) -> bool:
        """DESCRIBE_CONFIGS (describe) or ALTER_CONFIGS (alter) on the cluster with ACLs on;
        else ``quotas.describe_principals`` / ``admin_principals``."""
        client = self.host.client
        if self.acls is not None:
            return self.acls.access(client.user, client.peer_ip).cluster(operation, api)
        config = self.admin.config
        if operation is AclOperation.ALTER_CONFIGS:
            return config.may_alter(client.user)
        return config.may_describe(client.user)

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        if entry.answer is not None or not self.interests(entry.api_key, entry.api_version):
            return None  # a frame another filter asked for (fetch routing: Fetch)
        if not patchable:  # (never: these frames are read whole) it must not reach the broker
            self.host.close("answered_request_split", detail=apis.api_name(entry.api_key),
                            side="client")
            return None
        try:  # (answered: the connection takes the frame out, the answer goes in its place)
            if entry.api_key == DESCRIBE_CLIENT_QUOTAS:
                entry.answer = self._describe(entry, frame)
            else:
                entry.answer = self._alter(entry, frame)
        except MalformedFrame as exc:  # closed: nothing of this read goes upstream
            self.host.close("malformed_frame", detail=str(exc), side="client")
        return None

    # ------------------------------------------------------------------ describe
    def _describe(self, entry: InFlight, frame: bytes) -> bytes:
        version, cid = entry.api_version, entry.correlation_id
        request = decode_describe(frame, version)
        admin = self.admin
        if not self._may(AclOperation.DESCRIBE_CONFIGS, "DescribeClientQuotas"):
            admin.describes["refused"] += 1
            return describe_response(version, cid, 0, CLUSTER_AUTHORIZATION_FAILED,
                                     _CLUSTER_AUTHORIZATION_MESSAGE, None)
        try:
            found = describe(admin.view(),
                             [FilterComponent(t, m, n) for t, m, n in request.components],
                             request.strict)
        except ClientQuotaError as exc:
            admin.describes["answered"] += 1
            return describe_response(version, cid, 0, exc.code, exc.message, None)
        admin.describes["answered"] += 1
        return describe_response(version, cid, 0, 0, None,
                                 [(entity, sorted(values.items())) for entity, values in found])

    # ------------------------------------------------------------------ alter
    def _alter(self, entry: InFlight, frame: bytes) -> bytes:
        version, cid = entry.api_version, entry.correlation_id
        request = decode_alter(frame, version)
        admin = self.admin
        user = self.host.client.user
        if not self._may(AclOperation.ALTER_CONFIGS, "AlterClientQuotas"):
            admin.alters["unauthorized"] += len(request.entries)
            log.warning("quota_alter_refused", principal=user, client_id=entry.client_id)
            return alter_response(version, cid, 0, [
                (components, CLUSTER_AUTHORIZATION_FAILED, _CLUSTER_AUTHORIZATION_MESSAGE)
                for components, _ in request.entries])
        if not admin.config.overrides.enabled:
            admin.alters["invalid"] += len(request.entries)
            return alter_response(version, cid, 0, [
                (components, INVALID_REQUEST, "client quotas cannot be altered through this "
                 "proxy: quotas.overrides.enabled is false")
                for components, _ in request.entries])
        results, changes = alter(admin.overrides, _entries(request))
        answer = [(r.components, r.error_code, r.error_message) for r in results]
        response = alter_response(version, cid, 0, answer)
        changed = {c.entity for c in changes}
        for r in results:  # (the changed ones once written: ``_write``)
            if r.error_code:
                admin.alters["invalid"] += 1
            elif request.validate_only:
                admin.alters["validated"] += 1
            elif r.components not in changed:
                admin.alters["unchanged"] += 1
        if request.validate_only or not changes:
            return response
        # answered once the cluster has the changes: the responses wait until then
        reason = f"quota_alter:{cid}"
        self.host.hold_responses(reason)
        task = asyncio.get_running_loop().create_task(
            self._write(entry, changes, answer, user, reason))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return response

    async def _write(self, entry: InFlight, changes: list[Change],
                     answer: list[tuple[tuple[tuple[str, str | None], ...], int, str | None]],
                     user: str, reason: str) -> None:
        changed = {c.entity for c in changes}
        try:
            await self.admin.write(changes, user)
            self.admin.alters["applied"] += len(changed)
        except AlterFailed as exc:
            self.admin.alters["failed"] += len(changed)
            entry.answer = alter_response(entry.api_version, entry.correlation_id, 0, [
                (components, UNKNOWN_SERVER_ERROR, f"the quotas could not be stored: {exc}")
                if code == 0 and components in changed else (components, code, msg)
                for components, code, msg in answer])
        finally:
            self.host.release_responses(reason)

    def closed(self, reason: str) -> None:
        for task in list(self._writes):  # the write goes on: only the answer is not needed
            task.remove_done_callback(self._writes.discard)


def _entries(request: AlterRequest) -> list[AlterEntry]:
    return [AlterEntry(components, tuple(Op(o.key, o.value, o.remove) for o in ops))
            for components, ops in request.entries]

