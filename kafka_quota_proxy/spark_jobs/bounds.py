"""Which entities' budgets may throttle under one config, bounded from above before a replay,
so that the replay sends the Python workers only those entities' requests and counts the
others in the driver (``replay.replay_summary``, ``hot``).

The replay's own test (``replay._may_throttle``) is exact, per budget and replay group, on
the quota clock: a budget cannot throttle when, at each of its requests, what it recorded
over the ``samples + 1`` windows before (the most its samples can hold), over ``samples - 1``
windows (the shortest span its rate is measured over), is within its quota. ``hot_entities``
takes the same test from above, from each entity's peaks (``peaks``, computed with the
profile from its per-second rows, ``profile.per_second_profile``):

- an entity's peak is the most its produce (or fetch) values add up to in ``span`` whole
  seconds of ``ts_ms`` (the wall clock when the request was read) on one broker, over every
  run, each value at no less than 0 (a fetch with no response records -5: leaving it out only
  raises a sum, and a longer span can only hold more);
- ``(samples + 1) x window`` ms of one run's quota clock lie within ``span_seconds`` whole
  seconds of ``ts_ms``, counting the spread of ``quota_ms - ts_ms`` over the run
  (``clock_spread_ms``, the largest of any run's);
- a budget's peak is at most the sum of its entities' peaks, on any broker;
- request quotas are not bounded here: an entity with a request quota is always hot.

So a budget this finds cold is cold in every group, the replay's exact test finds the same
budgets hot on the rows it is sent (all the rows of every hot entity), and the requests left
out are requests the engine gives 0. The engine then runs its idle-sensor expiry on the
schedule of the rows it is sent rather than of the whole group: under Kafka's maths an expired
sensor and one idle for its expiry give every later request the same throttle
(tests/unit/quota/test_idle_expiry.py), so this holds there only (not under ``pacing:
strict``, whose level can be ahead of the clock when its sensor expires)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from kafka_quota_proxy.quota.entities import QuotaType, resolve
from kafka_quota_proxy.quota.manager import KAFKA, QuotaSettings

PRODUCE, FETCH, REQUEST = 1, 2, 4  # the ``hot`` bits: which types' budgets may throttle
_BITS = ((QuotaType.PRODUCE, PRODUCE, "produce_peak"), (QuotaType.FETCH, FETCH, "fetch_peak"),
         (QuotaType.REQUEST, REQUEST, None))
MARGIN = 1e-6  # cold only this far below the quota (the replay's own test: 1e-9)


def applies(settings: QuotaSettings) -> bool:
    """Whether requests can be left out of a replay under ``settings`` (``hot_entities``)."""
    return settings.pacing == KAFKA and settings.samples >= 2


def clock_spread_ms(names: pd.DataFrame) -> int:
    """The largest spread of ``quota_ms - ts_ms`` over the rows of one run, from
    ``replay.names_of`` (its ``min_offset_ms`` and ``max_offset_ms``)."""
    if names.empty:
        return 0
    runs = names.groupby("run").agg(low=("min_offset_ms", "min"), high=("max_offset_ms", "max"))
    spread = (runs["high"] - runs["low"]).max()
    return 0 if pd.isna(spread) else int(spread)


def span_seconds(settings: QuotaSettings, spread_ms: int) -> int:
    """The whole seconds of ``ts_ms`` that hold any ``(samples + 1) x window`` ms of a run's
    quota clock: ``H + spread`` consecutive ms touch at most ``(H + spread - 1) // 1000 + 2``
    seconds."""
    horizon = (settings.samples + 1) * settings.window_ms
    return (horizon + max(spread_ms, 0) - 1) // 1000 + 2


def peaks(codes: np.ndarray, broker: np.ndarray, second: np.ndarray, values: np.ndarray,
          span: int, groups: int) -> np.ndarray:
    """Per code (0 to ``groups - 1``): the most ``values`` (per second, at no less than 0)
    add up to over ``span`` consecutive seconds on one broker."""
    out = np.zeros(groups)
    keep = values > 0
    if not keep.any():
        return out
    c, b, s, v = codes[keep], broker[keep], second[keep], values[keep]
    order = np.lexsort((s, b, c))
    c, b, s, v = c[order], b[order], s[order], v[order]
    total = np.cumsum(v)
    # per (code, broker) run, the first row within ``span`` seconds of each row
    run = np.r_[0, np.cumsum((c[1:] != c[:-1]) | (b[1:] != b[:-1]))]
    key = run.astype(np.int64) * (1 << 32) + (s - s.min()).astype(np.int64)
    first = np.searchsorted(key, key - (span - 1), side="left")
    window = total - np.where(first > 0, total[np.maximum(first - 1, 0)], 0.0)
    # (sorted by code: each code's rows are one run, reduced at its first row)
    heads = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    out[c[heads]] = np.maximum.reduceat(window, heads)
    return out


def hot_entities(profile: pd.DataFrame, settings: QuotaSettings,
                 entities: Mapping[int, tuple[str, str]]) -> pd.DataFrame:
    """Per entity (the (user, client-id) hash of ``replay.catalog_of``) some budget of which
    may throttle under ``settings``: ``hot``, the bits of the types whose budgets may
    (``PRODUCE``, ``FETCH``, ``REQUEST``). ``profile``: per entity, ``produce_peak`` and
    ``fetch_peak`` over ``span_seconds(settings, ...)`` seconds or more. Entities left out
    cannot throttle."""
    per_second = 1000.0 / ((settings.samples - 1) * settings.window_ms)
    # (an entity's peaks by a dict: one lookup each, where a pandas reindex per budget cost
    # 4.9 s for the bench's 5,000 budgets of one client-id each)
    peak_of = {column: dict(zip(profile["entity"].tolist(),
                                np.nan_to_num(profile[column].to_numpy(dtype=np.float64)).tolist(),
                                strict=True))
               for _, _, column in _BITS if column is not None}
    hot: dict[int, int] = {}
    for qt, bit, column in _BITS:
        quotas = settings.for_type(qt)
        if not quotas:
            continue
        members: dict[tuple[str, str], list[int]] = {}
        limits: dict[tuple[str, str], float] = {}
        for entity, (user, client_id) in entities.items():
            found = resolve(quotas, qt, user, client_id)
            if found.limit is not None:
                members.setdefault(found.tags, []).append(entity)
                limits[found.tags] = float(found.limit)
        for tags, group in members.items():
            if column is not None:
                of = peak_of[column]
                peak = float(np.sum(np.array([of.get(e, 0.0) for e in group])))
                if peak * per_second <= limits[tags] * (1 - MARGIN):
                    continue
            for entity in group:
                hot[entity] = hot.get(entity, 0) | bit
    return pd.DataFrame({"entity": list(hot), "hot": list(hot.values())}).astype(
        {"entity": "int64", "hot": "int32"})
