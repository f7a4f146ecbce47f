"""Pausing a transport for several independent reasons (backpressure, shutdown drain, ...).

Reading resumes only when no reason is left. Backpressure lives here and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ReadGate:
    __slots__ = ("_reasons", "_transport", "on_resume")

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._reasons: set[str] = set()
        # called when the last reason is lifted (to process bytes held while paused)
        self.on_resume: Callable[[], None] | None = None

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        if self._reasons:
            transport.pause_reading()

    def pause(self, reason: str) -> None:
        if not self._reasons and self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._reasons.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self._reasons:
            return
        self._reasons.discard(reason)
        if not self._reasons and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
            if self.on_resume is not None:
                self.on_resume()

    def open(self) -> None:
        """Lift every reason and read (without ``on_resume``): a connection winding down reads
        what the client still sends only to discard it."""
        self._reasons.clear()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def has(self, reason: str) -> bool:
        return reason in self._reasons

    @property
    def paused(self) -> bool:
        return bool(self._reasons)

    def reasons(self) -> frozenset[str]:
        return frozenset(self._reasons)
