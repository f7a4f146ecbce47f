"""Synthetic traffic captures (the current capture schema) for benchmarking the Spark jobs:
millions of requests from thousands of client-ids over several brokers, with realistic bursts,
written by one proxy process or by several instances at the same time.

Each client-id is a producer or a consumer with a log-normal typical rate (a few heavy
hitters, a long tail), sends requests of a log-normal size at Poisson times, and now and
then bursts at ten times its rate for a few seconds. Requests are written in time order per
broker, as one proxy run would record them.

``instances``: the capture of that many proxy instances running side by side (capture schema
v4 ``instance`` and ``process``, a run and a quota clock of its own each), every request
going through one of them at random (a client's connections spread over the instances).
``live``: the ``quotas`` section live in every run, written next to the capture
(``quotas-<run>-00000.json``); each request then carries the throttles its instance's quota
engine gave it (one quota manager per broker, ``quota.replay``), so replaying the capture
reproduces them exactly.

Run: python bench/synth_capture.py OUT_DIR [--requests N] [--entities E] [--brokers B]
     [--instances I]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.proxy.features.capture.writer import FIELDS, SCHEMA
from kafka_quota_proxy.quota.replay import replay_rows, settings_from_section

ROWS_PER_FILE = 2_000_000
START_MS = 1_790_000_000_000
QUOTA_CLOCK_STEP = 7_000_000  # instance k's quota clock reads k x this at START_MS


def generate(out: Path, requests: int, entities: int, brokers: int, seed: int = 7,
             duration_s: int = 3600, instances: int = 1,
             live: Mapping[str, Any] | None = None) -> int:
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    # Per entity: weight (share of requests), producer or consumer, typical request size.
    weight = rng.lognormal(0.0, 1.5, entities)
    weight /= weight.sum()
    producer = rng.random(entities) < 0.5
    size = np.clip(rng.lognormal(9.0, 1.2, entities), 200, 1_000_000)
    start_ms = START_MS
    written = 0
    runs = ["synthetic-1"] if instances == 1 else [
        f"{100 + k}-{start_ms}" for k in range(instances)]
    held: list[tuple[int, dict[str, Any]]] = []  # (instance, columns): with ``live``
    for part, lo in enumerate(range(0, requests, ROWS_PER_FILE)):
        n = min(ROWS_PER_FILE, requests - lo)
        who = rng.choice(entities, n, p=weight)
        # Time: uniform over this file's slice of the hour, plus bursts: 10% of the requests
        # crowd into 2-second windows.
        t0 = duration_s * 1000 * lo // requests
        t1 = duration_s * 1000 * (lo + n) // requests
        ts = rng.integers(t0, max(t1, t0 + 1), n)
        bursty = rng.random(n) < 0.1
        ts[bursty] = (ts[bursty] // 2000) * 2000 + rng.integers(0, 200, bursty.sum())
        order = np.argsort(ts, kind="stable")
        who, ts = who[order], ts[order]
        is_produce = producer[who]
        bytes_ = np.maximum((size[who] * rng.lognormal(0, 0.3, n)).astype(np.int64), 64)
        request_bytes = np.where(is_produce, bytes_ + 120, 80).astype(np.int32)
        response_bytes = np.where(is_produce, 60, bytes_ + 90).astype(np.int32)
        columns: dict[str, Any] = {
            "seq": np.arange(lo + 1, lo + n + 1, dtype=np.int64),
            "ts_ms": start_ms + ts,
            "quota_ms": ts.astype(np.int64),
            "connection": who.astype(np.int64),
            "broker": (who % brokers).astype(np.int32),
            "who": who,
            "api_key": np.where(is_produce, 0, 1).astype(np.int16),
            "api_version": np.where(is_produce, 9, 15).astype(np.int16),
            "request_bytes": request_bytes,
            "response_bytes": response_bytes,
            "duration_us": rng.integers(300, 5000, n).astype(np.int64),
        }
        if instances == 1:
            parts = [(0, columns)]
        else:
            instance = rng.integers(0, instances, n)
            parts = [(k, {c: v[instance == k] for c, v in columns.items()})
                     for k in range(instances)]
        for k, cols in parts:
            cols["quota_ms"] = cols["quota_ms"] + k * QUOTA_CLOCK_STEP
            cols["connection"] = cols["connection"] * instances + k
            if live is None:
                _write(out / f"capture-synthetic-{k}-{part:05d}.parquet", cols, runs[k],
                       k, instances)
            else:
                held.append((k, cols))
        written += n
    if live is not None:
        _write_live(out, held, runs, instances, live)
    return written


def _write_live(out: Path, held: list[tuple[int, dict[str, Any]]], runs: list[str],
                instances: int, live: Mapping[str, Any]) -> None:
    """Every instance's requests with the throttles its quota engine gave them under
    ``live``, and the live config next to them."""
    settings = settings_from_section(live)
    for k, run in enumerate(runs):
        mine = [cols for i, cols in held if i == k]
        cols = {c: np.concatenate([m[c] for m in mine]) for c in mine[0]}
        n = len(cols["seq"])
        throttles = {name: np.zeros(n, dtype=np.int32) for name in ("produce", "fetch",
                                                                     "request")}
        for broker in np.unique(cols["broker"]):
            at = np.flatnonzero(cols["broker"] == broker)
            at = at[np.lexsort((cols["seq"][at], cols["quota_ms"][at]))]
            names = [f"client-{w}" for w in cols["who"][at]]
            m = len(at)
            rows = zip(cols["quota_ms"][at].tolist(), ["ANONYMOUS"] * m, names,
                       cols["api_key"][at].tolist(), cols["request_bytes"][at].tolist(),
                       cols["response_bytes"][at].tolist(), cols["duration_us"][at].tolist(),
                       [0.0] * m, [False] * m, [0] * m, [None] * m, strict=True)
            for name, got in zip(throttles, replay_rows(rows, settings), strict=True):
                throttles[name][at] = got
        for name, got in throttles.items():
            cols[f"throttle_{name}_ms"] = got
        _write(out / f"capture-synthetic-{k}-00000.parquet", cols, run, k, instances)
        (out / f"quotas-{run}-00000.json").write_text(json.dumps(
            {"run": run, "quota_generation": 0, "since_ms": START_MS, "quotas": dict(live)},
            indent=1))


def _write(path: Path, cols: Mapping[str, Any], run: str, k: int, instances: int) -> None:
    n = len(cols["seq"])
    instance = "synthetic" if instances == 1 else f"proxy-{k}"
    zeros = np.zeros(n, dtype=np.int32)
    columns = {
        "run": pa.array([run] * n, pa.string()),
        "instance": pa.array([instance] * n, pa.string()),
        "process": pa.array([f"{instance}/0/{START_MS}"] * n, pa.string()),
        "seq": cols["seq"],
        "ts_ms": cols["ts_ms"],
        "quota_ms": cols["quota_ms"],
        "connection": cols["connection"],
        "broker": cols["broker"],
        "user": pa.array(["ANONYMOUS"] * n, pa.string()),
        "client_id": pa.array([f"client-{w}" for w in cols["who"]], pa.string()),
        "client_address": pa.array(["10.0.0.1"] * n, pa.string()),
        "api_key": cols["api_key"],
        "api_version": cols["api_version"],
        "request_bytes": cols["request_bytes"],
        "response_bytes": cols["response_bytes"],
        "duration_us": cols["duration_us"],
        "request_time_ms": np.zeros(n),
        "follower": np.zeros(n, dtype=bool),
        "throttle_produce_ms": cols.get("throttle_produce_ms", zeros),
        "throttle_fetch_ms": cols.get("throttle_fetch_ms", zeros),
        "throttle_request_ms": cols.get("throttle_request_ms", zeros),
        "client_rack": pa.nulls(n, pa.string()),
        "quota_generation": zeros,
        "storage_scale": pa.nulls(n, pa.float64()),
        "partitions": pa.nulls(n, dict(FIELDS)["partitions"]),
    }
    write_capture_file(path, columns)


def write_capture_file(path: Path, columns: dict[str, object]) -> None:
    """One capture file of the proxy's schema from columns named as its fields."""
    table = pa.Table.from_arrays(
        [pa.array(columns[name], type=kind) for name, kind in FIELDS], schema=SCHEMA)
    pq.write_table(table, path, compression="zstd")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--entities", type=int, default=5_000)
    parser.add_argument("--brokers", type=int, default=6)
    parser.add_argument("--instances", type=int, default=1)
    args = parser.parse_args(argv)
    t = time.monotonic()
    n = generate(args.out, args.requests, args.entities, args.brokers,
                 instances=args.instances)
    print(f"{n} requests in {time.monotonic() - t:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
