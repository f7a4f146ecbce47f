"""The soak drill's 90-second version (``bench/drill_soak.py``; the hour-long run's figures are
in docs/reliability.md): with quotas, capture and rack routing on, memory and descriptors stay
flat, the quota'd producer gets its quota at the end as at the start, and every acknowledged
message of the good clients is consumed exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.drill_common import print_figures
from testkit.drill_soak import run

pytestmark = pytest.mark.e2e


def test_soak_ninety_seconds(tmp_path: Path) -> None:
    figures = run(minutes=1.5, sample_seconds=5, bulk_rate=5e6, warmup_seconds=20,
                  compare_seconds=35, workdir=tmp_path)
    figures.pop("samples")
    print_figures("soak (90 s)", figures)
    assert figures["proxy_alive"] and figures["tracebacks"] == 0
    assert figures["good_acked"] > 11_000
    assert figures["good_lost"] == 0 and figures["good_duplicated"] == 0
    assert figures["client_errors"] == 0
    assert figures["rss_growth_mb"] < 20
    assert figures["fds_end"] <= figures["fds_after_warmup"] + 4
    # Every throttle is Kafka's: the capture's replay reproduces each request's throttles.
    assert figures["replay_matched"] == figures["replay_requests"] > 11_000
    # Held to what Kafka's sampled rate gives a greedy producer of these request sizes (its
    # quota: 1 MB/s is above its 1 MB batches), at the end as at the start.
    model = figures["kafka_greedy_rate"]
    assert model == pytest.approx(1.0, abs=0.05)
    assert figures["quota_rate_first"] == pytest.approx(model, rel=0.15)
    assert figures["quota_rate_last"] == pytest.approx(model, rel=0.15)
    assert figures["quota_throttled_requests"] > 0
    assert figures["capture_records"] > 0 and figures["capture_dropped"] == 0
    assert figures["routing_fetch_bytes"] > 0
