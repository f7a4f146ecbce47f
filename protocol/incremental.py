"""Walk a Fetch response incrementally, as its bytes pass through, without buffering it.

A Fetch response (v16+) may end with KIP-951 ``node_endpoints`` in its top-level tagged fields,
which the proxy must rewrite. Holding whole Fetch responses until they are complete would turn
the proxy into a store-and-forward hop on the consumer hot path. Instead the response streams
through while this walker follows its structure chunk by chunk (skipping record batches by their
length); only the final top-level tagged-fields section is held back, and the rewriter replaces
it with bytes of exactly the same length, so the size prefix sent first stays right.

The walk is a generator: it yields ``n > 0`` to receive the next ``n`` bytes, ``-n`` to skip
``n`` bytes, and returns when it reaches the top-level tagged fields.
"""

from __future__ import annotations

from collections.abc import Generator

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


def fetch_response_walk(version: int) -> Walk:
    """Walk a flexible (v12+) Fetch response frame from just after its size prefix (response
    header v1 included) up to its top-level tagged fields."""
    if version < 12:
        raise ValueError("only flexible Fetch versions have top-level tagged fields")
    yield -4  # correlation id
    yield from _skip_tagged_fields()  # response header
    yield -10  # throttle_time_ms, error_code, session_id
    # partition_index, error_code, high_watermark, last_stable_offset, log_start_offset
    fixed = 30
    n_topics = (yield from _uvarint()) - 1
    for _ in range(max(n_topics, 0)):
        if version >= 13:
            yield -16  # topic_id
        else:
            yield from _skip((yield from _uvarint()) - 1)  # topic name
        n_parts = (yield from _uvarint()) - 1
        for _ in range(max(n_parts, 0)):
            yield -fixed
            n_aborted = (yield from _uvarint()) - 1
            for _ in range(max(n_aborted, 0)):
                yield -16
                yield from _skip_tagged_fields()
            yield -4  # preferred_read_replica
            yield from _skip((yield from _uvarint()) - 1)  # records
            yield from _skip_tagged_fields()
        yield from _skip_tagged_fields()


class Walker:
    """Drives a walk over chunks; ``feed`` says how far the walk consumed a chunk."""

    __slots__ = ("_gen", "_partial", "_want", "done")

    def __init__(self, walk: Walk) -> None:
        self._gen = walk
        self._partial = b""
        self._want = 0
        self.done = False
        self._advance(None)

    def _advance(self, value: bytes | None) -> None:
        try:
            self._want = self._gen.send(value)
        except StopIteration:
            self.done = True

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
                self._advance(data)
        return i
