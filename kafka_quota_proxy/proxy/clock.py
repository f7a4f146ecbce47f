"""The clocks of the runtime: the quota engine's (monotonic milliseconds) and the wall clock."""

from __future__ import annotations

import time


def now_ms() -> int:
    """The quota engine's clock: monotonic, in milliseconds."""
    return int(time.monotonic() * 1000)


def wall_ms() -> int:
    """Unix time in milliseconds."""
    return int(time.time() * 1000)
