"""Moving a frame's bytes from one socket to the other in the kernel (Linux ``splice``).

A Produce request is mostly record batches that the proxy only counts: its walks read the
request's header and the topics and partitions around them, and skip the records by their
length (``RequestStream.passable``). Read into Python and written out again, each of those
bytes is copied four times (into the proxy, into a ``bytes``, out to the broker's socket). Moved
socket to pipe to socket with ``splice``, the kernel hands the pages over instead: on this
machine a copying loop costs 0.36-0.40 core-s per GB moved and a splicing one 0.20
(docs/performance.md).

The move happens within the read that found the span (``ProxiedConnection``): it takes what
the client socket holds now, up to the span's end. When the broker's socket will not take all
of it, the rest waits in the pipe, which that connection then keeps: its client is not read
(a pause of its read gate) until the broker's socket has taken it, so nothing overtakes those
bytes and backpressure reaches the client as it does when the upstream transport's buffer is
full. Pipes are kept in a small pool of the process (one event loop) and made as needed.

Only plaintext sockets on both sides (TLS needs the bytes in user space) and only when the
upstream transport has nothing buffered (else the spliced bytes would overtake it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from typing import NamedTuple

# Spans shorter than this go the usual way (two system calls per chunk either way).
SPLICE_MIN_BYTES = 64 * 1024
PIPE_BYTES = 1024 * 1024  # asked of F_SETPIPE_SZ (the kernel's default is 64 KiB)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
AVAILABLE = hasattr(os, "splice")


class Spliced(NamedTuple):
    moved: int  # bytes taken from the source: delivered, or waiting in ``pipe``
    pipe: Pipe | None = None  # holding ``waiting`` bytes the sink would not take yet
    waiting: int = 0
    error: OSError | None = None
    side: str = ""  # "source" or "sink" when ``error``


class Pipe:
    """A pipe the kernel moves pages through (``F_SETPIPE_SZ``: up to ``PIPE_BYTES``)."""

    __slots__ = ("r", "size", "w")

    def __init__(self) -> None:
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.size = fcntl.fcntl(self.w, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # (over the user's pipe-user-pages limits: the default size)
            self.size = 64 * 1024

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


# Pipes kept for the next splice, and how many connections may hold one while its bytes
# wait for the broker's socket (three descriptors each, with the one watched): bounded well
# inside the descriptors ``network.max_connections`` leaves free. Past it, the bytes waiting
# are read back and go through the upstream transport (``read_back``).
_POOL_MAX = 2
WAITING_MAX = 8
_pool: list[Pipe] = []
_waiting = 0


def begin_wait() -> bool:
    """Whether one more connection may keep its pipe while its bytes wait (then counted
    until ``end_wait``)."""
    global _waiting
    if _waiting >= WAITING_MAX:
        return False
    _waiting += 1
    return True


def end_wait() -> None:
    global _waiting
    _waiting -= 1


def _take() -> Pipe | None:
    if _pool:
        return _pool.pop()
    try:
        return Pipe()
    except OSError:  # (out of descriptors: this read goes the usual way)
        return None


def release(pipe: Pipe, empty: bool = True) -> None:
    """Give a pipe back (one still holding bytes is closed, and they with it)."""
    if empty and len(_pool) < _POOL_MAX:
        _pool.append(pipe)
    else:
        pipe.close()


def drain(pipe: Pipe, n: int, sink: int) -> tuple[int, OSError | None]:
    """Move the ``n`` bytes waiting in ``pipe`` to ``sink`` as far as it takes them now:
    how many still wait, and the sink's error if it failed."""
    while n:
        try:
            n -= os.splice(pipe.r, sink, n, flags=_FLAGS)
        except BlockingIOError:
            break
        except OSError as exc:
            return n, exc
    return n, None


def read_back(pipe: Pipe, n: int) -> bytes:
    """The ``n`` bytes waiting in ``pipe``, read into memory (when no descriptor is left to
    watch the sink with: they then go the usual way)."""
    parts = []
    while n > 0:
        chunk = os.read(pipe.r, n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def splice_span(source: int, sink: int, limit: int) -> Spliced:
    """Move up to ``limit`` bytes from socket ``source`` to socket ``sink`` through a pipe,
    stopping when the source holds no more now (or at its end), or when the sink will not
    take more: those bytes then wait in the pipe returned (the caller's, until ``drain``
    has moved them and it is ``release``d)."""
    pipe = _take()
    if pipe is None:
        return Spliced(0)
    moved = 0
    while moved < limit:
        try:
            k = os.splice(source, pipe.w, min(limit - moved, pipe.size), flags=_FLAGS)
        except BlockingIOError:
            break
        except OSError as exc:
            release(pipe)
            return Spliced(moved, error=exc, side="source")
        if k == 0:  # the client's end: its own read sees it next
            break
        moved += k
        waiting, error = drain(pipe, k, sink)
        if error is not None:
            release(pipe, empty=False)
            return Spliced(moved, error=error, side="sink")
        if waiting:
            return Spliced(moved, pipe, waiting)
    release(pipe)
    return Spliced(moved)


def socket_fd(transport: asyncio.BaseTransport | None) -> int | None:
    """The file descriptor of a plaintext TCP transport's socket (None for anything else)."""
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        fd = sock.fileno()
    except (OSError, AttributeError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None
