"""Throttle time, as Kafka's ``QuotaUtils.throttleTime``: ``round((O - T) / T * W)`` ms, with
the same ``W`` as the measurement and Java rounding (``floor(x + 0.5)``). Request-time quotas
are bounded at one quota window (``ClientRequestQuotaManager``); byte-rate quotas are not,
unless the operator asks for the same bound (``quotas.cap_byte_rate_throttle``)."""

from __future__ import annotations

import math


def java_round(x: float) -> int:
    return math.floor(x + 0.5)


def throttle_time_ms(observed: float, bound: float, window_ms: int,
                     cap_ms: int | None = None) -> int:
    """0 unless ``observed > bound`` (Kafka checks the quota after recording the value)."""
    if observed <= bound:
        return 0
    throttle = java_round((observed - bound) / bound * window_ms)
    if cap_ms is not None:
        throttle = min(throttle, cap_ms)
    return max(throttle, 0)
