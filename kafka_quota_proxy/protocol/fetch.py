"""Fetch v11+ (KIP-392): what a consumer asks for, and ``preferred_read_replica`` in the answer.

``parse_fetch_request`` walks a FetchRequest body by lengths and returns what fetch-from-
follower routing needs: the partitions asked for (and where their ``partition_max_bytes``
are), the fetch session (KIP-227), the forgotten partitions and the consumer's ``rack_id``.
``ask_for_nothing`` patches a request in place, same size, so that the leader is asked for
no bytes of the partitions the proxy redirects. ``set_preferred_read_replicas`` sets
``preferred_read_replica`` in chosen partitions of a FetchResponse and empties their records,
as a Kafka leader does when its replica selector picks another replica: the consumer has not
advanced, so it fetches the same offsets again from that replica. Everything else in the
response (other partitions, tagged fields the proxy does not know) stays byte for byte.

Topics are keyed as the version names them: by name (``str``) before v13, by topic id (16
``bytes``) from v13. Layouts follow Kafka's FetchRequest.json / FetchResponse.json; the unit
tests check them against kio for every version.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TypeAlias

from kafka_quota_proxy.protocol.primitives import INT16, INT32, read_tagged_fields, read_uvarint
from kafka_quota_proxy.protocol.skim import _array_len, _skip_bytes

Buffer: TypeAlias = bytes | memoryview
TopicKey: TypeAlias = str | bytes  # topic name (Fetch < v13) or topic id (v13+)
FIRST_VERSION = 11  # rack_id and preferred_read_replica
_REPLICA_STATE_TAG = 1  # v15+: ReplicaState {replica_id, replica_epoch} (followers only)
FINAL_EPOCH = -1  # KIP-227: a full fetch that closes the session it names and opens none


@dataclass(frozen=True, slots=True)
class FetchRequestSummary:
    replica_id: int  # -1 for consumers
    session_id: int
    session_epoch: int  # -1: no session (full fetch); 0: a new session (full); > 0: incremental
    topics: tuple[tuple[TopicKey, tuple[int, ...]], ...]
    forgotten: tuple[tuple[TopicKey, tuple[int, ...]], ...]
    rack_id: str
    body_at: int = 0  # where the body starts in the buffer parsed
    # where each listed partition's partition_max_bytes is, in the order of ``topics``
    max_bytes_at: tuple[int, ...] = ()

    @property
    def from_consumer(self) -> bool:
        return self.replica_id < 0

    @property
    def listed(self) -> tuple[tuple[TopicKey, int], ...]:
        """The (topic, partition) pairs the request lists, in order (as ``max_bytes_at``)."""
        return tuple((t, p) for t, parts in self.topics for p in parts)


def read_length(buf: Buffer, pos: int, flexible: bool, classic: struct.Struct
                ) -> tuple[int, int]:
    """The length of a string or bytes field (-1: null): an unsigned varint of length + 1 in
    flexible versions, else ``classic`` (INT16 for strings, INT32 for bytes)."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    return classic.unpack_from(buf, pos)[0], pos + classic.size


def read_string(buf: Buffer, pos: int, flexible: bool) -> tuple[str, int]:
    n, pos = read_length(buf, pos, flexible, INT16)
    if n < 0:
        return "", pos
    end = pos + n
    if end > len(buf):
        raise IndexError("string runs past the end")
    return bytes(buf[pos:end]).decode(), end


def read_topic(buf: Buffer, pos: int, version: int, flexible: bool) -> tuple[TopicKey, int]:
    if version >= 13:
        if pos + 16 > len(buf):
            raise IndexError("topic id runs past the end")
        return bytes(buf[pos : pos + 16]), pos + 16
    return read_string(buf, pos, flexible)


def _skip_tags(buf: Buffer, pos: int) -> int:
    return read_tagged_fields(buf, pos)[1]


def parse_fetch_request(buf: Buffer, pos: int, version: int) -> FetchRequestSummary:
    """Walk a FetchRequest body (``pos`` just after the request header), v11+."""
    if version < FIRST_VERSION:
        raise ValueError(f"Fetch v{version} has no rack_id")
    flexible = version >= 12
    body_at = pos
    replica_id = -1
    if version < 15:
        replica_id = INT32.unpack_from(buf, pos)[0]
        pos += 4
    pos += 4 + 4 + 4 + 1  # max_wait_ms, min_bytes, max_bytes, isolation_level
    session_id = INT32.unpack_from(buf, pos)[0]
    session_epoch = INT32.unpack_from(buf, pos + 4)[0]
    pos += 8
    # partition, current_leader_epoch, fetch_offset, [last_fetched_epoch v12+],
    # log_start_offset, partition_max_bytes
    fixed = 4 + 4 + 8 + (4 if version >= 12 else 0) + 8 + 4
    topics = []
    max_bytes_at = []
    n_topics, pos = _array_len(buf, pos, flexible)
    for _ in range(max(n_topics, 0)):
        topic, pos = read_topic(buf, pos, version, flexible)
        n_parts, pos = _array_len(buf, pos, flexible)
        parts = []
        for _ in range(max(n_parts, 0)):
            parts.append(INT32.unpack_from(buf, pos)[0])
            pos += fixed
            max_bytes_at.append(pos - 4)
            if flexible:
                pos = _skip_tags(buf, pos)
        if flexible:
            pos = _skip_tags(buf, pos)
        topics.append((topic, tuple(parts)))
    forgotten = []
    n_forgotten, pos = _array_len(buf, pos, flexible)
    for _ in range(max(n_forgotten, 0)):
        topic, pos = read_topic(buf, pos, version, flexible)
        n_parts, pos = _array_len(buf, pos, flexible)
        parts = [INT32.unpack_from(buf, pos + 4 * i)[0] for i in range(max(n_parts, 0))]
        pos += 4 * max(n_parts, 0)
        if flexible:
            pos = _skip_tags(buf, pos)
        forgotten.append((topic, tuple(parts)))
    rack_id, pos = read_string(buf, pos, flexible)
    if flexible:
        fields, pos = read_tagged_fields(buf, pos)
        for tag, start, _end in fields:
            if tag == _REPLICA_STATE_TAG and version >= 15:
                replica_id = INT32.unpack_from(buf, start)[0]
    if pos > len(buf):
        raise IndexError("fetch request truncated")
    return FetchRequestSummary(
        replica_id, session_id, session_epoch, tuple(topics), tuple(forgotten), rack_id,
        body_at, tuple(max_bytes_at),
    )


def _limits_at(body_at: int, version: int) -> tuple[int, int, int]:
    """Where min_bytes, max_bytes and session_epoch are: fixed offsets from the body start
    (replica_id leads the body before v15; then max_wait_ms, min_bytes, max_bytes,
    isolation_level, session_id, session_epoch)."""
    min_bytes = body_at + (8 if version < 15 else 4)
    return min_bytes, min_bytes + 4, min_bytes + 4 + 4 + 1 + 4


def ask_for_nothing(
    frame: Buffer,
    summary: FetchRequestSummary,
    version: int,
    partitions: Container[tuple[TopicKey, int]],
    *,
    idle: bool = False,
    close_session: bool = False,
) -> bytes:
    """``frame`` (the buffer ``summary`` was parsed from) with ``partition_max_bytes`` = 0 for
    every listed partition in ``partitions``; with ``idle`` (nothing in the request is to be
    read) also ``min_bytes`` = ``max_bytes`` = 0; with ``close_session`` ``session_epoch`` =
    -1 (FINAL_EPOCH: the broker closes the session and answers the listed partitions without
    one, and the client's next fetch is a full one). Every edit overwrites an INT32 in place:
    the frame keeps its size and every other byte."""
    out = bytearray(frame)
    for key, at in zip(summary.listed, summary.max_bytes_at, strict=True):
        if key in partitions:
            INT32.pack_into(out, at, 0)
    min_at, max_at, epoch_at = _limits_at(summary.body_at, version)
    if idle:
        INT32.pack_into(out, min_at, 0)
        INT32.pack_into(out, max_at, 0)
    if close_session:
        INT32.pack_into(out, epoch_at, FINAL_EPOCH)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Redirect:
    """One partition whose ``preferred_read_replica`` was set."""

    topic: TopicKey
    partition: int
    replica: int
    records_dropped: int  # bytes of records emptied


# (topic, partition, preferred_read_replica the broker set) -> the replica to set, or None
Chooser = Callable[[TopicKey, int, int], "int | None"]

_EMPTY_RECORDS = {True: b"\x01", False: b"\x00\x00\x00\x00"}  # compact (flexible) / classic


def set_preferred_read_replicas(
    frame: Buffer, pos: int, version: int, choose: Chooser
) -> tuple[bytes | None, list[Redirect]]:
    """``frame`` (a FetchResponse without its size prefix; ``pos`` just after the response
    header) with ``preferred_read_replica`` set, and the records emptied, in every partition
    ``choose`` picks a replica for; ``(None, [])`` when it picks none."""
    if version < FIRST_VERSION:
        return None, []
    flexible = version >= 12
    pos += 4 + 2 + 4  # throttle_time_ms, error_code, session_id
    fixed = 4 + 2 + 8 + 8 + 8  # partition, error_code, high_watermark, lso, log_start_offset
    edits: list[tuple[int, int, int]] = []  # (prr offset, records end, replica)
    redirects: list[Redirect] = []
    n_topics, pos = _array_len(frame, pos, flexible)
    for _ in range(max(n_topics, 0)):
        topic, pos = read_topic(frame, pos, version, flexible)
        n_parts, pos = _array_len(frame, pos, flexible)
        for _ in range(max(n_parts, 0)):
            partition = INT32.unpack_from(frame, pos)[0]
            pos += fixed
            n_aborted, pos = _array_len(frame, pos, flexible)
            for _ in range(max(n_aborted, 0)):
                pos += 16
                if flexible:
                    pos = _skip_tags(frame, pos)
            prr_at = pos
            current = INT32.unpack_from(frame, pos)[0]
            pos += 4
            records_at = pos
            pos = _skip_bytes(frame, pos, flexible)
            replica = choose(topic, partition, current)
            if replica is not None and replica != current:
                edits.append((prr_at, pos, replica))
                redirects.append(Redirect(topic, partition, replica, pos - records_at))
            if flexible:
                pos = _skip_tags(frame, pos)
        if flexible:
            pos = _skip_tags(frame, pos)
    if flexible:
        pos = _skip_tags(frame, pos)
    if pos > len(frame):
        raise IndexError("fetch response truncated")
    if not edits:
        return None, []
    out: list[Buffer] = []
    last = 0
    empty = _EMPTY_RECORDS[flexible]
    for prr_at, records_end, replica in edits:
        out.append(frame[last:prr_at])
        out.append(INT32.pack(replica))
        out.append(empty)
        last = records_end
    out.append(frame[last:])
    return b"".join(out), redirects
