"""``RequestStream`` as tests read it: ``reading_stream(...)`` makes a stream and keeps, across
``feed`` calls, what its events said (``copied``, ``copied_at``, ``measured``, ``watched``,
``watched_at``, ``next_client_id``), while ``feed`` returns the bytes to forward and the
requests read, so that tests of framing need not sort events themselves."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.request_stream import (
    ClientIdChanged,
    FrameCopied,
    ProduceMeasured,
    ProduceWatched,
    RequestRead,
    RequestStream,
)

_OWN = frozenset({"stream", "copied", "copied_at", "measured", "watched", "watched_at",
                  "next_client_id", "events"})


class StreamReader:
    """A ``RequestStream`` whose events are sorted into lists the test empties."""

    def __init__(self, stream: RequestStream) -> None:
        object.__setattr__(self, "stream", stream)
        self.copied: list[tuple[InFlight, bytes]] = []
        self.copied_at: dict[int, int] = {}  # the last feed's, by id(entry)
        self.measured: list[InFlight] = []
        self.watched: list[tuple[InFlight, Any]] = []
        self.watched_at: dict[int, int] = {}  # the last feed's, by id(entry)
        self.next_client_id: str | None = None
        self.events: list[Any] = []  # the last feed's

    def feed(self, data: bytes = b"", stop_after_frame: bool = False,
             max_frames: int = 0) -> tuple[Any, list[InFlight]]:
        forward, events = self.stream.feed(data, stop_after_frame, max_frames)
        self.events = events
        self.copied_at = {}
        self.watched_at = {}
        read: list[InFlight] = []
        for event in events:
            if isinstance(event, RequestRead):
                read.append(event.entry)
            elif isinstance(event, FrameCopied):
                self.copied.append((event.entry, event.frame))
                if event.at >= 0:
                    self.copied_at[id(event.entry)] = event.at
            elif isinstance(event, ProduceMeasured):
                self.measured.append(event.entry)
            elif isinstance(event, ProduceWatched):
                self.watched.append((event.entry, event.watch))
                if event.at >= 0:
                    self.watched_at[id(event.entry)] = event.at
            elif isinstance(event, ClientIdChanged):
                self.next_client_id = event.client_id
        return forward, read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.stream, name, value)


def reading_stream(*args: Any, **kwargs: Any) -> Any:
    """A ``RequestStream(*args, **kwargs)`` read through a ``StreamReader``."""
    return StreamReader(RequestStream(*args, **kwargs))
