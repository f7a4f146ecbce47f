"""Rates measured the way Kafka's sampled quotas make them meaningful."""

from __future__ import annotations

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
