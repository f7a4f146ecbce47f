"""Skim a Produce request for what each partition carries: ``(topic, partition, bytes of
record batches)``, without decoding the records. Topics are keyed as the version names them:
by name before v13, by topic id (16 bytes) from v13. Layout: Kafka's ProduceRequest.json
(v3+); the unit tests check it against kio for every version."""

from __future__ import annotations

from protocol.fetch import Buffer, TopicKey, read_length, read_string, read_topic
from protocol.primitives import INT32, read_tagged_fields
from protocol.skim import _array_len

FIRST_VERSION = 3


def produce_partitions(buf: Buffer, pos: int, version: int
                       ) -> list[tuple[TopicKey, int, int]]:
    """Walk a ProduceRequest body (``pos`` just after the request header)."""
    if version < FIRST_VERSION:
        raise ValueError(f"Produce v{version} is not walked")
    flexible = version >= 9
    _, pos = read_string(buf, pos, flexible)  # transactional_id
    pos += 2 + 4  # acks, timeout_ms
    out: list[tuple[TopicKey, int, int]] = []
    n_topics, pos = _array_len(buf, pos, flexible)
    for _ in range(max(n_topics, 0)):
        topic, pos = read_topic(buf, pos, version, flexible)
        n_parts, pos = _array_len(buf, pos, flexible)
        for _ in range(max(n_parts, 0)):
            partition = INT32.unpack_from(buf, pos)[0]
            pos += 4
            size, pos = read_length(buf, pos, flexible, INT32)
            size = max(size, 0)
            pos += size
            if flexible:
                pos = read_tagged_fields(buf, pos)[1]
            out.append((topic, partition, size))
        if flexible:
            pos = read_tagged_fields(buf, pos)[1]
    if flexible:
        pos = read_tagged_fields(buf, pos)[1]
    if pos > len(buf):
        raise IndexError("produce request truncated")
    return out
