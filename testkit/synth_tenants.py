"""A synthetic multi-tenant capture with known demand, for ``replay --tune``: a few users, each
with a producer or a consumer client-id at a steady rate (Poisson request times, log-normal
request sizes) and one short burst, on two brokers, recorded under a deliberately bad live
config, written the way the proxy writes a capture (``capture-*.parquet`` and the live
``quotas-<run>-<generation>.json``).

The bad live config (``BAD_LIVE``): ``users/<default>`` is too low for the heavy users (bob
produces, erin consumes more than it allows) and far more than the light ones use; the
``alice/clientA`` override is a tenth of what clientA produces. The throttles in the capture
are what the quota engine (``quota.replay``) gives under that config, so replaying it
reproduces them exactly.

Run: python bench/synth_tenants.py OUT_DIR [--seconds S] [--brokers B]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.proxy.features.capture.writer import FIELDS
from kafka_quota_proxy.quota.replay import replay_rows, settings_from_section
from kafka_quota_proxy.spark_jobs.held import held_seconds
from testkit.synth_capture import write_capture_file


@dataclass(frozen=True)
class Tenant:
    user: str
    client_id: str
    kind: str  # "produce" or "fetch"
    rate: float  # bytes/s over all brokers (spread evenly over them)
    requests: float = 40.0  # requests/s over all brokers


TENANTS = [
    Tenant("alice", "clientA", "produce", 1_600_000),
    Tenant("alice", "clientB", "fetch", 400_000),
    Tenant("bob", "bob-app", "produce", 2_400_000),
    Tenant("carol", "carol-app", "produce", 100_000, 20),
    Tenant("dave", "dave-app", "fetch", 150_000, 20),
    Tenant("erin", "erin-app", "fetch", 2_000_000),
    Tenant("frank", "frank-app", "produce", 200_000, 20),
    Tenant("grace", "grace-app", "produce", 60_000, 10),
    Tenant("heidi", "heidi-app", "fetch", 80_000, 10),
]

BAD_LIVE: dict[str, Any] = {
    "window": {"samples": 11, "size_seconds": 1},
    "entities": [
        {"user": "alice", "client-id": "clientA", "producer_byte_rate": 100_000},
        {"user": "<default>", "producer_byte_rate": 1_000_000,
         "consumer_byte_rate": 800_000, "request_percentage": 50.0},
    ],
}

START_MS = 1_790_000_020_000  # 40 s into a minute: the first and last minutes are partial
RUN = f"4242-{START_MS}"


def requests_of(tenants: list[Tenant], seconds: float, brokers: int, seed: int = 11,
                ) -> pd.DataFrame:
    """The requests (capture columns, no throttles yet), in time order."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, t in enumerate(tenants):
        n = rng.poisson(t.requests * seconds)
        ts = rng.uniform(0, seconds * 1000, n)
        # One burst: 4x the rate for 2 s (a sustained-demand rule must not size for it).
        at = rng.uniform(0.2, 0.8) * seconds * 1000
        extra = rng.uniform(at, at + 2000, rng.poisson(3 * t.requests * 2))
        ts = np.sort(np.concatenate([ts, extra]))
        n = len(ts)
        mean = t.rate / t.requests
        size = np.maximum(mean * rng.lognormal(-0.045, 0.3, n), 64).astype(np.int64)
        produce = t.kind == "produce"
        parts.append(pd.DataFrame({
            "ts": ts.astype(np.int64), "tenant": i, "user": t.user, "client_id": t.client_id,
            "broker": rng.integers(1, brokers + 1, n).astype(np.int32),
            "api_key": np.int16(0 if produce else 1),
            "request_bytes": (size + 4 if produce else np.full(n, 90)).astype(np.int32),
            "response_bytes": (np.full(n, 60) if produce else size + 4).astype(np.int32),
            "duration_us": rng.integers(500, 4000, n).astype(np.int64),
        }))
    rows = pd.concat(parts).sort_values(["ts", "tenant"], kind="stable").reset_index(drop=True)
    rows["request_time_ms"] = rows["duration_us"] / 1000.0 + 0.05
    rows["seq"] = np.arange(1, len(rows) + 1, dtype=np.int64)
    rows["ts_ms"] = START_MS + rows["ts"]
    rows["quota_ms"] = 5_000_000 + rows["ts"]
    return rows.drop(columns=["ts", "tenant"])


def throttles(rows: pd.DataFrame, section: Mapping[str, Any]) -> pd.DataFrame:
    """The produce, fetch and request throttles the quota engine gives each row under
    ``section`` (one quota manager per broker, in the order the proxy recorded them)."""
    settings = settings_from_section(section)
    out = {name: np.zeros(len(rows), dtype=np.int32) for name in ("produce", "fetch", "request")}
    where = pd.Series(np.arange(len(rows)), index=rows.index)
    for _, g in rows.sort_values(["quota_ms", "seq"]).groupby("broker", sort=True):
        tuples = zip(g["quota_ms"].tolist(), g["user"].tolist(), g["client_id"].tolist(),
                     g["api_key"].tolist(), g["request_bytes"].tolist(),
                     g["response_bytes"].tolist(), g["duration_us"].tolist(),
                     g["request_time_ms"].tolist(), [False] * len(g), [0] * len(g),
                     [None] * len(g), strict=True)
        at = where[g.index].to_numpy()
        for name, got in zip(out, replay_rows(tuples, settings), strict=True):
            out[name][at] = got
    return pd.DataFrame(out, index=rows.index)


def throttled_client_seconds(rows: pd.DataFrame, section: Mapping[str, Any]) -> int:
    """The seconds in which each client was held back under ``section``, per broker, summed
    (``spark_jobs.held``: what the report counts)."""
    held = throttles(rows, section).max(axis=1).to_numpy()
    entity = pd.factorize(rows["user"] + "/" + rows["client_id"])[0]
    total = 0
    for broker in np.unique(rows["broker"].to_numpy()):
        on = rows["broker"].to_numpy() == broker
        total += int(held_seconds(entity[on], rows["quota_ms"].to_numpy()[on], held[on]).sum())
    return total


def generate(out: Path, seconds: float = 720, brokers: int = 2, seed: int = 11,
             live: Mapping[str, Any] = BAD_LIVE, tenants: list[Tenant] | None = None,
             ) -> pd.DataFrame:
    """Write the capture into ``out``; returns its rows."""
    out.mkdir(parents=True, exist_ok=True)
    rows = requests_of(tenants or TENANTS, seconds, brokers, seed)
    t = throttles(rows, live)
    n = len(rows)
    columns = {
        "run": pa.array([RUN] * n, pa.string()),
        "instance": pa.array(["synthetic"] * n, pa.string()),
        "process": pa.array([f"synthetic/0/{START_MS}"] * n, pa.string()),
        "seq": rows["seq"].to_numpy(),
        "ts_ms": rows["ts_ms"].to_numpy(),
        "quota_ms": rows["quota_ms"].to_numpy(),
        "connection": pd.factorize(rows["client_id"])[0].astype(np.int64) + 1,
        "broker": rows["broker"].to_numpy(),
        "user": pa.array(rows["user"].tolist(), pa.string()),
        "client_id": pa.array(rows["client_id"].tolist(), pa.string()),
        "client_address": pa.array(["10.0.0.1"] * n, pa.string()),
        "api_key": rows["api_key"].to_numpy(),
        "api_version": np.where(rows["api_key"] == 0, 9, 15).astype(np.int16),
        "request_bytes": rows["request_bytes"].to_numpy(),
        "response_bytes": rows["response_bytes"].to_numpy(),
        "duration_us": rows["duration_us"].to_numpy(),
        "request_time_ms": rows["request_time_ms"].to_numpy(),
        "follower": np.zeros(n, dtype=bool),
        "throttle_produce_ms": t["produce"].to_numpy(),
        "throttle_fetch_ms": t["fetch"].to_numpy(),
        "throttle_request_ms": t["request"].to_numpy(),
        "client_rack": pa.nulls(n, pa.string()),
        "quota_generation": np.zeros(n, dtype=np.int32),
        "storage_scale": pa.nulls(n, pa.float64()),
        "partitions": pa.nulls(n, dict(FIELDS)["partitions"]),
    }
    write_capture_file(out / f"capture-synthetic-{RUN}-00000.parquet", columns)
    (out / f"quotas-{RUN}-00000.json").write_text(json.dumps(
        {"run": RUN, "quota_generation": 0, "since_ms": START_MS, "quotas": dict(live)},
        indent=1))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=720)
    parser.add_argument("--brokers", type=int, default=2)
    args = parser.parse_args(argv)
    rows = generate(args.out, args.seconds, args.brokers)
    print(f"{len(rows)} requests over {args.seconds:g} s -> {args.out}; throttled "
          f"client-seconds under the live config: {throttled_client_seconds(rows, BAD_LIVE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
