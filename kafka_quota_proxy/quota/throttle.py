"""Throttle time, as Kafka's ``QuotaUtils.throttleTime``: ``Math.round((O - T) / T * W)`` ms,
computed in Kafka's order and types (``double difference = O - T``, then ``difference / T *
W`` with ``W`` the long window of the measurement), rounded as Java's ``Math.round`` (the
closest long, ties toward positive infinity). Request-time and connection-creation quotas
are bounded at one quota window (``QuotaUtils.boundedThrottleTime``); byte-rate quotas are
not, unless the operator asks for the same bound (``quotas.cap_byte_rate_throttle``)."""

from __future__ import annotations

import math
from typing import Final

LONG_MAX: Final = 2**63 - 1
LONG_MIN: Final = -(2**63)
# The largest throttle time: ``throttle_time_ms`` is an int32. Kafka narrows its long throttle
# with ``(int)``, which wraps past this (a throttle of 2^31 ms, some 24.8 days, becomes
# negative: never throttled); the proxy holds such a client for the largest time it can say.
INT32_MAX: Final = 2**31 - 1


def java_round(x: float) -> int:
    """Java's ``Math.round(double)``: the closest long, ties toward positive infinity; NaN is
    0 and values beyond the long range saturate. (``floor(x + 0.5)`` is not the same: for
    0.49999999999999994 the addition rounds up to 1.0 and gives 1 where Java gives 0.)"""
    if x != x:
        return 0
    if x >= 9.223372036854775807e18:
        return LONG_MAX
    if x <= -9.223372036854775808e18:
        return LONG_MIN
    r = round(x)  # exact: the closest integer, ties to even
    if x - r == 0.5:  # (exact: x and r are within 0.5 of each other) a tie went down
        r += 1
    return r


def throttle_time_ms(observed: float, bound: float, window_ms: int,
                     cap_ms: int | None = None) -> int:
    """0 unless ``observed > bound`` (Kafka checks the quota after recording the value)."""
    if observed <= bound:
        return 0
    difference = observed - bound
    throttle = java_round(difference / bound * float(window_ms))
    if cap_ms is not None:
        throttle = min(throttle, cap_ms)
    return min(max(throttle, 0), INT32_MAX)


def rate_per_second(total: float, window_ms: int) -> float:
    """Kafka's ``Rate.measure``: the samples' sum over the window in seconds, as
    ``value / convert(windowSize, SECONDS)`` = ``value / (windowMs / 1000.0)`` (dividing the
    sum by the milliseconds and scaling by 1000 differs in the last bit for about a quarter of
    windows that are not whole seconds, and a throttle then lands on the other side of .5)."""
    seconds = window_ms / 1000.0
    if seconds == 0.0:  # (one sample, at the first record of a window) Java does not raise
        return math.copysign(math.inf, total) if total != 0.0 else math.nan
    return total / seconds

