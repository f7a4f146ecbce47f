"""Synthetic traffic captures (the current capture schema, one process) for benchmarking the
Spark jobs: millions of requests from thousands of client-ids over several brokers, with
realistic bursts.

Each client-id is a producer or a consumer with a log-normal typical rate (a few heavy
hitters, a long tail), sends requests of a log-normal size at Poisson times, and now and
then bursts at ten times its rate for a few seconds. Requests are written in time order per
broker, as one proxy run would record them.

Run: python bench/synth_capture.py OUT_DIR [--requests N] [--entities E] [--brokers B]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.proxy.features.capture.writer import FIELDS, SCHEMA

ROWS_PER_FILE = 2_000_000


def generate(out: Path, requests: int, entities: int, brokers: int, seed: int = 7,
             duration_s: int = 3600) -> int:
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    # Per entity: weight (share of requests), producer or consumer, typical request size.
    weight = rng.lognormal(0.0, 1.5, entities)
    weight /= weight.sum()
    producer = rng.random(entities) < 0.5
    size = np.clip(rng.lognormal(9.0, 1.2, entities), 200, 1_000_000)
    start_ms = 1_790_000_000_000
    written = 0
    run = "synthetic-1"
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
        columns = {
            "run": pa.array([run] * n, pa.string()),
            "instance": pa.array(["synthetic"] * n, pa.string()),
            "process": pa.array([f"synthetic/0/{start_ms}"] * n, pa.string()),
            "seq": np.arange(lo + 1, lo + n + 1, dtype=np.int64),
            "ts_ms": start_ms + ts,
            "quota_ms": ts.astype(np.int64),
            "connection": who.astype(np.int64),
            "broker": (who % brokers).astype(np.int32),
            "user": pa.array(["ANONYMOUS"] * n, pa.string()),
            "client_id": pa.array([f"client-{w}" for w in who], pa.string()),
            "client_address": pa.array(["10.0.0.1"] * n, pa.string()),
            "api_key": np.where(is_produce, 0, 1).astype(np.int16),
            "api_version": np.where(is_produce, 9, 15).astype(np.int16),
            "request_bytes": request_bytes,
            "response_bytes": response_bytes,
            "duration_us": rng.integers(300, 5000, n).astype(np.int64),
            "request_time_ms": np.zeros(n),
            "follower": np.zeros(n, dtype=bool),
            "throttle_produce_ms": np.zeros(n, dtype=np.int32),
            "throttle_fetch_ms": np.zeros(n, dtype=np.int32),
            "throttle_request_ms": np.zeros(n, dtype=np.int32),
            "client_rack": pa.nulls(n, pa.string()),
            "quota_generation": np.zeros(n, dtype=np.int32),
            "storage_scale": pa.nulls(n, pa.float64()),
            "partitions": pa.nulls(n, dict(FIELDS)["partitions"]),
        }
        write_capture_file(out / f"capture-synthetic-{part:05d}.parquet", columns)
        written += n
    return written


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
    args = parser.parse_args(argv)
    t = time.monotonic()
    n = generate(args.out, args.requests, args.entities, args.brokers)
    print(f"{n} requests in {time.monotonic() - t:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
