"""Giving freed memory back to the system.

When a churn of client-ids or users expires (tens of thousands of quota budgets at once), the
memory they held is free but stays in the process's heap: glibc's ``malloc`` returns only the
top of its heap by itself. ``trim_heap`` asks it to return every free page (``malloc_trim``);
elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

# Budgets expired at once past which the heap is trimmed (a trim costs a walk of the heap:
# milliseconds for hundreds of MB).
TRIM_AFTER_EXPIRED = 10_000


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the system; whether anything was returned."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
