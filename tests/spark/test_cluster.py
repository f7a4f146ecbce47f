"""``kafka-quota-proxy replay --tune`` on a real Spark cluster: a standalone master and two
workers started from the pyspark package (``testkit.spark_cluster``), executors in JVMs of
their own and their Python workers on this interpreter, over a capture written by three proxy
instances at the same time (``testkit.synth_capture``, with the throttles each instance's
quota engine gave) gives what local mode gives: the same summary facts, replay.csv,
before_after.csv, multi-process budgets and recommended quotas."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession

from kafka_quota_proxy.cli.main import main
from testkit.spark_cluster import StandaloneCluster, cluster_env
from testkit.synth_capture import generate

LIVE = {"entities": [{"client-id": "<default>", "producer_byte_rate": 60_000,
                      "consumer_byte_rate": 90_000},
                     {"client-id": "client-0", "producer_byte_rate": 20_000,
                      "consumer_byte_rate": 20_000}]}
CONFIG = {"listeners": {"bootstrap": "127.0.0.1:9192", "advertised_host": "127.0.0.1",
                        "broker_ports": "9193-9292"},
          "upstream": {"bootstrap_servers": ["127.0.0.1:9092"]},
          "quotas": LIVE}
REQUESTS = 60_000
INSTANCES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers of one core each; everything they started ends with it."""
    with StandaloneCluster.start(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Seven minutes of 120 client-ids on three brokers through three proxy instances (each
    client's requests spread over all three, each instance on its own quota clock), recorded
    under ``LIVE``; and a proxy config with ``LIVE`` as its quotas."""
    directory = tmp_path_factory.mktemp("multi-instance")
    generate(directory / "capture", REQUESTS, 120, 3, seed=3, duration_s=420,
             instances=INSTANCES, live=LIVE)
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    return directory / "capture", config


def replay(capture: tuple[Path, Path], out: Path, master: str) -> list[str]:
    directory, config = capture
    return ["replay", "--capture", str(directory), "--config", str(config), "--out", str(out),
            "--tune", "--master", master]


def table(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, keep_default_na=False)
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def facts(out: Path) -> dict[str, Any]:
    summary = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in summary.items() if not k.startswith("seconds")}


def test_replay_and_tuning_on_two_workers_give_what_local_mode_gives(
        spark: SparkSession, cluster: StandaloneCluster, capture: tuple[Path, Path],
        tmp_path: Path) -> None:
    local = tmp_path / "local"
    assert main(replay(capture, local, "local[2]")) == 0
    on_cluster = tmp_path / "cluster"
    proc = subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", *replay(capture, on_cluster, cluster.url)],
        env=cluster_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # The application ran on the cluster: an executor on each worker, each running tasks.
    state = cluster.state()
    assert [a["name"] for a in state["completedapps"] + state["activeapps"]] == [
        "kafka-quota-proxy"]
    executors = cluster.executor_logs()
    assert {p.parts[-4] for p in executors} == {"worker-0", "worker-1"}, executors
    for log in executors:
        assert "Finished task" in log.read_text(errors="replace"), log

    # The capture is what it claims: three instances side by side, each reproduced exactly,
    # clients throttled, and a recommendation replayed.
    got = facts(on_cluster)
    assert got["processes"] == INSTANCES
    assert "multi-process capture" in got
    assert got["match_rate"] == 1.0
    assert got["throttled requests (recorded)"] > 100
    assert got == facts(local)
    for name in ("replay.csv", "before_after.csv", "profile.csv", "processes.csv",
                 "multi_process.csv", "demand.csv"):
        pd.testing.assert_frame_equal(table(on_cluster / name), table(local / name),
                                      check_exact=False, rtol=1e-9, obj=name)
    recommended = (on_cluster / "recommended-quotas.yaml").read_text()
    assert recommended == (local / "recommended-quotas.yaml").read_text()
    assert yaml.safe_load(recommended)["quotas"]["entities"]
