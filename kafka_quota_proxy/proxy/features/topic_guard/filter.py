"""The topic guard on the request path (``proxy.features.topic_guard.guard``,
``docs/topic-guard.md``).

- Produce: never held nor decoded; ``protocol.topic_guard.ProduceTopics`` follows each frame
  as it passes and spoils a guarded topic's name (or id) before it goes upstream; the
  response's result for it becomes TOPIC_AUTHORIZATION_FAILED. A frame the walk cannot
  follow, or below v3 naming a guarded topic, is refused as below (at once where its first
  bytes went upstream with an earlier read).
- Every other API whose requests name topics (``protocol.topic_fields.HANDLING``, derived
  from kio's schemas): the frame is read whole (up to 1 MiB) and searched for the guarded
  names and ids; only a frame that holds one is decoded. The request goes on without the
  guarded topics and their error results are merged into the broker's response, or, when
  nothing else is left, the proxy answers it (nothing goes upstream). A frame it cannot
  rewrite (larger than it reads whole, a version kio does not decode) is refused: the
  connection closes once what came before it is answered.
- Fetch with a replica id (``replica_id`` >= 0, or the ReplicaState tag from v15): a client
  posing as a follower. Answered by the proxy as Kafka answers a follower without
  CLUSTER_ACTION: TOPIC_AUTHORIZATION_FAILED on every partition it asked for, never
  forwarded.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from typing import TYPE_CHECKING

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.fetch import FIRST_VERSION as FETCH_WALKED_FROM
from kafka_quota_proxy.protocol.fetch import parse_fetch_request
from kafka_quota_proxy.protocol.headers import parse_request_header
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.protocol.topic_fields import (
    HANDLING,
    LeftOut,
    MetadataHandling,
    TopicRef,
    TopicRequest,
    Unguarded,
    answer_whole,
    encode,
    metadata_request_topics,
    metadata_without,
    read_topics,
    refused_response,
    without,
)
from kafka_quota_proxy.protocol.topic_guard import ProduceTopics
from kafka_quota_proxy.proxy.features.acls.topics import TOPIC_OPERATION, TopicAccess
from kafka_quota_proxy.proxy.features.topic_guard.guard import (
    OMIT,
    Metadata,
    Produce,
    Results,
    TopicGuard,
)
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from kafka_quota_proxy.proxy.logs import get_logger

if TYPE_CHECKING:
    from kafka_quota_proxy.proxy.features.acls.state import Acls

log = get_logger("kafka_quota_proxy.topic_guard")

_PRODUCE = int(apis.ApiKey.PRODUCE)
_FETCH = int(apis.ApiKey.FETCH)
_METADATA = int(apis.ApiKey.METADATA)
_REPLICA_STATE_FROM = 15
UNKNOWN_TOPIC_ID = 100


class TopicGuardFilter(Filter):
    """The topic guard on one connection (see the module's docstring)."""

    watches_produce = True

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        if api_key == _PRODUCE:
            return Interest.PRODUCE_TOPICS
        handling = HANDLING.get(api_key)
        if handling is None or isinstance(handling, Unguarded):
            return Interest.NONE
        return Interest.REQUEST_FRAME | Interest.WHOLE_REQUEST

    def __init__(self, host: FilterHost, guard: TopicGuard, acls: Acls | None = None) -> None:
        self.host = host
        self.guard = guard
        self.acls = acls
        self._access: TopicAccess | None = None
        self._access_for: tuple[str, str | None] | None = None

    def _topic_access(self) -> TopicAccess | None:
        """The ACL checks on this connection's topics (None: ACLs off, or a super user)."""
        acls = self.acls
        if acls is None:
            return None
        client = self.host.client
        if self._access_for != (client.user, client.peer_ip):
            self._access_for = (client.user, client.peer_ip)
            access = acls.access(client.user, client.peer_ip)
            self._access = None if access.super_user else TopicAccess(access, self.guard.topics)
        return self._access

    # ------------------------------------------------------------------ Produce
    def watch_produce(self, version: int) -> ProduceTopics:
        """Follows one Produce frame (``RequestStream``'s ``watch_produce``): the guarded
        topics refused, and those the ACLs do not let this client write."""
        access = self._topic_access()
        return ProduceTopics(version, self.guard.topics if access is None else access)

    def produce_watched(self, entry: InFlight, watch: ProduceTopics) -> None:
        """A Produce frame followed to its end named a guarded topic, or did not parse.

        One that does not parse (what follows it cannot be checked), or of a version below 3
        naming a guarded topic with acks (no schema to answer it with), is refused
        (``FilterHost.refuse``), as Kafka closes on a request it cannot handle after
        answering what came before it: the frame and whatever was read after it are cut out
        of what goes upstream, the requests before it answered, then the connection closes.
        The frame is cut from its first byte, which must be in the read being forwarded: the
        common case, a frame read whole or whose failure shows in the read it began in. Where
        its first bytes went upstream with an earlier read (a frame split across reads), the
        broker holds part of it and the connection closes at once (the connection's doing:
        ``read_events``)."""
        guard = self.guard
        if watch.failed or not watch.done:
            guard.closed["produce_unparsed"] = guard.closed.get("produce_unparsed", 0) + 1
            self.host.refuse(entry, "malformed_frame",
                             "Produce request does not parse (topic guard)")
            return
        guarded = [n or str(i) for n, i, _ in watch.refused if guard.topics.guarded(n, i)]
        if guarded:  # (the ACLs count and log their denials themselves)
            guard.count("produce")
            log.warning("guarded_topic_refused", api="produce",
                        principal=self.host.client.user, client_id=entry.client_id,
                        topics=guarded)
        if entry.api_version < 3 and entry.expects_response:  # (no schema to answer with)
            self._close(entry, "produce_version")
            return
        entry.refused = Produce(watch.refused, watch.error_code)

    # ------------------------------------------------------------------ other requests
    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        key = entry.api_key
        if entry.answer is not None or not self.interests(key, entry.api_version):
            return None
        if key == _FETCH and self._follower(entry, frame):
            return self._answer_follower(entry, frame, patchable)
        topics = self.guard.topics
        if isinstance(HANDLING[key], LeftOut):  # (its response may list them all the same)
            entry.refused = OMIT
        access = self._topic_access()
        if access is not None and key in TOPIC_OPERATION:
            if key == _FETCH and self._fetch_allowed(entry, frame, access):
                return None
            return self._authorize(entry, frame, patchable, access)
        if not topics.in_frame(frame):
            return None
        version = entry.api_version
        low, high = apis.kio_version_range(key)
        if not low <= version <= high:
            self._close(entry, "version_not_decoded")
            return None
        try:
            request = read_topics(frame, key, version)
        except MalformedFrame:
            return None  # the broker answers it (or closes) as it would
        refused = [r for r in request.refs if topics.ref_guarded(r)]
        return self._refuse(entry, frame, patchable, request, refused)

    def _fetch_allowed(self, entry: InFlight, frame: bytes, access: TopicAccess) -> bool:
        """The hot path of a consumer's Fetch under ACLs: walked without decoding, every
        topic it asks for (by name, or by id from v13) read through the ACLs' cache; True
        when all may be read and no guarded topic is in the frame (nothing to rewrite)."""
        version = entry.api_version
        if version < FETCH_WALKED_FROM or self.guard.topics.in_frame(frame):
            return False
        try:
            header = parse_request_header(frame, 0, len(frame))
            summary = parse_fetch_request(frame, header.size, version)
        except (IndexError, ValueError, struct.error):
            return False  # decoded whole: the slow path says what is wrong with it
        refused = access.refused
        for topic, _ in summary.topics:
            if isinstance(topic, str):
                if refused(_FETCH, topic, None, False):
                    return False
            elif refused(_FETCH, None, uuid.UUID(bytes=topic), False):
                return False
        return True

    def _authorize(self, entry: InFlight, frame: bytes, patchable: bool,
                   access: TopicAccess) -> bytes | None:
        """The topics this API names, each checked against the guarded topics and the ACLs
        (every frame decoded: the check needs its names)."""
        key, version = entry.api_key, entry.api_version
        low, high = apis.kio_version_range(key)
        if not low <= version <= high:
            self._close(entry, "version_not_decoded")
            return None
        try:
            request = read_topics(frame, key, version)
        except MalformedFrame:
            return None  # the broker answers it (or closes) as it would
        refused = [dataclasses.replace(r, error_code=UNKNOWN_TOPIC_ID)
                   if access.unknown(r.name, r.topic_id) else r
                   for r in request.refs if access.refused(key, r.name, r.topic_id)]
        if key == _METADATA:
            return self._metadata(entry, frame, patchable, request, refused, access)
        return self._refuse(entry, frame, patchable, request, refused)

    def _metadata(self, entry: InFlight, frame: bytes, patchable: bool,
                  request: TopicRequest, refused: list[TopicRef],
                  access: TopicAccess) -> bytes | None:
        """Metadata under ACLs: named topics not describable answered 29, the others left
        out of a listing of all topics (``Metadata.hidden``); auto-creation only with CREATE
        (else the request goes on without it: a missing topic is UNKNOWN_TOPIC_OR_PARTITION)."""
        version = entry.api_version
        value = request.value
        creates = version >= 4 and value.allow_auto_topic_creation
        no_create = creates and any(
            not access.may_create(r.name) for r in request.refs
            if r.name is not None and r not in refused)
        if not refused and not no_create:
            entry.refused = Metadata([], False, access.hidden, access)
            return None
        if not patchable:
            self._close(entry, "frame_too_large")
            return None
        if refused:
            self._log_refused(entry, refused)
        value = metadata_without(value, version, refused)
        if no_create:
            value = dataclasses.replace(value, allow_auto_topic_creation=False)
        only = version == 0 and metadata_request_topics(value, version) is None
        entry.refused = Metadata(refused, only, access.hidden, access)
        return bytes(frame[: request.header_size]) + encode(value)

    def _log_refused(self, entry: InFlight, refused: list[TopicRef]) -> None:
        """Counted and logged where the proxy's own topics were named (the ACLs count and
        log their denials themselves)."""
        guarded = [r for r in refused if self.guard.topics.ref_guarded(r)]
        if not guarded:
            return
        label = apis.api_name(entry.api_key)
        self.guard.count(label)
        log.warning("guarded_topic_refused", api=label, principal=self.host.client.user,
                    client_id=entry.client_id,
                    topics=sorted({r.name or str(r.topic_id) for r in guarded}))

    def _refuse(self, entry: InFlight, frame: bytes, patchable: bool,
                request: TopicRequest, refused: list[TopicRef]) -> bytes | None:
        """The request without ``refused``, their results to be merged into the broker's
        answer (or answered whole by the proxy when nothing else is left)."""
        key, version = entry.api_key, entry.api_version
        if not refused:
            return None
        if not patchable:
            self._close(entry, "frame_too_large")
            return None
        self._log_refused(entry, refused)
        handling = HANDLING[key]
        before = entry.refused if hasattr(entry.refused, "amend") else None  # (the ACLs')
        if isinstance(handling, MetadataHandling):
            value = metadata_without(request.value, version, refused)
            only = version == 0 and metadata_request_topics(value, version) is None
            entry.refused = Metadata(refused, only)
            return bytes(frame[: request.header_size]) + encode(value)
        if answer_whole(request, refused):  # answered: never forwarded
            try:
                answer = refused_response(request, refused)
                entry.answer = answer if before is None else (
                    before.amend(entry, answer) or answer)
            except MalformedFrame:
                self._close(entry, "no_answer")
            return None
        if not isinstance(handling, LeftOut):
            entry.refused = Results(refused, before)
        return without(frame, request, refused)

    # ------------------------------------------------------------------ followers
    @staticmethod
    def _follower(entry: InFlight, frame: bytes) -> bool:
        if entry.follower:
            return True
        if entry.api_version < _REPLICA_STATE_FROM:
            return False
        try:
            header = parse_request_header(frame, 0, len(frame))
            summary = parse_fetch_request(frame, header.size, entry.api_version)
        except (IndexError, ValueError, struct.error):
            return False  # the broker answers it (or closes) as it would
        return not summary.from_consumer

    def _answer_follower(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        """Kafka's answer to a follower fetch from a principal without CLUSTER_ACTION:
        TOPIC_AUTHORIZATION_FAILED on every partition asked for (high watermark -1, no
        records); the request never reaches the broker."""
        guard = self.guard
        guard.replica_fetches += 1
        entry.follower = False  # a client's fetch: recorded in its quotas as any other
        log.warning("replica_fetch_refused", principal=self.host.client.user,
                    client_id=entry.client_id, client=self.host.client.peer)
        if not patchable:
            self._close(entry, "replica_fetch_too_large")
            return None
        try:
            request = read_topics(frame, _FETCH, entry.api_version)
            asked = [r for r in request.refs if r.array.steps[0][0] == "topics"]
            entry.answer = refused_response(request, asked)
        except MalformedFrame:
            self._close(entry, "replica_fetch_unread")
        return None

    def _close(self, entry: InFlight, reason: str) -> None:
        """Refuse the request: the connection answers what came before it, then closes."""
        guard = self.guard
        guard.closed[reason] = guard.closed.get(reason, 0) + 1
        detail = (f"{apis.api_name(entry.api_key)} v{entry.api_version} names a topic of the "
                  f"proxy and cannot be rewritten ({reason})")
        self.host.refuse(entry, "guarded_topic", detail)

