"""Throttled client-seconds: the seconds in which a client was held back by a throttle.

A throttle of ``T`` ms given to a request recorded at ``quota_ms`` holds its client back over
``[quota_ms, quota_ms + T)``; the client is throttled in every second (of the quota clock)
that interval touches. Per (user, client-id) and replay group (one proxy process and
upstream broker: one enforcement point), the seconds of all its holds are counted once; the
totals add the groups up (a client held back on two brokers in one second counts twice, as
it was held on two connections)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd


def held_seconds(entity: np.ndarray, quota_ms: np.ndarray, throttle_ms: np.ndarray
                 ) -> pd.Series:
    """Per entity (the index): the number of distinct seconds its holds touch (entities
    never held back are left out)."""
    throttled = throttle_ms > 0
    if not throttled.any():
        return pd.Series([], dtype="int64")
    e = entity[throttled]
    start = quota_ms[throttled] // 1000
    end = (quota_ms[throttled] + throttle_ms[throttled] - 1) // 1000  # inclusive
    order = np.lexsort((start, e))
    e, start, end = e[order], start[order], end[order]
    # Per entity, merge the intervals in start order: a new run of covered seconds begins
    # where a start is past every end before it (of the same entity).
    first = np.ones(len(e), dtype=bool)
    first[1:] = e[1:] != e[:-1]
    bounds = np.append(np.flatnonzero(first), len(e))
    out: dict[int, int] = {}
    for lo, hi in itertools.pairwise(bounds):
        s, r = start[lo:hi], np.maximum.accumulate(end[lo:hi])  # r: the furthest end so far
        begins = np.ones(hi - lo, dtype=bool)
        begins[1:] = s[1:] > r[:-1]
        out[int(e[lo])] = int((np.maximum.reduceat(r, np.flatnonzero(begins)) - s[begins]
                               + 1).sum())
    return pd.Series(out, dtype="int64")
