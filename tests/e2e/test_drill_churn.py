"""The churn drill's short version (``bench/drill_churn.py``; the full-size run's figures, a
million client-ids and a hundred thousand users, are in docs/security.md): two rounds of
20,000 client-ids and 1,000 authenticated users, each followed by quiet. Every structure keyed
by client-chosen names is back at its baseline once their budgets expire, the per-client
figures are not kept at all, and the second round leaves the process no bigger than the
first."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.drill_churn import run
from testkit.drill_common import print_figures

pytestmark = pytest.mark.e2e

CLIENT_IDS, USERS = 20_000, 1_000


def test_churn_of_client_ids_and_users_leaves_nothing_behind(tmp_path: Path) -> None:
    figures = run(client_ids=CLIENT_IDS, users=USERS, connections=8, user_connections=16,
                  expiry=4.0, rounds=2, workdir=tmp_path, sample_seconds=0.5)
    print_figures("churn (2 x 20,000 client-ids, 1,000 users)", figures)
    assert figures["proxy_alive"] and figures["tracebacks"] == 0
    structures = {k[len("entries_"):-len("_after")] for k in figures
                  if k.startswith("entries_") and k.endswith("_after")}
    assert {"quota_budgets", "quota_caches", "per_client", "fetch_redirects"} <= structures
    for s in structures:  # back where they started once the churn expired
        assert figures[f"entries_{s}_after"] == figures[f"entries_{s}_baseline"], s
    # the churn made budgets, no more than it brought: one per client-id, two per user (its
    # fetch budget, and the request-time one of the client-id it uses)
    assert 1_000 < figures["entries_quota_budgets_peak"] <= CLIENT_IDS + 2 * USERS + 100
    # the demo's per-client figures are not kept for clients that come and go
    assert figures["entries_per_client_peak"] == 0
    # the second round reuses what the first freed: the process does not grow round by round
    assert figures["r2_rss_after_expiry_mb"] <= figures["r1_rss_after_expiry_mb"] + 10
    assert figures["r2_rss_peak_mb"] <= figures["r1_rss_peak_mb"] + 10
    assert figures["fds_end"] <= figures["fds_start"] + 2
