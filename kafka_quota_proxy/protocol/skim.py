"""Skim Produce and Fetch responses, and Produce requests read whole: find field offsets
without decoding.

Produce responses and Fetch responses are the proxy's hot path (a Fetch response holds the
record batches). The proxy must find a few things in them (the top-level tagged fields that
carry KIP-951 ``node_endpoints``; the ``throttle_time_ms`` field) without building objects for
every topic, partition and batch. These functions walk the structure by lengths only and
return offsets. Layouts follow Kafka's ProduceResponse.json / FetchResponse.json; the unit
tests check them against kio for every version.

A Produce request is followed by walks (``incremental``) that take it chunk by chunk as it
passes; one read whole (a small request: most of them) is skimmed once instead
(``skim_produce_request``), for every follower, in one straight pass.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka_quota_proxy.protocol.primitives import INT16, INT32, read_uvarint, skip_tagged_fields


@dataclass(frozen=True, slots=True)
class Layout:
    throttle_offset: int  # offset of throttle_time_ms, or -1 when the version has none
    tags_offset: int  # offset of the top-level tagged-fields section, or -1 (not flexible)
    end: int  # offset just past the message


def _array_len(buf: bytes | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        n -= 1  # -1 means null
    else:
        n = INT32.unpack_from(buf, pos)[0]
        pos += 4
    if n > len(buf) - pos:  # every element takes at least one byte: a garbage count
        raise IndexError("array count exceeds the bytes left")  # must not spin the loops
    return n, pos


def _string_size(buf: bytes | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """A (nullable) string's length, -1 for null, and where its bytes start."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    size: int = INT16.unpack_from(buf, pos)[0]
    return size, pos + 2


def _skip_string(buf: bytes | memoryview, pos: int, flexible: bool) -> int:
    size, pos = _string_size(buf, pos, flexible)
    return pos + max(size, 0)


def _read_string(buf: bytes, pos: int, flexible: bool) -> tuple[bytes, int]:
    """A (nullable) string's raw bytes (``b""`` when empty or null), and the offset past it."""
    size, pos = _string_size(buf, pos, flexible)
    if size <= 0:
        return b"", pos
    return bytes(buf[pos:pos + size]), pos + size


def _skip_bytes(buf: bytes | memoryview, pos: int, flexible: bool) -> int:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return pos + max(n - 1, 0)
    size: int = INT32.unpack_from(buf, pos)[0]
    return pos + 4 + max(size, 0)


@dataclass(frozen=True, slots=True)
class ProduceRequestSkim:
    """A Produce request's topics, read whole: ``topics`` holds, per topic in frame order,
    its name (raw UTF-8, ``b""`` when empty or null) or 16-byte topic id (v13+), the offset
    just past those bytes in the buffer skimmed, and ``(partition, bytes of records)`` per
    partition (-1 for null records)."""

    transactional_id: bytes | None  # raw, when non-empty (v3+)
    topics: list[tuple[bytes, int, list[tuple[int, int]]]]


def skim_produce_request(buf: bytes, pos: int, end: int,
                         version: int) -> ProduceRequestSkim | None:
    """Skim the Produce request frame in ``buf[pos:end]`` (``pos`` just after its size
    prefix, request header included). None where it is anything but plain (a null array, a
    structure that does not fit the frame, a field that does not parse): the walks then
    decide what it is, as for a frame read in pieces. What it gives is what those walks give
    (``tests/unit/protocol/test_skim_produce.py``)."""
    found = _skim_produce(buf, pos, end, end, version)
    return None if found is None else found[0]


@dataclass(frozen=True, slots=True)
class ProducePrefix:
    """A Produce request skimmed before all of it arrived (``skim_produce_prefix``): every
    topic and partition (the last partition's records still arriving), and where in the
    buffer those records start and how many bytes they are."""

    skim: ProduceRequestSkim
    records_at: int
    records: int


def skim_produce_prefix(buf: bytes, pos: int, n: int, end: int,
                        version: int) -> ProducePrefix | None:
    """Skim the Produce request frame that starts at ``pos`` (just after its size prefix)
    and ends at ``end``, of which the ``n`` bytes of ``buf`` hold the beginning: when all of
    it up to its last partition's records is there (a large request's first read: one
    topic and one partition, or more partitions whose records are all in that read), the
    skim of the whole frame, what follows those records being tagged fields only (the
    stream's ``incremental.produce_tail``). None otherwise: the walks follow the frame."""
    found = _skim_produce(buf, pos, n, end, version)
    if found is None or found[1] < 0:
        return None
    return ProducePrefix(*found)


def _skim_produce(buf: bytes, pos: int, avail: int, end: int,
                  version: int) -> tuple[ProduceRequestSkim, int, int] | None:
    """The skim of the frame in ``buf[pos:end]`` of which ``buf[:avail]`` has arrived, with
    where its last partition's records start and their size when they run past ``avail``
    (else -1, 0: the frame is all there)."""
    flexible = version >= 9
    try:
        pos += 8  # api_key, api_version, correlation_id
        pos += 2 + max(INT16.unpack_from(buf, pos)[0], 0)  # client_id (nullable, classic)
        if flexible:
            pos = skip_tagged_fields(buf, pos)  # request header v2
        transactional_id = None
        if version >= 3:
            raw, pos = _read_string(buf, pos, flexible)
            transactional_id = raw or None
        pos += 6  # acks, timeout_ms
        n_topics, pos = _array_len(buf, pos, flexible)
        if n_topics < 0:
            return None
        topics: list[tuple[bytes, int, list[tuple[int, int]]]] = []
        for t in range(n_topics):
            if version >= 13:
                name = bytes(buf[pos:pos + 16])
                pos += 16
            else:
                name, pos = _read_string(buf, pos, flexible)
            at = pos
            n_parts, pos = _array_len(buf, pos, flexible)
            if n_parts < 0:
                return None
            parts = []
            for p in range(n_parts):
                index = INT32.unpack_from(buf, pos)[0]
                if flexible:
                    size, pos = read_uvarint(buf, pos + 4)
                    size -= 1
                else:
                    size = INT32.unpack_from(buf, pos + 4)[0]
                    pos += 8
                if size > 0:
                    if pos + size > avail:
                        # (read whole: past the frame's end. Arriving: only the frame's
                        # last records may still be on their way)
                        if pos + size > end or p < n_parts - 1 or t < n_topics - 1:
                            return None
                        parts.append((index, size))
                        topics.append((name, at, parts))
                        return ProduceRequestSkim(transactional_id, topics), pos, size
                    pos += size
                parts.append((index, size))
                if flexible:
                    pos = skip_tagged_fields(buf, pos)
            if flexible:
                pos = skip_tagged_fields(buf, pos)
            topics.append((name, at, parts))
        if flexible:
            pos = skip_tagged_fields(buf, pos)
    except (IndexError, ValueError, struct.error):
        return None
    if pos > end or avail < end:
        return None
    return ProduceRequestSkim(transactional_id, topics), -1, 0


@dataclass(frozen=True, slots=True)
class FetchPrefix:
    """A Fetch response skimmed up to its last partition's records (``skim_fetch_prefix``):
    every partition's ``(topic name or 16-byte topic id, partition, bytes of records)``, as
    ``incremental.fetch_response_walk`` lists them, and where in the buffer those last
    records start and how many bytes they are."""

    parts: list[tuple[str | bytes, int, int]]
    records_at: int
    records: int


def skim_fetch_prefix(buf: memoryview, pos: int, avail: int,
                      version: int) -> FetchPrefix | None:
    """Skim the Fetch response frame that starts at ``pos`` (just after its size prefix,
    response header included), of which ``buf[:avail]`` has arrived, up to the start of its
    last partition's records, when all of that is there (a response's first read: one
    partition, or more whose records all came before). What is left is those records and,
    in flexible versions, the partition's and the topic's tagged fields (followed by
    ``incremental.fetch_tail``). None otherwise (no topic, a last topic with no partition, a
    null array, a field that does not parse or is not there yet): the walk follows the
    frame."""
    flexible = version >= 12
    buf = buf[:avail]  # (nothing past what has arrived, or past the frame, is read)
    # error_code, high_watermark[, last_stable_offset][, log_start_offset]
    fixed = 14 + (8 if version >= 4 else 0) + (8 if version >= 5 else 0)  # (index too)
    parts: list[tuple[str | bytes, int, int]] = []
    try:
        pos += 4  # correlation id
        if flexible:
            pos = skip_tagged_fields(buf, pos)  # response header
        if version >= 1:
            pos += 4  # throttle_time_ms
        if version >= 7:
            pos += 6  # error_code, session_id
        n_topics, pos = _array_len(buf, pos, flexible)
        for t in range(n_topics):
            topic: str | bytes
            if version >= 13:
                topic = bytes(buf[pos:pos + 16])
                pos += 16
            else:
                size, pos = _string_size(buf, pos, flexible)
                topic = str(buf[pos:pos + size], "utf-8", "replace") if size > 0 else ""
                pos += max(size, 0)
            n_parts, pos = _array_len(buf, pos, flexible)
            if n_parts < 0 or (n_parts == 0 and t == n_topics - 1):
                return None
            for p in range(n_parts):
                index = INT32.unpack_from(buf, pos)[0]
                pos += fixed
                if version >= 4:
                    n_aborted, pos = _array_len(buf, pos, flexible)
                    for _ in range(n_aborted):
                        pos += 16  # producer_id, first_offset
                        if flexible:
                            pos = skip_tagged_fields(buf, pos)
                if version >= 11:
                    pos += 4  # preferred_read_replica
                if flexible:
                    size, pos = read_uvarint(buf, pos)
                    size -= 1
                else:
                    size = INT32.unpack_from(buf, pos)[0]
                    pos += 4
                size = max(size, 0)
                parts.append((topic, index, size))
                if p == n_parts - 1 and t == n_topics - 1:
                    return FetchPrefix(parts, pos, size)  # (pos <= avail: its size was read)
                pos += size
                if flexible:
                    pos = skip_tagged_fields(buf, pos)
            if flexible:
                pos = skip_tagged_fields(buf, pos)
    except (IndexError, ValueError, struct.error):
        return None
    return None


def produce_response_layout(buf: bytes | memoryview, pos: int, version: int) -> Layout:
    """Walk a ProduceResponse body (after the response header)."""
    flexible = version >= 9
    n_topics, pos = _array_len(buf, pos, flexible)
    # index, error_code, base_offset [, log_append_time_ms v2+] [, log_start_offset v5+]
    fixed = 14 + (8 if version >= 2 else 0) + (8 if version >= 5 else 0)
    for _ in range(max(n_topics, 0)):
        pos = pos + 16 if version >= 13 else _skip_string(buf, pos, flexible)
        n_parts, pos = _array_len(buf, pos, flexible)
        for _ in range(max(n_parts, 0)):
            pos += fixed
            if version >= 8:
                n_errors, pos = _array_len(buf, pos, flexible)
                for _ in range(max(n_errors, 0)):
                    pos = _skip_string(buf, pos + 4, flexible)
                    if flexible:
                        pos = skip_tagged_fields(buf, pos)
                pos = _skip_string(buf, pos, flexible)
            if flexible:
                pos = skip_tagged_fields(buf, pos)
        if flexible:
            pos = skip_tagged_fields(buf, pos)
    throttle = -1
    if version >= 1:
        throttle = pos
        pos += 4
    tags = -1
    if flexible:
        tags = pos
        pos = skip_tagged_fields(buf, pos)
    if pos > len(buf):
        raise IndexError("produce response truncated")
    return Layout(throttle, tags, pos)


def fetch_response_layout(buf: bytes | memoryview, pos: int, version: int) -> Layout:
    """Walk a FetchResponse body (after the response header), skipping record batches."""
    flexible = version >= 12
    throttle = -1
    if version >= 1:
        throttle = pos
        pos += 4
    if version >= 7:
        pos += 6  # error_code, session_id
    # partition_index, error_code, high_watermark [, last_stable_offset v4+]
    # [, log_start_offset v5+]
    fixed = 14 + (8 if version >= 4 else 0) + (8 if version >= 5 else 0)
    n_topics, pos = _array_len(buf, pos, flexible)
    for _ in range(max(n_topics, 0)):
        pos = pos + 16 if version >= 13 else _skip_string(buf, pos, flexible)
        n_parts, pos = _array_len(buf, pos, flexible)
        for _ in range(max(n_parts, 0)):
            pos += fixed
            if version >= 4:
                n_aborted, pos = _array_len(buf, pos, flexible)
                for _ in range(max(n_aborted, 0)):
                    pos += 16
                    if flexible:
                        pos = skip_tagged_fields(buf, pos)
            if version >= 11:
                pos += 4  # preferred_read_replica
            pos = _skip_bytes(buf, pos, flexible)
            if flexible:
                pos = skip_tagged_fields(buf, pos)
        if flexible:
            pos = skip_tagged_fields(buf, pos)
    tags = -1
    if flexible:
        tags = pos
        pos = skip_tagged_fields(buf, pos)
    if pos > len(buf):
        raise IndexError("fetch response truncated")
    return Layout(throttle, tags, pos)
