"""The ACL checks on each topic a request names (``authorizer.api_checks``: the checks "on
each topic"), asked by the topic guard for one connection (``TopicAccess``): a denied topic
is refused as the proxy's own topics are, with TOPIC_AUTHORIZATION_FAILED in its place
(``proxy.features.topic_guard``).

A topic named by id is authorized by its name, learnt from the Metadata responses that went
through this process (``Acls.topic_names``); an id not learnt is refused (a client gets ids
from Metadata, which it asks through the proxy: it may ask again).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from kafka_quota_proxy.authorizer.acls import AclOperation, ResourceType
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.topic_guard import GuardedTopics

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.features.acls.state import Access

_Op = AclOperation
_TOPIC = ResourceType.TOPIC

# The operation Kafka asks on each topic the request names, per API key (the APIs whose
# checks are on the whole request only, the cluster's, are not here: ``AclFilter``; nor
# AddPartitionsToTxn v0-3, answered whole when a topic is denied: ``AclFilter`` too)
TOPIC_OPERATION: dict[int, AclOperation] = {
    0: _Op.WRITE,  # Produce
    1: _Op.READ,  # Fetch (a consumer's; a follower's is refused whole by the topic guard)
    2: _Op.DESCRIBE,  # ListOffsets
    3: _Op.DESCRIBE,  # Metadata
    8: _Op.READ,  # OffsetCommit
    9: _Op.DESCRIBE,  # OffsetFetch
    19: _Op.CREATE,  # CreateTopics (else CREATE on the cluster)
    20: _Op.DELETE,  # DeleteTopics (else DELETE on the cluster; and DESCRIBE)
    21: _Op.DELETE,  # DeleteRecords
    23: _Op.DESCRIBE,  # OffsetForLeaderEpoch (else CLUSTER_ACTION on the cluster)
    28: _Op.READ,  # TxnOffsetCommit
    32: _Op.DESCRIBE_CONFIGS,  # DescribeConfigs (topic resources)
    33: _Op.ALTER_CONFIGS,  # AlterConfigs (topic resources)
    37: _Op.ALTER,  # CreatePartitions
    44: _Op.ALTER_CONFIGS,  # IncrementalAlterConfigs (topic resources)
    47: _Op.READ,  # OffsetDelete
    61: _Op.READ,  # DescribeProducers
    68: _Op.DESCRIBE,  # ConsumerGroupHeartbeat (subscribed topics)
    75: _Op.DESCRIBE,  # DescribeTopicPartitions
    76: _Op.DESCRIBE,  # ShareGroupHeartbeat (subscribed topics)
    78: _Op.READ,  # ShareFetch
    79: _Op.READ,  # ShareAcknowledge
    88: _Op.DESCRIBE,  # StreamsGroupHeartbeat (topology topics)
    90: _Op.DESCRIBE,  # DescribeShareGroupOffsets
    91: _Op.READ,  # AlterShareGroupOffsets
    92: _Op.READ,  # DeleteShareGroupOffsets
}
# Where the cluster allows what each topic's check would (Kafka asks it first)
CLUSTER_FIRST: dict[int, AclOperation] = {
    19: _Op.CREATE, 20: _Op.DELETE, 23: _Op.CLUSTER_ACTION}
_DELETE_TOPICS = 20


class TopicAccess:
    """What one connection's principal may do with topics, for the topic guard: ``refused``
    for one API's topic, and the ``RefusedTopics`` of a Produce frame (WRITE)."""

    __slots__ = ("access", "guarded")

    def __init__(self, access: Access, guarded: GuardedTopics) -> None:
        self.access = access
        self.guarded = guarded

    def unknown(self, name: str | None, topic_id: uuid.UUID | None) -> bool:
        """A topic named by an id this process has not learnt (refused with
        UNKNOWN_TOPIC_ID, which clients answer by asking Metadata again; the proxy refreshes
        its own view of the topics at once)."""
        if name is not None or topic_id is None:
            return False
        acls = self.access.acls
        if topic_id in acls.topic_names:
            return False
        acls.unknown_id()
        return True

    def name_of(self, name: str | None, topic_id: uuid.UUID | None) -> str | None:
        if name is not None:
            return name
        if topic_id is None:
            return None
        return self.access.acls.topic_names.get(topic_id)

    def refused(self, api_key: int, name: str | None, topic_id: uuid.UUID | None,
                count: bool = True) -> bool:
        """Whether this API may not name this topic (a guarded topic always is); a denial is
        counted and logged unless ``count`` is false (a pre-check the full check follows)."""
        if self.guarded.guarded(name, topic_id):
            return True
        operation = TOPIC_OPERATION.get(api_key)
        if operation is None:
            return False
        access = self.access
        label = apis.api_name(api_key)
        cluster = CLUSTER_FIRST.get(api_key)
        if cluster is not None and access.allowed(cluster, ResourceType.CLUSTER,
                                                  "kafka-cluster"):
            return False
        topic = self.name_of(name, topic_id)
        if topic is None:
            return True  # an id this process has not seen in Metadata
        ask = access.check if count else lambda op, kind, name, _: access.allowed(op, kind, name)
        if api_key == _DELETE_TOPICS and not ask(_Op.DESCRIBE, _TOPIC, topic, label):
            return True
        return not ask(operation, _TOPIC, topic, label)

    def hidden(self, name: str | None, topic_id: uuid.UUID | None) -> bool:
        """Left out of a Metadata response listing all topics (not describable)."""
        if self.guarded.guarded(name, topic_id):
            return True
        topic = self.name_of(name, topic_id)
        return topic is None or not self.access.allowed(_Op.DESCRIBE, _TOPIC, topic)

    def may_create(self, name: str) -> bool:
        """Auto-creation of ``name`` by a Metadata request: CREATE on the cluster or on it."""
        access = self.access
        return (access.allowed(_Op.CREATE, ResourceType.CLUSTER, "kafka-cluster")
                or access.allowed(_Op.CREATE, _TOPIC, name))

    # ------------------------------------------------------------------ Metadata's fields
    def topic_operations(self, name: str) -> int:
        """Kafka's bit field of the operations this client may do on the topic."""
        return self.access.authorized_operations(_TOPIC, name)

    def cluster_operations(self) -> int:
        """Kafka's bit field of the operations this client may do on the cluster."""
        return self.access.authorized_operations(ResourceType.CLUSTER, "kafka-cluster")

    # ------------------------------------------------------------------ Produce
    def refuses_name(self, raw: bytes) -> bool:
        """(``RefusedTopics``) WRITE on a topic, named as a Produce frame holds it."""
        if raw in self.guarded.raw_names:
            return True
        return not self.access.check(_Op.WRITE, _TOPIC, raw.decode("utf-8", "replace"),
                                     "Produce")

    def refuses_transaction(self, raw: bytes) -> bool:
        """(``RefusedTopics``) WRITE on the transactional id of a Produce frame."""
        return not self.access.check(_Op.WRITE, ResourceType.TRANSACTIONAL_ID,
                                     raw.decode("utf-8", "replace"), "Produce")

    def refuses_id(self, raw: bytes) -> bool:
        """(``RefusedTopics``) WRITE on a topic, by the id a Produce frame holds."""
        if raw in self.guarded.raw_ids:
            return True
        name = self.access.acls.topic_names.get(uuid.UUID(bytes=bytes(raw)))
        return name is None or not self.access.check(_Op.WRITE, _TOPIC, name, "Produce")
