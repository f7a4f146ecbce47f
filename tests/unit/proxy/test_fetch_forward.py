"""Where the proxy puts a patched consumer fetch: the request stream forwards frames
cut-through, so the connection (``proxy.connection.read_events``) finds the copied fetch in
the bytes it is about to forward (``FrameCopied.at``) and overwrites it there (same size), or
leaves it alone when the frame is not wholly there. A connection driven with a filter that
patches every fetch it is given whole: checked under any chunking, with and without reading
one frame at a time (clients with a quota)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.interests import Interest
from kafka_quota_proxy.proxy.filters.base import Filter, FilterHost
from testkit.connection import DrivenConnection
from testkit.frames import chunked, request_frame

FETCH, METADATA = 1, 3


def _frames(kinds: list[tuple[bool, int]]) -> list[tuple[int, bool, bytes]]:
    """(correlation id, is a fetch, frame with size prefix); bodies are opaque here."""
    out = []
    for corr, (fetch, size) in enumerate(kinds):
        body = bytes((corr + i) % 251 for i in range(size))
        if fetch:
            out.append((corr, True, request_frame(FETCH, 15, corr, "c", body)))
        else:
            out.append((corr, False, request_frame(METADATA, 12, corr, "c", body)))
    return out


def _mark(frame: bytes, corr: int) -> bytes:
    """The "patched" fetch: its last 4 bytes overwritten (same size)."""
    return frame[:-4] + (0x7F000000 + corr).to_bytes(4, "big")


class _PatchFetches(Filter):
    """Sees every fetch whole (as fetch routing does) and patches those it may (``_mark``),
    recording whether each was patchable; ``one_at_a_time``: asks for frames one by one (as
    quotas do)."""

    def __init__(self, host: FilterHost, patchable: dict[int, bool],
                 one_at_a_time: bool) -> None:
        self.patchable = patchable
        self.one_at_a_time = one_at_a_time

    @staticmethod
    def interests(api_key: int, api_version: int) -> Interest:
        return Interest.REQUEST_FRAME if api_key == FETCH else Interest.NONE

    def request_frame(self, entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        self.patchable[entry.correlation_id] = patchable
        return _mark(frame, entry.correlation_id) if patchable else None

    def serial(self) -> bool:
        return self.one_at_a_time


def _forward(chunks: list[bytes], one_at_a_time: bool,
             run: Callable[[Coroutine[Any, Any, bytes]], bytes] = asyncio.run,
             ) -> tuple[bytes, dict[int, bool]]:
    """What reaches the broker of the client's reads ``chunks``, and whether each fetch was
    patchable (``run``: the event loop the connection is driven on)."""
    patchable: dict[int, bool] = {}

    async def drive() -> bytes:
        h = await DrivenConnection.open(
            [partial(_PatchFetches, patchable=patchable, one_at_a_time=one_at_a_time)])
        for chunk in chunks:
            h.client_sends(chunk)
        assert h.closed_reason is None and not h.conn.requests.unread  # nothing held back
        return h.upstream_got()

    return run(drive()), patchable


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.tuples(st.booleans(), st.integers(4, 40)), min_size=1, max_size=6),
       one_at_a_time=st.booleans(), data=st.data())
def test_a_patched_fetch_replaces_exactly_its_own_bytes(
        kinds: list[tuple[bool, int]], one_at_a_time: bool, data: Any) -> None:
    frames = _frames(kinds)
    stream = b"".join(f for _, _, f in frames)
    out, patchable = _forward(chunked(stream, data.draw), one_at_a_time)
    assert sorted(patchable) == [corr for corr, fetch, _ in frames if fetch]
    expected = b"".join(_mark(f, corr) if fetch and patchable[corr] else f
                        for corr, fetch, f in frames)
    assert out == expected  # the same stream, with the patched fetches in place


@settings(max_examples=100, deadline=None)
@given(kinds=st.lists(st.tuples(st.booleans(), st.integers(4, 40)), min_size=1, max_size=6),
       one_at_a_time=st.booleans(), data=st.data())
def test_fetches_read_whole_are_always_patched(
        kinds: list[tuple[bool, int]], one_at_a_time: bool, data: Any) -> None:
    """Chunks of whole frames (a consumer's fetch comes in one read): every fetch is
    patched, wherever it is among the other requests."""
    frames = _frames(kinds)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(frames) - 1))) if len(frames) > 1
                  else [])
    groups = [frames[a:b] for a, b in itertools.pairwise([0, *cuts, len(frames)])]
    chunks = [b"".join(f for _, _, f in g) for g in groups]
    out, patchable = _forward(chunks, one_at_a_time)
    assert all(patchable.values())
    assert out == b"".join(_mark(f, corr) if fetch else f for corr, fetch, f in frames)


def test_a_fetch_split_over_two_reads_goes_as_sent() -> None:
    frames = _frames([(True, 30)])
    frame = frames[0][2]
    out, patchable = _forward([frame[:20], frame[20:]], one_at_a_time=False)
    assert patchable == {0: False} and out == frame


def test_the_connection_is_driven_on_uvloop_as_the_proxy_runs_it() -> None:
    """The connection core reaches its broker through the context's connector, so it is
    driven without sockets on the proxy's own event loop too."""
    frames = _frames([(False, 12), (True, 30), (False, 8)])
    out, patchable = _forward([b"".join(f for _, _, f in frames)], one_at_a_time=False,
                              run=uvloop.run)
    assert patchable == {1: True}
    assert out == b"".join(_mark(f, corr) if fetch else f for corr, fetch, f in frames)
