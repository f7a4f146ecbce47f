"""Pausing a transport for several independent reasons (backpressure, shutdown drain, ...).

Reading resumes only when no reason is left. Backpressure lives here and nowhere else.

A transport may be reading while the gate holds a reason: uvloop starts reading a connection
after ``connection_made`` returns, whatever that method told it, so a pause given there (the
proxied connection's "connecting") does not take hold. Every ``pause`` therefore tells the
transport again (``pause_reading`` does nothing on a paused transport), and ``enforce`` does for
the reasons already held: reading that goes on past one read is not possible behind a reason.
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
        # (told even when another reason holds: see the module's docstring)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._reasons.add(reason)

    def enforce(self) -> None:
        """Bytes arrived though the gate is paused (see the module's docstring): pause the
        transport for the reasons held."""
        if self._reasons and self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

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
