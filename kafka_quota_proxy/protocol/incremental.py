"""Walk a Fetch response incrementally, as its bytes pass through, without buffering it.

A Fetch response (v16+) may end with KIP-951 ``node_endpoints`` in its top-level tagged fields,
which the proxy must rewrite. Holding whole Fetch responses until they are complete would turn
the proxy into a store-and-forward hop on the consumer hot path. Instead the response streams
through while this walker follows its structure chunk by chunk (skipping record batches by their
length); only the final top-level tagged-fields section is held back, and the rewriter replaces
it with bytes of exactly the same length, so the size prefix sent first stays right.

The same walk measures Fetch responses of any version for the capture: the bytes of record
batches per partition, read off the size fields as they pass.

The walk is a generator: it yields ``n > 0`` to receive the next ``n`` bytes, ``-n`` to skip
``n`` bytes, and returns when it reaches the top-level tagged fields.
"""

from __future__ import annotations

from collections.abc import Generator

from kafka_quota_proxy.protocol.primitives import skip_tagged_fields

Walk = Generator[int, bytes | None, None]


def _uvarint() -> Generator[int, bytes | None, int]:
    value = 0
    shift = 0
    while True:
        data = yield 1
        assert data is not None
        b = data[0]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value
        shift += 7
        if shift > 28:
            raise ValueError("varint is longer than 5 bytes")


def _skip(n: int) -> Generator[int, bytes | None, None]:
    if n > 0:
        yield -n


def _skip_tagged_fields() -> Generator[int, bytes | None, None]:
    count = yield from _uvarint()
    for _ in range(count):
        yield from _uvarint()  # tag
        size = yield from _uvarint()
        yield from _skip(size)


def _int(n: int) -> Generator[int, bytes | None, int]:
    data = yield n
    assert data is not None
    return int.from_bytes(data, "big", signed=True)


def _array_count(flexible: bool) -> Generator[int, bytes | None, int]:
    """An array's length (-1 for null: no items)."""
    if flexible:
        return (yield from _uvarint()) - 1
    return (yield from _int(4))


PartitionBytes = list[tuple[str | bytes, int, int]]


def fetch_response_walk(version: int, parts: PartitionBytes | None = None) -> Walk:
    """Walk a Fetch response frame from just after its size prefix (response header
    included) up to its top-level tagged fields (v12+), or to its end.

    With ``parts``, each partition's ``(topic name or 16-byte topic id, partition, bytes of
    record batches)`` is appended to it as the walk passes it (every version)."""
    flexible = version >= 12
    yield -4  # correlation id
    if flexible:
        yield from _skip_tagged_fields()  # response header
    if version >= 1:
        yield -4  # throttle_time_ms
    if version >= 7:
        yield -6  # error_code, session_id
    # error_code, high_watermark[, last_stable_offset][, log_start_offset]
    fixed = 10 + (8 if version >= 4 else 0) + (8 if version >= 5 else 0)
    n_topics = yield from _array_count(flexible)
    for _ in range(max(n_topics, 0)):
        topic: str | bytes = b""
        if version >= 13:
            if parts is None:
                yield -16
            else:
                topic_id = yield 16
                assert topic_id is not None
                topic = topic_id
        else:
            size = (yield from _uvarint()) - 1 if flexible else (yield from _int(2))
            if parts is None:
                yield from _skip(size)
            elif size > 0:
                name = yield size
                assert name is not None
                topic = name.decode("utf-8", "replace")
            else:
                topic = ""
        n_parts = yield from _array_count(flexible)
        for _ in range(max(n_parts, 0)):
            if parts is None:
                yield -(4 + fixed)
                index = 0
            else:
                index = yield from _int(4)
                yield -fixed
            if version >= 4:
                n_aborted = yield from _array_count(flexible)
                for _ in range(max(n_aborted, 0)):
                    yield -16
                    if flexible:
                        yield from _skip_tagged_fields()
            if version >= 11:
                yield -4  # preferred_read_replica
            size = (yield from _uvarint()) - 1 if flexible else (yield from _int(4))
            yield from _skip(size)  # records
            if parts is not None:
                parts.append((topic, index, max(size, 0)))
            if flexible:
                yield from _skip_tagged_fields()
        if flexible:
            yield from _skip_tagged_fields()


def produce_request_walk(version: int, parts: PartitionBytes) -> Walk:
    """Walk a Produce request frame (v3+) from just after its size prefix, request header
    included, to its end, appending each partition's ``(topic name or 16-byte topic id,
    partition, bytes of record batches)`` to ``parts``: the capture's per-partition bytes,
    read off the size fields while the records pass through."""
    if version < 3:
        raise ValueError("only Produce v3+ is walked")
    flexible = version >= 9
    yield -8  # api_key, api_version, correlation_id
    yield from _skip(max((yield from _int(2)), 0))  # client_id (nullable, classic)
    if flexible:
        yield from _skip_tagged_fields()  # request header v2
    size = (yield from _uvarint()) - 1 if flexible else (yield from _int(2))
    yield from _skip(max(size, 0))  # transactional_id
    yield -6  # acks, timeout_ms
    n_topics = yield from _array_count(flexible)
    for _ in range(max(n_topics, 0)):
        topic: str | bytes
        if version >= 13:
            topic_id = yield 16
            assert topic_id is not None
            topic = topic_id
        else:
            size = (yield from _uvarint()) - 1 if flexible else (yield from _int(2))
            topic = ""
            if size > 0:
                name = yield size
                assert name is not None
                topic = name.decode("utf-8", "replace")
        n_parts = yield from _array_count(flexible)
        for _ in range(max(n_parts, 0)):
            index = yield from _int(4)
            size = (yield from _uvarint()) - 1 if flexible else (yield from _int(4))
            yield from _skip(size)  # records
            parts.append((topic, index, max(size, 0)))
            if flexible:
                yield from _skip_tagged_fields()
        if flexible:
            yield from _skip_tagged_fields()
    if flexible:
        yield from _skip_tagged_fields()


def _sections(n: int) -> Walk:
    for _ in range(n):
        yield from _skip_tagged_fields()


class RecordsTail:
    """A frame followed from the start of its last partition's records on, as a ``Walker``
    follows the frame's walk from there, without one: past the records (``skippable``), then
    ``sections`` tagged-field sections, read straight when all of them are in what is fed
    (else walked: a section may be large, and is then skipped as it passes, never held), to
    where the walk ends (``done``; ``feed`` returns that offset, bytes after it unread).
    A frame skimmed at its first read (``skim.skim_produce_prefix``,
    ``skim.skim_fetch_prefix``) is followed from there by this alone: ``produce_tail``,
    ``fetch_tail``."""

    __slots__ = ("_records", "_sections", "_walker", "done")

    def __init__(self, records: int, sections: int) -> None:
        self._records = records
        self._sections = sections
        self._walker: Walker | None = None
        self.done = not records and not sections  # (nothing left to walk)

    @property
    def skippable(self) -> int:
        """How many of the next bytes may go by unseen (``passed``)."""
        if self.done:
            return 0
        walker = self._walker
        return self._records if walker is None else walker.skippable

    def passed(self, n: int) -> None:
        """``n`` bytes (at most ``skippable``) went by unseen."""
        self.feed(b"", 0, n)

    def feed(self, buf: bytes | memoryview, start: int, end: int) -> int:
        """Consume ``buf[start:end]`` as far as the tail goes; return the offset reached
        (``end`` unless the walk ends inside the range)."""
        if self.done:
            return start
        walker = self._walker
        if walker is not None:
            i = walker.feed(buf, start, end)
            self.done = walker.done
            return i
        i = start
        records = self._records
        if records:
            k = records if records < end - i else end - i
            i += k
            self._records = records = records - k
            if records:
                return i
        if not self._sections:
            self.done = True
            return i
        if i == end:  # (the records passed, nothing of the sections yet: read them straight)
            return i
        view = memoryview(buf)[i:end]
        pos = 0
        try:
            for _ in range(self._sections):
                pos = skip_tagged_fields(view, pos)
                if pos > len(view):
                    break
        except IndexError:  # (not all there yet)
            pos = len(view) + 1
        if pos <= len(view):
            self.done = True
            return i + pos
        self._walker = Walker(_sections(self._sections))
        return self.feed(buf, i, end)


def produce_tail(records: int, flexible: bool) -> RecordsTail:
    """A Produce request's (``produce_request_walk``'s, the topic guard's) from its last
    partition's records on: the partition's, the topic's and the request's tagged fields."""
    return RecordsTail(records, 3 if flexible else 0)


def fetch_tail(records: int, flexible: bool) -> RecordsTail:
    """A Fetch response's (``fetch_response_walk``'s) from its last partition's records on:
    the partition's and the topic's tagged fields, up to the top-level ones."""
    return RecordsTail(records, 2 if flexible else 0)


class Walker:
    """Drives a walk over chunks; ``feed`` says how far the walk consumed a chunk."""

    __slots__ = ("_gen", "_partial", "_want", "at", "done")

    def __init__(self, walk: Walk) -> None:
        self._gen = walk
        self._partial = b""
        self._want = 0
        self.done = False
        self.at = 0  # where (in the buffer fed) the bytes the walk last received ended
        self._advance(None)

    def _advance(self, value: bytes | None) -> None:
        try:
            self._want = self._gen.send(value)
        except StopIteration:
            self.done = True

    @property
    def skippable(self) -> int:
        """How many of the next bytes the walk skips unseen (0 when it wants the next ones,
        or is done): ``feed`` may be given that many without their bytes (``passed``)."""
        want = self._want
        return -want if want < 0 and not self.done else 0

    def passed(self, n: int) -> None:
        """``n`` bytes (at most ``skippable``) went by unseen."""
        self.feed(b"", 0, n)

    def feed(self, buf: bytes | memoryview, start: int, end: int) -> int:
        """Consume ``buf[start:end]`` as far as the walk goes; return the offset reached
        (``end`` unless the walk finished inside the range)."""
        i = start
        while not self.done and i < end:
            want = self._want
            if want < 0:
                k = min(-want, end - i)
                i += k
                if k < -want:
                    self._want = want + k
                    break
                self._advance(None)
            else:
                need = want - len(self._partial)
                k = min(need, end - i)
                piece = bytes(buf[i : i + k])
                i += k
                if k < need:
                    self._partial += piece
                    break
                data = self._partial + piece if self._partial else piece
                self._partial = b""
                self.at = i
                self._advance(data)
        return i
