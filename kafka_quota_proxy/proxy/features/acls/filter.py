"""The ACL checks on whole requests (``docs/acls.md``): the cluster, the request's group or
transactional id, each group or transactional id a request lists, and the config resources
of the cluster and of groups, in Kafka's order (``authorizer.api_checks``). A denied request
is answered by the proxy with the response Kafka's broker gives (``getErrorResponse``:
``protocol.error_responses``) and never forwarded. The checks on each topic are the topic
guard's (``proxy.features.acls.topics``); the lists a broker answers in full (ListGroups,
ListTransactions) are filtered on their way back (``ListedOnly``).

Where Kafka answers a list item by item (``ITEMIZED``: OffsetFetch v8+, FindCoordinator v4+,
DescribeGroups, DeleteGroups, DescribeTransactions, ConsumerGroupDescribe, config resources),
the denied items are answered by the proxy and merged into the broker's answer to the others
(``ItemErrors``; the topic guard merges its refused topics' results with them). An API whose
error response the proxy cannot build, when denied, closes the connection
(``FilterHost.refuse``), logged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_quota_proxy.authorizer.acls import CLUSTER_NAME, AclOperation, ResourceType
from kafka_quota_proxy.authorizer.api_checks import API_CHECKS
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.decoded import request_body, response_body
from kafka_quota_proxy.protocol.error_responses import COVERED, error_response
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import parse_request_header, parse_response_header
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.proxy.features.acls.state import NOT_ASKED, Access, Acls
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.acls")

_Op = AclOperation
_R = ResourceType
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
DELEGATION_TOKEN_AUTHORIZATION_FAILED = 58
TOPIC_AUTHORIZATION_FAILED = 29
OPERATION_NOT_ATTEMPTED = 55
_CODE = {_R.GROUP: GROUP_AUTHORIZATION_FAILED, _R.CLUSTER: CLUSTER_AUTHORIZATION_FAILED,
         _R.TRANSACTIONAL_ID: TRANSACTIONAL_ID_AUTHORIZATION_FAILED}

Need = tuple[ResourceType, AclOperation, str]  # one question: (type, operation, name)

# APIs checked on the cluster only: the operation (denied: CLUSTER_AUTHORIZATION_FAILED)
CLUSTER_ONLY: dict[int, AclOperation] = {
    34: _Op.ALTER,  # AlterReplicaLogDirs
    35: _Op.DESCRIBE,  # DescribeLogDirs
    43: _Op.ALTER,  # ElectLeaders
    45: _Op.ALTER,  # AlterPartitionReassignments
    46: _Op.DESCRIBE,  # ListPartitionReassignments
    50: _Op.DESCRIBE,  # DescribeUserScramCredentials
    51: _Op.ALTER,  # AlterUserScramCredentials
    55: _Op.DESCRIBE,  # DescribeQuorum
    57: _Op.ALTER,  # UpdateFeatures
    64: _Op.ALTER,  # UnregisterBroker
    74: _Op.DESCRIBE_CONFIGS,  # ListConfigResources
    80: _Op.ALTER,  # AddRaftVoter
    81: _Op.ALTER,  # RemoveRaftVoter
}
# APIs naming one group in ``group_id``: the operation on it
REQUEST_GROUP: dict[int, AclOperation] = {
    8: _Op.READ,  # OffsetCommit
    11: _Op.READ, 12: _Op.READ, 13: _Op.READ, 14: _Op.READ,  # Join, Heartbeat, Leave, Sync
    47: _Op.DELETE,  # OffsetDelete
    68: _Op.READ,  # ConsumerGroupHeartbeat
    76: _Op.READ,  # ShareGroupHeartbeat
    78: _Op.READ, 79: _Op.READ,  # ShareFetch, ShareAcknowledge
    88: _Op.READ,  # StreamsGroupHeartbeat
    91: _Op.READ,  # AlterShareGroupOffsets
    92: _Op.DELETE,  # DeleteShareGroupOffsets
}
# APIs listing groups: the field (a list of names, or of entries with ``group_id``)
GROUP_LISTS: dict[int, tuple[str, AclOperation]] = {
    15: ("groups", _Op.DESCRIBE),  # DescribeGroups
    42: ("groups_names", _Op.DELETE),  # DeleteGroups
    69: ("group_ids", _Op.DESCRIBE),  # ConsumerGroupDescribe
    77: ("group_ids", _Op.DESCRIBE),  # ShareGroupDescribe
    89: ("group_ids", _Op.DESCRIBE),  # StreamsGroupDescribe
    90: ("groups", _Op.DESCRIBE),  # DescribeShareGroupOffsets
}
DELEGATION_TOKENS = frozenset({38, 39, 40, 41})
# ConfigResource types: those of the cluster, and groups (topics: the topic guard)
_CLUSTER_CONFIGS = frozenset({4, 8, 16})  # BROKER, BROKER_LOGGER, CLIENT_METRICS
_GROUP_CONFIGS = 32
_CONFIG_OPERATION = {32: _Op.DESCRIBE_CONFIGS, 33: _Op.ALTER_CONFIGS,
                     44: _Op.ALTER_CONFIGS}
LISTED: dict[int, tuple[str, str, ResourceType]] = {
    16: ("groups", "group_id", _R.GROUP),  # ListGroups
    66: ("transaction_states", "transactional_id", _R.TRANSACTIONAL_ID),  # ListTransactions
}
_BROKER_ONLY = frozenset(k for k, a in API_CHECKS.items() if a.audience == "broker")


def _names(items: Any) -> Iterator[str]:
    for item in items or ():
        yield item if isinstance(item, str) else item.group_id


def needs(api_key: int, version: int, body: Any) -> list[tuple[Need, int]]:
    """What Kafka asks for this request before its topics, in its order, each with the error
    a denial answers."""
    out: list[tuple[Need, int]] = []
    cluster: Callable[[AclOperation], tuple[Need, int]] = lambda op: (  # noqa: E731
        (_R.CLUSTER, op, CLUSTER_NAME), CLUSTER_AUTHORIZATION_FAILED)
    if api_key in CLUSTER_ONLY:
        return [cluster(CLUSTER_ONLY[api_key])]
    if api_key in (22, 25, 26, 28) or (api_key == 24 and version <= 3):
        txn = body.v3_and_below_transactional_id if api_key == 24 else body.transactional_id
        if txn is not None:
            out.append(((_R.TRANSACTIONAL_ID, _Op.WRITE, txn),
                        TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
            if api_key == 22 and getattr(body, "enable2_pc", False):
                out.append(((_R.TRANSACTIONAL_ID, _Op.TWO_PHASE_COMMIT, txn),
                            TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    if api_key == 24 and version >= 4:
        return [cluster(_Op.CLUSTER_ACTION)]
    if api_key in (25, 28):
        out.append(((_R.GROUP, _Op.READ, body.group_id), GROUP_AUTHORIZATION_FAILED))
    operation = REQUEST_GROUP.get(api_key)
    if operation is not None:
        out.append(((_R.GROUP, operation, body.group_id), GROUP_AUTHORIZATION_FAILED))
    lists = GROUP_LISTS.get(api_key)
    if lists is not None:
        out += [((_R.GROUP, lists[1], g), GROUP_AUTHORIZATION_FAILED)
                for g in _names(getattr(body, lists[0]))]
    if api_key == 9 and version <= 7:  # OffsetFetch: one group (v0-7) or several
        out.append(((_R.GROUP, _Op.DESCRIBE, body.group_id), GROUP_AUTHORIZATION_FAILED))
    elif api_key == 9 or api_key in _CONFIG_OPERATION:
        out += [check for _, check in item_checks(api_key, version, body) if check is not None]
    elif api_key == 10:  # FindCoordinator: one key (v0-3) or several, of one type
        keys = [body.key] if version <= 3 else list(body.coordinator_keys)
        key_type = body.key_type if version >= 1 else 0
        if key_type == 0:
            out += [((_R.GROUP, _Op.DESCRIBE, k), GROUP_AUTHORIZATION_FAILED) for k in keys]
        elif key_type == 1:
            out += [((_R.TRANSACTIONAL_ID, _Op.DESCRIBE, k),
                     TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for k in keys]
        else:
            out.append(cluster(_Op.CLUSTER_ACTION))
    elif api_key == 65:  # DescribeTransactions
        out += [((_R.TRANSACTIONAL_ID, _Op.DESCRIBE, t), TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                for t in body.transactional_ids]
    elif api_key == 60 and getattr(body, "endpoint_type", 1) == 2:  # DescribeCluster
        out.append(cluster(_Op.ALTER))
    elif api_key in _BROKER_ONLY:
        out.append(cluster(_Op.CLUSTER_ACTION))
    return out


def item_checks(api_key: int, version: int, body: Any
                ) -> list[tuple[Any, tuple[Need, int] | None]]:
    """Each item of a request answered item by item (``ITEMIZED``), with what Kafka asks
    for it here (None: nothing: a topic's config resource, the topic guard's)."""
    if api_key in _CONFIG_OPERATION:
        op = _CONFIG_OPERATION[api_key]
        out: list[tuple[Any, tuple[Need, int] | None]] = []
        for resource in body.resources:
            kind = int(resource.resource_type)
            if kind in _CLUSTER_CONFIGS:
                out.append((resource, ((_R.CLUSTER, op, CLUSTER_NAME),
                                       CLUSTER_AUTHORIZATION_FAILED)))
            elif kind == _GROUP_CONFIGS:
                out.append((resource, ((_R.GROUP, op, resource.resource_name),
                                       GROUP_AUTHORIZATION_FAILED)))
            else:
                out.append((resource, None))
        return out
    if api_key == 9:  # OffsetFetch v8+
        return [(g, ((_R.GROUP, _Op.DESCRIBE, g.group_id), GROUP_AUTHORIZATION_FAILED))
                for g in body.groups]
    items = getattr(body, ITEMIZED[api_key][0])
    return list(zip(items, needs(api_key, version, body), strict=True))  # (one per item)


# the API keys ``needs`` may ask about, and those whose whole request it reads
CHECKED = frozenset({*CLUSTER_ONLY, *REQUEST_GROUP, *GROUP_LISTS, 9, 10, 22, 24, 25, 26, 28,
                     65, *_CONFIG_OPERATION, 60, *_BROKER_ONLY, *DELEGATION_TOKENS})


# APIs answering item by item (the request's list, the response's, from which version):
# a request with some items denied goes on without them, their errors merged into the answer
ITEMIZED: dict[int, tuple[str, str, int]] = {
    9: ("groups", "groups", 8),  # OffsetFetch
    10: ("coordinator_keys", "coordinators", 4),  # FindCoordinator
    15: ("groups", "groups", 0),  # DescribeGroups
    42: ("groups_names", "results", 0),  # DeleteGroups
    65: ("transactional_ids", "transaction_states", 0),  # DescribeTransactions
    69: ("group_ids", "groups", 0),  # ConsumerGroupDescribe
    32: ("resources", "results", 0),  # DescribeConfigs
    33: ("resources", "responses", 0),  # AlterConfigs
    44: ("resources", "responses", 0),  # IncrementalAlterConfigs
}


class ItemErrors:
    """``InFlight.refused`` of a request answered item by item: the denied items' error
    entries (as Kafka's error response has them) added to the broker's answer, and, where the
    request asked for them, each group's ``authorized_operations`` the client's (``amend``)."""

    __slots__ = ("access", "entries", "field")

    def __init__(self, field: str, entries: tuple[Any, ...],
                 access: Access | None = None) -> None:
        self.field = field
        self.entries = entries
        self.access = access

    def amend(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        key, version = entry.api_key, entry.api_version
        value = response_body(frame, key, version)
        header = parse_response_header(frame, 0, len(frame),
                                       apis.response_header_version(key, version))
        items = getattr(value, self.field)
        access = self.access
        if access is not None:
            items = tuple(dataclasses.replace(
                g, authorized_operations=access.authorized_operations(_R.GROUP, g.group_id))
                if g.authorized_operations != NOT_ASKED and not g.error_code else g
                for g in items)
        return bytes(frame[: header.size]) + encode(
            dataclasses.replace(value, **{self.field: (*items, *self.entries)}))


class ClusterOperations:
    """``InFlight.refused`` of a DescribeCluster asking for the cluster's authorized
    operations: the client's, not the proxy's own principal's (``amend``)."""

    __slots__ = ("access",)

    def __init__(self, access: Access) -> None:
        self.access = access

    def amend(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        key, version = entry.api_key, entry.api_version
        value = response_body(frame, key, version)
        if value.cluster_authorized_operations == NOT_ASKED:
            return None
        header = parse_response_header(frame, 0, len(frame),
                                       apis.response_header_version(key, version))
        return bytes(frame[: header.size]) + encode(dataclasses.replace(
            value, cluster_authorized_operations=self.access.authorized_operations(
                _R.CLUSTER, CLUSTER_NAME)))


class ListedOnly:
    """``InFlight.refused`` of a ListGroups or ListTransactions answered in full by the
    broker: the items this client may not describe left out (``amend``)."""

    __slots__ = ("access",)

    def __init__(self, access: Access) -> None:
        self.access = access

    def amend(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        key, version = entry.api_key, entry.api_version
        field, name_field, resource_type = LISTED[key]
        value = response_body(frame, key, version)
        items = getattr(value, field)
        kept = tuple(i for i in items if self.access.allowed(
            _Op.DESCRIBE, resource_type, getattr(i, name_field)))
        if len(kept) == len(items):
            return None
        header = parse_response_header(frame, 0, len(frame),
                                       apis.response_header_version(key, version))
        return bytes(frame[: header.size]) + encode(dataclasses.replace(value, **{field: kept}))


class AclFilter(Filter):
    """The checks on whole requests for one connection (see the module's docstring)."""

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key in CHECKED:
            return Interest.REQUEST_FRAME | Interest.WHOLE_REQUEST
        return Interest.NONE

    def __init__(self, host: FilterHost, acls: Acls) -> None:
        self.host = host
        self.acls = acls
        self._access: Access | None = None
        self._access_for: tuple[str, str | None] | None = None

    def access(self) -> Access:
        """This connection's principal from its address (the principal changes once, when
        the client authenticates)."""
        client = self.host.client
        access = self._access
        if access is None or self._access_for != (client.user, client.peer_ip):
            self._access_for = (client.user, client.peer_ip)
            access = self._access = self.acls.access(client.user, client.peer_ip)
        return access

    def request(self, entry: InFlight) -> None:
        key = entry.api_key
        if key in LISTED:
            access = self.access()
            if access.super_user:
                return
            if key == 66 or not access.allowed(_Op.DESCRIBE, _R.CLUSTER, CLUSTER_NAME):
                entry.refused = ListedOnly(access)  # (ListGroups: the cluster's sees all)

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        key, version = entry.api_key, entry.api_version
        if entry.answer is not None or key not in CHECKED:
            return None
        access = self.access()
        if access.super_user:
            return None
        if key in DELEGATION_TOKENS:  # (tokens the brokers would make for the proxy's login)
            access.acls.denial(access, _Op.CREATE_TOKENS, _R.USER, access.principal,
                               apis.api_name(key))
            self._refuse(entry, "delegation tokens are not offered through the proxy")
            return None
        low, high = apis.kio_version_range(key)
        if not low <= version <= high:
            self._refuse(entry, "version_not_decoded")
            return None
        try:
            body = request_body(frame, key, version)
        except MalformedFrame:
            return None  # the broker answers it (or closes) as it would
        label = apis.api_name(key)
        itemized = ITEMIZED.get(key)
        if itemized is not None and version >= itemized[2] and (
                key != 10 or body.key_type in (0, 1)):
            forwarded = self._items(entry, frame, patchable, body, itemized, access)
            if entry.answer is None and getattr(body, "include_authorized_operations", False):
                if isinstance(entry.refused, ItemErrors):
                    entry.refused.access = access
                else:
                    entry.refused = ItemErrors(itemized[1], (), access)
            return forwarded
        for (resource_type, operation, name), code in needs(key, version, body):
            if not access.check(operation, resource_type, name, label):
                self._deny(entry, frame, code)
                return None
        if key == 24 and version <= 3:
            self._add_partitions(entry, frame, body, access, label)
            return None
        if key == 60 and body.include_cluster_authorized_operations:
            entry.refused = ClusterOperations(access)
        if key == 22 and body.transactional_id is None and not (
                access.allowed(_Op.IDEMPOTENT_WRITE, _R.CLUSTER, CLUSTER_NAME)
                or access.any_of_type(_Op.WRITE, _R.TOPIC)):  # (idempotence: either)
            access.acls.denial(access, _Op.IDEMPOTENT_WRITE, _R.CLUSTER, CLUSTER_NAME, label)
            self._deny(entry, frame, CLUSTER_AUTHORIZATION_FAILED)
        return None

    def _items(self, entry: InFlight, frame: bytes, patchable: bool, body: Any,
               itemized: tuple[str, str, int], access: Access) -> bytes | None:
        """A request answered item by item: the denied items answered by the proxy (merged
        into the broker's answer to the others), as Kafka answers each."""
        key, version = entry.api_key, entry.api_version
        field, response_field, _ = itemized
        label = apis.api_name(key)
        checks = item_checks(key, version, body)
        denied: dict[int, int] = {}  # item's index -> its error
        for i, (_, check) in enumerate(checks):
            if check is not None:
                (kind, op, name), code = check
                if not access.check(op, kind, name, label):
                    denied[i] = code
        if not denied:
            return None
        if len(denied) == len(checks):
            self._deny(entry, frame, next(iter(denied.values())))
            return None
        if not patchable:
            self._refuse(entry, "frame_too_large")
            return None
        head = frame[: parse_request_header(frame, 0, len(frame)).size]
        errors: list[Any] = []
        for code in sorted(set(denied.values())):  # (Kafka's error entries, per error)
            only = tuple(item for i, (item, _) in enumerate(checks) if denied.get(i) == code)
            try:
                answer = error_response(key, version, entry.correlation_id,
                                        head + encode(dataclasses.replace(body, **{field: only})),
                                        code)
            except (MalformedFrame, NotImplementedError):
                self._refuse(entry, "no_error_response")
                return None
            errors += getattr(response_body(answer[4:], key, version), response_field)
        entry.refused = ItemErrors(response_field, tuple(errors))
        return head + encode(dataclasses.replace(body, **{field: tuple(
            item for i, (item, _) in enumerate(checks) if i not in denied)}))

    def _add_partitions(self, entry: InFlight, frame: bytes, body: Any, access: Access,
                        label: str) -> None:
        """AddPartitionsToTxn v0-3 with a topic the client may not write: nothing is added,
        as Kafka answers it: TOPIC_AUTHORIZATION_FAILED on that topic's partitions,
        OPERATION_NOT_ATTEMPTED on the others (checked here, not by the topic guard, which
        would let the rest go on)."""
        denied = {t.name for t in body.v3_and_below_topics
                  if not access.check(_Op.WRITE, _R.TOPIC, t.name, label)}
        if not denied:
            return
        key, version = entry.api_key, entry.api_version
        try:
            answer = error_response(key, version, entry.correlation_id, frame,
                                    OPERATION_NOT_ATTEMPTED)
        except (MalformedFrame, NotImplementedError):
            self._refuse(entry, "no_error_response")
            return
        answer = answer[4:]  # (without its size)
        value = response_body(answer, key, version)
        topics = tuple(dataclasses.replace(t, results_by_partition=tuple(
            dataclasses.replace(p, partition_error_code=ErrorCode(TOPIC_AUTHORIZATION_FAILED))
            for p in t.results_by_partition)) if t.name in denied else t
            for t in value.results_by_topic_v3_and_below)
        header = parse_response_header(answer, 0, len(answer),
                                       apis.response_header_version(key, version))
        entry.answer = answer[:header.size] + encode(
            dataclasses.replace(value, results_by_topic_v3_and_below=topics))

    def _deny(self, entry: InFlight, frame: bytes, code: int) -> None:
        """Answered as Kafka answers it (nothing forwarded), or, where no answer is built,
        refused (the connection closes once what came before is answered)."""
        if entry.api_key not in COVERED:
            self._refuse(entry, "no_error_response")
            return
        try:
            answer = error_response(entry.api_key, entry.api_version, entry.correlation_id,
                                    frame, code)
        except (MalformedFrame, NotImplementedError):
            self._refuse(entry, "no_error_response")
            return
        entry.answer = answer[4:]  # (without its size)

    def _refuse(self, entry: InFlight, reason: str) -> None:
        self.host.refuse(entry, "acl_denied", f"{apis.api_name(entry.api_key)} "
                         f"v{entry.api_version} denied and not answerable ({reason})")
