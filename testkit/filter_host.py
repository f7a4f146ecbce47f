"""One fake of what a filter uses of its connection (``proxy.filters.base.FilterHost``), for
unit tests of filters: every call a filter makes is recorded for the test to check."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.proxy.filters.base import Client, Filter, FilterChain


class FakeFilterHost:
    """A connection as filters see it. ``closes`` holds (reason, side, detail) of each
    ``close``, ``refusals`` (entry, reason, detail) of each ``refuse``; ``retired``, ``holds``,
    ``released``, ``mutes`` and ``resumed`` the other calls. ``may_mute=False``: a filter
    that must never mute fails the test at once if it does."""

    def __init__(self, user: str = "ANONYMOUS", *, conn_id: int = 1, listener: str = "plain",
                 scope: int = 0, peer: str | None = None, chain: FilterChain | None = None,
                 may_mute: bool = True) -> None:
        self.client = Client(conn_id, listener, scope, user)
        if peer is not None:
            self.client.peer = peer
        self.client_gate: Any = None
        self.table: Any = None
        # (between frames: nothing measured, no frame under way)
        self.requests: Any = SimpleNamespace(frame_remaining=0, measuring=None)
        self.responses: Any = None
        self.chain = chain
        self.may_mute = may_mute
        self.closes: list[tuple[str, str | None, str | None]] = []
        self.refusals: list[tuple[InFlight, str, str]] = []
        self.retired: list[tuple[Filter, tuple[str, ...]]] = []
        self.holds: list[str] = []
        self.released: list[str] = []
        self.mutes: list[int] = []
        self.resumed = 0
        self.unsent = 0  # bytes buffered for the broker (``unsent_upstream``)

    def mute(self, throttle_ms: int) -> None:
        if not self.may_mute:
            raise AssertionError("this filter never mutes")
        self.mutes.append(throttle_ms)

    def unsent_upstream(self) -> int:
        return self.unsent

    def close(self, reason: str, *, detail: str | None = None, side: str | None = None) -> None:
        self.closes.append((reason, side, detail))

    def refuse(self, entry: InFlight, reason: str, detail: str) -> None:
        self.refusals.append((entry, reason, detail))

    def retire(self, f: Filter, hooks: tuple[str, ...]) -> None:
        self.retired.append((f, hooks))
        if self.chain is not None:
            self.chain.retire(f, hooks)

    def resume_interception(self) -> None:
        self.resumed += 1

    def hold_responses(self, reason: str) -> None:
        self.holds.append(reason)

    def release_responses(self, reason: str) -> None:
        self.released.append(reason)

    @property
    def close_reasons(self) -> list[str]:
        """The reasons of every ``close``, then of every ``refuse``."""
        return [r for r, _, _ in self.closes] + [r for _, r, _ in self.refusals]


class RecordingLog:
    """Stands for a module's structlog logger: every event recorded as (level, event,
    fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str) -> Any:
        return lambda event, **fields: self.events.append((level, event, fields))

    def __getattr__(self, level: str) -> Any:
        return self._record(level)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.events]
