"""Client -> broker framing, cut-through (see ``protocol.framing``): request headers read,
requests entered in the correlation table, Produce frames measured and consumer frames copied
where the interest table asks, everything else forwarded as the same bytes."""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import (
    FrameTooLarge,
    MalformedFrame,
    UnknownApiKey,
    UnsupportedVersion,
)
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES, NOTHING, Buffer, check_size
from kafka_quota_proxy.protocol.headers import (
    HeaderProgress,
    RequestHeader,
    parse_request_header,
    produce_acks,
)
from kafka_quota_proxy.protocol.incremental import (
    PartitionBytes,
    RecordsTail,
    Walker,
    produce_request_walk,
    produce_tail,
)
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.skim import skim_produce_prefix, skim_produce_request
from kafka_quota_proxy.protocol.topic_guard import SPOILED

# The most a legal request header (plus Produce's transactional_id and acks) can take: two
# strings of at most 32767 bytes, fixed fields and header tagged fields. Beyond this an
# incomplete header is refused whatever the chunking.
_MAX_HEADER_BYTES = 2 * 32767 + 4096
# The largest request the proxy reads whole to answer itself (client quota admin requests)
WHOLE_FRAME_MAX = 1 << 20

_PRODUCE = int(apis.ApiKey.PRODUCE)
_SPOILED = SPOILED
_FETCH = int(apis.ApiKey.FETCH)


class RequestRead(NamedTuple):
    """A request's header was read: it is in the correlation table (if it expects a
    response), and its frame goes on to the broker unless the caller stops it."""

    entry: InFlight


class FrameCopied(NamedTuple):
    """A request frame (without size prefix) the interest table asked to see whole, complete.
    ``at``: where it starts (after its size prefix) in the bytes this ``feed`` returned, -1
    when it began in an earlier ``feed`` (its first bytes went with those)."""

    entry: InFlight
    frame: bytes
    at: int


class ProduceMeasured(NamedTuple):
    """A Produce frame walked as it passed has ended (``entry.partitions`` set, or None when
    the walk failed)."""

    entry: InFlight


class ProduceWatched(NamedTuple):
    """A Produce frame's watch refused a topic (the frame ended) or stopped parsing. ``at``:
    as ``FrameCopied``'s."""

    entry: InFlight
    watch: Any
    at: int


class ClientIdChanged(NamedTuple):
    """The read stopped before a frame of another client-id (held, not forwarded): the caller
    judges that client-id's limits, then ``accept_client_id`` and reads on."""

    client_id: str


RequestEvent = RequestRead | FrameCopied | ProduceMeasured | ProduceWatched | ClientIdChanged


class RequestStream:
    """Client -> broker. ``feed`` returns the bytes to forward now and the requests whose
    headers were read; requests that expect a response are entered in the correlation table.
    """

    __slots__ = (
        "_answered_keys",
        "_copy_frame",
        "_copying",
        "_events",
        "_gated",
        "_held",
        "_max",
        "_measure",
        "_measuring",
        "_pending",
        "_progress",
        "_remaining",
        "_reported",
        "_table",
        "_watch",
        "_watch_start",
        "_watching",
        "_whole",
        "_whole_until",
        "client_id",
    )

    def __init__(
        self,
        table: CorrelationTable,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        copy_frame: Callable[[InFlight], bool] | None = None,
        measure_produce: bool = False,
        whole: Callable[[int, int], bool] | None = None,
        watch_produce: Callable[[int], Any] | None = None,
        answered_keys: Collection[int] = frozenset(apis.ANSWERED_BY_PROXY),
    ) -> None:
        self._table = table
        # ``whole(api_key, api_version)`` True: the frame is read whole before any of it is
        # forwarded (requests the proxy answers itself, whose frames it replaces), at most
        # ``WHOLE_FRAME_MAX`` bytes; ``_whole_until``: the length such a frame in ``_pending``
        # waits for.
        self._whole = whole
        self._whole_until = 0
        # ``answered_keys``: the APIs the proxy answers itself (``InterestTable.answered_keys``):
        # a frame of one that ``whole`` asks for is read whole above ``WHOLE_FRAME_MAX`` too,
        # which refuses it (``FrameTooLarge``) rather than let it through cut-through
        self._answered_keys = answered_keys
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
        # What one ``feed`` saw, in order (``RequestEvent``): the list it returns.
        self._events: list[RequestEvent] = []
        # ``copy_frame(entry)`` True: a copy of that request frame (without size prefix) is an
        # event once complete (``FrameCopied``); it is forwarded cut-through all the same.
        self._copy_frame = copy_frame
        self._copying: tuple[InFlight, list[bytes]] | None = None
        # ``measure_produce``: Produce v3+ frames are walked as they pass (nothing copied) and
        # their entry's ``partitions`` set when they end (``ProduceMeasured``).
        self._measure = measure_produce
        # (entry, the walk so far: None once it failed, partitions so far)
        self._measuring: tuple[InFlight, Walker | RecordsTail | None, PartitionBytes] | None = None
        # ``watch_produce(api_version)``: a watch (``protocol.topic_guard.ProduceTopics``) that
        # follows each Produce frame as it passes; the bytes it asks to spoil are changed
        # before they are forwarded. ``ProduceWatched`` when the frame ended naming a topic
        # the watch refused, or as soon as it stops parsing (the caller must not let the rest
        # of a frame whose watch failed go upstream); ``_watch_start``: where the frame being
        # watched starts in the bytes this ``feed`` returns (-1: an earlier ``feed``'s).
        self._watch = watch_produce
        self._watching: tuple[InFlight, Any] | None = None
        self._reported: list[Any] = []  # the watches reported by this ``feed``
        self._watch_start = -1
        # Every request is gated by its own header: frames are read only while their
        # client-id (null read as "") is ``client_id``; a read stops before a frame of another
        # (held, not forwarded) and says so (``ClientIdChanged``), for the caller to judge
        # that client-id's limits and ``accept_client_id`` before reading it. None until the
        # caller has seen a first frame: a connection's very first frame stops a read too.
        # Off unless ``gate_client_ids`` (the stream alone reads every frame).
        self._gated = False
        self.client_id: str | None = None

    def gate_client_ids(self) -> None:
        """Read each frame only under its own client-id (``client_id``, ``ClientIdChanged``)."""
        self._gated = True

    def accept_client_id(self, client_id: str) -> None:
        """Frames of ``client_id`` are read from now on (after ``ClientIdChanged``)."""
        self.client_id = client_id

    @property
    def table(self) -> CorrelationTable:
        """The correlation table the requests are entered in."""
        return self._table

    @property
    def buffered(self) -> int:
        return len(self._pending)

    @property
    def unread(self) -> int:
        """Bytes taken from the client and not forwarded yet: whole frames held back (``hold``,
        ``stop_after_frame``) and the start of a frame whose header is not complete."""
        return len(self._held) + len(self._pending)

    @property
    def mid_frame(self) -> bool:
        """A frame has started but not ended (at end of input this means truncation)."""
        return self._remaining > 0 or bool(self._pending)

    @property
    def frame_remaining(self) -> int:
        """How much of the newest request's frame has not passed yet (0: it has ended). A
        connection closed before it ends leaves the broker a truncated frame, which it never
        processes."""
        return self._remaining

    def inside_frame(self, n: int) -> bool:
        """The next ``n`` bytes all continue the body of the frame under way, which goes on
        past them: reading them decides nothing (no header, no frame ends)."""
        return self._remaining > n

    def passable(self) -> int:
        """How many of the next client bytes may go upstream without passing through
        ``feed``: the body of the frame under way that no follower needs to see (the record
        batches a Produce's walks skip, or an unfollowed frame's body), short of the frame's
        last byte, which ``feed`` reads as usual (so a frame always ends there). 0 while a
        frame is copied or bytes are held or pending."""
        room = self._remaining - 1
        if room <= 0 or self._copying is not None or self._pending or self._held:
            return 0
        measuring = self._measuring
        if measuring is not None and measuring[1] is not None and not measuring[1].done:
            room = min(room, measuring[1].skippable)
        watching = self._watching
        if watching is not None:
            watch = watching[1]
            if watch.failed:
                return 0
            if not watch.done:
                room = min(room, watch.walker.skippable)
        return room

    def passed(self, n: int) -> None:
        """``n`` bytes (at most ``passable()``) of the frame under way went upstream without
        passing through ``feed``."""
        self._remaining -= n
        measuring = self._measuring
        if measuring is not None and measuring[1] is not None and not measuring[1].done:
            measuring[1].passed(n)
        watching = self._watching
        if watching is not None and not watching[1].done:
            watching[1].walker.passed(n)

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
        self._whole_until = 0

    def watch(self, watch_produce: Callable[[int], Any]) -> None:
        """Follow Produce frames with ``watch_produce`` (``ProduceWatched``) from now on."""
        self._watch = watch_produce

    @property
    def measuring(self) -> InFlight | None:
        """The produce request whose frame is being measured but has not ended yet, if any."""
        return self._measuring[0] if self._measuring is not None else None

    @property
    def held(self) -> bool:
        """Bytes are held back after a frame (see ``feed``)."""
        return bool(self._held)

    def feed(self, data: bytes, stop_after_frame: bool = False,
             max_frames: int = 0) -> tuple[Buffer | bytearray, list[RequestEvent]]:
        """Take client bytes; return the bytes to forward and what was seen, in order (see
        ``_feed`` and ``RequestEvent``), with the bytes a Produce watch spoils changed."""
        forward: Buffer | bytearray
        forward, events = self._feed(data, stop_after_frame, max_frames)
        watching = self._watching
        watched = self._reported
        if watching is not None or watched:
            spoil = [] if watching is None else watching[1].spoil
            for watch in watched:
                spoil += watch.spoil
                watch.spoil = []
            if spoil:
                out = bytearray(forward)
                for at in spoil:
                    out[at] = _SPOILED
                spoil.clear()
                forward = out
        return forward, events

    def _feed(self, data: bytes, stop_after_frame: bool = False,
              max_frames: int = 0) -> tuple[Buffer, list[RequestEvent]]:
        """Take client bytes; return the bytes to forward and the requests seen.

        With ``stop_after_frame`` the stream stops at the end of the first frame that completes
        and holds the rest (not parsed, not forwarded) until the next ``feed`` (which may be
        ``feed(b"")``): Kafka brokers read one request per connection at a time, and quota
        enforcement relies on that. ``max_frames`` (> 0) does the same after that many frames
        complete (a bound on requests in flight holds whatever one read brings).
        """
        if stop_after_frame:
            max_frames = 1
        events: list[RequestEvent] = []
        self._events = events
        self._watch_start = -1  # (a frame watched since an earlier feed began there)
        if self._reported:
            self._reported = []
        progress, self._progress = self._progress, None
        if self._held:
            data = self._held + data
            self._held = b""
        elif self._pending:  # (never both)
            resumed = self._with_pending(data, progress)
            if resumed is None:  # (the header, or the frame read whole, is not all there yet)
                return NOTHING, events
            data, progress = resumed
        n = len(data)
        rem = self._remaining
        if rem >= n:
            self._remaining = rem - n
            self._go_on(data, n)
            return data, events
        pos = rem
        self._remaining = 0
        if rem:
            self._go_on(data, rem)
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
            check_size(size, max_frame)
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
            if self._gated and (header.client_id or "") != self.client_id:
                # another client-id's frame: its own limits first
                events.append(ClientIdChanged(header.client_id or ""))
                if end > n:  # still arriving: it stays the frame under way (``mid_frame``)
                    self._pending = bytearray(memoryview(data)[pos:])
                else:
                    self._held = data[pos:]
                break
            api_key = header.api_key
            if (end > n and self._whole is not None
                    and self._whole(api_key, header.api_version)
                    and (size <= WHOLE_FRAME_MAX or api_key in self._answered_keys)):
                # (a larger frame of an API the broker answers goes through cut-through, its
                # filters told it cannot be patched; one the proxy answers must not reach it)
                if size > WHOLE_FRAME_MAX:
                    raise FrameTooLarge(
                        f"{apis.api_name(api_key)} request of {size} bytes: the proxy answers "
                        f"it itself and reads at most {WHOLE_FRAME_MAX}")
                self._pending = bytearray(memoryview(data)[pos:])
                self._whole_until = end - pos
                break
            entry = InFlight(api_key, header.api_version, header.correlation_id,
                             header.client_id, size + 4, expects_response)
            entry.follower = follower
            if expects_response:
                table.add(entry)
            events.append(RequestRead(entry))
            if self._copy_frame is not None or self._measure or self._watch is not None:
                self._follow(entry, data, pos, end, n)
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

    def _go_on(self, data: bytes, upto: int) -> None:
        """The first ``upto`` bytes of ``data`` continue the frame under way (``_remaining``
        already counts them): its copy, measure and watch go on."""
        if self._copying is not None:
            self._copy_more(data, upto)
        if self._measuring is not None:
            self._measure_more(data, upto)
        if self._watching is not None:
            self._watch_more(data, upto)

    def _follow(self, entry: InFlight, data: bytes, pos: int, end: int, n: int) -> None:
        """The frame of ``entry`` starts at ``pos`` of the ``n`` bytes of ``data`` (and ends at
        ``end``, maybe past them): copied (``FrameCopied``), measured (``ProduceMeasured``)
        and watched (``ProduceWatched``) as its filters asked, from its first bytes on."""
        api_key, api_version = entry.api_key, entry.api_version
        more = end > n
        limit = n if more else end
        if self._copy_frame is not None and self._copy_frame(entry):
            if more:
                self._copying = (entry, [data[pos + 4 : n]])
            else:
                self._events.append(FrameCopied(entry, data[pos + 4 : end], pos + 4))
        if api_key != _PRODUCE:
            return
        measure = self._measure and api_version >= 3
        skim = prefix = None
        if measure or self._watch is not None:
            # one straight pass for every follower (None: the walks decide): read whole, or
            # all but its last records (a large request's first read), then only its tail
            # is walked
            if not more:
                skim = skim_produce_request(data, pos + 4, end, api_version)
            else:
                prefix = skim_produce_prefix(data, pos + 4, n, end, api_version)
                if prefix is not None:
                    skim = prefix.skim
        if measure:
            if skim is not None:
                partitions: PartitionBytes = [
                    (name if api_version >= 13 else name.decode("utf-8", "replace"), index,
                     size if size > 0 else 0)
                    for name, _, parts in skim.topics for index, size in parts]
                if prefix is None:
                    entry.partitions = partitions
                    self._events.append(ProduceMeasured(entry))
                else:  # (measured, as a walk, once the frame has passed whole)
                    tail = produce_tail(prefix.records, api_version >= 9)
                    self._measuring = (entry, tail, partitions)
                    self._measure_more(data, limit, prefix.records_at, more)
            else:
                parts: PartitionBytes = []
                self._measuring = (entry, Walker(produce_request_walk(api_version, parts)),
                                   parts)
                self._measure_more(data, limit, pos + 4, more)
        if self._watch is not None:
            watch = self._watch(api_version)
            self._watch_start = pos + 4
            if prefix is not None:
                watch.skimmed(prefix.skim, produce_tail(prefix.records, api_version >= 9))
                self._watching = (entry, watch)
                self._watch_more(data, limit, prefix.records_at, more)
            elif skim is not None:
                watch.skimmed(skim)
                if watch.refused or watch.failed:
                    self._watched(entry, watch)
            else:
                self._watching = (entry, watch)
                self._watch_more(data, limit, pos + 4, more)

    def _with_pending(self, data: bytes, progress: HeaderProgress | None
                      ) -> tuple[bytes, HeaderProgress | None] | None:
        """``data`` after the start of a frame kept in ``_pending``: the bytes to read on with
        (and the header's progress), or None while its header (or, for a frame read whole,
        the frame) is still incomplete, kept in ``_pending`` again.

        Grown in place and tried again where the last attempt stopped, so that a header
        arriving in many small reads costs time linear in its length; it is only copied out
        once the header is complete (or fails)."""
        pending, self._pending = self._pending, bytearray()
        pending += data
        n = len(pending)
        if self._whole_until:  # a frame read whole: waits until it is
            if n < self._whole_until:
                self._pending = pending
                return None
            self._whole_until = 0
            progress = None
        if n >= 4:
            size = INT32.unpack_from(pending, 0)[0]
            check_size(size, self._max)
            if 4 + size <= n:
                return bytes(pending), progress
            if progress is None:
                progress = HeaderProgress()
            if self._read_header(pending, 0, 4 + size, n, progress) is not None:
                return bytes(pending), progress
        self._pending, self._progress = pending, progress
        return None

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
        self._events.append(ProduceMeasured(entry))

    def _watch_more(self, data: bytes, upto: int, start: int = 0,
                    more: bool | None = None) -> None:
        """Bytes ``[start, upto)`` of ``data`` continue the Produce frame being watched."""
        assert self._watching is not None
        entry, watch = self._watching
        watch.feed(data, start, upto)
        if self._remaining if more is None else more:
            if watch.failed:
                self._watching = None
                self._watched(entry, watch)
            return
        self._watching = None
        if watch.refused or watch.failed or not watch.done:
            self._watched(entry, watch)

    def _watched(self, entry: InFlight, watch: Any) -> None:
        self._events.append(ProduceWatched(entry, watch, self._watch_start))
        self._reported.append(watch)

    def _copy_more(self, data: bytes, upto: int) -> None:
        """The next ``upto`` bytes of ``data`` continue the frame being copied."""
        assert self._copying is not None
        entry, parts = self._copying
        parts.append(data[:upto])
        if not self._remaining:
            self._copying = None
            self._events.append(FrameCopied(entry, b"".join(parts), -1))
