"""What a Kafka broker (or controller) authorizes for each API, as data: the checks the proxy
must make to enforce ACLs as Kafka would, with the error a denied client gets.

Each ``ApiChecks`` lists its ``Check`` s in the order Kafka makes them. A check is one
question to the authorizer: ``operation`` on ``resource`` (a LITERAL resource name: the
request's topic, group, transactional id... or the cluster ``kafka-cluster``), asked for
``on`` (the whole request, each topic, each group...), under the condition ``when`` (empty:
always). ``denied`` is the error code the denied request or resource gets (29
TOPIC_AUTHORIZATION_FAILED, 30 GROUP_AUTHORIZATION_FAILED, 31 CLUSTER_AUTHORIZATION_FAILED, 53
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 58 DELEGATION_TOKEN_AUTHORIZATION_FAILED); 0 means the
denied resource is left out of the answer without an error (or, where the note says so, the
check only changes what the answer shows).

Alternatives: a check with ``or_else=True`` is asked only where the check just before it was
denied, and allows what that one did not. A chain (a check followed by its ``or_else``
checks) allows when any of its checks allows; a chain denied as a whole gets the ``denied``
of its last check (the first checks of a chain carry the same code). For example CreateTopics
is "CREATE on the cluster, else CREATE on each topic (29)".

The checks were read in Apache Kafka's request handlers (``KafkaApis``, ``ControllerApis``,
``AclApis``, ``AuthHelper``, ``ConfigHelper``, ``DescribeTopicPartitionsRequestHandler``);
``source`` names the handler and ``SOURCE_FILES`` the file each class lives in. Requests a
broker forwards to the controller in KRaft are authorized by the controller (``ControllerApis``).
The semantics are Kafka 3.7-4.0 (KRaft); a note marks a check that may be newer than 4.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.authorizer.acls import AclOperation, ResourceType

# Kafka's error codes a denied check answers with (0: left out of the answer, no error)
ERROR_NAMES: dict[int, str] = {
    0: "no error (left out)",
    29: "TOPIC_AUTHORIZATION_FAILED",
    30: "GROUP_AUTHORIZATION_FAILED",
    31: "CLUSTER_AUTHORIZATION_FAILED",
    53: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    58: "DELEGATION_TOKEN_AUTHORIZATION_FAILED",
}

# where the handlers named in ``ApiChecks.source`` live in Apache Kafka's repository
SOURCE_FILES: dict[str, str] = {
    "KafkaApis": "core/src/main/scala/kafka/server/KafkaApis.scala",
    "ControllerApis": "core/src/main/scala/kafka/server/ControllerApis.scala",
    "AclApis": "core/src/main/scala/kafka/server/AclApis.scala",
    "AuthHelper": "core/src/main/scala/kafka/server/AuthHelper.scala",
    "ConfigHelper": "core/src/main/scala/kafka/server/ConfigHelper.scala",
    "DescribeTopicPartitionsRequestHandler":
        "core/src/main/java/kafka/server/handlers/DescribeTopicPartitionsRequestHandler.java",
}

AUDIENCES = frozenset({"client", "broker", "proxy"})


@dataclass(frozen=True, slots=True)
class Check:
    """One authorization question Kafka asks for a request (see the module docstring)."""

    resource: ResourceType
    operation: AclOperation
    on: str
    denied: int
    when: str = ""
    or_else: bool = False  # asked only where the check before it was denied; either allows


@dataclass(frozen=True, slots=True)
class ApiChecks:
    """The checks Kafka makes for one API key, where it makes them, and who sends the API:
    ``client`` (clients and admin tools), ``broker`` (brokers and controllers only: a client
    never should) or ``proxy`` (the proxy answers it itself)."""

    api_key: int
    name: str
    checks: tuple[Check, ...]
    source: str
    audience: str
    note: str = ""


_T, _G, _C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
_TX, _DT, _U = ResourceType.TRANSACTIONAL_ID, ResourceType.DELEGATION_TOKEN, ResourceType.USER
_Op = AclOperation

_TOPIC, _GROUP, _CLUSTER, _TXN = 29, 30, 31, 53


def _cluster(op: AclOperation, when: str = "") -> Check:
    """``op`` on the cluster for the whole request: Kafka's ``authorizeClusterOperation``,
    which fails the whole request with CLUSTER_AUTHORIZATION_FAILED."""
    return Check(_C, op, "request", _CLUSTER, when)


def _group(op: AclOperation) -> Check:
    return Check(_G, op, "request's group", _GROUP)


def _api(key: int, name: str, checks: tuple[Check, ...], source: str, audience: str,
         note: str = "") -> ApiChecks:
    return ApiChecks(key, name, checks, source, audience, note)


_ALL: tuple[ApiChecks, ...] = (
    _api(0, "Produce", (
        Check(_TX, _Op.WRITE, "request", _TXN, "the records are transactional"),
        Check(_T, _Op.WRITE, "each topic", _TOPIC),
    ), "KafkaApis.handleProduceRequest", "client",
        "Transactional records with a null transactional_id are denied too (53, whole "
        "request). Idempotent (non-transactional) produce needs no IDEMPOTENT_WRITE here. "
        "WRITE is checked before existence: an unknown topic the client may write gets "
        "UNKNOWN_TOPIC_OR_PARTITION, one it may not gets 29."),
    _api(1, "Fetch", (
        Check(_T, _Op.READ, "each topic", _TOPIC, "a consumer (replica_id < 0)"),
        Check(_C, _Op.CLUSTER_ACTION, "request", _TOPIC, "a follower (replica_id >= 0)"),
    ), "KafkaApis.handleFetchRequest", "client",
        "The error is per partition. A follower fetch without CLUSTER_ACTION gets "
        "TOPIC_AUTHORIZATION_FAILED (29) on every partition, not 31. READ is checked before "
        "existence. Controllers answer Fetch (KRaft) with CLUSTER_ACTION (ControllerApis."
        "handleFetch)."),
    _api(2, "ListOffsets", (
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC),
    ), "KafkaApis.handleListOffsetRequest", "client"),
    _api(3, "Metadata", (
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, "topics named (by name or id)"),
        Check(_T, _Op.DESCRIBE, "each topic", 0, "listing all topics (topics null)"),
        Check(_C, _Op.CREATE, "the cluster", _TOPIC,
              "auto-creating a topic (allow_auto_topic_creation and auto.create.topics.enable)"),
        Check(_T, _Op.CREATE, "each topic to create", _TOPIC, "auto-creating a topic",
              or_else=True),
        Check(_C, _Op.DESCRIBE, "the cluster", 0,
              "v8-10 with include_cluster_authorized_operations"),
    ), "KafkaApis.handleTopicMetadataRequest", "client",
        "A named topic not describable gets 29 whether it exists or not (its existence is "
        "never checked; topic id zeroed); listing all topics leaves it out (so does v0 with "
        "an empty list). Only describable topics that do not exist are considered for "
        "auto-creation. Denied DESCRIBE on the cluster only sets cluster_authorized_operations "
        "to 0; topic_authorized_operations is each topic's allowed operations."),
    _api(8, "OffsetCommit", (
        _group(_Op.READ),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleOffsetCommitRequest", "client",
        "A denied group fails every partition with 30. READ on the topic is checked before "
        "existence (UNKNOWN_TOPIC_OR_PARTITION only for allowed topics)."),
    _api(9, "OffsetFetch", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, "topics named"),
        Check(_T, _Op.DESCRIBE, "each topic", 0, "all the group's offsets (topics null)"),
    ), "KafkaApis.handleOffsetFetchRequest", "client",
        "v8+ carries several groups, each authorized alone."),
    _api(10, "FindCoordinator", (
        Check(_G, _Op.DESCRIBE, "each key", _GROUP, "key_type 0 (group)"),
        Check(_TX, _Op.DESCRIBE, "each key", _TXN, "key_type 1 (transaction)"),
        Check(_C, _Op.CLUSTER_ACTION, "request", _CLUSTER, "key_type 2 (share coordinator)"),
    ), "KafkaApis.getCoordinator", "client",
        "v4+ carries several keys, each answered alone; below v4 the error is the "
        "response's. Share-coordinator keys are asked by brokers only."),
    _api(11, "JoinGroup", (_group(_Op.READ),), "KafkaApis.handleJoinGroupRequest", "client"),
    _api(12, "Heartbeat", (_group(_Op.READ),), "KafkaApis.handleHeartbeatRequest", "client"),
    _api(13, "LeaveGroup", (_group(_Op.READ),), "KafkaApis.handleLeaveGroupRequest", "client"),
    _api(14, "SyncGroup", (_group(_Op.READ),), "KafkaApis.handleSyncGroupRequest", "client",
         "v5+ without protocol_type and protocol_name gets INCONSISTENT_GROUP_PROTOCOL "
         "before the ACL check."),
    _api(15, "DescribeGroups", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
    ), "KafkaApis.handleDescribeGroupsRequest", "client",
        "authorized_operations (v3+) is each group's allowed operations."),
    _api(16, "ListGroups", (
        Check(_C, _Op.DESCRIBE, "the cluster", 0),
        Check(_G, _Op.DESCRIBE, "each group", 0, or_else=True),
    ), "KafkaApis.handleListGroupsRequest", "client",
        "DESCRIBE on the cluster lists every group; without it, only the groups the client "
        "may DESCRIBE are listed (the others silently left out)."),
    _api(17, "SaslHandshake", (), "KafkaApis.handleSaslHandshakeRequest", "client",
         "Part of authentication: no ACL."),
    _api(18, "ApiVersions", (), "KafkaApis.handleApiVersionsRequest", "client",
         "No ACL, before or after authentication."),
    _api(19, "CreateTopics", (
        Check(_C, _Op.CREATE, "the cluster", _TOPIC),
        Check(_T, _Op.CREATE, "each topic", _TOPIC, or_else=True),
        Check(_T, _Op.DESCRIBE_CONFIGS, "each created topic's configs", 0,
              "returning the topic's configs (v5+)"),
    ), "ControllerApis.handleCreateTopics", "client",
        "Forwarded by the broker to the controller (KRaft), which authorizes. Duplicate "
        "names get INVALID_REQUEST. Topics not allowed DESCRIBE_CONFIGS are created without "
        "their configs in the answer (how the controller marks them, "
        "ReplicationControlManager, was not read here)."),
    _api(20, "DeleteTopics", (
        Check(_C, _Op.DELETE, "the cluster", _TOPIC),
        Check(_T, _Op.DELETE, "each topic", _TOPIC, or_else=True),
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, "no DELETE on the cluster"),
    ), "ControllerApis.handleDeleteTopics", "client",
        "DELETE on the cluster allows every topic; without it a topic needs both DELETE "
        "and DESCRIBE (an ALLOW of DELETE implies DESCRIBE, so only a DENY of DESCRIBE "
        "matters). Not describable: 29 (a topic named by id "
        "gets no name back); describable but not deletable: 29. Existence is checked only "
        "after DESCRIBE, and the answers are shuffled so order reveals nothing."),
    _api(21, "DeleteRecords", (
        Check(_T, _Op.DELETE, "each topic", _TOPIC),
    ), "KafkaApis.handleDeleteRecordsRequest", "client"),
    _api(22, "InitProducerId", (
        Check(_TX, _Op.WRITE, "request", _TXN, "transactional_id set"),
        Check(_TX, _Op.TWO_PHASE_COMMIT, "request", _TXN, "transactional_id set and enable_2pc"),
        Check(_C, _Op.IDEMPOTENT_WRITE, "the cluster", _CLUSTER, "transactional_id null"),
        Check(_T, _Op.WRITE, "any topic", _CLUSTER, "transactional_id null", or_else=True),
    ), "KafkaApis.handleInitProducerIdRequest", "client",
        "An idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some "
        "topic: authorizeByResourceType(WRITE, TOPIC) (KIP-679), true when an ALLOW on any "
        "topic pattern is not covered by a DENY. The TWO_PHASE_COMMIT check (KIP-939, "
        "enable_2pc in v6) is newer than 4.0."),
    _api(23, "OffsetForLeaderEpoch", (
        Check(_C, _Op.CLUSTER_ACTION, "the cluster", _TOPIC),
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, or_else=True),
    ), "KafkaApis.handleOffsetForLeaderEpochRequest", "client",
        "CLUSTER_ACTION (followers) allows every topic; consumers (KIP-320) need DESCRIBE "
        "on each topic. The error is per partition."),
    _api(24, "AddPartitionsToTxn", (
        Check(_TX, _Op.WRITE, "each transaction", _TXN, "v0-3 (clients)"),
        Check(_T, _Op.WRITE, "each topic", _TOPIC, "v0-3 (clients)"),
        _cluster(_Op.CLUSTER_ACTION, "v4+ (brokers verifying a transaction)"),
    ), "KafkaApis.handleAddPartitionsToTxnRequest", "client",
        "Internal topics are never allowed by WRITE here (they get 29). One partition denied "
        "or unknown fails the whole transaction: the others get OPERATION_NOT_ATTEMPTED. v4+ "
        "(batched transactions) is sent by brokers only."),
    _api(25, "AddOffsetsToTxn", (
        Check(_TX, _Op.WRITE, "request", _TXN),
        _group(_Op.READ),
    ), "KafkaApis.handleAddOffsetsToTxnRequest", "client"),
    _api(26, "EndTxn", (
        Check(_TX, _Op.WRITE, "request", _TXN),
    ), "KafkaApis.handleEndTxnRequest", "client"),
    _api(27, "WriteTxnMarkers", (
        Check(_C, _Op.ALTER, "request", _CLUSTER),
        Check(_C, _Op.CLUSTER_ACTION, "request", _CLUSTER, or_else=True),
    ), "KafkaApis.handleWriteTxnMarkersRequest", "broker",
        "Sent by transaction coordinators. The ALTER-on-cluster alternative is in the "
        "post-4.0 source read; older releases may ask CLUSTER_ACTION only."),
    _api(28, "TxnOffsetCommit", (
        Check(_TX, _Op.WRITE, "request", _TXN),
        _group(_Op.READ),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleTxnOffsetCommitRequest", "client",
        "The transactional id and the group fail every partition (53, then 30); the topic "
        "check is per topic, before existence."),
    _api(29, "DescribeAcls", (_cluster(_Op.DESCRIBE),), "AclApis.handleDescribeAcls", "proxy",
         "The proxy will answer it from its own ACLs."),
    _api(30, "CreateAcls", (_cluster(_Op.ALTER),), "AclApis.handleCreateAcls", "proxy",
         "The proxy will answer it from its own ACLs (forwarded to the controller in Kafka)."),
    _api(31, "DeleteAcls", (_cluster(_Op.ALTER),), "AclApis.handleDeleteAcls", "proxy",
         "The proxy will answer it from its own ACLs (forwarded to the controller in Kafka)."),
    _api(32, "DescribeConfigs", (
        Check(_C, _Op.DESCRIBE_CONFIGS, "each resource", _CLUSTER,
              "resource type BROKER, BROKER_LOGGER or CLIENT_METRICS"),
        Check(_T, _Op.DESCRIBE_CONFIGS, "each resource", _TOPIC, "resource type TOPIC"),
        Check(_G, _Op.DESCRIBE_CONFIGS, "each resource", _GROUP, "resource type GROUP"),
    ), "ConfigHelper.handleDescribeConfigsRequest", "client",
        "Other resource types fail the request with INVALID_REQUEST. The error is per "
        "resource; a topic is checked before its existence."),
    _api(33, "AlterConfigs", (
        Check(_C, _Op.ALTER_CONFIGS, "each resource", _CLUSTER,
              "resource type BROKER or CLIENT_METRICS"),
        Check(_T, _Op.ALTER_CONFIGS, "each resource", _TOPIC, "resource type TOPIC"),
        Check(_G, _Op.ALTER_CONFIGS, "each resource", _GROUP, "resource type GROUP"),
    ), "ControllerApis.authorizeAlterResource", "client",
        "Forwarded to the controller (KafkaApis.handleAlterConfigsRequest), which authorizes "
        "per resource; other types get INVALID_REQUEST."),
    _api(34, "AlterReplicaLogDirs", (_cluster(_Op.ALTER),),
         "KafkaApis.handleAlterReplicaLogDirsRequest", "client",
         "Every partition gets 31."),
    _api(35, "DescribeLogDirs", (_cluster(_Op.DESCRIBE),),
         "KafkaApis.handleDescribeLogDirsRequest", "client",
         "Denied: an empty result with error_code 31 (v3+)."),
    _api(36, "SaslAuthenticate", (), "KafkaApis.handleSaslAuthenticateRequest", "client",
         "Part of authentication: no ACL."),
    _api(37, "CreatePartitions", (
        Check(_T, _Op.ALTER, "each topic", _TOPIC),
    ), "ControllerApis.handleCreatePartitions", "client",
        "Forwarded to the controller, which authorizes."),
    _api(38, "CreateDelegationToken", (
        Check(_U, _Op.CREATE_TOKENS, "the token's owner", 58, "owner given and not the requester"),
    ), "KafkaApis.handleCreateTokenRequest", "client",
        "A principal may always create a token for itself. Token requests over PLAINTEXT, "
        "1-way SSL or from a token-authenticated connection get "
        "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED first. Forwarded to the controller "
        "(ControllerApis.handleCreateDelegationTokenRequest makes the same checks)."),
    _api(39, "RenewDelegationToken", (), "ControllerApis.handleRenewDelegationTokenRequest",
         "client",
         "No ACL: the controller lets the token's owner and renewers renew it (others get "
         "DELEGATION_TOKEN_OWNER_MISMATCH). DELEGATION_TOKEN_REQUEST_NOT_ALLOWED as for "
         "CreateDelegationToken."),
    _api(40, "ExpireDelegationToken", (), "ControllerApis.handleExpireDelegationTokenRequest",
         "client",
         "No ACL: the controller lets the token's owner and renewers expire it (others get "
         "DELEGATION_TOKEN_OWNER_MISMATCH). DELEGATION_TOKEN_REQUEST_NOT_ALLOWED as for "
         "CreateDelegationToken."),
    _api(41, "DescribeDelegationToken", (
        Check(_DT, _Op.DESCRIBE, "each token", 0),
        Check(_U, _Op.DESCRIBE_TOKENS, "each token's owner", 0, or_else=True),
    ), "KafkaApis.handleDescribeTokensRequest", "client",
        "Tokens are filtered (DelegationTokenManager.filterToken): the requester sees the "
        "tokens it owns or renews, and others only with DESCRIBE on the token id or "
        "DESCRIBE_TOKENS on the owner user; the rest are left out."),
    _api(42, "DeleteGroups", (
        Check(_G, _Op.DELETE, "each group", _GROUP),
    ), "KafkaApis.handleDeleteGroupsRequest", "client"),
    _api(43, "ElectLeaders", (_cluster(_Op.ALTER),), "ControllerApis.handleElectLeaders",
         "client", "Forwarded to the controller, which authorizes."),
    _api(44, "IncrementalAlterConfigs", (
        Check(_C, _Op.ALTER_CONFIGS, "each resource", _CLUSTER,
              "resource type BROKER, BROKER_LOGGER or CLIENT_METRICS"),
        Check(_T, _Op.ALTER_CONFIGS, "each resource", _TOPIC, "resource type TOPIC"),
        Check(_G, _Op.ALTER_CONFIGS, "each resource", _GROUP, "resource type GROUP"),
    ), "ControllerApis.handleIncrementalAlterConfigs", "client",
        "BROKER_LOGGER resources are answered by the broker itself "
        "(KafkaApis.handleIncrementalAlterConfigsRequest, ConfigAdminManager.preprocess); "
        "the rest is forwarded to the controller, which authorizes per resource."),
    _api(45, "AlterPartitionReassignments", (_cluster(_Op.ALTER),),
         "ControllerApis.handleAlterPartitionReassignments", "client",
         "Forwarded to the controller, which authorizes."),
    _api(46, "ListPartitionReassignments", (_cluster(_Op.DESCRIBE),),
         "ControllerApis.handleListPartitionReassignments", "client",
         "Forwarded to the controller, which authorizes."),
    _api(47, "OffsetDelete", (
        Check(_G, _Op.DELETE, "request's group", _GROUP),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleOffsetDeleteRequest", "client",
        "READ (not DELETE) on each topic, checked before existence."),
    _api(48, "DescribeClientQuotas", (_cluster(_Op.DESCRIBE_CONFIGS),),
         "KafkaApis.handleDescribeClientQuotasRequest", "proxy",
         "The proxy answers it from its own quotas."),
    _api(49, "AlterClientQuotas", (_cluster(_Op.ALTER_CONFIGS),),
         "ControllerApis.handleAlterClientQuotas", "proxy",
         "The proxy answers it for its own quotas."),
    _api(50, "DescribeUserScramCredentials", (_cluster(_Op.DESCRIBE),),
         "KafkaApis.handleDescribeUserScramCredentialsRequest", "client"),
    _api(51, "AlterUserScramCredentials", (_cluster(_Op.ALTER),),
         "ControllerApis.handleAlterUserScramCredentials", "client",
         "Forwarded to the controller, which authorizes."),
    _api(52, "Vote", (_cluster(_Op.CLUSTER_ACTION),), "ControllerApis.handleVote", "broker",
         "KRaft quorum traffic between controllers."),
    _api(53, "BeginQuorumEpoch", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleBeginQuorumEpoch", "broker",
         "KRaft quorum traffic between controllers."),
    _api(54, "EndQuorumEpoch", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleEndQuorumEpoch", "broker",
         "KRaft quorum traffic between controllers."),
    _api(55, "DescribeQuorum", (_cluster(_Op.DESCRIBE),), "ControllerApis.handleDescribeQuorum",
         "client", "Admin tools (kafka-metadata-quorum); the broker forwards it."),
    _api(56, "AlterPartition", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleAlterPartitionRequest", "broker"),
    _api(57, "UpdateFeatures", (_cluster(_Op.ALTER),), "ControllerApis.handleUpdateFeatures",
         "client", "Forwarded to the controller, which authorizes."),
    _api(58, "Envelope", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleEnvelopeRequest", "broker",
         "Brokers wrap forwarded requests in it; the inner request is then authorized as "
         "its principal."),
    _api(59, "FetchSnapshot", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleFetchSnapshot", "broker"),
    _api(60, "DescribeCluster", (
        Check(_C, _Op.DESCRIBE, "the cluster", 0, "include_cluster_authorized_operations"),
        _cluster(_Op.ALTER, "sent to a controller (endpoint_type 2)"),
    ), "KafkaApis.handleDescribeCluster", "client",
        "A broker authorizes nothing to describe the cluster: denied DESCRIBE only sets "
        "cluster_authorized_operations to 0 (AuthHelper.computeDescribeClusterResponse). A "
        "controller asks ALTER on the cluster (ControllerApis.handleDescribeCluster)."),
    _api(61, "DescribeProducers", (
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleDescribeProducersRequest", "client",
        "READ (not DESCRIBE), checked before existence."),
    _api(62, "BrokerRegistration", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleBrokerRegistration", "broker"),
    _api(63, "BrokerHeartbeat", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleBrokerHeartBeatRequest", "broker"),
    _api(64, "UnregisterBroker", (_cluster(_Op.ALTER),), "ControllerApis.handleUnregisterBroker",
         "client", "Admin.unregisterBroker; forwarded to the controller, which authorizes."),
    _api(65, "DescribeTransactions", (
        Check(_TX, _Op.DESCRIBE, "each transactional id", _TXN),
        Check(_T, _Op.DESCRIBE, "each topic of a transaction", 0),
    ), "KafkaApis.handleDescribeTransactionsRequest", "client",
        "The partitions of topics the client may not DESCRIBE are left out of each "
        "transaction's state."),
    _api(66, "ListTransactions", (
        Check(_TX, _Op.DESCRIBE, "each transactional id", 0),
    ), "KafkaApis.handleListTransactionsRequest", "client",
        "Only transactions the client may DESCRIBE are listed."),
    _api(67, "AllocateProducerIds", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleAllocateProducerIdsRequest", "broker"),
    _api(68, "ConsumerGroupHeartbeat", (
        _group(_Op.READ),
        Check(_T, _Op.DESCRIBE, "each subscribed topic", _TOPIC, "subscribed_topic_names set"),
    ), "KafkaApis.handleConsumerGroupHeartbeat", "client",
        "One subscribed topic not describable fails the whole heartbeat with 29; that "
        "check is in the post-4.0 source read and may be newer than 4.0. "
        "UNSUPPORTED_VERSION comes first when the consumer protocol is off."),
    _api(69, "ConsumerGroupDescribe", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
        Check(_T, _Op.DESCRIBE, "each topic assigned in a group", _TOPIC),
    ), "KafkaApis.handleConsumerGroupDescribe", "client",
        "A group whose members' assignments name a topic the client may not DESCRIBE is "
        "answered with 29 and no members."),
    _api(70, "ControllerRegistration", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleControllerRegistration", "broker"),
    _api(71, "GetTelemetrySubscriptions", (),
         "KafkaApis.handleGetTelemetrySubscriptionsRequest", "client",
         "No ACL in KafkaApis (KIP-714); ClientMetricsManager was not read here."),
    _api(72, "PushTelemetry", (), "KafkaApis.handlePushTelemetryRequest", "client",
         "No ACL in KafkaApis (KIP-714); ClientMetricsManager was not read here."),
    _api(73, "AssignReplicasToDirs", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleAssignReplicasToDirs", "broker"),
    _api(74, "ListConfigResources", (_cluster(_Op.DESCRIBE_CONFIGS),),
         "KafkaApis.handleListConfigResources", "client",
         "Was ListClientMetricsResources (KIP-714); the handler read is post-4.0 (KIP-1142)."),
    _api(75, "DescribeTopicPartitions", (
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, "topics named"),
        Check(_T, _Op.DESCRIBE, "each topic", 0, "listing all topics (topics empty)"),
    ), "DescribeTopicPartitionsRequestHandler.handleDescribeTopicPartitionsRequest", "client",
        "Like Metadata: a named topic not describable gets 29 without its existence being "
        "checked (topic id zeroed); listing all topics leaves it out."),
    _api(76, "ShareGroupHeartbeat", (
        _group(_Op.READ),
        Check(_T, _Op.DESCRIBE, "each subscribed topic", _TOPIC, "subscribed_topic_names set"),
    ), "KafkaApis.handleShareGroupHeartbeat", "client",
        "One subscribed topic not describable fails the whole heartbeat with 29."),
    _api(77, "ShareGroupDescribe", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
        Check(_T, _Op.DESCRIBE, "each topic assigned in a group", _TOPIC),
    ), "KafkaApis.handleShareGroupDescribe", "client",
        "A group assigning a topic the client may not DESCRIBE is answered with 29 and no "
        "members."),
    _api(78, "ShareFetch", (
        _group(_Op.READ),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleShareFetchRequest", "client",
        "The group check fails the whole request (30). The topic check covers the "
        "piggybacked acknowledgements too."),
    _api(79, "ShareAcknowledge", (
        _group(_Op.READ),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleShareAcknowledgeRequest", "client"),
    _api(80, "AddRaftVoter", (_cluster(_Op.ALTER),), "ControllerApis.handleAddRaftVoter",
         "client", "Admin.addRaftVoter; the broker forwards it."),
    _api(81, "RemoveRaftVoter", (_cluster(_Op.ALTER),), "ControllerApis.handleRemoveRaftVoter",
         "client", "Admin.removeRaftVoter; the broker forwards it."),
    _api(82, "UpdateRaftVoter", (_cluster(_Op.CLUSTER_ACTION),),
         "ControllerApis.handleUpdateRaftVoter", "broker"),
    _api(83, "InitializeShareGroupState", (_cluster(_Op.CLUSTER_ACTION),),
         "KafkaApis.handleInitializeShareGroupStateRequest", "broker",
         "Share-coordinator traffic between brokers."),
    _api(84, "ReadShareGroupState", (_cluster(_Op.CLUSTER_ACTION),),
         "KafkaApis.handleReadShareGroupStateRequest", "broker",
         "Share-coordinator traffic between brokers."),
    _api(85, "WriteShareGroupState", (_cluster(_Op.CLUSTER_ACTION),),
         "KafkaApis.handleWriteShareGroupStateRequest", "broker",
         "Share-coordinator traffic between brokers."),
    _api(86, "DeleteShareGroupState", (_cluster(_Op.CLUSTER_ACTION),),
         "KafkaApis.handleDeleteShareGroupStateRequest", "broker",
         "Share-coordinator traffic between brokers."),
    _api(87, "ReadShareGroupStateSummary", (_cluster(_Op.CLUSTER_ACTION),),
         "KafkaApis.handleReadShareGroupStateSummaryRequest", "broker",
         "Share-coordinator traffic between brokers."),
    _api(88, "StreamsGroupHeartbeat", (
        _group(_Op.READ),
        Check(_T, _Op.DESCRIBE, "each topology topic", _TOPIC, "topology set"),
        Check(_C, _Op.CREATE, "the cluster", 0, "internal topics to create"),
        Check(_T, _Op.CREATE, "each internal topic to create", 0, "internal topics to create",
              or_else=True),
    ), "KafkaApis.handleStreamsGroupHeartbeat", "client",
        "One topology topic (source, repartition, changelog) not describable fails the "
        "heartbeat with 29. Internal topics the client may not CREATE are not created: the "
        "answer's MISSING_INTERNAL_TOPICS status names them (no error code). Kafka internal "
        "topics in a topology get STREAMS_INVALID_TOPOLOGY before the ACL checks."),
    _api(89, "StreamsGroupDescribe", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
        Check(_T, _Op.DESCRIBE, "each topic of a group's topology", _TOPIC),
    ), "KafkaApis.handleStreamsGroupDescribe", "client",
        "A group whose topology names a topic the client may not DESCRIBE is answered with "
        "29, no members and no topology."),
    _api(90, "DescribeShareGroupOffsets", (
        Check(_G, _Op.DESCRIBE, "each group", _GROUP),
        Check(_T, _Op.DESCRIBE, "each topic", _TOPIC, "topics named"),
        Check(_T, _Op.DESCRIBE, "each topic", 0, "all the group's offsets (topics null)"),
    ), "KafkaApis.handleDescribeShareGroupOffsetsRequest", "client"),
    _api(91, "AlterShareGroupOffsets", (
        _group(_Op.READ),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleAlterShareGroupOffsetsRequest", "client",
        "READ (not ALTER) on the group and on each topic, the topic before existence."),
    _api(92, "DeleteShareGroupOffsets", (
        Check(_G, _Op.DELETE, "request's group", _GROUP),
        Check(_T, _Op.READ, "each topic", _TOPIC),
    ), "KafkaApis.handleDeleteShareGroupOffsetsRequest", "client",
        "Like OffsetDelete: DELETE on the group, READ on each topic."),
)

API_CHECKS: dict[int, ApiChecks] = {entry.api_key: entry for entry in _ALL}


def _render_check(check: Check) -> str:
    when = f" if {check.when}" if check.when else ""
    return (f"{check.operation.name} on {check.resource.name} ({check.on}){when}"
            f" → {ERROR_NAMES[check.denied]}")


def render_checks(entry: ApiChecks) -> str:
    """One API's checks as a line of text: a chain's alternatives joined by ``else``, the
    chains by ``;``."""
    if not entry.checks:
        return "none"
    chains: list[list[Check]] = []
    for check in entry.checks:
        if check.or_else and chains:
            chains[-1].append(check)
        else:
            chains.append([check])
    parts = []
    for chain in chains:
        if len(chain) == 1:
            parts.append(_render_check(chain[0]))
            continue
        alternatives = [
            f"{c.operation.name} on {c.resource.name} ({c.on})" + (f" if {c.when}" if c.when
                                                                    else "")
            for c in chain
        ]
        parts.append(" else ".join(alternatives) + f" → {ERROR_NAMES[chain[-1].denied]}")
    return "; ".join(parts)


def render_table() -> str:
    """The markdown table docs/acls.md shows, one row per API key."""
    lines = ["| API key | API | checks (operation on resource (per what) → error if denied)"
             " | audience | Kafka source |",
             "|---|---|---|---|---|"]
    for key in sorted(API_CHECKS):
        entry = API_CHECKS[key]
        cells = (str(key), entry.name, render_checks(entry), entry.audience,
                 f"`{entry.source}`")
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
