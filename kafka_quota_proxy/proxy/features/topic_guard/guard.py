"""The proxy's own topics belong to the proxy (``docs/topic-guard.md``).

The quota overrides topic (``quotas.overrides.topic``), the usage topic
(``coordination.topic``) and the volumes topic (``storage.topic``) are read and written by the
proxy's own clients, which connect to the brokers directly. No client of the proxy's listeners
may produce to them, fetch from them, create, delete or alter them, read or change their
configs, offsets or records, or see them in Metadata: each request naming one (by name, or by
an id learnt from Metadata responses) is answered for that topic as Kafka answers a topic the
client may not access (TOPIC_AUTHORIZATION_FAILED), and goes on without it
(``proxy.features.topic_guard.filter``). This module holds what every connection shares: the names,
the ids learnt, the response amendments and the figures.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import CounterMetricFamily

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.topic_fields import (
    TopicRef,
    metadata_amended,
    response_without,
    with_refused,
)
from kafka_quota_proxy.protocol.topic_guard import GuardedTopics, produce_with_refused
from kafka_quota_proxy.proxy.features.acls.state import NOT_ASKED
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import family

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import ProxyConfig

log = get_logger("kafka_quota_proxy.topic_guard")

DEFAULT_VOLUMES_TOPIC = "__kafka_quota_proxy_volumes"


def guarded_names(config: ProxyConfig) -> list[str]:
    """The topics the proxy uses, from its config (the volumes topic at its default when
    this proxy has no storage section: a volume agent may publish there all the same)."""
    names = [config.quotas.overrides.topic, config.coordination.topic,
             config.storage.topic if config.storage is not None else DEFAULT_VOLUMES_TOPIC]
    if config.acls is not None:
        names.append(config.acls.topic)
    return sorted(set(names))


class Produce:
    """``InFlight.refused`` of a Produce whose guarded topics were spoiled on their way."""

    __slots__ = ("error_code", "topics")

    def __init__(self, topics: list[tuple[str | None, uuid.UUID | None, list[int]]],
                 error_code: int = 29) -> None:
        self.topics = topics
        self.error_code = error_code


class Results:
    """``InFlight.refused`` of a request forwarded without some topics; ``then``: what an
    earlier filter had to amend in the same response (the ACLs' items), after."""

    __slots__ = ("refs", "then")

    def __init__(self, refs: list[TopicRef], then: Amendment | None = None) -> None:
        self.refs = refs
        self.then = then


class Amendment(Protocol):
    """Another feature's ``InFlight.refused``: it amends the response itself."""

    def amend(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None: ...


class Metadata:
    """``InFlight.refused`` of a Metadata request that named guarded topics, or of any
    Metadata request under ACLs (``hidden``: what this client may not see of the topics)."""

    __slots__ = ("access", "hidden", "only_refused", "refs")

    def __init__(self, refs: list[TopicRef], only_refused: bool,
                 hidden: Callable[[str | None, uuid.UUID | None], bool] | None = None,
                 access: AuthorizedOperations | None = None) -> None:
        self.refs = refs
        self.only_refused = only_refused
        self.hidden = hidden
        self.access = access  # (ACLs) the operations this client may do, where asked


class AuthorizedOperations(Protocol):
    """What Metadata's ``*_authorized_operations`` fields say for one client (Kafka's bit
    fields of operation codes, computed for the requester's principal)."""

    def topic_operations(self, name: str) -> int: ...

    def cluster_operations(self) -> int: ...


class Omit:
    """``InFlight.refused`` of a request whose response may list guarded topics it did not
    name (DescribeLogDirs, ListPartitionReassignments for all topics): left out."""

    __slots__ = ()


OMIT = Omit()


def _authorized_operations(value: Any, access: AuthorizedOperations) -> Any:
    """The broker's ``topic_authorized_operations`` and ``cluster_authorized_operations``
    (its own principal's: the proxy's) replaced by the client's, where the request asked."""
    topics = value.topics
    if any(getattr(t, "topic_authorized_operations", NOT_ASKED) != NOT_ASKED and not t.error_code
           for t in topics):
        topics = tuple(
            dataclasses.replace(t, topic_authorized_operations=access.topic_operations(t.name))
            if t.topic_authorized_operations != NOT_ASKED and not t.error_code
            and t.name is not None else t
            for t in topics)
        value = dataclasses.replace(value, topics=topics)
    if getattr(value, "cluster_authorized_operations", NOT_ASKED) != NOT_ASKED:
        value = dataclasses.replace(value,
                                    cluster_authorized_operations=access.cluster_operations())
    return value


class TopicGuard:
    def __init__(self, names: list[str]) -> None:
        self.topics = GuardedTopics(names)
        # figures: requests by API and what was done (refused topics, answered whole...)
        self.refused: dict[str, int] = {}
        self.replica_fetches = 0
        self.closed: dict[str, int] = {}
        log.info("topic_guard", topics=sorted(self.topics.names))

    def count(self, api: str, n: int = 1) -> None:
        self.refused[api] = self.refused.get(api, 0) + n

    def learn(self, name: str | None, topic_id: uuid.UUID | None) -> None:
        if self.topics.learn(name, topic_id):
            log.info("guarded_topic_id_learnt", topic=name, topic_id=str(topic_id))

    # ------------------------------------------------------------------ responses
    def amend(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        """The broker's response to a request forwarded without guarded topics, with their
        results added (``ResponseRewriter.amend``)."""
        refused = entry.refused
        amendment = getattr(refused, "amend", None)  # (another feature's: ACLs' lists)
        if amendment is not None:
            return amendment(entry, frame)  # type: ignore[no-any-return]
        if isinstance(refused, Produce):
            return produce_with_refused(frame, entry.api_version, refused.topics,
                                        refused.error_code)
        if isinstance(refused, Results):
            new = with_refused(frame, entry.api_key, entry.api_version, refused.refs)
            if refused.then is not None:
                new = refused.then.amend(entry, new if new is not None else frame) or new
            return new
        if refused is OMIT:
            return response_without(frame, entry.api_key, entry.api_version,
                                    self.topics.ref_guarded)
        return None

    def filter_metadata(self, entry: InFlight, value: Any) -> Any:
        """Every decoded MetadataResponse on its way to a client: ids of guarded topics
        learnt, the guarded topics left out, those the request named answered
        TOPIC_AUTHORIZATION_FAILED (``ResponseRewriter.metadata_filter``)."""
        topics = self.topics
        for t in value.topics:
            if t.name in topics.names:
                self.learn(t.name, getattr(t, "topic_id", None))
        refused = entry.refused if isinstance(entry.refused, Metadata) else None
        hidden = topics.guarded if refused is None or refused.hidden is None else refused.hidden
        value = metadata_amended(value, entry.api_version, refused.refs if refused else (),
                                 hidden, refused.only_refused if refused else False)
        if refused is not None and refused.access is not None:
            value = _authorized_operations(value, refused.access)
        return value

    # ------------------------------------------------------------------ figures
    def metric_families(self) -> Iterator[Any]:
        yield family(CounterMetricFamily, "kafka_proxy_guarded_topic_requests",
                     "Client requests that named one of the proxy's own topics, by API (the "
                     "topic answered TOPIC_AUTHORIZATION_FAILED)", "api", self.refused)
        c = CounterMetricFamily("kafka_proxy_replica_fetches_refused",
                                "Fetch requests from clients posing as a follower broker "
                                "(replica_id >= 0), answered TOPIC_AUTHORIZATION_FAILED")
        c.add_metric([], self.replica_fetches)
        yield c
        yield family(CounterMetricFamily, "kafka_proxy_guarded_topic_connections_closed",
                     "Connections closed because a request naming a guarded topic could not "
                     "be rewritten (too large to read whole, a version not decoded)",
                     "reason", self.closed)
