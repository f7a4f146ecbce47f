"""Framing of the two directions of one proxied connection, cut-through.

Kafka frames are a 4-byte big-endian size followed by that many bytes. The proxy does not
wait for whole frames it does not need to change: once a frame's size and header are read
and accepted, the rest of the frame is forwarded as it arrives, as the same bytes. Only
responses that must be rewritten (what ``protocol.interests`` says, per API and version, or
what the caller asks for when a response starts) are held until complete and handed to the
rewriter.

Sizes are checked before any buffering: a negative size or one above ``max_frame_bytes``
raises at once, so a hostile size never causes an allocation.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from protocol import apis
from protocol.correlation import CorrelationTable, InFlight
from protocol.errors import (
    FrameTooLarge,
    MalformedFrame,
    NegativeFrameSize,
    UnknownApiKey,
    UnsupportedVersion,
)
from protocol.headers import HeaderProgress, RequestHeader, parse_request_header, produce_acks
from protocol.incremental import (
    PartitionBytes,
    Walker,
    fetch_response_walk,
    produce_request_walk,
)
from protocol.interests import ADDRESSES, InterestTable
from protocol.primitives import INT32

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
# The most a legal request header (plus Produce's transactional_id and acks) can take: two
# strings of at most 32767 bytes, fixed fields and header tagged fields. Beyond this an
# incomplete header is refused whatever the chunking.
_MAX_HEADER_BYTES = 2 * 32767 + 4096

_PRODUCE = int(apis.ApiKey.PRODUCE)
_FETCH = int(apis.ApiKey.FETCH)

Buffer = bytes | memoryview
_NOTHING = memoryview(b"")


def _check_size(size: int, max_frame_bytes: int) -> None:
    if size < 0:
        raise NegativeFrameSize(f"frame size {size} is negative")
    if size > max_frame_bytes:
        raise FrameTooLarge(f"frame size {size} exceeds the maximum of {max_frame_bytes} bytes")


class RequestStream:
    """Client -> broker. ``feed`` returns the bytes to forward now and the requests whose
    headers were read; requests that expect a response are entered in the correlation table.
    """

    __slots__ = (
        "_capture",
        "_capturing",
        "_held",
        "_max",
        "_measure",
        "_measuring",
        "_pending",
        "_progress",
        "_remaining",
        "_table",
        "captured",
        "measured",
    )

    def __init__(
        self,
        table: CorrelationTable,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        capture: Callable[[InFlight], bool] | None = None,
        measure_produce: bool = False,
    ) -> None:
        self._table = table
        self._max = max_frame_bytes
        self._remaining = 0  # bytes of the current frame still to pass through
        # The start of a frame whose header is not complete yet (grown in place, so that a
        # header trickling in is not copied again on every read), and how far that header has
        # been parsed (so that it is not parsed again from its start: see ``HeaderProgress``).
        # ``_progress`` is about the frame the unread bytes start with (``_pending`` or
        # ``_held``), when there is one.
        self._pending = bytearray()
        self._progress: HeaderProgress | None = None
        self._held = b""  # whole frames not read yet (``stop_after_frame``)
        # ``capture(entry)`` True: a copy of that request frame (without size prefix) is
        # appended to ``captured`` as ``(entry, frame)`` once complete; it is forwarded
        # cut-through all the same. The caller empties ``captured``.
        self._capture = capture
        self._capturing: tuple[InFlight, list[bytes]] | None = None
        self.captured: list[tuple[InFlight, bytes]] = []
        # ``measure_produce``: Produce v3+ frames are walked as they pass (nothing copied) and
        # their entry's ``partitions`` set when they end; those entries are appended to
        # ``measured`` (the caller empties it).
        self._measure = measure_produce
        # (entry, the walk so far: None once it failed, partitions so far)
        self._measuring: tuple[InFlight, Walker | None, PartitionBytes] | None = None
        self.measured: list[InFlight] = []

    @property
    def buffered(self) -> int:
        return len(self._pending)

    @property
    def mid_frame(self) -> bool:
        """A frame has started but not ended (at end of input this means truncation)."""
        return self._remaining > 0 or bool(self._pending)

    @property
    def reading_header(self) -> bool:
        """A frame has started and its request header is not complete yet."""
        return bool(self._pending)

    def next_api_key(self, data: bytes) -> int | None:
        """The API key of the frame that ``feed(data)`` would start with, when the stream is
        between frames and that much of it is there (else None)."""
        if self._remaining:
            return None
        head = self._held or self._pending
        if len(head) < 6:
            head = head + data[: 6 - len(head)]
            if len(head) < 6:
                return None
        return int.from_bytes(head[4:6], "big", signed=True)

    def hold(self, data: bytes) -> None:
        """Keep ``data`` unread (and unforwarded) until the next ``feed``."""
        self._held += self._pending + data
        self._pending = bytearray()

    @property
    def measuring(self) -> InFlight | None:
        """The produce request whose frame is being measured but has not ended yet, if any."""
        return self._measuring[0] if self._measuring is not None else None

    @property
    def held(self) -> bool:
        """Bytes are held back after a frame (see ``feed``)."""
        return bool(self._held)

    def feed(self, data: bytes, stop_after_frame: bool = False,
             max_frames: int = 0) -> tuple[Buffer, list[InFlight]]:
        """Take client bytes; return the bytes to forward and the requests seen.

        With ``stop_after_frame`` the stream stops at the end of the first frame that completes
        and holds the rest (not parsed, not forwarded) until the next ``feed`` (which may be
        ``feed(b"")``): Kafka brokers read one request per connection at a time, and quota
        enforcement relies on that. ``max_frames`` (> 0) does the same after that many frames
        complete (a bound on requests in flight holds whatever one read brings).
        """
        if stop_after_frame:
            max_frames = 1
        events: list[InFlight] = []
        progress, self._progress = self._progress, None
        if self._held:
            data = self._held + data
            self._held = b""
        elif self._pending:  # (never both)
            # Grown in place and tried again where the last attempt stopped, so that a header
            # arriving in many small reads costs time linear in its length; it is only copied
            # out once the header is complete (or fails).
            pending, self._pending = self._pending, bytearray()
            pending += data
            n = len(pending)
            waiting = True
            if n >= 4:
                size = INT32.unpack_from(pending, 0)[0]
                _check_size(size, self._max)
                if 4 + size > n:
                    if progress is None:
                        progress = HeaderProgress()
                    waiting = self._read_header(pending, 0, 4 + size, n, progress) is None
                else:
                    waiting = False
            if waiting:
                self._pending, self._progress = pending, progress
                return _NOTHING, events
            data = bytes(pending)
        n = len(data)
        rem = self._remaining
        if rem >= n:
            self._remaining = rem - n
            if self._capturing is not None:
                self._capture_more(data, n)
            if self._measuring is not None:
                self._measure_more(data, n)
            return data, events
        pos = rem
        self._remaining = 0
        if rem and self._capturing is not None:
            self._capture_more(data, rem)
        if rem and self._measuring is not None:
            self._measure_more(data, rem)
        if rem and max_frames == 1:
            self._held = data[rem:]
            return memoryview(data)[:rem], events
        frames = 1 if rem else 0
        table = self._table
        max_frame = self._max
        while pos < n:
            if n - pos < 4:
                self._pending = bytearray(data[pos:])
                break
            size = INT32.unpack_from(data, pos)[0]
            _check_size(size, max_frame)
            end = pos + 4 + size
            if end > n and progress is None:
                progress = HeaderProgress()
            read = self._read_header(data, pos, end, n, progress)
            if read is None:
                self._pending = bytearray(memoryview(data)[pos:])
                self._progress = progress
                break
            progress = None  # (only ever about the first frame)
            header, expects_response, follower = read
            api_key = header.api_key
            limit = end if end < n else n
            entry = InFlight(
                api_key,
                header.api_version,
                header.correlation_id,
                header.client_id,
                size + 4,
                expects_response,
            )
            entry.follower = follower
            if expects_response:
                table.add(entry)
            events.append(entry)
            if self._capture is not None and self._capture(entry):
                if end > n:
                    self._capturing = (entry, [data[pos + 4 : n]])
                else:
                    self.captured.append((entry, data[pos + 4 : end]))
            if self._measure and api_key == _PRODUCE and header.api_version >= 3:
                parts: PartitionBytes = []
                self._measuring = (
                    entry, Walker(produce_request_walk(header.api_version, parts)), parts)
                self._measure_more(data, limit, pos + 4, end > n)
            if end > n:
                self._remaining = end - n
                pos = n
                break
            pos = end
            frames += 1
            if frames == max_frames and pos < n:
                self._held = data[pos:]
                break
        if pos == n:
            return data, events
        return memoryview(data)[:pos], events

    def _read_header(
        self,
        data: bytes | bytearray,
        pos: int,
        end: int,
        n: int,
        progress: HeaderProgress | None,
    ) -> tuple[RequestHeader, bool, bool] | None:
        """The header of the frame at ``pos`` (ending at ``end``) of the ``n`` bytes of
        ``data``: ``(header, expects_response, follower)``, or None while it has not all
        arrived. ``progress``: see ``HeaderProgress`` (required to make waiting linear)."""
        limit = end if end < n else n
        try:
            header = parse_request_header(data, pos + 4, limit, progress)
            api_key = header.api_key
            if not apis.is_known(api_key):
                raise UnknownApiKey(f"unknown api key {api_key}")
            if not apis.accepts_request_version(api_key, header.api_version):
                raise UnsupportedVersion(
                    f"{apis.api_name(api_key)} v{header.api_version} "
                    "is not offered by the proxy"
                )
            expects_response = True
            follower = False
            if api_key == _PRODUCE:
                acks = produce_acks(data, pos + 4 + header.size, limit, header.api_version)
                expects_response = acks != 0
            elif api_key == _FETCH and header.api_version < 15:
                # replica_id leads the body until v15 (then a tagged ReplicaState that
                # only followers send). Followers do not come through the proxy, so when
                # the field is not in this chunk the fetch counts as a consumer's.
                at = pos + 4 + header.size
                follower = at + 4 <= limit and INT32.unpack_from(data, at)[0] >= 0
        except (IndexError, ValueError, struct.error) as exc:
            if end <= n:
                raise MalformedFrame(f"request header does not parse: {exc}") from None
            if n - pos > _MAX_HEADER_BYTES:
                raise MalformedFrame(
                    f"request header longer than {_MAX_HEADER_BYTES} bytes"
                ) from None
            return None
        return header, expects_response, follower


    def _measure_more(self, data: bytes, upto: int, start: int = 0,
                      more: bool | None = None) -> None:
        """Bytes ``[start, upto)`` of ``data`` continue the produce frame being measured;
        ``more``: whether the frame goes on past them (default: bytes remain)."""
        assert self._measuring is not None
        entry, walker, parts = self._measuring
        if walker is not None and not walker.done:
            try:
                walker.feed(data, start, upto)
            except ValueError:  # measured no further: the frame passes all the same
                walker = None
                self._measuring = (entry, None, parts)
        if self._remaining if more is None else more:
            return
        self._measuring = None
        entry.partitions = parts if walker is not None and walker.done else None
        self.measured.append(entry)

    def _capture_more(self, data: bytes, upto: int) -> None:
        """The next ``upto`` bytes of ``data`` continue the frame being captured."""
        assert self._capturing is not None
        entry, parts = self._capturing
        parts.append(data[:upto])
        if not self._remaining:
            self._capturing = None
            self.captured.append((entry, b"".join(parts)))


Rewriter = Callable[[InFlight, Buffer], bytes | None]
TailRewriter = Callable[[InFlight, bytes], bytes]


def _same_tail(entry: InFlight, tail: bytes) -> bytes:
    return tail


class ResponseStarted(NamedTuple):
    """A response has started: ``entry`` is its request, with ``response_size`` set. Before
    the next ``next_event()``, the caller may call ``rewrite_whole()`` to have this frame held
    and handed to the rewriter whole (the proxy does, to set ``throttle_time_ms`` or
    ``preferred_read_replica``)."""

    entry: InFlight


class Forward(NamedTuple):
    """Everything received so far is handled: the byte segments to write to the client, in
    order, and the requests whose responses completed (in order). Then: ``receive_data``."""

    segments: list[Buffer]
    completed: list[InFlight]


class ResponseStream:
    """Broker -> client, in the manner of h11: ``receive_data(data)``, then ``next_event()``
    until it returns ``Forward``. With ``announce=True`` each response's start is an event
    (``ResponseStarted``) where the caller decides; without, only ``Forward`` is returned.
    ``feed(data)`` does both for a caller that decides nothing.

    What each (api_key, api_version) needs is the ``interests`` table's answer (by default the
    address rewriter's declaration, ``interests.ADDRESSES``):

    - ``response_frames``: the frame is held until complete and handed to
      ``rewriter(entry, frame)`` (without its size prefix; bytes, or a memoryview into the
      received data: copy it to keep it), which returns the new frame or ``None`` to forward it
      unchanged, without a copy.
    - ``response_tails``: the frame streams through while ``incremental.Walker`` follows it,
      and only its top-level tagged fields (KIP-951 ``node_endpoints``) are held back and
      replaced by ``tail_rewriter(entry, tail)``, which must return exactly ``len(tail)`` bytes.
    - ``fetch_partitions``: every Fetch response is walked as it passes (streamed, or whole
      when it is rewritten anyway) and its entry's ``partitions`` set to ``[(topic, partition,
      bytes of record batches)]`` (``None`` where the response does not parse: it then passes
      unchanged all the same). The bytes still go through cut-through.
    - anything else passes through as the same bytes, cut-through.
    """

    __slots__ = (
        "_announce",
        "_collect",
        "_collect_entry",
        "_collect_need",
        "_current",
        "_data",
        "_done",
        "_end",
        "_frames",
        "_hold_tail",
        "_max",
        "_measure",
        "_mv",
        "_out",
        "_pending",
        "_pos",
        "_receiving",
        "_remaining",
        "_rewriter",
        "_run_start",
        "_started",
        "_table",
        "_tail",
        "_tail_rewriter",
        "_tails",
        "_walker",
        "_whole",
    )

    def __init__(
        self,
        table: CorrelationTable,
        rewriter: Rewriter,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        tail_rewriter: TailRewriter = _same_tail,
        interests: InterestTable = ADDRESSES,
        announce: bool = False,
    ) -> None:
        self._table = table
        self._rewriter = rewriter
        self._tail_rewriter = tail_rewriter
        self._frames = interests.response_frames
        self._tails = interests.response_tails
        self._measure = interests.fetch_partitions
        self._announce = announce
        self._walker: Walker | None = None
        self._hold_tail = False  # the streamed frame's top-level tagged fields are rewritten
        self._tail: list[bytes] = []
        self._max = max_frame_bytes
        self._remaining = 0
        self._current: InFlight | None = None  # pass-through frame in progress
        self._pending = b""
        self._collect: list[Buffer] = []
        self._collect_need = 0
        self._collect_entry: InFlight | None = None
        # The data being handled between ``receive_data`` and the ``Forward`` that ends it:
        # where the next frame starts, the start of the current run of pass-through bytes, the
        # end of the frame whose start was announced, and what is forwarded so far.
        self._data = b""
        self._mv = _NOTHING
        self._pos = 0
        self._run_start = 0
        self._end = 0
        self._out: list[Buffer] = []
        self._done: list[InFlight] = []
        self._started: InFlight | None = None  # announced, not decided yet
        self._receiving = False  # between receive_data and the Forward that ends its events
        self._whole = False

    @property
    def buffered(self) -> int:
        return len(self._pending) + sum(len(c) for c in self._collect)

    @property
    def in_progress(self) -> InFlight | None:
        """The request whose response has started but not completed, if any."""
        return self._current or self._collect_entry or self._started

    def feed(self, data: bytes) -> Forward:
        """``receive_data(data)`` and every event up to ``Forward``, deciding nothing."""
        self.receive_data(data)
        event = self.next_event()
        while event.__class__ is ResponseStarted:
            event = self.next_event()
        assert isinstance(event, Forward)
        return event

    def rewrite_whole(self) -> None:
        """The response just announced is held and handed to the rewriter whole."""
        if self._started is None:
            raise RuntimeError("rewrite_whole() answers a ResponseStarted event")
        self._whole = True

    def receive_data(self, data: bytes) -> None:
        """Take the next bytes from the broker; what they hold comes from ``next_event()``."""
        if self._receiving:
            raise RuntimeError("receive_data() before next_event() returned Forward")
        self._receiving = True
        out = self._out
        if self._pending:
            data = self._pending + data
            self._pending = b""
        n = len(data)
        mv = memoryview(data)
        self._data = data
        self._mv = mv
        self._pos = self._run_start = 0
        if self._collect_need:
            # Continue a frame being collected for rewriting.
            take = min(self._collect_need, n)
            self._collect.append(mv[:take])
            self._collect_need -= take
            if not self._collect_need:
                entry = self._collect_entry
                assert entry is not None
                frame = b"".join(self._collect)
                self._collect = []
                self._collect_entry = None
                if self._measure and entry.api_key == _FETCH:
                    _measure_whole(entry, frame)
                new = self._rewriter(entry, frame)
                out.append(INT32.pack(len(frame if new is None else new)))
                out.append(frame if new is None else new)
                self._done.append(entry)
            self._pos = self._run_start = take
        elif self._remaining and self._walker is not None:
            # Continue a streamed frame.
            take = min(self._remaining, n)
            self._stream(mv, 0, take, out)
            self._remaining -= take
            if not self._remaining:
                self._done.append(self._finish_stream(out))
            self._pos = self._run_start = take
        elif self._remaining:
            # Continue a pass-through frame: its bytes start the run.
            rem = self._remaining
            if rem > n:
                self._remaining = rem - n
                self._pos = n
            else:
                self._remaining = 0
                current = self._current
                assert current is not None
                self._done.append(current)
                self._current = None
                self._pos = rem

    def next_event(self) -> ResponseStarted | Forward:
        started = self._started
        if started is not None:
            self._started = None
            whole, self._whole = self._whole, False
            if not self._dispatch(started, whole):
                return self._forward()
        data = self._data
        n = len(data)
        pos = self._pos
        table = self._table
        max_frame = self._max
        while pos < n:
            if n - pos < 8:
                if n - pos >= 4:  # the size alone can already be wrong
                    _check_size(INT32.unpack_from(data, pos)[0], max_frame)
                self._pending = data[pos:]
                self._pos = n
                return self._forward(pos)
            size = INT32.unpack_from(data, pos)[0]
            _check_size(size, max_frame)
            if size < 4:
                raise MalformedFrame(f"response frame of {size} bytes has no correlation id")
            entry = table.pop(INT32.unpack_from(data, pos + 4)[0])
            entry.response_size = size + 4
            self._pos = pos
            self._end = pos + 4 + size
            if self._announce:
                self._started = entry
                return ResponseStarted(entry)
            if not self._dispatch(entry, False):
                break
            pos = self._pos
        return self._forward()

    def _forward(self, upto: int | None = None) -> Forward:
        """The ``Forward`` that ends the received data: the pass-through run up to ``upto``
        (default: where handling stopped) joins the segments."""
        data = self._data
        end = self._pos if upto is None else upto
        run_start = self._run_start
        out = self._out
        if end > run_start:
            out.append(data if run_start == 0 and end == len(data) else self._mv[run_start:end])
        event = Forward(out, self._done)
        self._receiving = False
        self._out = []
        self._done = []
        self._data = b""
        self._mv = _NOTHING
        self._pos = self._run_start = 0
        return event

    def _dispatch(self, entry: InFlight, whole: bool) -> bool:
        """Send the frame at ``[_pos, _end)`` its way: streamed, held whole, or passed
        through. True when it ended within the data (``_pos`` is then its end), False when
        it continues in later data (``_pos`` is then the end of the data)."""
        pos, end, mv = self._pos, self._end, self._mv
        n = len(mv)
        out = self._out
        key = (entry.api_key, entry.api_version)
        hold_tail = key in self._tails
        if not whole and (hold_tail or (self._measure and entry.api_key == _FETCH)):
            # The size prefix goes now; the body streams while the walker follows it.
            out.append(mv[self._run_start : pos + 4])
            parts: PartitionBytes | None = [] if self._measure else None
            entry.partitions = parts
            self._walker = Walker(fetch_response_walk(entry.api_version, parts))
            self._hold_tail = hold_tail
            self._current = entry
            self._stream(mv, pos + 4, min(end, n), out)
            if end <= n:
                self._done.append(self._finish_stream(out))
                self._pos = self._run_start = end
                return True
            self._remaining = end - n
            self._pos = self._run_start = n
            return False
        if whole or key in self._frames:
            if end <= n:
                if self._measure and entry.api_key == _FETCH:
                    _measure_whole(entry, mv[pos + 4 : end])
                new = self._rewriter(entry, mv[pos + 4 : end])
                self._done.append(entry)
                if new is not None:  # else the frame joins the pass-through run
                    if pos > self._run_start:
                        out.append(mv[self._run_start : pos])
                    out.append(INT32.pack(len(new)) + new)
                    self._run_start = end
                self._pos = end
                return True
            if pos > self._run_start:
                out.append(mv[self._run_start : pos])
            self._collect = [mv[pos + 4 :]]
            self._collect_need = end - n
            self._collect_entry = entry
            self._pos = self._run_start = n
            return False
        if end > n:
            self._remaining = end - n
            self._current = entry
            self._pos = n
            return False
        self._done.append(entry)
        self._pos = end
        return True

    def _stream(self, mv: memoryview, start: int, end: int, out: list[Buffer]) -> None:
        """Bytes ``[start, end)`` of a streamed frame: forward what the walker has passed,
        hold back the rest (the top-level tagged fields)."""
        walker = self._walker
        assert walker is not None
        if not walker.done:
            try:
                upto = walker.feed(mv, start, end)
            except ValueError as exc:
                if self._hold_tail:
                    raise MalformedFrame(f"fetch response does not parse: {exc}") from None
                # Only measuring: the rest passes as it is, unmeasured.
                assert self._current is not None
                self._current.partitions = None
                walker.done = True
                upto = end
            if upto > start:
                out.append(mv[start:upto])
            start = upto
        if start < end:
            if self._hold_tail:
                self._tail.append(bytes(mv[start:end]))
            else:
                out.append(mv[start:end])

    def _finish_stream(self, out: list[Buffer]) -> InFlight:
        entry, walker = self._current, self._walker
        assert entry is not None and walker is not None
        self._walker = None
        self._current = None
        if not self._hold_tail:
            if not walker.done:  # shorter than its structure says: not measured
                entry.partitions = None
            return entry
        tail = b"".join(self._tail)
        self._tail = []
        if not walker.done:
            raise MalformedFrame("fetch response ended before its top-level tagged fields")
        new = self._tail_rewriter(entry, tail)
        if len(new) != len(tail):
            raise MalformedFrame("tagged fields rewritten to a different length")
        out.append(new)
        return entry


def _measure_whole(entry: InFlight, frame: Buffer) -> None:
    """``entry.partitions`` of a whole Fetch response frame (without size prefix)."""
    parts: PartitionBytes = []
    walker = Walker(fetch_response_walk(entry.api_version, parts))
    try:
        walker.feed(frame, 0, len(frame))
    except ValueError:
        walker.done = False
    entry.partitions = parts if walker.done else None
