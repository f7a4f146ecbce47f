"""Broker -> client framing, cut-through (see ``protocol.framing``), with events in the
manner of h11: each response's start is a point where the caller decides (``ResponseStarted``),
and each batch of received data ends with what to write (``Forward``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, cast

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES, NOTHING, Buffer, check_size
from kafka_quota_proxy.protocol.incremental import (
    PartitionBytes,
    RecordsTail,
    Walker,
    fetch_response_walk,
    fetch_tail,
)
from kafka_quota_proxy.protocol.interests import ADDRESSES, InterestTable
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.skim import skim_fetch_prefix

_FETCH = int(apis.ApiKey.FETCH)
_new_tuple = tuple.__new__
_PASS, _WHOLE, _TAIL = 0, 1, 2  # how a response goes: through, held whole, tail rewritten


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
        "_answer",
        "_collect",
        "_collect_entry",
        "_collect_need",
        "_current",
        "_data",
        "_done",
        "_end",
        "_hold_tail",
        "_max",
        "_measure",
        "_modes",
        "_mv",
        "_out",
        "_pending",
        "_pos",
        "_ready",
        "_receiving",
        "_remaining",
        "_rewriter",
        "_run_start",
        "_started",
        "_table",
        "_tail",
        "_tail_rewriter",
        "_walker",
        "_whole",
        "answers_held",
    )

    def __init__(
        self,
        table: CorrelationTable,
        rewriter: Rewriter,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        tail_rewriter: TailRewriter = _same_tail,
        interests: InterestTable = ADDRESSES,
        announce: bool = False,
        answer: Callable[[InFlight], bytes] | None = None,
    ) -> None:
        self._table = table
        # The frame (without size prefix) of a request the proxy answers itself (``local``)
        self._answer = answer
        # While true, an answer of the proxy's next in order waits, and the broker's responses
        # behind it with it (an answer still being made)
        self.answers_held = False
        self._rewriter = rewriter
        self._tail_rewriter = tail_rewriter
        # (api_key, api_version) -> how its responses go (absent: passed through)
        self._modes = dict.fromkeys(interests.response_frames, _WHOLE)
        self._modes.update(dict.fromkeys(interests.response_tails, _TAIL))
        self._measure = interests.fetch_partitions
        self._announce = announce
        self._walker: Walker | RecordsTail | None = None
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
        self._mv = NOTHING
        self._pos = 0
        self._run_start = 0
        self._end = 0
        self._out: list[Buffer] = []
        self._done: list[InFlight] = []
        self._started: InFlight | None = None  # announced, not decided yet
        self._receiving = False  # between receive_data and the Forward that ends its events
        self._ready: Forward | None = None  # the Forward of data handled in receive_data
        self._whole = False

    @property
    def buffered(self) -> int:
        return len(self._pending) + sum(len(c) for c in self._collect)

    @property
    def in_progress(self) -> InFlight | None:
        """The request whose response has started but not completed, if any."""
        return self._current or self._collect_entry or self._started

    def passable(self) -> int:
        """How many of the broker's next bytes may go to the client without passing through
        ``receive_data``: the body of the response under way that nothing reads (a Fetch
        response's record batches its walk skips, or a passed-through response's body),
        short of its last byte, which ``receive_data`` reads as usual (so a response always
        ends there). 0 between responses, or while one is held whole or its tail is."""
        room = self._remaining - 1
        if (room <= 0 or self._receiving or self._pending or self._collect_need
                or self._started is not None):
            return 0
        walker = self._walker
        if walker is not None:
            if walker.done:
                return 0 if self._hold_tail else room
            return min(room, walker.skippable)
        return room

    def passed(self, n: int) -> None:
        """``n`` bytes (at most ``passable()``) of the response under way went to the
        client without passing through ``receive_data``."""
        self._remaining -= n
        walker = self._walker
        if walker is not None and not walker.done:
            walker.passed(n)

    def feed(self, data: bytes,
             rewrite_whole: Callable[[InFlight], bool] | None = None) -> Forward:
        """``receive_data(data)`` and every event up to ``Forward``; each ``ResponseStarted``
        is answered by ``rewrite_whole(entry)`` (default: no). For callers off the hot path;
        the proxy's connection runs the same loop inline."""
        self.receive_data(data)
        event = self.next_event()
        while type(event) is ResponseStarted:
            if rewrite_whole is not None and rewrite_whole(event.entry):
                self.rewrite_whole()
            event = self.next_event()
        return cast(Forward, event)

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
        if self._pending:
            data = self._pending + data
            self._pending = b""
        n = len(data)
        rem = self._remaining
        if rem > n and self._walker is None:
            # The whole of it continues a pass-through frame (the common case: a large
            # response read in many pieces).
            self._remaining = rem - n
            self._ready = Forward([data], [])
            return
        out = self._out
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
        elif rem:
            # A pass-through frame ends in it: its last bytes start the run.
            self._remaining = 0
            current = self._current
            assert current is not None
            self._done.append(current)
            self._current = None
            self._pos = rem

    def next_event(self) -> ResponseStarted | Forward:
        ready = self._ready
        if ready is not None:
            self._ready = None
            self._receiving = False
            return ready
        started = self._started
        if started is not None:
            self._started = None
            whole, self._whole = self._whole, False
            if started.local:
                self._answer_locally(started)
            elif not self._dispatch(started, whole):
                return self._forward()
        data = self._data
        n = len(data)
        pos = self._pos
        table = self._table
        max_frame = self._max
        while True:
            if table.local and self._between_responses():
                # The proxy's own answers next in order go before the broker's next response
                head = table.first()
                if head is not None and head.local:
                    if self.answers_held:  # it waits, and what the broker sent after it
                        if pos < n:
                            self._pending = data[pos:]
                        self._pos = n
                        return self._forward(pos)
                    table.pop(head.correlation_id)
                    table.local -= 1
                    self._pos = pos
                    if self._announce:
                        head.response_size = len(head.answer or b"") + 4
                        self._started = head
                        return _new_tuple(ResponseStarted, (head,))
                    self._answer_locally(head)
                    continue
            if pos >= n:
                break
            if n - pos < 8:
                if n - pos >= 4:  # the size alone can already be wrong
                    check_size(INT32.unpack_from(data, pos)[0], max_frame)
                self._pending = data[pos:]
                self._pos = n
                return self._forward(pos)
            size = INT32.unpack_from(data, pos)[0]
            check_size(size, max_frame)
            if size < 4:
                raise MalformedFrame(f"response frame of {size} bytes has no correlation id")
            entry = table.pop(INT32.unpack_from(data, pos + 4)[0])
            entry.response_size = size + 4
            self._pos = pos
            self._end = pos + 4 + size
            if self._announce:
                self._started = entry
                return _new_tuple(ResponseStarted, (entry,))  # (NamedTuple.__new__ is slow)
            if not self._dispatch(entry, False):
                break
            pos = self._pos
        return self._forward()

    def _between_responses(self) -> bool:
        """No response of the broker's is under way (one could go before the next)."""
        return (self._current is None and self._collect_entry is None
                and not self._remaining)

    def _answer_locally(self, entry: InFlight) -> None:
        """The proxy's answer to ``entry`` goes here, after the pass-through run before it."""
        assert self._answer is not None, "a local answer with no ``answer`` to make it"
        pos = self._pos
        out = self._out
        if pos > self._run_start:
            out.append(self._mv[self._run_start : pos])
        frame = self._answer(entry)
        entry.response_size = len(frame) + 4
        out.append(INT32.pack(len(frame)) + frame)
        self._done.append(entry)
        self._run_start = pos

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
        self._mv = NOTHING
        self._pos = self._run_start = 0
        return event

    def _dispatch(self, entry: InFlight, whole: bool) -> bool:
        """Send the frame at ``[_pos, _end)`` its way: streamed, held whole, or passed
        through. True when it ended within the data (``_pos`` is then its end), False when
        it continues in later data (``_pos`` is then the end of the data)."""
        pos, end, mv = self._pos, self._end, self._mv
        n = len(mv)
        mode = _WHOLE if whole else self._modes.get((entry.api_key, entry.api_version), _PASS)
        if mode == _PASS and not (self._measure and entry.api_key == _FETCH):
            if end > n:
                self._remaining = end - n
                self._current = entry
                self._pos = n
                return False
            self._done.append(entry)
            self._pos = end
            return True
        out = self._out
        hold_tail = mode == _TAIL
        if mode != _WHOLE:
            # The size prefix goes now; the body streams while the walker follows it: from
            # its last partition's records on when all before them is in (skimmed), else
            # from its start.
            avail = end if end < n else n
            prefix = skim_fetch_prefix(mv, pos + 4, avail, entry.api_version)
            if prefix is not None:
                start = prefix.records_at
                entry.partitions = prefix.parts if self._measure else None
                self._walker = fetch_tail(prefix.records, entry.api_version >= 12)
            else:
                start = pos + 4
                parts: PartitionBytes | None = [] if self._measure else None
                entry.partitions = parts
                self._walker = Walker(fetch_response_walk(entry.api_version, parts))
            out.append(mv[self._run_start : start])
            self._hold_tail = hold_tail
            self._current = entry
            self._stream(mv, start, avail, out)
            if end <= n:
                self._done.append(self._finish_stream(out))
                self._pos = self._run_start = end
                return True
            self._remaining = end - n
            self._pos = self._run_start = n
            return False
        # Held whole for the rewriter.
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
