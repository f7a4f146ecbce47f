"""Tune: recommend the quotas an operator would apply, from what the capture shows each quota
budget really needed: the load its clients offered. Pure pandas: the rule over small tables
(one row per budget), and the offered-load estimator over a capture's rows (``demand_requests``,
``offered_load``, then ``offered_intervals`` and ``offered_demand`` over its segments); over a
whole capture the first two run in Spark's Python workers, on groups of whole entities
(``entity_pass``: the same code, so the same segments), and these the rest.

The rule (``rule_text`` says it with the numbers in force; the README and every report state
it):

- A *budget* is what one quota entity of the base config (the config whose structure is kept:
  the ``--config`` given, else the last one live in the capture) gives to whoever shares it,
  resolved by the quota engine's own precedence (``quota.entities``): per (user, client-id),
  per user or per client-id, per broker. ``users/<default>`` gives every user a budget of its
  own; ``clients/<default>`` every client-id.
- A budget's *demand*, per quota type, is its *offered load*: what its clients would have
  sent had no quota held them back. Not what the capture recorded per second: behind a
  throttle a client queues, and once let go it sends the queue at once, so a producer offering
  3 MB/s against a 1 MB/s quota records 11 MB/s seconds, and its quota's rate the rest of the
  time. The estimator (``offered_load``; in Spark, ``entity_pass``), per *client*
  (one connection of one (user, client-id) to one broker, in one proxy run) and *segment* of
  its requests:

  - The requests it sent before it was first held back (read before the response that carried
    its first throttle, of any quota type) left as it offered them, nothing queued behind a
    hold yet: their bytes over their traffic time (n requests d apart stand for n x d, at least
    ``measure_seconds``) are its *free rate*. Its bytes over the whole segment's traffic time,
    what got through, are a floor. The offered load is the larger of the two; for a client
    never held back, its plain rate.
  - A segment ends when the client is *absent*, reading no request for ``idle_seconds`` (11,
    Kafka's default quota window) after its last response and hold: absence is not offering
    zero, and its seconds do not count. Once it has been held back, a segment also ends at the
    first request read ``idle_seconds`` after its last hold ended (free again, and the quota's
    window has forgotten it), and the next one measures afresh.
  - Bytes are what the quota records (request bytes - 4 of a Produce, counted when it was
    read; response bytes - 4 of a consumer Fetch, counted when its response started); for
    request_percentage, request time as a percentage of one thread.
  - A budget's offered load in a second is the sum over the clients present in that second
    (from their segment's first request to its last: ``offered_intervals``); its demand is
    the ``percentile`` (p99) of that over the seconds with clients present in the capture's
    whole minutes only (the partial first and last minute are left out), on its busiest
    broker (``offered_demand``).
  - Bytes over the time the client was not held back (total / (span - time throttled)) was
    the other candidate, and is wrong for a client that queues: the time it is let go it
    spends sending its queue as fast as it can, so that measures its draining speed, not its
    demand (on the clients below, 1.6 to 80 times the truth at 1 - 5 x the quota).
  - Validated against clients of known offered load run through the quota engine
    (``testkit/offered_load.py``: librdkafka-like producers, batch.size 16 KB - 1 MB, and
    consumers, fetch.max.bytes 16 KB - 1 MB, at 0.5 - 5 x their quota): within 0.1 % of the
    truth (``tests/unit/test_offered_load.py``).
  - What a capture cannot tell: a client held back from its first request on (the capture
    began when it was over its quota already, or it joined a budget that was) has no free
    rate, and its estimate is what got through, about its share of the quota: a floor. A
    client more than 10 x over its quota is held back within its first second (Kafka's window
    lets 10 s of quota through at first): its estimate is about 10 x its quota. A
    client with a queue when its segment starts (a proxy restarted under load) shows its
    draining speed. A client whose load rises while it is held back shows the load it had
    when first held; one whose load falls is measured afresh once free again.
- Only a budget with at least ``min_minutes`` whole minutes of traffic sets a value; a capture
  shorter than that keeps every live value. (``span_seconds`` below 60 counts whole spans of
  that many seconds instead of whole minutes: for demos and tests on captures of a minute.)
- Every entity of the base config is kept, at its level and with its quota types; only values
  change. A named entity gets ``headroom`` x its budget's demand. A default entity gets
  ``headroom`` x the ``default_percentile`` of the demands of the budgets it governs (the
  nearest observed demand at or below it). A budget whose demand is above that default gets an
  override of its own, at the level it came from (``users/<default>`` -> ``user: U``,
  ``clients/<default>`` -> ``client-id: C``, ``users/U/clients/<default>`` -> ``user: U,
  client-id: C``), at ``headroom`` x its demand: at most ``max_overrides`` per default, biggest
  first, and never one that would move any client to another budget.
- ``total_budget="keep"``: per quota type, the sum of the limits over the budgets seen may not
  exceed the base config's; when it would, the values set from data are scaled down together
  (what over-provisioned budgets give up goes to the under-provisioned ones). ``capacity_bytes``
  caps the sum the same way.
- request_percentage never exceeds 100 x ``broker_threads`` (Kafka's request quota is a share
  of the broker's network and I/O threads: num.network.threads 3 + num.io.threads 8 = 11 by
  default); byte rates are at least ``min_rate``.

A base config with no quota at all has no structure to keep: ``recommend`` then proposes one,
as seed 000 suggests (a ``client-id: <default>`` plus overrides for the top outliers), from the
same sustained demands.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kafka_quota_proxy.quota.entities import (
    DEFAULT,
    DEFAULT_NAME,
    EntityKey,
    Name,
    QuotaType,
    Tags,
    metric_tags,
    quota_limit,
    resolve,
)
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.replay import settings_from_section

DEFAULT_ENTITY = DEFAULT_NAME


@dataclass(frozen=True)
class TuneOptions:
    headroom: float = 1.5
    default_percentile: float = 0.9
    max_overrides: int = 10  # new overrides per default entity and quota type
    capacity_bytes: dict[str, float] | None = None  # "produce"/"fetch" -> bytes/s per broker
    min_rate: int = 1024  # never recommend a byte rate below this
    percentile: float = 0.99  # demand: this percentile of per-second offered load
    min_minutes: float = 5  # whole minutes of data needed to set a value
    # offered load (``offered_load``): a client silent this long after its last response and
    # hold is absent (Kafka's default quota window, 11 x 1 s); a rate is measured over at
    # least ``measure_seconds``
    idle_seconds: float = 11.0
    measure_seconds: float = 1.0
    span_seconds: int = 60  # "whole minutes" are whole spans of this many seconds
    broker_threads: int = 11  # request_percentage <= 100 x this (network + I/O threads)
    total_budget: str = "keep"  # "keep": never above the base config's total; "free"
    min_request_percentage: float = 1.0

    def __post_init__(self) -> None:
        if self.total_budget not in ("keep", "free"):
            raise ValueError(f"total_budget: 'keep' or 'free', not {self.total_budget!r}")
        for name in ("percentile", "default_percentile"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if (self.headroom <= 0 or self.broker_threads < 1 or self.min_minutes < 0
                or not 1 <= self.span_seconds <= 60 or self.idle_seconds <= 0
                or self.measure_seconds <= 0):
            raise ValueError("headroom > 0, broker_threads >= 1, min_minutes >= 0, "
                             "span_seconds in 1..60, idle_seconds > 0 and "
                             "measure_seconds > 0")

    @property
    def max_request_percentage(self) -> float:
        return 100.0 * self.broker_threads


def rule_text(options: TuneOptions) -> str:
    """The rule in force, for the report."""
    h, o = options.headroom, options
    total = ("the sum of the limits over the budgets seen stays at or below the base "
             "config's, per quota type: values set from data are scaled down together when "
             "it would not" if o.total_budget == "keep" else "no cap on the total")
    return (
        f"Demand of a budget (what one entity of the base config gives whoever shares it: per "
        f"(user, client-id), per user or per client-id, on one broker) is its offered load, "
        f"what its clients would have sent had no quota held them back, not the bursts that "
        f"follow a throttle: per client connection, the rate of the requests it sent before it "
        f"was first held back (at least what got through), summed over the clients present "
        f"in each second (a client silent for {o.idle_seconds:g} s is absent, not offering "
        f"zero); the p{_pct(o.percentile)} of that over the seconds with clients present in "
        f"the capture's whole minutes (the partial first and last minute left out), on its "
        f"busiest broker. Only budgets with at least {o.min_minutes:g} whole minutes of traffic "
        f"set a value; others keep the live one. Every entity of the base config is kept with its "
        f"quota types; only values change. A named entity gets {h:g} x its demand; a default "
        f"entity {h:g} x the p{_pct(o.default_percentile)} of the demands of the budgets it "
        f"governs; a budget above that default gets its own override at its own level, "
        f"{h:g} x its demand (at most {o.max_overrides} per default). Total: {total}. "
        f"request_percentage <= {o.max_request_percentage:g} (100 x {o.broker_threads} broker "
        f"threads); byte rates >= {o.min_rate} B/s.")


def _pct(q: float) -> str:
    return f"{q * 100:g}"


# ------------------------------------------------------------------ budgets and their demand

# A budget, in the tables below: the quota type's short name and its tags (user, client-id;
# "" where that part takes no part in sharing), as the quota engine names its sensors. The
# entity that sets its limit follows from the config (``quota.entities.quota_limit``).
KEYS = ["quota_type", "budget_user", "budget_client"]
DEMAND_COLUMNS = {**dict.fromkeys(KEYS, "string"), "broker": "int", "demand": "double",
                  "peak": "double", "minutes": "double", "seconds": "int", "total": "double"}


def budget_mapping(pairs: Iterable[tuple[str, str]], section: Mapping[str, Any],
                   types: Iterable[QuotaType]) -> pd.DataFrame:
    """Which budget each (user, client-id) of the capture records into, per quota type, under
    ``section``: the quota engine's own resolution (``quota.entities.metric_tags``). ``budget``
    numbers the budgets (``KEYS``)."""
    settings = settings_from_section(section)
    rows = []
    for qt in types:
        quotas = settings.for_type(qt)
        for user, client_id in pairs:
            tags = metric_tags(quotas, user, client_id)[0]
            rows.append((user, client_id, qt.short, tags[0], tags[1]))
    out = pd.DataFrame(rows, columns=["user", "client_id", *KEYS])
    out["budget"] = out.groupby(KEYS, sort=False).ngroup()
    return out.astype({"budget": "int32"})


def governing(section: Mapping[str, Any] | QuotaSettings, qt: QuotaType, tags: Tags
              ) -> tuple[float | None, EntityKey | None]:
    """The limit of a budget under a config, and the entity it comes from."""
    settings = section if isinstance(section, QuotaSettings) else settings_from_section(section)
    return quota_limit(settings.for_type(qt), tags)


def _name_str(name: Name | None) -> str | None:
    if name is None:
        return None
    return name if isinstance(name, str) else DEFAULT_NAME


def _name(value: Any) -> Name | None:
    if value is None:
        return None
    return DEFAULT if value == DEFAULT_NAME else str(value)


def whole_minutes(first_ms: int, last_ms: int, span_seconds: int = 60) -> tuple[int, int]:
    """The capture's whole minutes as [start, end) in seconds (Unix): from the first minute
    boundary at or after the first request to the last one at or before the last request
    (``span_seconds``: spans of that many seconds instead of minutes)."""
    span = span_seconds * 1000
    start = -(-int(first_ms) // span) * span_seconds
    end = (int(last_ms) // span) * span_seconds
    return start, max(start, end)


def sustained(values: np.ndarray, q: float) -> float:
    """The ``q`` quantile (linear, as ``numpy.quantile``) of per-second rates, over the
    seconds with traffic (0 when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[v > 0]
    return float(np.quantile(v, q)) if len(v) else 0.0


def budget_demand(seconds: pd.DataFrame, start_s: int, end_s: int, percentile: float,
                  span_seconds: int = 60) -> pd.DataFrame:
    """Per budget (``KEYS``) from its per-second values (``broker``, ``second``, ``value``):
    its demand (the ``percentile`` of its per-second values over the seconds with a value in
    the whole minutes [start_s, end_s), on its busiest broker: ``broker``), its peak second,
    the whole minutes and seconds with a value, and its total over the whole minutes.
    ``profile.budget_demand`` computes the same in Spark; ``offered_demand`` the same over the
    offered load's intervals."""
    columns = list(DEMAND_COLUMNS)
    if seconds.empty:
        return pd.DataFrame(columns=columns)
    codes = seconds.groupby(KEYS, dropna=False, sort=False).ngroup()
    rows = []
    for _, group in seconds.groupby(codes, sort=False):
        first = group.iloc[0]
        second = group["second"].to_numpy()
        whole = group[(second >= start_s) & (second < end_s) & (group["value"] > 0)]
        demand, broker = 0.0, int(first["broker"])
        for b, per_broker in whole.groupby("broker", sort=True):
            d = sustained(per_broker["value"].to_numpy(), percentile)
            if d > demand:
                demand, broker = d, int(b)
        minutes = int((whole["second"] // span_seconds).nunique()) * span_seconds / 60
        rows.append([*(first[k] for k in KEYS), broker, demand, float(group["value"].max()),
                     minutes, int(whole["second"].nunique()), float(whole["value"].sum())])
    out = pd.DataFrame(rows, columns=columns)
    return out.astype({"broker": "int32", "minutes": "float64", "seconds": "int32"})


# ------------------------------------------------------------------ offered load

# A client, in the offered-load tables: one connection of one (user, client-id) to one broker,
# in one proxy run, per quota type it records into.
CLIENT = ["quota_type", "run", "broker", "connection", "user", "client_id"]
SEGMENT_COLUMNS = [*CLIENT, "segment", "first_ms", "last_ms", "requests", "bytes",
                   "free_requests", "free_bytes", "rate", "free_rate", "offered"]
THROTTLES = ["throttle_produce_ms", "throttle_fetch_ms", "throttle_request_ms"]


def demand_requests(captures: pd.DataFrame, types: Iterable[str]) -> pd.DataFrame:
    """Per capture row (the capture's columns), one row per quota type of ``types`` it records
    into (``quota.recording``): its client (``CLIENT``), ``seq``, when the proxy read it
    (``read_ms``), when its response started (``resp_ms``: the record, and the start of any
    hold), when its bytes were counted off (``at_ms``: a Produce's batch when it was sent, a
    Fetch's response when the broker cut it, so at its response), what it recorded
    (``value``: bytes, or request time in percent of one thread x seconds) and the hold that
    followed it (``held_ms``: the largest of its three throttles, as the client was held)."""
    types = list(types)
    parts = demand_arrays(captures, types)
    if parts is None:
        return pd.DataFrame(columns=[*CLIENT, "seq", "read_ms", "resp_ms", "at_ms", "value",
                                     "held_ms"])
    kind = parts.pop("kind")
    return pd.DataFrame({"quota_type": np.asarray(types, dtype=object)[kind], **parts})


def demand_arrays(captures: pd.DataFrame, types: Iterable[str]) -> dict[str, Any] | None:
    """``demand_requests``' rows as numpy arrays (None for no type), the quota type as
    ``kind``, its index in ``types``: what the Spark pass (``entity_pass``) estimates from,
    without a column of names."""
    types = list(types)
    if not types:
        return None
    c = captures
    read = c["ts_ms"].to_numpy(dtype=np.float64)
    resp = read + np.maximum(c["duration_us"].to_numpy(dtype=np.float64), 0.0) / 1000.0
    held = np.maximum.reduce([c[t].to_numpy() for t in THROTTLES]).astype(np.float64)
    api_key = c["api_key"].to_numpy()
    response = c["response_bytes"].to_numpy()
    answered = ~c["follower"].to_numpy(dtype=bool) & (response >= 0)
    masks, values, ats = [], [], []
    for qt in types:
        if qt == "produce":
            mask, value, at = api_key == 0, c["request_bytes"].to_numpy() - 4.0, read
        elif qt == "fetch":
            mask, value, at = (api_key == 1) & answered, response - 4.0, resp
        else:
            rt = c["request_time_ms"].to_numpy(dtype=np.float64)
            elapsed = np.where(rt > 0, rt, c["duration_us"].to_numpy(dtype=np.float64) / 1000.0)
            mask, value, at = answered, elapsed / 10.0, read
        masks.append(mask)
        values.append(np.asarray(value, dtype=np.float64)[mask])
        ats.append(at[mask])
    rows = np.concatenate([np.flatnonzero(m) for m in masks])
    out: dict[str, Any] = {
        "kind": np.concatenate([np.full(int(m.sum()), i, dtype=np.int32)
                                for i, m in enumerate(masks)])}
    for column in ("run", "broker", "connection", "user", "client_id", "seq"):
        out[column] = c[column].to_numpy()[rows]
    out.update({"read_ms": read[rows], "resp_ms": resp[rows], "at_ms": np.concatenate(ats),
                "value": np.concatenate(values), "held_ms": held[rows]})
    return out


def _traffic_ms(n: Any, first: Any, last: Any, min_ms: float) -> Any:
    """The time ``n`` requests from ``first`` to ``last`` stand for (``n`` requests ``d``
    apart: ``n x d``), at least ``min_ms``."""
    n = np.asarray(n, dtype="float64")
    span = np.where(n > 1, (np.asarray(last) - np.asarray(first)) * n / np.maximum(n - 1, 1),
                    0.0)
    return np.maximum(span, min_ms)


def _shifted(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each row's previous row's value within its run (``first``: a run's first row): NaN at
    a run's first row."""
    out = np.empty(len(values))
    out[0] = np.nan
    out[1:] = values[:-1]
    out[first] = np.nan
    return out


def _running(op: np.ufunc, values: np.ndarray, run: np.ndarray) -> np.ndarray:
    """``op`` (``np.maximum`` or ``np.minimum``) accumulated over each run of rows (``run``:
    its number, ascending), NaN values skipped (NaN until a run's first value). Exact: the
    values are ranked (their order is all an extreme needs) and each run's ranks are set above
    every earlier run's, so one accumulation over all rows never carries a value across runs."""
    out = np.full(len(values), np.nan)
    present = ~np.isnan(values)
    if not present.any():
        return out
    distinct, rank = np.unique(values[present], return_inverse=True)
    width = len(distinct) + 1
    ranks = np.zeros(len(values), dtype=np.int64)  # 0: no value yet
    ranks[present] = (rank + 1) if op is np.maximum else (width - 1 - rank)
    keyed = np.maximum.accumulate(run.astype(np.int64) * width + ranks) - run * width
    found = keyed > 0
    index = keyed[found] - 1 if op is np.maximum else width - 1 - keyed[found]
    out[found] = distinct[index]
    return out


def offered_load(requests: pd.DataFrame, idle_ms: float = 11_000.0,
                 min_ms: float = 1000.0) -> pd.DataFrame:
    """Each client's offered load (what it would have sent had nothing held it back), per
    *segment* of its requests (``demand_requests``): the estimator of ``tune`` (the module's
    docstring; ``entity_pass`` runs it in Spark).

    - A segment ends when the client pauses (reads no request) for more than ``idle_ms`` after
      its last request's response and hold: a client that is absent offers nothing, and its
      absence is not counted as offering zero. It also ends, once the client has been held
      back, at its first request read more than ``idle_ms`` after its last hold ended (free
      again: the quota window forgot it).
    - ``free``: the requests of a segment read before its first hold began (the response that
      carried the first throttle, of the requests read so far). They left as the client
      offered them: nothing queued behind a hold yet. ``free_rate``: their bytes over their
      traffic time (``_traffic_ms``, at least ``min_ms``).
    - ``rate``: the segment's bytes over its traffic time: what got through, a floor.
    - ``offered`` = max(``free_rate``, ``rate``). A client never held back: its plain rate.
    """
    if requests.empty:
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    order = [*CLIENT, "read_ms", "seq"]
    if all(pd.api.types.is_numeric_dtype(requests[k]) for k in order):
        # numbers (the client's names as Spark moves them): numpy's sort, without pandas'
        # factorizing eight keys (the same order: a stable sort)
        r = requests.iloc[np.lexsort([requests[k].to_numpy() for k in reversed(order)])]
        r = r.reset_index(drop=True)
    else:
        r = requests.sort_values(order).reset_index(drop=True)
    # The rows are in order of client, then read: each client is a run of rows (``first``:
    # its first row), and so is each segment of it. numpy over those runs, where pandas'
    # groupby factorized the clients again at every step (3 x the time).
    n = len(r)
    first = np.zeros(n, dtype=bool)
    first[0] = True
    for k in CLIENT:
        column = r[k].to_numpy()
        first[1:] |= column[1:] != column[:-1]
    client = np.cumsum(first) - 1
    read = r["read_ms"].to_numpy(dtype=np.float64)
    resp = r["resp_ms"].to_numpy(dtype=np.float64)
    held = r["held_ms"].to_numpy(dtype=np.float64)
    end = resp + held  # the last moment the request held the client
    before = _shifted(_running(np.maximum, end, client), first)
    held_before = _shifted(_running(np.maximum, np.where(held > 0, end, np.nan), client), first)
    previous = _shifted(read, first)
    with np.errstate(invalid="ignore"):
        starts = (np.isnan(before) | (read - before > idle_ms)
                  | (~np.isnan(held_before) & (read - held_before > idle_ms)
                     & (previous - held_before <= idle_ms)))
    segment_id = np.cumsum(starts) - 1  # (every client's first row starts a segment)
    heads = np.flatnonzero(starts)
    # the first hold of the segment among the requests read so far (a request read later
    # cannot have started a hold before this one was read)
    hold_from = _running(np.minimum, np.where(held > 0, resp, np.nan), segment_id)
    with np.errstate(invalid="ignore"):
        free = np.isnan(hold_from) | (read < hold_from)
    at = r["at_ms"].to_numpy(dtype=np.float64)
    value = r["value"].to_numpy(dtype=np.float64)
    count = np.diff(np.r_[heads, n])
    free_at = np.where(free, at, np.nan)
    out = r.loc[heads, list(CLIENT)].reset_index(drop=True)
    out["segment"] = (segment_id[heads] - segment_id[heads[np.flatnonzero(first[heads])]][
        client[heads]] + 1)
    out["first_ms"] = np.minimum.reduceat(at, heads)
    out["last_ms"] = np.maximum.reduceat(at, heads)
    out["requests"] = count
    out["bytes"] = np.add.reduceat(value, heads)
    out["free_requests"] = np.add.reduceat(free.astype(np.int64), heads)
    out["free_bytes"] = np.add.reduceat(np.where(free, value, 0.0), heads)
    out["free_first"] = np.fmin.reduceat(free_at, heads)
    out["free_last"] = np.fmax.reduceat(free_at, heads)
    out["rate"] = out["bytes"] * 1000.0 / _traffic_ms(out["requests"], out["first_ms"],
                                                      out["last_ms"], min_ms)
    out["free_rate"] = out["free_bytes"] * 1000.0 / _traffic_ms(
        out["free_requests"], out["free_first"], out["free_last"], min_ms)
    out["offered"] = np.maximum(out["rate"], out["free_rate"])
    return out[SEGMENT_COLUMNS].astype({"segment": "int64", "requests": "int64",
                                        "free_requests": "int64"})


INTERVAL_COLUMNS = [*KEYS, "broker", "start_s", "end_s", "value", "clients"]


def offered_intervals(segments: pd.DataFrame, mapping: pd.DataFrame) -> pd.DataFrame:
    """Per budget (``KEYS``, by ``mapping``: ``budget_mapping``) and broker, its offered load
    over time as intervals of whole seconds [``start_s``, ``end_s``] in which it is constant:
    ``value``, the sum of the offered loads of its ``clients`` present (a client's segment
    counts in every second from its first request to its last, the next segment of the same
    client taking over the second they share). Only seconds with a client present. From
    ``offered_load``'s segments (Spark's ``entity_pass`` too: the same code
    then takes over)."""
    if segments.empty:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    seg = segments.sort_values([*CLIENT, "segment"]).reset_index(drop=True)
    start = np.floor(seg["first_ms"].to_numpy(dtype="float64") / 1000.0).astype("int64")
    last = np.floor(seg["last_ms"].to_numpy(dtype="float64") / 1000.0).astype("int64")
    following = pd.Series(start).groupby([seg[k] for k in CLIENT], sort=False).shift(-1)
    end = np.where(following.isna(), last,
                   np.minimum(last, following.fillna(0).to_numpy(dtype="int64") - 1))
    named = seg.assign(start_s=start, end_s=end)[end >= start].merge(
        mapping[["user", "client_id", *KEYS]], on=["user", "client_id", "quota_type"])
    if named.empty:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    group = [*KEYS, "broker"]
    events = pd.concat([
        named[group].assign(second=named["start_s"], value=named["offered"], clients=1),
        named[group].assign(second=named["end_s"] + 1, value=-named["offered"], clients=-1)],
        ignore_index=True)
    events = events.groupby([*group, "second"], sort=True).agg(
        value=("value", "sum"), clients=("clients", "sum")).reset_index()
    by = [events[k] for k in group]
    events["value"] = events["value"].groupby(by, sort=False).cumsum()
    events["clients"] = events["clients"].groupby(by, sort=False).cumsum()
    events["end_s"] = events["second"].groupby(by, sort=False).shift(-1) - 1
    out = events[(events["clients"] > 0) & events["end_s"].notna()].rename(
        columns={"second": "start_s"})
    return out.astype({"end_s": "int64"})[INTERVAL_COLUMNS].reset_index(drop=True)


def offered_demand(intervals: pd.DataFrame, start_s: int, end_s: int, percentile: float,
                   span_seconds: int = 60) -> pd.DataFrame:
    """``budget_demand`` over the budgets' offered load (``offered_intervals``): per budget,
    its demand (the ``percentile``, linear as ``numpy.quantile``, of its offered load over the
    seconds with clients present in the whole minutes [start_s, end_s), on its busiest broker:
    ``broker``), its peak (the largest offered load), the whole minutes and seconds with
    clients present, and its total (offered load x seconds) over the whole minutes: what
    ``budget_demand`` gives over the same load second by second, without a row per second."""
    columns = list(DEMAND_COLUMNS)
    if intervals.empty:
        return pd.DataFrame(columns=columns)
    iv = intervals.reset_index(drop=True)
    budget = iv.groupby(KEYS, sort=False).ngroup().to_numpy()
    lo = np.maximum(iv["start_s"].to_numpy(dtype="int64"), start_s)
    hi = np.minimum(iv["end_s"].to_numpy(dtype="int64"), end_s - 1)
    inside = hi >= lo
    whole = pd.DataFrame({"budget": budget[inside], "broker": iv["broker"].to_numpy()[inside],
                          "lo": lo[inside], "hi": hi[inside],
                          "value": iv["value"].to_numpy(dtype="float64")[inside]})
    whole["length"] = whole["hi"] - whole["lo"] + 1
    names = iv[KEYS].assign(budget=budget).drop_duplicates("budget").set_index("budget")
    out = names.assign(
        peak=pd.Series(iv["value"].to_numpy(dtype="float64"), index=budget).groupby(
            level=0).max())
    # the percentile per (budget, broker): the values in order, each as many times as seconds
    ranked = whole.sort_values(["budget", "broker", "value"], kind="stable")
    cells = ranked.groupby(["budget", "broker"], sort=False)
    upto = cells["length"].cumsum().to_numpy()
    size = cells["length"].transform("sum").to_numpy()
    offset = np.cumsum(ranked["length"].to_numpy()) - upto  # seconds of the cells before
    cell = ranked[["budget", "broker"]].assign(n=size, offset=offset).drop_duplicates(
        ["budget", "broker"])
    h = (cell["n"].to_numpy() - 1) * percentile
    i = np.floor(h).astype("int64")
    total_upto = np.cumsum(ranked["length"].to_numpy())
    values = ranked["value"].to_numpy()
    base = cell["offset"].to_numpy()
    a = values[np.searchsorted(total_upto, base + i, side="right")]
    b = values[np.searchsorted(total_upto, base + np.minimum(i + 1, cell["n"].to_numpy() - 1),
                               side="right")]
    cell = cell.assign(demand=a + (b - a) * (h - i))
    every = pd.DataFrame({"budget": budget, "broker": iv["broker"].to_numpy()}).drop_duplicates()
    per_broker = every.merge(cell[["budget", "broker", "demand"]], how="left").fillna(
        {"demand": 0.0})
    busiest = (per_broker.sort_values(["budget", "demand", "broker"],
                                      ascending=[True, False, True])
               .drop_duplicates("budget").set_index("budget"))
    out = out.join(busiest[["broker", "demand"]])
    # seconds and spans with a client present, over every broker: the union of the intervals
    merged = whole.sort_values(["budget", "lo"], kind="stable")
    by = merged["budget"]
    reach = merged["hi"].groupby(by, sort=False).cummax().groupby(by, sort=False).shift()
    block = (reach.isna() | (merged["lo"] > reach + 1)).cumsum()
    blocks = merged.assign(block=block).groupby("block", sort=False).agg(
        budget=("budget", "first"), lo=("lo", "min"), hi=("hi", "max"))
    first_span, last_span = blocks["lo"] // span_seconds, blocks["hi"] // span_seconds
    shared = (first_span == last_span.groupby(blocks["budget"], sort=False).shift()).astype(
        "int64")
    blocks = blocks.assign(seconds=blocks["hi"] - blocks["lo"] + 1,
                           spans=last_span - first_span + 1 - shared)
    covered = blocks.groupby("budget")[["seconds", "spans"]].sum()
    out = out.join(covered).fillna({"seconds": 0, "spans": 0})
    out["minutes"] = out["spans"] * span_seconds / 60
    out["total"] = (whole["value"] * whole["length"]).groupby(whole["budget"]).sum()
    out["total"] = out["total"].fillna(0.0)
    return out.reset_index(drop=True)[columns].astype(
        {"broker": "int32", "minutes": "float64", "seconds": "int32", "demand": "float64",
         "peak": "float64", "total": "float64"})


# ------------------------------------------------------------------ the recommendation


@dataclass
class Recommendation:
    """A ``quotas`` section, and why: one row per (entity, quota type), the totals, notes."""

    section: dict[str, Any]
    entities: pd.DataFrame  # entity, quota, live, recommended, budgets, demand, basis
    totals: pd.DataFrame  # quota, budgets, demand, live_total, recommended_total
    notes: list[str] = field(default_factory=list)
    rule: str = ""
    whole_minutes: float = 0
    why: list[str] = field(default_factory=list)  # one line per entity (``reasons``)


def reasons(rec: Recommendation,
            held: Mapping[tuple[str, str], tuple[int, int]] | None = None) -> list[str]:
    """One line per (entity, quota type) of ``rec``: its value, live -> recommended, and why.
    ``held``: (entity path, quota) -> the throttled client-seconds of the clients it governs,
    recorded and replayed under the recommendation."""
    lines = []
    for r in rec.entities.to_dict("records"):
        qt = QuotaType(str(r["quota"]))
        live, new, demand = r["live"], r["recommended"], r["demand"]
        head = f"{r['entity']} {qt.value}: "
        if live is None or live != live:
            head += f"new, {_amount(qt, float(new))}"
        elif new == live:
            head += f"{_amount(qt, float(live))} kept"
        else:
            head += f"{_amount(qt, float(live))} -> {_amount(qt, float(new))}"
        if demand is None or demand != demand:
            lines.append(f"{head} ({r['basis']})")
            continue
        demand = float(demand)
        if live is None or live != live:
            why = f"its clients offered {_amount(qt, demand)}"
        elif demand > float(live):
            why = f"its clients offered {_amount(qt, demand)}, more than the live quota"
        else:
            why = (f"its clients offered {_amount(qt, demand)}, {demand / float(live):.0%} of "
                   f"the live quota")
        before_after = (held or {}).get((str(r["entity"]), qt.value))
        if before_after is not None and (before_after[0] or before_after[1]):
            why += (f"; throttled client-seconds {before_after[0]:,} recorded, "
                    f"{before_after[1]:,} replayed under the recommendation")
        lines.append(f"{head}: {why} ({r['basis']})")
    return lines


@dataclass
class _Budget:
    qt: QuotaType
    tags: Tags
    entity: EntityKey | None
    demand: float
    minutes: float

    @property
    def path(self) -> str:
        key = _override_key(self.tags)
        return key.path if key is not None else "(no client-id)"


def _budgets(demand: pd.DataFrame, settings: QuotaSettings) -> list[_Budget]:
    out = []
    for r in demand.to_dict("records"):
        qt = QuotaType.from_short(str(r["quota_type"]))
        tags = (str(r["budget_user"]), str(r["budget_client"]))
        entity = governing(settings, qt, tags)[1]
        out.append(_Budget(qt, tags, entity, float(r["demand"]), float(r["minutes"])))
    return out


def _override_key(tags: Tags) -> EntityKey | None:
    """The entity that names exactly this budget: its own level."""
    user, client = tags
    if not user and not client:
        return None
    return EntityKey(user or None, client or None)


def _is_default(key: EntityKey) -> bool:
    return key.user is DEFAULT or key.client_id is DEFAULT


def _entry_key(entry: Mapping[str, Any]) -> EntityKey:
    return EntityKey(_name(entry.get("user")),
                     _name(entry.get("client-id", entry.get("client_id"))))


def _value(qt: QuotaType, v: float, options: TuneOptions) -> float:
    """Rounded down (so that a scaled total stays within its cap), within the floor and cap."""
    if qt is QuotaType.REQUEST:
        v = min(v, options.max_request_percentage)
        return max(math.floor(v * 10) / 10, options.min_request_percentage)
    return float(max(math.floor(v), options.min_rate))


def _show(qt: QuotaType, v: float | None) -> Any:
    if v is None:
        return None
    return round(v, 1) if qt is QuotaType.REQUEST else int(v)


def _amount(qt: QuotaType, v: float) -> str:
    if qt is QuotaType.REQUEST:
        return f"{v:.1f}%"
    return f"{v / 1e6:.2f} MB/s" if v >= 1e5 else f"{v / 1e3:.1f} kB/s"


def retune(base: Mapping[str, Any], demand: pd.DataFrame, pairs: Iterable[tuple[str, str]],
           options: TuneOptions = TuneOptions(), minutes: float = 0) -> Recommendation:
    """The base config (a ``quotas`` section) with values from the budgets' demands
    (``offered_demand`` under the base config's resolution, ``budget_mapping``) over a capture
    of ``minutes`` whole minutes; ``pairs``: the capture's (user, client-id) pairs, none of
    which may move to another budget. See the module's docstring for the rule."""
    entries = [dict(e) for e in base.get("entities") or []]
    settings = settings_from_section(base)
    if not settings.entities:
        return _from_scratch(base, demand, options, minutes)
    budgets = _budgets(demand, settings)
    seen = list(pairs)
    notes: list[str] = []
    values: dict[tuple[EntityKey, QuotaType], float] = {}
    new: dict[tuple[EntityKey, QuotaType], float] = {}
    tuned: set[tuple[EntityKey, QuotaType]] = set()
    basis: dict[tuple[EntityKey, QuotaType], tuple[int, float | None, str]] = {}
    short = minutes < options.min_minutes or minutes <= 0
    if short:
        notes.append(f"capture too short: {minutes:g} whole minutes < min_minutes "
                     f"({options.min_minutes:g}): kept live values" if minutes > 0 else
                     "capture too short: no whole minute (--span-seconds counts shorter "
                     "spans): kept live values")
    for qt in QuotaType:
        quotas = settings.for_type(qt)
        mine = [b for b in budgets if b.qt is qt]
        unlimited = [b for b in mine if b.entity is None]
        if quotas and unlimited:
            notes.append(f"{len(unlimited)} budget(s) have no {qt.value} under the base config "
                         f"(e.g. {unlimited[0].path}): left unlimited")
        for key, live in quotas.items():
            values[(key, qt)] = live
            governed = [b for b in mine if b.entity == key]
            # (a budget with no whole span of traffic has no demand to set a value from,
            # whatever min_minutes allows)
            supported = [b for b in governed if b.minutes >= options.min_minutes
                         and b.minutes > 0]
            if short:
                basis[(key, qt)] = (len(governed), None, "kept: capture too short")
                continue
            if not governed:
                basis[(key, qt)] = (0, None, "kept: no traffic")
                continue
            if not supported:
                most = max(b.minutes for b in governed)
                if most <= 0:
                    basis[(key, qt)] = (len(governed), None, "kept: no whole span of traffic")
                    continue
                basis[(key, qt)] = (len(governed), None,
                                    f"kept: {most:g} whole minutes of data < "
                                    f"{options.min_minutes:g}")
                notes.append(f"{key.path} {qt.value}: only {most:g} whole minutes of data < "
                             f"min_minutes ({options.min_minutes:g}): kept the live value")
                continue
            tuned.add((key, qt))
            if not _is_default(key):
                d = supported[0].demand
                values[(key, qt)] = _value(qt, options.headroom * d, options)
                basis[(key, qt)] = (len(governed), d, f"{options.headroom:g} x demand")
                continue
            demands = sorted(b.demand for b in supported)
            typical = float(np.quantile(demands, options.default_percentile, method="lower"))
            default = _value(qt, options.headroom * typical, options)
            values[(key, qt)] = default
            basis[(key, qt)] = (len(governed), typical,
                                f"{options.headroom:g} x p{_pct(options.default_percentile)} "
                                f"of {len(supported)} budgets' demands")
            above = sorted((b for b in supported if b.demand > default),
                           key=lambda b: -b.demand)
            beyond = above[options.max_overrides:]
            if beyond:
                notes.append(f"{key.path} {qt.value}: {len(beyond)} more budget(s) above the "
                             f"default than max_overrides ({options.max_overrides}) allows "
                             f"(e.g. {beyond[0].path}, demand {_amount(qt, beyond[0].demand)}):"
                             f" no override for them")
            for b in above[:options.max_overrides]:
                okey = _override_key(b.tags)
                if okey is None or not _allowed(okey, quotas):
                    notes.append(f"{b.path} {qt.value}: demand {_amount(qt, b.demand)} above "
                                 f"the default, but an override there would move other "
                                 f"clients to another budget: none added")
                    continue
                new[(okey, qt)] = _value(qt, options.headroom * b.demand, options)
                tuned.add((okey, qt))
                basis[(okey, qt)] = (1, b.demand,
                                     f"new override: demand {_amount(qt, b.demand)} > default "
                                     f"{_amount(qt, default)} ({key.path})")
    _keep_sharing(settings, entries, values, new, tuned, basis, seen, notes)
    totals = _cap_totals(settings, budgets, values, new, tuned, basis, options, notes)
    section = _section(base, entries, values, new)
    rows = []
    for (key, qt), (count, dem, why) in basis.items():
        was = settings.for_type(qt).get(key)
        rec = new.get((key, qt), values.get((key, qt)))
        rows.append({"entity": key.path, "quota": qt.value, "live": _show(qt, was),
                     "recommended": _show(qt, rec), "budgets": count,
                     "demand": _show(qt, dem), "basis": why})
    table = pd.DataFrame(rows, columns=["entity", "quota", "live", "recommended", "budgets",
                                        "demand", "basis"])
    return Recommendation(section, table, totals, notes, rule_text(options), minutes)


def _allowed(key: EntityKey, quotas: Mapping[EntityKey, float]) -> bool:
    """Whether an override at ``key`` changes no one's budget but the one it is for: a user
    override would take that user's clients from any ``users/<default>/clients/C`` entry."""
    if key.client_id is None:
        return not any(k.user is DEFAULT and isinstance(k.client_id, str) for k in quotas)
    return True


def _keep_sharing(settings: QuotaSettings, entries: list[dict[str, Any]],
                  values: dict[tuple[EntityKey, QuotaType], float],
                  new: dict[tuple[EntityKey, QuotaType], float],
                  tuned: set[tuple[EntityKey, QuotaType]],
                  basis: dict[tuple[EntityKey, QuotaType], tuple[int, float | None, str]],
                  pairs: list[tuple[str, str]], notes: list[str]) -> None:
    """Drop any new override under which a (user, client-id) of the capture would record into
    another budget than under the base config."""
    while new:
        rec = settings_from_section({"entities": _entities(entries, values, new)})
        moved = None
        for qt in QuotaType:
            before, after = settings.for_type(qt), rec.for_type(qt)
            for user, client_id in pairs:
                if metric_tags(before, user, client_id)[0] != metric_tags(after, user,
                                                                          client_id)[0]:
                    found = resolve(after, qt, user, client_id).entity
                    if found is not None and (found, qt) in new:
                        moved = (found, qt)
                        break
            if moved:
                break
        if moved is None:
            return
        del new[moved]
        tuned.discard(moved)
        basis.pop(moved, None)
        notes.append(f"{moved[0].path} {moved[1].value}: an override there would move other "
                     f"clients to another budget: none added")


def _cap_totals(settings: QuotaSettings, budgets: list[_Budget],
                values: dict[tuple[EntityKey, QuotaType], float],
                new: dict[tuple[EntityKey, QuotaType], float],
                tuned: set[tuple[EntityKey, QuotaType]],
                basis: dict[tuple[EntityKey, QuotaType], tuple[int, float | None, str]],
                options: TuneOptions, notes: list[str]) -> pd.DataFrame:
    """Per quota type, the sum of the limits over the budgets seen, live and recommended;
    values set from data are scaled down together to keep the recommended sum within the
    live one (``total_budget="keep"``) and ``capacity_bytes``."""
    rows = []
    for qt in QuotaType:
        live_quotas = settings.for_type(qt)
        mine = [b for b in budgets if b.qt is qt and b.entity is not None]
        if not live_quotas or not mine:
            continue

        def limit(k: tuple[EntityKey, QuotaType]) -> float:
            return new.get(k, values.get(k, 0.0))

        live_total = sum(quota_limit(live_quotas, b.tags)[0] or 0.0 for b in mine)
        keys = [_governed_by(b, new) for b in mine]
        fixed = sum(limit(k) for k in keys if k not in tuned)
        free = sum(limit(k) for k in keys if k in tuned)
        cap = live_total if options.total_budget == "keep" else math.inf
        capacity = (options.capacity_bytes or {}).get(qt.short)
        if capacity:
            cap = min(cap, capacity)
        if free > 0 and fixed + free > cap:
            scale = max(0.0, (cap - fixed) / free)
            notes.append(f"{qt.value}: the budgets' limits would sum to "
                         f"{_amount(qt, fixed + free)} > {_amount(qt, cap)} (the "
                         f"{'live total' if cap == live_total else 'capacity'}): the values "
                         f"set from data are scaled by {scale:.2f}")
            for k in [k for k in tuned if k[1] is qt]:
                table = new if k in new else values
                table[k] = _value(qt, table[k] * scale, options)
                count, dem, why = basis[k]
                basis[k] = (count, dem, f"{why}, x {scale:.2f} (total)")
        rec_total = sum(limit(k) for k in keys)
        rows.append({"quota": qt.value, "budgets": len(mine),
                     "demand": _show(qt, sum(b.demand for b in mine)),
                     "live_total": _show(qt, live_total),
                     "recommended_total": _show(qt, rec_total)})
    return pd.DataFrame(rows, columns=["quota", "budgets", "demand", "live_total",
                                       "recommended_total"])


def _governed_by(b: _Budget, new: Mapping[tuple[EntityKey, QuotaType], float]
                 ) -> tuple[EntityKey, QuotaType]:
    """The (entity, quota type) whose value limits a budget under the recommendation."""
    own = _override_key(b.tags)
    if own is not None and (own, b.qt) in new:
        return own, b.qt
    assert b.entity is not None
    return b.entity, b.qt


def _entities(entries: list[dict[str, Any]], values: dict[tuple[EntityKey, QuotaType], float],
              new: dict[tuple[EntityKey, QuotaType], float]) -> list[dict[str, Any]]:
    """The base entries in their order with the new values, then the new overrides (merged
    into a base entry at the same key, if there is one). Client-ids as ``client-id``, as the
    configuration documents them (``client_id`` is accepted too)."""
    out = []
    index: dict[EntityKey, dict[str, Any]] = {}
    for entry in entries:
        e = {("client-id" if k == "client_id" else k): v for k, v in entry.items()}
        key = _entry_key(e)
        for qt in QuotaType:
            if e.get(qt.value) is not None and (key, qt) in values:
                e[qt.value] = _show(qt, values[(key, qt)])
        index[key] = e
        out.append(e)
    added: dict[EntityKey, dict[str, Any]] = {}
    for (key, qt), v in new.items():
        target = index.get(key) or added.get(key)
        if target is None:
            target = added[key] = {}
            if key.user is not None:
                target["user"] = _name_str(key.user)
            if key.client_id is not None:
                target["client-id"] = _name_str(key.client_id)
        target[qt.value] = _show(qt, v)
    return out + [added[k] for k in sorted(added, key=lambda k: k.path)]


def _section(base: Mapping[str, Any], entries: list[dict[str, Any]],
             values: dict[tuple[EntityKey, QuotaType], float],
             new: dict[tuple[EntityKey, QuotaType], float]) -> dict[str, Any]:
    section: dict[str, Any] = {"window": dict(base.get("window") or
                                              {"samples": 11, "size_seconds": 1})}
    if "cap_byte_rate_throttle" in base:
        section["cap_byte_rate_throttle"] = base["cap_byte_rate_throttle"]
    section["entities"] = _entities(entries, values, new)
    return section


def _from_scratch(base: Mapping[str, Any], demand: pd.DataFrame, options: TuneOptions,
                  minutes: float) -> Recommendation:
    """No quota in the base config: a ``client-id: <default>`` and overrides (``recommend``)
    from the per-client-id budgets' sustained demands."""
    notes = ["the base config has no quota: a default per client-id and overrides for the "
             "outliers are proposed"]
    frame = pd.DataFrame(columns=["client_id", *KINDS_COLUMNS])
    if minutes < options.min_minutes:
        notes.append(f"capture too short: {minutes:g} whole minutes < min_minutes "
                     f"({options.min_minutes:g}): no quota proposed")
    else:
        usable = demand[(demand["minutes"] >= options.min_minutes)
                        & (demand["budget_client"] != "") & (demand["budget_user"] == "")]
        if not usable.empty:
            wide = usable.pivot_table(index="budget_client", columns="quota_type",
                                      values="demand", aggfunc="max")
            frame = pd.DataFrame({"client_id": wide.index})
            for kind, column in zip(("produce", "fetch", "request"), KINDS_COLUMNS,
                                    strict=True):
                frame[column] = (wide[kind].to_numpy() if kind in wide.columns
                                 else np.zeros(len(wide)))
    section: dict[str, Any] = recommend(frame, options) if not frame.empty else {
        "window": {"samples": 11, "size_seconds": 1}, "entities": []}
    section["window"] = dict(base.get("window") or section["window"])
    rows = []
    for e in section["entities"]:
        key = _entry_key(e)
        for qt in QuotaType:
            if e.get(qt.value) is not None:
                rows.append({"entity": key.path, "quota": qt.value, "live": None,
                             "recommended": e[qt.value], "budgets": None, "demand": None,
                             "basis": "proposed (no quota in the base config)"})
    table = pd.DataFrame(rows, columns=["entity", "quota", "live", "recommended", "budgets",
                                        "demand", "basis"])
    totals = pd.DataFrame(columns=["quota", "budgets", "demand", "live_total",
                                   "recommended_total"])
    return Recommendation(section, table, totals, notes, rule_text(options), minutes)


# ------------------------------------------------------------------ from scratch (seed 000)

KINDS = {"produce": ("produce_rate_p99", "producer_byte_rate"),
         "fetch": ("fetch_rate_p99", "consumer_byte_rate")}
KINDS_COLUMNS = ["produce_rate_p99", "fetch_rate_p99", "request_percentage_p99"]


def recommend(profile: pd.DataFrame, options: TuneOptions = TuneOptions()) -> dict[str, Any]:
    """A ``quotas`` section (window, entities) from per-client-id demands (``client_id`` and
    the ``KINDS_COLUMNS``), for a base with no quota: defaults for everyone plus overrides for
    the top outliers, as seed 000 suggests.

    - The default (``client-id: <default>``) is ``headroom`` x the ``default_percentile`` of
      the client-ids' demands: most clients never meet it.
    - Client-ids whose demand is above the default (at most ``max_overrides``, biggest first)
      get an override of ``headroom`` x their demand.
    - With a ``capacity`` per broker (bytes/s), defaults and overrides are scaled down together
      when the client-ids, each at its quota, would exceed it.
    - request_percentage gets a default the same way, at most 100 x ``broker_threads``.
    """
    default: dict[str, Any] = {"client-id": DEFAULT_ENTITY}
    overrides: dict[str, dict[str, Any]] = {}
    for kind, (column, key) in KINDS.items():
        demand = profile.set_index("client_id")[column].fillna(0.0)
        demand = demand[demand > 0]
        if demand.empty:
            continue
        base = max(options.headroom * float(demand.quantile(options.default_percentile)),
                   options.min_rate)
        above = demand[demand > base].sort_values(ascending=False)  # the default throttles them
        chosen = {cid: max(options.headroom * float(rate), options.min_rate)
                  for cid, rate in above.head(options.max_overrides).items()}
        capacity = (options.capacity_bytes or {}).get(kind)
        if capacity:
            others = len(demand) - len(chosen)
            total = base * others + sum(chosen.values())
            if total > capacity:
                scale = capacity / total
                base *= scale
                chosen = {c: r * scale for c, r in chosen.items()}
        default[key] = int(base)
        for cid, rate in chosen.items():
            if cid == DEFAULT_ENTITY:
                continue
            overrides.setdefault(cid, {"client-id": cid})[key] = int(rate)
    share = profile["request_percentage_p99"].fillna(0.0)
    share = share[share > 0]
    if not share.empty:
        default["request_percentage"] = round(min(
            max(options.headroom * float(share.quantile(options.default_percentile)), 1.0),
            options.max_request_percentage), 1)
    entities = ([default] if len(default) > 1 else []) + [
        overrides[c] for c in sorted(overrides)]
    return {"window": {"samples": 11, "size_seconds": 1}, "entities": entities}
