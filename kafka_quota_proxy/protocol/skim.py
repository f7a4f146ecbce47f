"""Skim Produce and Fetch responses: find field offsets without decoding.

Produce responses and Fetch responses are the proxy's hot path (a Fetch response holds the
record batches). The proxy must find a few things in them (the top-level tagged fields that
carry KIP-951 ``node_endpoints``; the ``throttle_time_ms`` field) without building objects for
every topic, partition and batch. These functions walk the structure by lengths only and
return offsets. Layouts follow Kafka's ProduceResponse.json / FetchResponse.json; the unit
tests check them against kio for every version.
"""

from __future__ import annotations

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


def _skip_string(buf: bytes | memoryview, pos: int, flexible: bool) -> int:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return pos + max(n - 1, 0)
    size: int = INT16.unpack_from(buf, pos)[0]
    return pos + 2 + max(size, 0)


def _skip_bytes(buf: bytes | memoryview, pos: int, flexible: bool) -> int:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return pos + max(n - 1, 0)
    size: int = INT32.unpack_from(buf, pos)[0]
    return pos + 4 + max(size, 0)


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
