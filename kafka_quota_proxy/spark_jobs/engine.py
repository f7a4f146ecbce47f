"""The replay's quota engine, budget by budget, for a group replayed under one config on
Kafka's maths with no storage factor: each budget's requests, in the order recorded, through a
sampled rate of its own (``quota.sampled.SampledRate``), giving the throttles
``quota.replay.replay_rows`` gives them (tests/unit/test_engine_by_budget.py holds the two
equal), without its per-request lookups of sensors by name.

Budgets are independent under Kafka's maths: a budget's throttle depends only on what it
recorded, and idle-sensor expiry changes no throttle (tests/unit/quota/test_idle_expiry.py),
so they can be replayed one after the other."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kafka_quota_proxy.quota.entities import EntityKey, QuotaType, resolve
from kafka_quota_proxy.quota.manager import KAFKA, QuotaSettings, percent_of_thread
from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.throttle import throttle_time_ms


def applies(settings: QuotaSettings) -> bool:
    return settings.pacing == KAFKA


def records(qt: QuotaType, api_key: np.ndarray, follower: np.ndarray,
            response_bytes: np.ndarray) -> np.ndarray:
    """Which requests record into quota type ``qt`` (``quota.recording``)."""
    if qt is QuotaType.PRODUCE:
        mask = api_key == 0
    elif qt is QuotaType.FETCH:
        mask = (api_key == 1) & ~follower
    else:
        mask = ~follower & (response_bytes >= 0)
    return np.asarray(mask, dtype=bool)


def budget_runs(quotas: dict[EntityKey, float], qt: QuotaType, names: list[tuple[str, str]],
                codes: np.ndarray, mask: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The requests of ``mask`` that record into a budget with a limit, budget by budget, each
    budget's in the order recorded: ``(rows, budget of each, where each budget's run starts,
    the limit of each run's budget)``. ``codes``: each request's (user, client-id) as an
    index into ``names``."""
    resolved = [resolve(quotas, qt, user, client_id) for user, client_id in names]
    limits = np.asarray([np.inf if r.limit is None else r.limit for r in resolved])
    budget_of, _ = pd.factorize(pd.Series([r.tags for r in resolved], dtype=object))
    rows = np.flatnonzero(mask & np.isfinite(limits)[codes])
    budget = budget_of[codes[rows]]
    order = np.argsort(budget, kind="stable")
    rows, budget = rows[order], budget[order]
    starts = np.flatnonzero(np.r_[True, budget[1:] != budget[:-1]]) if len(rows) else rows
    bounds = np.empty(int(budget_of.max()) + 1 if len(budget_of) else 0)
    bounds[budget_of] = limits  # (the names of one budget share its limit)
    return rows, budget, starts, bounds[budget[starts]]


def throttles(times: np.ndarray, codes: np.ndarray, names: list[tuple[str, str]],
              api_key: np.ndarray, request_bytes: np.ndarray, response_bytes: np.ndarray,
              request_time_ms: np.ndarray, follower: np.ndarray, settings: QuotaSettings,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The produce, fetch and request throttles of requests in the order recorded (``times``:
    ``quota_ms``; ``codes``: each request's (user, client-id) as an index into ``names``)."""
    n = len(times)
    out = []
    for qt in (QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST):
        result = np.zeros(n, dtype=np.int32)
        out.append(result)
        quotas = settings.for_type(qt)
        if not quotas or not n:
            continue
        rows, _, starts, limits = budget_runs(
            quotas, qt, names, codes, records(qt, api_key, follower, response_bytes))
        if not len(rows):
            continue
        cap = (settings.window_ms
               if qt is QuotaType.REQUEST or settings.cap_byte_rate_throttle else None)
        at = times[rows].tolist()
        if qt is QuotaType.PRODUCE:
            values = (request_bytes[rows].astype(np.int64) - 4).tolist()
        elif qt is QuotaType.FETCH:
            values = (response_bytes[rows].astype(np.int64) - 4).tolist()
        else:
            model = settings.request_time
            values = [percent_of_thread(t if t > 0 else model.broker_ms(q, r))
                      for t, q, r in zip(request_time_ms[rows].tolist(),
                                         request_bytes[rows].tolist(),
                                         response_bytes[rows].tolist(), strict=True)]
        got = [0] * len(rows)
        integral = qt is not QuotaType.REQUEST
        for lo, hi, bound in zip(starts.tolist(), [*starts[1:].tolist(), len(rows)],
                                 limits.tolist(), strict=True):
            record = SampledRate(settings.samples, settings.window_ms,
                                 integral=integral).record_and_measure
            for k in range(lo, hi):
                rate, window = record(values[k], at[k])
                if rate > bound:
                    got[k] = throttle_time_ms(rate, bound, window, cap)
        result[rows] = got
    return out[0], out[1], out[2]
