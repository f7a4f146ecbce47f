"""One pass over the capture's requests for everything the jobs compute per (user,
client-id): the profile (``profile.per_second_profile``, with the replay's peaks), each
entity's bytes per broker (which budgets the report draws), the throttles the proxy recorded,
and, when tuning, the load its clients offered (``tune.offered_load``).

Spark moves each request once, as a few 64-bit numbers (``packed``), into groups of whole
entities (``ENTITY_GROUPS``: by the entity's hash). The Python workers unpack them (numpy) and
compute, per group: the per-second rows (``per_second_rows``: what ``profile.entity_seconds``
sums, in the same way), the profile from them, the recorded throttles, and the offered-load
segments of each client (one connection of the entity) with tune's own code, so the Spark
estimator and the pandas one cannot differ. The results come back as one frame, told apart by
``part`` (``split``).

Before, each was a pass of its own (the per-second rows aggregated and cached in Spark, the
profile from them, the offered load from a second shuffle of every request, the recorded
throttles): 72 task-seconds on the bench's 10 M requests against 31 now, most of them Spark
building, moving and caching rows that the Python workers then read again."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_quota_proxy.spark_jobs.profile import PROFILE, QUOTA_TYPES, per_second_profile
from kafka_quota_proxy.spark_jobs.replay import Names
from kafka_quota_proxy.spark_jobs.tune import (
    SEGMENT_COLUMNS,
    THROTTLES,
    demand_arrays,
    offered_load,
)

ENTITY_GROUPS = 32  # groups of entities: work for every core, few calls into Python
# ``part``: which result a row belongs to
PROFILE_PART, SEGMENT_PART, BYTES_PART, RECORDED_PART = 0, 1, 2, 3
BUCKET_MS = 100  # the recorded throttles' buckets (``profile.recorded_throttles``')
_LOW32 = 0xFFFFFFFF
_PROFILE_COLUMNS = [c.split()[0] for c in PROFILE.split(", ")]  # entity first
_SEGMENT_FIGURES = ["segment", "first_ms", "last_ms", "requests", "bytes", "free_requests",
                    "free_bytes", "rate", "free_rate", "offered"]
# One schema for the three results: the profile's columns, a segment's (``kind``, the quota
# type's index in ``QUOTA_TYPES``; ``run_id``, the run's hash; ``requests`` shared with the
# profile), and an entity's bytes on one broker (``produce_total``, ``fetch_total``: its
# per-second produce and fetch bytes summed where above zero, as ``profile.budget_seconds``
# keeps them), and the throttles recorded per entity and bucket (``bucket_ms``,
# ``throttle_ms``, with ``requests`` and ``moved``: ``profile.recorded_throttles``'). Columns
# that are not a row's own are 0 (numbers) or NaN.
SCHEMA = ", ".join([
    "part int", *[c for c in PROFILE.split(", ")],
    "broker int", "kind int", "run_id long", "connection long", "segment long",
    "first_ms double", "last_ms double", "bytes double", "free_requests long",
    "free_bytes double", "rate double", "free_rate double", "offered double",
    "produce_total double", "fetch_total double", "bucket_ms int", "throttle_ms long"])
_SCHEMA_COLUMNS = [c.split()[0] for c in SCHEMA.split(", ")]
_INTEGERS = [c.split()[0] for c in SCHEMA.split(", ") if c.split()[1] in ("int", "long")]


def packed(captures: DataFrame, names: Names, request_time: bool) -> list[Column]:
    """The request columns the pass reads, as numbers (unpacked by ``unpacked``):

    - ``group``: the entity's group (``ENTITY_GROUPS``), what Spark groups by;
    - ``entity`` (the (user, client-id) hash of ``replay.catalog_of``), ``connection``,
      ``seq``, ``ts_ms`` and ``duration_us`` as they are;
    - ``meta``: run << 40 | broker (32 bits, -1 included) << 8 | follower << 2 | kind, where
      run is the run's index among the capture's runs by name and kind 0 a Produce, 1 a
      Fetch, 2 any other request;
    - ``sizes``: request_bytes << 32 | response_bytes (32 bits, -1 included);
    - ``held``: the largest of the three recorded throttles (as the client was held);
    - ``request_time_ms`` only when ``request_time`` (the offered load of request quotas)."""
    runs = F.create_map(*[F.lit(x) for i, run in enumerate(sorted(names.runs.values()))
                          for x in (run, i)])
    kind = (F.when(F.col("api_key") == 0, F.lit(0)).when(F.col("api_key") == 1, F.lit(1))
            .otherwise(F.lit(2)).cast("long"))
    meta = (runs[F.col("run")].cast("long") * (1 << 40)
            + F.col("broker").cast("long").bitwiseAND(_LOW32) * (1 << 8)
            + F.col("follower").cast("long") * 4 + kind)
    sizes = (F.col("request_bytes").cast("long") * (1 << 32)
             + F.col("response_bytes").cast("long").bitwiseAND(_LOW32))
    entity = F.xxhash64("user", "client_id")
    out = [F.pmod(entity, F.lit(ENTITY_GROUPS)).cast("int").alias("group"),
           entity.alias("entity"), F.col("connection"), F.col("seq"), F.col("ts_ms"),
           F.col("duration_us"), meta.alias("meta"), sizes.alias("sizes"),
           F.greatest(*[F.col(c) for c in THROTTLES]).cast("long").alias("held")]
    if request_time:
        out.append(F.col("request_time_ms"))
    return out


def unpacked(pdf: pd.DataFrame, run_ids: np.ndarray) -> pd.DataFrame:
    """``packed``'s columns back as capture columns (``tune.demand_requests`` reads them):
    ``run`` and ``user`` are the run's and the entity's hashes, ``client_id`` 0, the hold is
    ``throttle_produce_ms`` (the other two 0), ``api_key`` 0, 1 or 2 (any other request)."""
    meta = pdf["meta"].to_numpy()
    sizes = pdf["sizes"].to_numpy()
    n = len(pdf)
    zeros = np.zeros(n, dtype=np.int64)
    return pd.DataFrame({
        "run": run_ids[meta >> 40] if n else zeros,
        "broker": ((meta >> 8) & _LOW32).astype(np.uint32).view(np.int32),
        "connection": pdf["connection"].to_numpy(), "user": pdf["entity"].to_numpy(),
        "client_id": zeros, "seq": pdf["seq"].to_numpy(), "ts_ms": pdf["ts_ms"].to_numpy(),
        "duration_us": pdf["duration_us"].to_numpy(),
        "api_key": (meta & 3).astype(np.int16), "follower": ((meta >> 2) & 1).astype(bool),
        "request_bytes": (sizes >> 32).astype(np.int32),
        "response_bytes": (sizes & _LOW32).astype(np.uint32).view(np.int32),
        "request_time_ms": (pdf["request_time_ms"].to_numpy(dtype=np.float64)
                            if "request_time_ms" in pdf else np.zeros(n)),
        THROTTLES[0]: pdf["held"].to_numpy(), THROTTLES[1]: zeros, THROTTLES[2]: zeros,
    })


def per_second_rows(c: pd.DataFrame) -> pd.DataFrame:
    """Per (entity, broker, second of ``ts_ms``), from capture rows (``unpacked``: the entity
    is ``user``): what ``profile.entity_seconds`` sums: ``requests``, ``produce_rate``
    (produce bytes, ``request_bytes - 4``), ``fetch_rate`` (consumer fetch bytes,
    ``response_bytes - 4``), ``request_percentage`` (positive durations, in percent of one
    thread), ``fetch_bound`` (consumer fetch bytes at no less than 0) and ``moved`` (a
    fetch's response bytes, any other request's). Sorted by entity, broker and second."""
    columns = ["entity", "broker", "interval", "requests", "produce_rate", "fetch_rate",
               "request_percentage", "fetch_bound", "moved"]
    if c.empty:
        return pd.DataFrame(columns=columns)
    entity, broker = c["user"].to_numpy(), c["broker"].to_numpy()
    # (Spark's cast of ts_ms / 1000 to long: towards zero)
    second = (c["ts_ms"].to_numpy() / 1000.0).astype(np.int64)
    order = np.lexsort((second, broker, entity))
    entity, broker, second = entity[order], broker[order], second[order]
    api_key = c["api_key"].to_numpy()[order]
    follower = c["follower"].to_numpy()[order]
    request = c["request_bytes"].to_numpy()[order].astype(np.int64)
    response = c["response_bytes"].to_numpy()[order].astype(np.int64)
    duration = c["duration_us"].to_numpy()[order]
    heads = np.flatnonzero(np.r_[True, (entity[1:] != entity[:-1]) | (broker[1:] != broker[:-1])
                                 | (second[1:] != second[:-1])])
    consumer = (api_key == 1) & ~follower

    def total(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, heads)

    return pd.DataFrame({
        "entity": entity[heads], "broker": broker[heads], "interval": second[heads],
        "requests": np.diff(np.r_[heads, len(entity)]).astype(np.int64),
        "produce_rate": total(np.where(api_key == 0, request - 4, 0)).astype(np.float64),
        "fetch_rate": total(np.where(consumer, response - 4, 0)).astype(np.float64),
        "request_percentage": total(np.where(duration > 0, duration, 0) / 1000.0) / 10.0,
        "fetch_bound": total(np.where(consumer, np.maximum(response - 4, 0), 0)),
        "moved": total(np.where(api_key == 1, response, request)),
    })


def broker_bytes(sec: pd.DataFrame) -> pd.DataFrame:
    """Per (entity, broker), from ``per_second_rows``: ``produce_total`` and ``fetch_total``,
    the per-second bytes summed where above zero (a budget's seconds as
    ``profile.budget_seconds`` keeps them)."""
    keys = ["entity", "broker"]
    positive = sec[keys].assign(produce_total=sec["produce_rate"].clip(lower=0.0),
                                fetch_total=sec["fetch_rate"].clip(lower=0.0))
    return positive.groupby(keys, sort=False).sum().reset_index()


def recorded(c: pd.DataFrame, bucket_ms: int = BUCKET_MS) -> pd.DataFrame:
    """What ``profile.recorded_throttles`` sums, from capture rows (``unpacked``: the entity
    in ``user``, the hold in ``throttle_produce_ms``): per (entity, throttle bucket) of the
    requests held back, ``requests``, ``throttle_ms`` (the hold) and ``moved`` (a fetch's
    response bytes, any other request's)."""
    held = c[THROTTLES[0]].to_numpy().astype(np.int64)
    kept = held > 0
    moved = np.where(c["api_key"].to_numpy() == 1, c["response_bytes"].to_numpy(),
                     c["request_bytes"].to_numpy()).astype(np.int64)
    rows = pd.DataFrame({"entity": c["user"].to_numpy()[kept],
                         "bucket_ms": held[kept] // bucket_ms * bucket_ms,
                         "requests": 1, "throttle_ms": held[kept], "moved": moved[kept]})
    return rows.groupby(["entity", "bucket_ms"], as_index=False, sort=False).sum()


def _segments(c: pd.DataFrame, types: list[str], idle_ms: float, min_ms: float
              ) -> pd.DataFrame:
    parts = demand_arrays(c, types)
    assert parts is not None  # (types: some)
    # the quota type as its index in QUOTA_TYPES: offered_load sorts numbers faster than names
    kind = np.asarray([QUOTA_TYPES.index(t) for t in types], dtype=np.int32)[parts.pop("kind")]
    out = offered_load(pd.DataFrame({"quota_type": kind, **parts}), idle_ms, min_ms)
    return out.drop(columns="client_id").rename(
        columns={"quota_type": "kind", "run": "run_id", "user": "entity"})


def per_group(pdf: pd.DataFrame, run_ids: np.ndarray, span: int, types: list[str],
              idle_ms: float, min_ms: float) -> pd.DataFrame:
    """One group's results (``SCHEMA``): its entities' profile, bytes per broker and, with
    ``types``, offered-load segments."""
    c = unpacked(pdf, run_ids)
    sec = per_second_rows(c)
    parts = [per_second_profile(sec, span).assign(part=PROFILE_PART),
             broker_bytes(sec).assign(part=BYTES_PART), recorded(c).assign(part=RECORDED_PART)]
    if types:
        parts.append(_segments(c, types, idle_ms, min_ms).assign(part=SEGMENT_PART))
    # (each part given every integer column first: a column missing from one part would
    # come out of the concatenation as floats, and a 64-bit hash would lose its low bits)
    return pd.concat([p.reindex(columns=_SCHEMA_COLUMNS).fillna(
        {c: 0 for c in _INTEGERS}).astype({c: np.int64 for c in _INTEGERS}) for p in parts],
        ignore_index=True)


def entity_pass(captures: DataFrame, names: Names, span: int = 13,
                types: Iterable[str] = (), idle_ms: float = 11_000.0,
                min_ms: float = 1000.0) -> DataFrame:
    """The pass (``SCHEMA``; ``split`` takes its rows apart). ``names``: the capture's
    ``replay.Catalog.names``; ``span``: the seconds of the replay's peaks
    (``bounds.span_seconds``); ``types``: the quota types whose offered load to estimate
    (none: no segments); ``idle_ms``, ``min_ms``: ``tune.offered_load``'s."""
    wanted = [t for t in QUOTA_TYPES if t in set(types)]
    run_ids = np.asarray([{r: i for i, r in names.runs.items()}[run]
                          for run in sorted(names.runs.values())], dtype=np.int64)

    def group(pdf: pd.DataFrame) -> pd.DataFrame:
        return per_group(pdf, run_ids, span, wanted, idle_ms, min_ms)

    return (captures.select(*packed(captures, names, "request" in wanted))
            .groupBy("group").applyInPandas(group, SCHEMA))


def split(rows: pd.DataFrame, names: Names
          ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``entity_pass``'s rows (in the driver) as four tables:

    - the profile: per (user, client-id), its figures (``profile.entity_profile``'s, in
      that order: ``request_time_share`` the entity's share of all request time) and, last,
      the replay's ``entity``, ``produce_peak``, ``fetch_peak`` and ``moved``;
    - the offered-load segments (``tune.SEGMENT_COLUMNS``, with the names);
    - per (user, client-id, broker): ``produce_total``, ``fetch_total``;
    - the recorded throttles (``profile.recorded_throttles``' columns)."""
    # (by pandas' own lookups: a segment a client, some hundred thousand of them)
    users = pd.Series({e: u for e, (u, _) in names.entities.items()}, dtype=object)
    clients = pd.Series({e: c for e, (_, c) in names.entities.items()}, dtype=object)

    def named(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(user=frame["entity"].map(users).to_numpy(),
                            client_id=frame["entity"].map(clients).to_numpy())

    part = rows["part"].to_numpy()
    profile = named(rows.loc[part == PROFILE_PART, _PROFILE_COLUMNS].reset_index(drop=True))
    busy = profile.pop("busy")
    profile["request_time_share"] = busy / busy.sum() if busy.sum() else np.nan
    replay = ["produce_peak", "fetch_peak", "moved"]
    figures = [c for c in _PROFILE_COLUMNS if c not in ("entity", "busy", *replay)]
    profile = profile[["user", "client_id", *figures, "request_time_share", "entity", *replay]]
    profile = profile.sort_values(["user", "client_id"]).reset_index(drop=True)

    seg = rows.loc[part == SEGMENT_PART].reset_index(drop=True)
    seg = named(seg).assign(
        quota_type=np.asarray(QUOTA_TYPES, dtype=object)[seg["kind"].to_numpy()],
        run=seg["run_id"].map(pd.Series(names.runs, dtype=object)).to_numpy())
    segments = seg[["quota_type", "run", "broker", "connection", "user", "client_id",
                    *_SEGMENT_FIGURES]]
    segments = segments.astype({"broker": "int32", "connection": "int64", "segment": "int64",
                                "requests": "int64", "free_requests": "int64"})

    per_broker = named(rows.loc[part == BYTES_PART, ["entity", "broker", "produce_total",
                                                       "fetch_total"]].reset_index(drop=True))
    per_broker = per_broker[["user", "client_id", "broker", "produce_total", "fetch_total"]]
    held = named(rows.loc[part == RECORDED_PART, ["entity", "bucket_ms", "requests",
                                                  "throttle_ms", "moved"]])
    held = held[["user", "client_id", "bucket_ms", "requests", "throttle_ms", "moved"]]
    return (profile, segments[SEGMENT_COLUMNS], per_broker.astype({"broker": "int32"}),
            held.astype({"bucket_ms": "int32"}).reset_index(drop=True))
