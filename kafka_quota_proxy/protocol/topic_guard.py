"""The topics a proxy keeps to itself (sans-IO): which names and ids, the cheap check of a
frame, and the Produce hot path.

``GuardedTopics`` holds the guarded names and the topic ids learnt for them; ``in_frame``
is the pre-filter: a byte search for every guarded name and id, so that only a frame that
holds one is decoded (``protocol.topic_fields``).

Produce frames are never held or decoded: ``ProduceTopics`` follows a Produce frame as it
passes (``incremental.Walker``, skipping record batches by their length) and, when a topic's
name (or id) is a guarded one, spoils its last byte before that byte is forwarded: the last
byte of a name is always in the chunk that completes it, which has not gone upstream yet, so
however the client splits its frame the broker is asked for a topic that cannot exist (a
name with a character Kafka never allows in topic names, or another id) and writes nothing.
The broker's result for that topic is then replaced by TOPIC_AUTHORIZATION_FAILED under the
name the client used (``produce_with_refused``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Protocol

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.headers import parse_response_header
from kafka_quota_proxy.protocol.incremental import (
    RecordsTail,
    Walker,
    _array_count,
    _int,
    _skip,
    _skip_tagged_fields,
    _uvarint,
)
from kafka_quota_proxy.protocol.skim import ProduceRequestSkim
from kafka_quota_proxy.protocol.topic_fields import TopicArray, TopicRef, encode, error_result

PRODUCE = 0
TOPIC_AUTHORIZATION_FAILED = 29
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
# What a guarded name's last byte becomes upstream: never allowed in a topic name
SPOILED = ord("!")


class RefusedTopics(Protocol):
    """The topics a Produce frame may not name (``ProduceTopics``), asked as the frame holds
    them: the proxy's own (``GuardedTopics``), or any a question per topic refuses."""

    def refuses_name(self, raw: bytes) -> bool: ...

    def refuses_id(self, raw: bytes) -> bool: ...

    def refuses_transaction(self, raw: bytes) -> bool:
        """A non-empty transactional id (UTF-8): every topic of the frame is refused, with
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
        ...


class GuardedTopics:
    """The guarded topic names, and the ids learnt for them (Metadata responses)."""

    __slots__ = ("_needles", "ids", "names", "raw_ids", "raw_names")

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.raw_names = frozenset(n.encode() for n in self.names)
        self.ids: frozenset[uuid.UUID] = frozenset()
        self.raw_ids: frozenset[bytes] = frozenset()
        self._needles: tuple[bytes, ...] = tuple(sorted(self.raw_names))

    def learn(self, name: str | None, topic_id: uuid.UUID | None) -> bool:
        """A topic's id seen in a response: kept when the topic is guarded; True when new."""
        if (name is None or name not in self.names or topic_id is None
                or topic_id.int == 0 or topic_id in self.ids):
            return False
        self.ids = self.ids | {topic_id}
        self.raw_ids = frozenset(i.bytes for i in self.ids)
        self._needles = (*sorted(self.raw_names), *sorted(self.raw_ids))
        return True

    def guarded(self, name: str | None, topic_id: uuid.UUID | None = None) -> bool:
        return (name is not None and name in self.names) or (
            topic_id is not None and topic_id in self.ids)

    def ref_guarded(self, ref: TopicRef) -> bool:
        return self.guarded(ref.name, ref.topic_id)

    def refuses_name(self, raw: bytes) -> bool:
        """(``RefusedTopics``) A topic name as a Produce frame holds it, UTF-8."""
        return raw in self.raw_names

    def refuses_id(self, raw: bytes) -> bool:
        """(``RefusedTopics``) A topic id as a Produce frame holds it, 16 bytes."""
        return raw in self.raw_ids

    def refuses_transaction(self, raw: bytes) -> bool:
        """(``RefusedTopics``) Transactions are not the topic guard's concern."""
        return False

    def in_frame(self, frame: bytes | bytearray | memoryview) -> bool:
        """The pre-filter: whether any guarded name or id is in ``frame`` (a hit may be
        anywhere, in a record or a longer name: the frame is then decoded)."""
        for needle in self._needles:  # noqa: SIM110 (hot path: no generator)
            if needle in frame:
                return True
        return False


class ProduceTopics:
    """One Produce frame followed as it passes: ``feed`` each chunk before it is forwarded;
    ``spoil`` lists the offsets (in the chunk just fed) of bytes to set to ``SPOILED``;
    ``refused`` the guarded topics met, with their partitions (every topic where the
    transactional id is refused: ``error_code`` is then TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
    ``failed``: the frame does not parse (the connection must close: what comes after cannot
    be checked)."""

    __slots__ = ("_topics", "_version", "_walker", "error_code", "failed", "refused", "spoil")

    def __init__(self, version: int, topics: RefusedTopics) -> None:
        self.spoil: list[int] = []
        self.refused: list[tuple[str | None, uuid.UUID | None, list[int]]] = []
        self.failed = False
        self.error_code = TOPIC_AUTHORIZATION_FAILED
        self._version = version
        self._topics = topics
        # (made at the first ``feed``: see ``skimmed``)
        self._walker: Walker | RecordsTail | None = None

    @property
    def walker(self) -> Walker | RecordsTail:
        if self._walker is None:
            self._walker = Walker(self._walk(self._version, self._topics))
        return self._walker

    def feed(self, buf: bytes | memoryview, start: int, end: int) -> None:
        if self.failed or self.walker.done:
            return
        try:
            self.walker.feed(buf, start, end)
        except ValueError:
            self.failed = True

    def skimmed(self, skim: ProduceRequestSkim, tail: RecordsTail | None = None) -> None:
        """The whole frame, skimmed (``skim_produce_request``): what feeding it would find,
        without the walk. Only before any ``feed``. ``tail``: the frame's last records are
        still arriving (``skim_produce_prefix``): this follows it from their start, where
        ``feed`` goes on."""
        assert self._walker is None
        topics = self._topics
        every = False
        if skim.transactional_id is not None and topics.refuses_transaction(
                skim.transactional_id):
            every = True
            self.error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        self._walker = _DONE if tail is None else tail
        by_id = self._version >= 13
        for raw, at, parts in skim.topics:
            if not raw:
                continue
            if every or (topics.refuses_id(raw) if by_id else topics.refuses_name(raw)):
                self.spoil.append(at - 1)
                if by_id:
                    self.refused.append((None, uuid.UUID(bytes=raw), [p for p, _ in parts]))
                    continue
                try:
                    name = raw.decode()
                except UnicodeDecodeError:  # (as the walk: the frame does not parse)
                    self.failed = True
                    return
                self.refused.append((name, None, [p for p, _ in parts]))

    def _walked_to(self) -> int:
        """Where the bytes the walk (``_walk``, which alone calls this) last received end."""
        walker = self._walker
        assert isinstance(walker, Walker)
        return walker.at

    @property
    def done(self) -> bool:
        return self.walker.done

    def _walk(self, version: int, topics: RefusedTopics) -> Generator[int, bytes | None, None]:
        flexible = version >= 9
        yield -8  # api_key, api_version, correlation_id
        yield from _skip(max((yield from _int(2)), 0))  # client_id (nullable, classic)
        if flexible:
            yield from _skip_tagged_fields()  # request header v2
        every = False  # the transactional id refused: every topic is
        if version >= 3:
            size = (yield from _uvarint()) - 1 if flexible else (yield from _int(2))
            if size > 0:  # transactional_id
                raw = yield size
                assert raw is not None
                if topics.refuses_transaction(raw):
                    every = True
                    self.error_code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        yield -6  # acks, timeout_ms
        n_topics = yield from _array_count(flexible)
        for _ in range(max(n_topics, 0)):
            found: list[int] | None = None
            if version >= 13:
                raw = yield 16
                assert raw is not None
                if every or topics.refuses_id(raw):
                    found = []
                    self.spoil.append(self._walked_to() - 1)
                    self.refused.append((None, uuid.UUID(bytes=bytes(raw)), found))
            else:
                size = (yield from _uvarint()) - 1 if flexible else (yield from _int(2))
                if size > 0:
                    raw = yield size
                    assert raw is not None
                    if every or topics.refuses_name(raw):
                        found = []
                        self.spoil.append(self._walked_to() - 1)
                        self.refused.append((raw.decode(), None, found))
            n_parts = yield from _array_count(flexible)
            for _ in range(max(n_parts, 0)):
                index = yield from _int(4)
                if found is not None:
                    found.append(index)
                size = (yield from _uvarint()) - 1 if flexible else (yield from _int(4))
                yield from _skip(size)  # records
                if flexible:
                    yield from _skip_tagged_fields()
            if flexible:
                yield from _skip_tagged_fields()
        if flexible:
            yield from _skip_tagged_fields()


def _nothing() -> Generator[int, bytes | None, None]:
    yield from ()


_DONE = Walker(_nothing())  # (a walk that is over: a frame skimmed whole)


def _spoiled_name(name: str) -> str:
    return name[:-1] + chr(SPOILED)


def _spoiled_id(topic_id: uuid.UUID) -> uuid.UUID:
    raw = bytearray(topic_id.bytes)
    raw[-1] = SPOILED
    return uuid.UUID(bytes=bytes(raw))


def produce_with_refused(frame: bytes | memoryview, version: int,
                         refused: Sequence[tuple[str | None, uuid.UUID | None, list[int]]],
                         error_code: int = TOPIC_AUTHORIZATION_FAILED) -> bytes:
    """A Produce response (whole frame) with the broker's results for the spoiled topics
    replaced by ``error_code`` (TOPIC_AUTHORIZATION_FAILED) on each partition, under the
    client's name."""
    if version < 3:
        raise MalformedFrame(f"Produce v{version} response: not decoded")
    hv = apis.response_header_version(PRODUCE, version)
    header = parse_response_header(frame, 0, len(frame), hv)
    value = response_body(frame, PRODUCE, version)
    spoiled_names = {_spoiled_name(n) for n, _, _ in refused if n is not None}
    spoiled_ids = {_spoiled_id(i) for _, i, _ in refused if i is not None}
    kept = tuple(r for r in value.responses
                 if getattr(r, "name", None) not in spoiled_names
                 and getattr(r, "topic_id", None) not in spoiled_ids)
    cls = type(value.responses[0]) if value.responses else _topic_class(version)
    array = TopicArray((("topic_data", True),), name="name" if version < 13 else None,
                       topic_id="topic_id" if version >= 13 else None)
    errors = [error_result(cls, TopicRef(array, (i,), name, topic_id, None), partitions,
                           error_code)
              for i, (name, topic_id, partitions) in enumerate(refused)]
    value = dataclasses.replace(value, responses=(*kept, *errors))
    return bytes(frame[: header.size]) + encode(value)


def _topic_class(version: int) -> Any:
    from kio.index import load_response_schema

    from kafka_quota_proxy.protocol.topic_fields import _entry_class

    return _entry_class(load_response_schema(PRODUCE, version), ("responses",))


Amend = Callable[[bytes | memoryview], bytes]
