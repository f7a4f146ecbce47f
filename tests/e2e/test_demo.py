"""The demo (the README's first command) runs on the embedded broker and stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e


def _rates(output: str, client_id: str) -> list[tuple[float, float]]:
    rows = []
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0] == client_id:
            rows.append((float(parts[1]), float(parts[2])))
    return rows


def test_demo_runs_and_reports_per_client_rates() -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy", "demo", "--seconds", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    steady = _rates(out, "demo-steady")
    consumer = _rates(out, "demo-consumer")
    assert steady and any(to_broker > 0.5 for to_broker, _ in steady), out
    assert consumer and any(to_client > 0.5 for _, to_client in consumer), out
    assert "every acknowledged message was consumed exactly once" in out


def test_demo_stops_cleanly_on_ctrl_c() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "demo"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # wait for the first rate table
            if line.startswith("demo-steady") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert "consumed exactly once" in out
