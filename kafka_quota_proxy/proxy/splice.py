"""Moving a frame's bytes from one socket to the other in the kernel (Linux ``splice``).

A Produce request and a Fetch response are mostly record batches that the proxy only counts:
its walks read the frame's header and the topics and partitions around them, and skip the
records by their length (``RequestStream.passable``, ``ResponseStream.passable``). Read into
Python and written out again, each of those bytes is copied three times (into the read
buffer, into a ``bytes``, into the other socket). Moved socket to pipe to socket with
``splice``, the kernel hands the pages over instead: on this machine a copying loop costs
0.36-0.40 core-s per GB moved and a splicing one 0.20 (``bench/splice_floor.py``,
docs/performance.md).

A ``Lane`` per direction of a connection moves a span within the read that found it: it
takes what the source socket holds now, up to the span's end (never a frame's last byte,
which the stream reads as usual). When the sink's socket will not take all of it, the rest
waits in the pipe, which that lane then keeps: its source is not read (a pause of its read
gate) until the sink's socket has taken it, so nothing overtakes those bytes and
backpressure reaches the sending side as it does when a transport's buffer is full. Pipes are
kept in a small pool of the process (one event loop) and made as needed.

Only plaintext sockets on both sides (TLS needs the bytes in user space) and only when the
sink's transport has nothing buffered (else the spliced bytes would overtake it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
from collections.abc import Callable
from typing import NamedTuple, Protocol

from kafka_quota_proxy.proxy.flow import ReadGate
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats

log = get_logger("kafka_quota_proxy.splice")

# Spans shorter than this go the usual way (two system calls per chunk either way).
SPLICE_MIN_BYTES = 64 * 1024
# How much a read of a side that splices takes (``Lane.read_size``): within a span to
# splice only what wakes the connection; where a span may follow, enough for a Produce
# request's or a Fetch response's headers before it; else as much as uvloop reads at once
READ_IN_SPAN = 4 * 1024
READ_BETWEEN_SPANS = 16 * 1024
READ_BYTES = 256 * 1024
PIPE_BYTES = 1024 * 1024  # asked of F_SETPIPE_SZ (the kernel's default is 64 KiB)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
AVAILABLE = hasattr(os, "splice")


class Spliced(NamedTuple):
    moved: int  # bytes taken from the source: delivered, waiting in ``pipe``, or ``left``
    pipe: Pipe | None = None  # holding ``waiting`` bytes the sink would not take yet
    waiting: int = 0
    error: OSError | None = None
    side: str = ""  # "source" or "sink" when ``error``
    # splice refused by the system (``unusable``): the bytes taken but not delivered, read
    # back, to go next through the transport
    left: bytes | None = None


# What splice answers where the system does not allow it on these descriptors (a seccomp
# profile, a sandbox's kernel), as opposed to a failing connection
_REFUSALS = frozenset({errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EACCES,
                       errno.EOPNOTSUPP})
_unusable = False


def usable() -> bool:
    """Whether splicing is on for this process (off for good once the system refused it)."""
    return AVAILABLE and not _unusable


def _refused(exc: OSError) -> bool:
    global _unusable
    if exc.errno not in _REFUSALS:
        return False
    if not _unusable:
        _unusable = True
        log.warning("splice_unavailable", error=str(exc),
                    detail="the system refuses splice: every byte is read and written")
    return True


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
    """The ``n`` bytes waiting in ``pipe``, read into memory to go through the transport
    (no descriptor left to watch the sink with, or the system refused the splice out)."""
    parts = []
    while n > 0:
        chunk = os.read(pipe.r, n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def splice_span(source: int, sink: int, limit: int, chunk: int = PIPE_BYTES) -> Spliced:
    """Move up to ``limit`` bytes from socket ``source`` to socket ``sink`` through a pipe,
    ``chunk`` bytes at most at a time, stopping when the source holds no more now (or at
    its end), or when the sink will not take more: those bytes (at most a chunk) then wait
    in the pipe returned (the caller's, until ``drain`` has moved them and it is
    ``release``d)."""
    pipe = _take()
    if pipe is None:
        return Spliced(0)
    chunk = min(chunk, pipe.size)
    moved = 0
    while moved < limit:
        try:
            k = os.splice(source, pipe.w, min(limit - moved, chunk), flags=_FLAGS)
        except BlockingIOError:
            break
        except OSError as exc:
            release(pipe)
            if _refused(exc):  # (nothing taken by this call)
                return Spliced(moved, left=b"")
            return Spliced(moved, error=exc, side="source")
        if k == 0:  # the client's end: its own read sees it next
            break
        moved += k
        waiting, error = drain(pipe, k, sink)
        if error is not None:
            if _refused(error):
                left = read_back(pipe, waiting)
                release(pipe)
                return Spliced(moved, left=left)
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


class Passable(Protocol):
    """A stream whose frame under way may partly go by unread (``RequestStream``,
    ``ResponseStream``)."""

    def passable(self) -> int: ...

    def passed(self, n: int) -> None: ...


class Lane:
    """One direction of a connection's splicing: from the socket read behind ``gate`` (the
    source side's read gate) to the socket written through ``sink`` (the other side's
    transport, holding ``marks`` as its write buffer limits). ``may()`` says whether the
    connection splices at all now; ``failed(side, error)`` closes it when a socket fails
    (``side``: "source" or "sink").

    Bytes waiting in its pipe are the proxy's buffer towards the sink as a transport's are:
    at most the high-water mark of them (each splice moves at most that much at a time), and
    a wait is a backpressure pause of the source (``stats.backpressure[slow_side]``)."""

    __slots__ = ("_waiting", "direction", "draining", "failed", "gate", "marks", "may",
                 "off", "sink", "sink_fd", "slow_side", "source_fd", "spliced_frame", "stats",
                 "stream")

    def __init__(self, stream: Passable, source_fd: int, sink_fd: int, gate: ReadGate,
                 sink: asyncio.Transport, marks: tuple[int, int], stats: ProxyStats,
                 direction: str, slow_side: str, may: Callable[[], bool],
                 failed: Callable[[str, OSError], None]) -> None:
        self.stream = stream
        self.source_fd, self.sink_fd = source_fd, sink_fd
        self.gate = gate
        self.sink = sink
        self.marks = marks
        self.stats = stats
        self.direction = direction
        self.slow_side = slow_side
        self.may = may
        self.failed = failed
        self.draining = False  # the sink's marks lowered to 0 until its buffer empties
        self.spliced_frame = False  # the newest frame's bytes were spliced (``read_size``)
        self.off = False  # the system refused splice: read and written as any bytes
        # bytes spliced that the sink has not taken yet: (their pipe, how many, a duplicate
        # of the sink's descriptor watched for room)
        self._waiting: tuple[Pipe, int, int] | None = None

    def read_size(self, mid_frame: bool) -> int:
        """How much the source side's next read should take: within a span to splice only
        what wakes it, at the start of a frame after a spliced one (or between its spans)
        enough for the headers before the next span, else ``READ_BYTES``."""
        if self.off:
            return READ_BYTES
        if mid_frame:
            if self.stream.passable() >= SPLICE_MIN_BYTES:
                return READ_IN_SPAN
            if self.spliced_frame:
                return READ_BETWEEN_SPANS
        elif self.spliced_frame:  # (once: a frame that is not spliced ends it)
            self.spliced_frame = False
            return READ_BETWEEN_SPANS
        return READ_BYTES

    def splice(self) -> None:
        """The rest of the span under way, as far as the source has it now. Only while the
        source is read and the sink's transport has nothing buffered, so that order holds:
        when it has, the source is not read until it has emptied (its pause_writing at a
        high-water mark of 0, then ``drained``), and the span is spliced after it."""
        if self.off:
            return
        stream = self.stream
        room = stream.passable()
        if room < SPLICE_MIN_BYTES or self.gate.paused or not self.may():
            return
        if self.sink.get_write_buffer_size():
            if not self.draining:
                self.draining = True
                self.sink.set_write_buffer_limits(0, 0)
            return
        moved, pipe, waiting, error, side, left = splice_span(
            self.source_fd, self.sink_fd, room, self.marks[0])
        if moved:
            self.spliced_frame = True
            stream.passed(moved)
            self.stats.spliced[self.direction] += moved
        if left is not None:  # (refused by the system: no more splicing here)
            self.off = True
            if left:
                self.sink.write(left)
        elif error is not None:
            self.failed(side, error)
        elif pipe is not None:
            self._wait(pipe, waiting)

    def drained(self) -> None:
        """The sink's transport has emptied (its resume_writing): its own marks again."""
        if self.draining:
            self.draining = False
            self.sink.set_write_buffer_limits(*self.marks)

    def _wait(self, pipe: Pipe, waiting: int) -> None:
        """Spliced bytes wait in ``pipe`` for room in the sink's socket: the source is not
        read until they have gone (``_room``)."""
        watched = -1
        if begin_wait():
            try:
                watched = os.dup(self.sink_fd)  # (the transport's own is the loop's)
            except OSError:
                end_wait()
        if watched < 0:  # (too many waiting, or out of descriptors: through the transport)
            self.sink.write(read_back(pipe, waiting))
            release(pipe)
            return
        self._waiting = (pipe, waiting, watched)
        self.stats.splice_waits += 1
        self.stats.backpressure[self.slow_side] += 1
        self.gate.pause("splice")
        asyncio.get_running_loop().add_writer(watched, self._room)

    def _room(self) -> None:
        """The sink's socket has room: the bytes waiting go on; once all have, the source is
        read again, and what it has of the span meanwhile is spliced."""
        state = self._waiting
        if state is None:
            return
        pipe, waiting, watched = state
        waiting, error = drain(pipe, waiting, self.sink_fd)
        self._waiting = (pipe, waiting, watched)
        if error is not None:
            self.failed("sink", error)
            return
        if waiting:
            return
        self.close()
        self.gate.resume("splice")
        self.splice()

    def close(self) -> None:
        """No more waiting (the connection closes: bytes still waiting are dropped with the
        pipe, and the sink never gets the frame's end)."""
        state = self._waiting
        if state is None:
            return
        self._waiting = None
        pipe, waiting, watched = state
        asyncio.get_running_loop().remove_writer(watched)
        os.close(watched)
        end_wait()
        release(pipe, empty=not waiting)

    @property
    def waiting(self) -> bool:
        return self._waiting is not None

    @property
    def waiting_bytes(self) -> int:
        """Spliced bytes the sink has not taken yet."""
        return self._waiting[1] if self._waiting is not None else 0
