"""Captures written by several processes (capture schema v4 ``instance`` and ``process``):
``spark_jobs.main.run`` lists them and sets each budget's rate as the processes let it through
against one enforcement point (``spark_jobs.replay.single_point``); a capture of one process
replays as before, with no such section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from kafka_quota_proxy.proxy.features.capture.writer import FIELDS
from kafka_quota_proxy.quota.capture_schema import SCHEMA_VERSION_KEY, process_id
from kafka_quota_proxy.quota.replay import Recorded, replay, settings_from_section
from kafka_quota_proxy.spark_jobs.main import run
from kafka_quota_proxy.spark_jobs.replay import overlapping
from testkit.synth_capture import write_capture_file

QUOTA = 100_000.0  # producer_byte_rate of client-id "c"
LIVE = {"entities": [{"client-id": "c", "producer_byte_rate": QUOTA}]}
T0 = 1_790_000_000_000  # wall clock (Unix ms) of the first request
SECONDS = 60


def process_rows(name: str, pid: int, quota_clock: int, phase_ms: int) -> pd.DataFrame:
    """One process letting client-id "c" through at its full quota, alone: 9,900 B every
    100 ms (99 %: what Kafka's maths lets through without a throttle) for ``SECONDS``, from
    ``T0 + phase_ms`` on the wall clock, on its own quota clock (``quota_clock`` at T0;
    recorded 2 ms after each request is read), with the throttles it recorded (its own quota
    engine over its own requests); and one request a second from "free", which has no
    quota."""
    start = T0 - 1000
    ts = T0 + phase_ms + 100 * np.arange(10 * SECONDS)
    free = T0 + phase_ms + 30 + 1000 * np.arange(SECONDS)
    rows = pd.DataFrame({"ts_ms": np.concatenate([ts, free]),
                         "client_id": ["c"] * len(ts) + ["free"] * len(free),
                         "connection": [1] * len(ts) + [2] * len(free),
                         "request_bytes": [9_904] * len(ts) + [504] * len(free)})
    rows = rows.sort_values("ts_ms", kind="stable").reset_index(drop=True)
    rows["quota_ms"] = quota_clock + (rows["ts_ms"] - T0) + 2
    rows["seq"] = np.arange(1, len(rows) + 1)
    rows["run"] = f"{pid}-{start}"
    rows["instance"] = name
    rows["process"] = process_id(name, 0, start, 4321)
    recorded = [Recorded(int(r.seq), int(r.quota_ms), "ANONYMOUS", str(r.client_id), 0,
                         int(r.request_bytes), 54, 2000, 0.0, False)
                for r in rows.itertuples(index=False)]
    rows["throttle_produce_ms"] = [t.produce_ms for t in replay(
        recorded, settings_from_section(LIVE))]
    return rows


def write_process(directory: Path, rows: pd.DataFrame, version: int = 4) -> None:
    """``rows`` as the proxy writes them (a capture file of the schema ``version``: 3 has no
    ``instance`` and ``process``), and the live config next to them."""
    n = len(rows)
    run_id = str(rows["run"].iloc[0])
    columns: dict[str, Any] = {
        "run": rows["run"].tolist(), "instance": rows["instance"].tolist(),
        "process": rows["process"].tolist(), "seq": rows["seq"].to_numpy(),
        "ts_ms": rows["ts_ms"].to_numpy(), "quota_ms": rows["quota_ms"].to_numpy(),
        "connection": rows["connection"].to_numpy(), "broker": np.ones(n, dtype=np.int32),
        "user": ["ANONYMOUS"] * n, "client_id": rows["client_id"].tolist(),
        "client_address": ["10.0.0.1"] * n, "api_key": np.zeros(n, dtype=np.int16),
        "api_version": np.full(n, 9, dtype=np.int16),
        "request_bytes": rows["request_bytes"].to_numpy(dtype=np.int32),
        "response_bytes": np.full(n, 54, dtype=np.int32),
        "duration_us": np.full(n, 2000, dtype=np.int64), "request_time_ms": np.zeros(n),
        "follower": np.zeros(n, dtype=bool),
        "throttle_produce_ms": rows["throttle_produce_ms"].to_numpy(dtype=np.int32),
        "throttle_fetch_ms": np.zeros(n, dtype=np.int32),
        "throttle_request_ms": np.zeros(n, dtype=np.int32),
        "client_rack": pa.nulls(n, pa.string()), "quota_generation": np.zeros(n, np.int32),
        "storage_scale": pa.nulls(n, pa.float64()),
        "partitions": pa.nulls(n, dict(FIELDS)["partitions"]),
    }
    path = directory / f"capture-20260919T000000-{run_id}-00001.parquet"
    directory.mkdir(parents=True, exist_ok=True)
    if version >= 4:
        write_capture_file(path, columns)
    else:
        kept = [(name, kind) for name, kind in FIELDS if name not in ("instance", "process")]
        schema = pa.schema([pa.field(name, kind) for name, kind in kept],
                           metadata={SCHEMA_VERSION_KEY: str(version)})
        pq.write_table(pa.Table.from_arrays(
            [pa.array(columns[name], type=kind) for name, kind in kept], schema=schema), path)
    (directory / f"quotas-{run_id}-00000.json").write_text(json.dumps(
        {"run": run_id, "quota_generation": 0, "since_ms": T0, "quotas": LIVE}))


def test_two_processes_at_full_quota_each_are_twice_one_enforcement_point(
        spark: SparkSession, tmp_path: Path) -> None:
    """Two processes (on two hosts, with quota clocks 9,000 s apart) each let client-id c
    through at its quota: together 2x (1.98). The report lists both, gives c's budget a
    recorded ratio of 2, and one enforcement point, on one clock, throttles it to about its
    quota."""
    a = process_rows("host-a", 101, quota_clock=5_000, phase_ms=0)
    b = process_rows("host-b", 202, quota_clock=9_000_000, phase_ms=50)
    assert not a["throttle_produce_ms"].any() and not b["throttle_produce_ms"].any()
    write_process(tmp_path / "capture", a)
    write_process(tmp_path / "capture", b)
    out = tmp_path / "out"
    facts = run(tmp_path / "capture", out, None, master="local[2]")
    assert facts["processes"] == 2
    assert facts["match_rate"] == 1.0  # each process alone still reproduces exactly
    assert "multi-process capture" in facts
    report = (out / "report.md").read_text()
    assert "## Multi-process capture" in report
    assert "host-a/0/" in report and "host-b/0/" in report
    processes = pd.read_csv(out / "processes.csv")
    assert sorted(processes["instance"]) == ["host-a", "host-b"]
    assert sorted(processes["requests"]) == [10 * SECONDS + SECONDS] * 2
    budgets = pd.read_csv(out / "multi_process.csv", keep_default_na=False)
    [c] = budgets.to_dict("records")  # "free" has no quota: not listed
    assert (c["broker"], c["quota_type"], c["budget_user"], c["budget_client"]) == (
        1, "produce", "", "c")
    assert (c["quota"], c["processes"], c["requests"]) == (QUOTA, 2, 20 * SECONDS)
    assert c["traffic_ms"] == pytest.approx(SECONDS * 1000)
    assert c["ratio"] == pytest.approx(1.98)  # recorded: twice (99 % of) the quota
    assert c["recorded_throttled"] == c["recorded_held_ms"] == 0
    # One engine on one clock throttles most requests; what it lets through: about 1x.
    assert c["replayed_throttled"] > 0.5 * c["requests"]
    assert c["replayed_held_ms"] > 0
    assert 0.9 < c["single_ratio"] < 1.25
    row = next(line for line in report.splitlines() if "| clients/c |" in line)
    assert "| 1.980 |" in row


def test_one_process_replays_as_before_with_no_multi_process_section(
        spark: SparkSession, tmp_path: Path) -> None:
    """A capture of one process, written before v4 (no ``instance``, ``process``): read with
    process = its run, one process, reproduced exactly; no multi-process section."""
    write_process(tmp_path / "capture",
                  process_rows("host-a", 101, quota_clock=5_000, phase_ms=0), version=3)
    out = tmp_path / "out"
    facts = run(tmp_path / "capture", out, None, master="local[2]")
    assert facts["processes"] == 1
    assert facts["match_rate"] == 1.0
    assert "multi-process capture" not in facts
    assert "Multi-process capture" not in (out / "report.md").read_text()
    assert not (out / "multi_process.csv").exists()


def test_processes_overlap_only_when_they_ran_at_the_same_time() -> None:
    def spans(*pairs: tuple[int, int]) -> pd.DataFrame:
        return pd.DataFrame(pairs, columns=["first_ms", "last_ms"])

    assert not overlapping(spans((0, 100)))
    assert not overlapping(spans((0, 100), (101, 200), (300, 400)))  # restarts
    assert overlapping(spans((0, 100), (50, 60)))
    assert overlapping(spans((300, 400), (0, 1000), (1200, 1300)))
