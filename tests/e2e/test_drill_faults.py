"""The faults drill's bounded version (``bench/drill_faults.py``; the long run's figures are in
docs/reliability.md): two idempotent producers and their consumers (one in a consumer group,
three partitions) through the proxy while the broker is frozen for 5 s (SIGSTOP), the proxy is
stopped with SIGTERM and started again at the same ports, and the broker is killed (SIGKILL)
and restarted. The proxy survives each fault without a traceback, every client recovers
through it, and no acknowledged message is lost or duplicated: across the freeze and the
proxy restart, all of them; across the broker kill, those produced after the broker is back
(the broker restarts empty: tansu's memory storage), and none is ever consumed twice.
About a minute."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.drill_common import print_figures
from testkit.drill_faults import NOTES, run

pytestmark = pytest.mark.e2e


def test_faults_bounded(tmp_path: Path) -> None:
    # session.timeout.ms 10 s: tansu makes a group join last half of it (45 s by default
    # would cost 23 s a join); it still outlasts the 5 s freeze.
    results = run(workdir=tmp_path, producers=2, rate=200.0, partitions=3, warmup_seconds=4,
                  after_seconds=4, stop_seconds=5, session_timeout_ms=10_000,
                  recover_timeout=30, drain_seconds=30, flush_seconds=30)
    for fault, figures in results.items():
        print_figures(f"{fault}: {NOTES[fault]}", figures)
    assert list(results) == ["broker_stop", "proxy_restart", "broker_kill"]

    for fault, f in results.items():
        assert f["proxy_alive"], fault
        assert f["tracebacks"] == 0, fault
        assert f["lost"] == 0, fault
        assert f["duplicated"] == 0, fault
        assert f["recovery_produce_s"] is not None, f"{fault}: a producer never recovered"
        assert f["recovery_consume_s"] is not None, f"{fault}: a consumer never recovered"
        assert f["rss_peak_mb"] - f["rss_start_mb"] < 50, fault

    # The broker frozen and the proxy restarted: nothing is lost, so everything counts.
    for fault in ("broker_stop", "proxy_restart"):
        f = results[fault]
        assert f["acknowledged"] > 2_000, fault
        assert f["acknowledged"] == f["consumed"] == f["sent"], fault
        assert f["producer_fatal_errors"] == 0 and f["delivery_errors"] == 0, fault
        assert f["unsettled_at_stop"] == 0, fault
    stop = results["broker_stop"]
    assert stop["recovery_produce_s"] < 5 and stop["recovery_consume_s"] < 5

    restart = results["proxy_restart"]
    assert restart["exit_code"] == 0 and restart["drained"], "SIGTERM must drain, then exit 0"
    assert restart["drain_seconds"] < 10
    assert restart["recovery_produce_s"] < 10 and restart["recovery_consume_s"] < 10

    # The broker killed: it comes back empty; what is produced after that goes through.
    kill = results["broker_kill"]
    assert kill["topics_after_restart"] == 0  # the broker's own loss, not the proxy's
    assert kill["acked_after_back"] > 500
    # A new group's join takes half the session timeout (5 s) on tansu.
    assert kill["recovery_produce_s"] < 10 and kill["recovery_consume_s"] < 15
