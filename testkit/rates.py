"""Rates measured the way Kafka's sampled quotas make them meaningful."""

from __future__ import annotations

import bisect
import itertools

# How long a measurement spans by default: whole burst cycles over at least this long.
MEASURE_S = 15.0


def cycle_rate(events: list[tuple[float, float]], start: float, quota: float,
               measure_s: float = MEASURE_S, whole: bool = False) -> float:
    """Bytes per second over whole burst cycles beginning at or after ``start`` (``whole``:
    fail unless the measurement ends at the start of a burst, a whole cycle)."""
    bucket = 0.25
    volume: dict[int, float] = {}
    for t, n in events:
        volume[int(t / bucket)] = volume.get(int(t / bucket), 0) + n
    busy = 2 * quota * bucket  # a bucket above twice the quota rate is part of a burst
    starts = [b * bucket for b in sorted(volume)
              if volume[b] > busy and volume.get(b - 1, 0) <= busy and b * bucket >= start]
    first = starts[0] if starts else start
    later = [b for b in starts if b >= first + measure_s]
    assert later or not whole, f"no burst began {measure_s} s after the one at {first} s"
    end = later[0] if later else first + measure_s
    assert end <= max(t for t, _ in events), "the run ended before a whole cycle was seen"
    return sum(n for t, n in events if first <= t < end) / (end - first)


def burst_starts(events: list[tuple[float, float]], quota: float) -> list[float]:
    """The starts of throttle cycles: a 0.25 s bucket above twice the quota rate (a burst, as
    ``cycle_rate`` finds them) after at least 5 s without one. (With many connections a
    burst can spread over seconds, with buckets below the level in it, and a second, smaller
    burst can follow a few seconds later: ``cycle_rate`` would begin a cycle there.)"""
    bucket = 0.25
    volume: dict[int, float] = {}
    for t, n in events:
        volume[int(t / bucket)] = volume.get(int(t / bucket), 0) + n
    busy = 2 * quota * bucket
    return [b * bucket for b in sorted(volume)
            if volume[b] > busy and all(volume.get(b - i, 0) <= busy for i in range(1, 21))]


class Cycles:
    """Rates over whole throttle cycles of one run (``burst_starts``), / quota."""

    def __init__(self, events: list[tuple[float, float]], quota: float) -> None:
        self.quota = quota
        self.starts = burst_starts(events, quota)
        self.times = [t for t, _ in events]
        self.cumulative = [0.0, *itertools.accumulate(n for _, n in events)]

    def volume(self, since: float, until: float) -> float:
        c, times = self.cumulative, self.times
        return c[bisect.bisect_left(times, until)] - c[bisect.bisect_left(times, since)]

    def rate(self, start: float, measure_s: float = 15.0) -> float:
        """``cycle_rate``'s measure over these cycles: from the first cycle begun at or after
        ``start`` to the first begun ``measure_s`` or more later."""
        starts = [s for s in self.starts if s >= start]
        first = starts[0] if starts else start
        end = next((s for s in starts if s >= first + measure_s), first + measure_s)
        return self.volume(first, end) / (end - first) / self.quota

    def whole(self, start: float, span_s: float = 30.0) -> tuple[float, float, float]:
        """Over every whole cycle from the first begun at or after ``start`` to the last one
        begun; then the lowest and the highest ``rate`` over ``span_s`` or more, begun at
        each cycle."""
        starts = [s for s in self.starts if s >= start]
        if len(starts) < 2:  # no throttle cycles (paced): from ``start`` to the last event
            end = self.times[-1] if self.times else start
            r = self.volume(start, end) / max(end - start, 1e-9) / self.quota
            return r, r, r
        first, last = starts[0], starts[-1]
        total = self.volume(first, last) / (last - first) / self.quota
        each = [self.rate(s, span_s) for s in starts if s + span_s <= last]
        return total, min(each, default=total), max(each, default=total)
