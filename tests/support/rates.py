"""Rates measured the way Kafka's sampled quotas make them meaningful."""

from __future__ import annotations

# How long a measurement spans by default: whole burst cycles over at least this long.
MEASURE_S = 15.0


def cycle_rate(events: list[tuple[float, int]], start: float, quota: float,
               measure_s: float = MEASURE_S) -> float:
    """Bytes per second over whole burst cycles beginning at or after ``start``."""
    bucket = 0.25
    volume: dict[int, int] = {}
    for t, n in events:
        volume[int(t / bucket)] = volume.get(int(t / bucket), 0) + n
    busy = 2 * quota * bucket  # a bucket above twice the quota rate is part of a burst
    starts = [b * bucket for b in sorted(volume)
              if volume[b] > busy and volume.get(b - 1, 0) <= busy and b * bucket >= start]
    first = starts[0] if starts else start
    later = [b for b in starts if b >= first + measure_s]
    end = later[0] if later else first + measure_s
    assert end <= max(t for t, _ in events), "the run ended before a whole cycle was seen"
    return sum(n for t, n in events if first <= t < end) / (end - first)
