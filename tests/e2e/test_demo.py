"""The demo (the README's first command) shows what the product is for, on the embedded broker:
a per-user and a per-client-id quota held, a tenant far under her quota unaffected, throttles,
a hot reload half-way that the rates follow, the capture replayed and the mis-sized producer
quotas retuned at the end (budget moved from the tenant with headroom to the starved one, one
line per entity saying why, fewer throttled client-seconds), and every acknowledged message
consumed exactly once. It stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e

SECONDS = 60


def _averages(output: str) -> dict[tuple[str, int], tuple[float, float | None]]:
    """(client-id, start s) -> (MB/s, quota MB/s) from the demo's closing averages."""
    found = {}
    line = r"^\s+(\S+)\s+(\d+)-\s*\d+ s\s+([\d.]+) MB/s\s+(?:quota ([\d.]+)|no quota)"
    for m in re.finditer(line, output, re.M):
        found[(m[1], int(m[2]))] = (float(m[3]), float(m[4]) if m[4] else None)
    return found


def _ticks(output: str, client_id: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.startswith(client_id + " ")]


def test_demo_shows_quotas_a_reload_and_a_recommendation(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "demo", "--seconds",
                           str(SECONDS), "--out", str(out_dir)],
                          capture_output=True, text=True, timeout=SECONDS + 300)
    out = proc.stdout
    print(out[-6000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "every acknowledged message was consumed exactly once" in out
    averages = _averages(out)
    alice_before = next(v for (c, t), v in averages.items() if c == "alice-loader" and t < 30)
    alice_after = next(v for (c, t), v in averages.items() if c == "alice-loader" and t >= 30)
    reader = next(v for (c, _), v in averages.items() if c == "demo-reader")
    carol = next(v for (c, _), v in averages.items() if c == "carol-app")
    # Held to the quota (alice offers 3 MB/s; the reader could read 3 MB/s and more) ...
    assert alice_before[1] == 1.0 and 0.75 <= alice_before[0] <= 1.25, alice_before
    assert reader[1] == 1.5 and 1.1 <= reader[0] <= 1.9, reader
    # ... the rate follows the reload ...
    assert alice_after[1] == 2.0 and 1.5 <= alice_after[0] <= 2.5, alice_after
    assert ">>> config.yaml edited" in out
    # ... with throttles shown live, and carol, far under her quota, unaffected.
    throttled = [int(row[-3]) for row in _ticks(out, "alice-loader") if row[-3].isdigit()]
    assert sum(throttled) > 0
    assert carol[1] == 3.0 and 0.8 <= carol[0] <= 1.2, carol
    # The capture replayed, a config recommended with the live config's entities, a report.
    assert "reproduction match" in out
    recommended = out_dir / "report" / "recommended-quotas.yaml"
    assert str(recommended) in out and (out_dir / "report" / "report.md").exists()
    entities = yaml.safe_load(recommended.read_text())["quotas"]["entities"]
    keys = {(e.get("user"), e.get("client-id")) for e in entities}
    assert {("alice", None), (None, "demo-reader"), ("carol", None)} <= keys, entities
    # The mis-sizing found: producer budget moves from carol (headroom) to alice (starved) at
    # the same total, each entity saying why, with fewer throttled client-seconds.
    producer = {e.get("user"): e["producer_byte_rate"] for e in entities
                if "producer_byte_rate" in e}
    assert producer["alice"] > 2_000_000 and producer["carol"] < 3_000_000, producer
    assert producer["alice"] + producer["carol"] <= 5_000_000, producer
    why = {line.split(":")[0].strip(): line for line in out.splitlines()
           if line.startswith("  users/") or line.startswith("  clients/")}
    assert "more than the live quota" in why["users/alice producer_byte_rate"], why
    assert "of the live quota" in why["users/carol producer_byte_rate"], why
    held = {m[1]: int(m[2]) for m in re.finditer(
        r"^throttled client-seconds \((recorded|replayed, recommended config)\)\s*: (\d+)$",
        out, re.M)}
    assert held["recorded"] > 0 and held["replayed, recommended config"] < held["recorded"], held
    # The command the demo prints runs the job the demo ran, on the same inputs (the job is
    # deterministic: tests/spark/test_cluster.py; the CLI's own replay runs end to end in
    # tests/e2e/test_capture.py), so it tunes the short capture to the same recommendation.
    command = next(line.split(": ", 1)[1] for line in out.splitlines()
                   if line.startswith("the same from the command line: "))
    assert "--span-seconds 10" in command
    assert _job_call(command.split()[1:], tmp_path) == _job_call_of_the_demo(out_dir)


def _job_call(args: list[str], tmp_path: Path) -> dict[str, Any]:
    """What ``kafka-quota-proxy <args>`` hands the Spark job (``spark_jobs.main.run``), with
    the job itself replaced by a recorder (it writes the recommendation the CLI reads back)."""
    from kafka_quota_proxy.cli.main import main

    calls: list[dict[str, Any]] = []

    def recorder(capture_dir: str, out_dir: str, candidate: Any, master: str | None = None,
                 tune: bool = False, options: Any = None) -> dict[str, Any]:
        calls.append({"capture": str(capture_dir), "out": str(out_dir), "base": candidate,
                      "tune": tune, "options": options})
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "recommended-quotas.yaml").write_text("quotas: {entities: []}\n")
        return {}

    args = list(args)
    args[args.index("--out") + 1] = str(tmp_path / "cli-report")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("kafka_quota_proxy.spark_jobs.main.run", recorder)
        assert main(args) == 0
    (call,) = calls
    call["out"] = "<out>"
    return call


def _job_call_of_the_demo(out_dir: Path) -> dict[str, Any]:
    """What the demo handed the job (it writes the inputs it passed beside the report)."""
    from kafka_quota_proxy.spark_jobs.tune import TuneOptions

    inputs = json.loads((out_dir / "report" / "replay-inputs.json").read_text())
    return {"capture": inputs["capture"], "out": "<out>", "base": inputs["base"],
            "tune": inputs["tune"], "options": TuneOptions(**inputs["options"])}


def test_demo_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kafka_quota_proxy", "demo", "--no-replay",
                             "--out", str(tmp_path / "demo")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # wait for the first rate table
            if line.startswith("carol-app") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert "consumed exactly once" in out
