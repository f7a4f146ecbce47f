"""Bytes per entry of each structure keyed by client-chosen names (client-id, user, address,
rack): the cost column of docs/security.md, "Bounded per-client state".

Each structure is filled with N entries of fresh names through its own public path, and the
memory allocated meanwhile (``tracemalloc``: Python objects, dict tables, the names' strings)
is divided by N.

    python bench/state_costs.py            # N = 20,000
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.proxy.features.fetch_routing.routing import FetchRouting
from kafka_quota_proxy.proxy.metrics import ProxyStats
from kafka_quota_proxy.quota.connection_rate import ConnectionRates, IpConnectionQuotas
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings
from kafka_quota_proxy.quota.mutation import MutationQuotas


def per_entry(n: int, fill: Callable[[int], None]) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fill(n)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def quota_budgets(n: int) -> None:
    """One budget per client-id (an unlimited one: no entity names it), with its two cache
    entries ((quota type, user, client-id) -> resolution, -> sensor)."""
    m = QuotaManager(QuotaSettings(entities={EntityKey(None, "nobody"): {QuotaType.REQUEST: 1}}))
    for i in range(n):
        m.record(QuotaType.REQUEST, "", f"churn-{i:08d}", 0.01, 1000)
    per_entry.keep = m  # type: ignore[attr-defined]


def quota_caches_only(n: int) -> None:
    """Cache entries alone: every client-id of one user records into the user's budget."""
    m = QuotaManager(QuotaSettings(entities={EntityKey(DEFAULT, None): {QuotaType.REQUEST: 1e9}}))
    for i in range(n):
        m.record(QuotaType.REQUEST, "alice", f"churn-{i:08d}", 0.01, 1000)
    per_entry.keep = m  # type: ignore[attr-defined]


def mutation_budgets(n: int) -> None:
    q = MutationQuotas({EntityKey(None, DEFAULT): 10.0})
    for i in range(n):
        q.budget("", f"churn-{i:08d}")
    per_entry.keep = q  # type: ignore[attr-defined]


def ip_sensors(n: int) -> None:
    import ipaddress

    rates = ConnectionRates(ip_quotas=IpConnectionQuotas(default=1e9))
    base = int(ipaddress.ip_address("10.0.0.0"))
    for i in range(n):
        rates.record_ip("main", 0, str(ipaddress.ip_address(base + i)), 1000)
    per_entry.keep = rates  # type: ignore[attr-defined]


def redirects(n: int) -> None:
    routing = FetchRouting(None, clock=lambda: 1000)
    decisions = {("t", 0): 2}
    for i in range(n):
        routing.chooser(f"churn-{i:08d}", decisions)("t", 0, -1)
    per_entry.keep = routing  # type: ignore[attr-defined]


def per_client(n: int) -> None:
    stats = ProxyStats()
    stats.track_clients(n)
    for i in range(n):
        stats.client(f"churn-{i:08d}")[0] += 100
    per_entry.keep = stats  # type: ignore[attr-defined]


STRUCTURES = {
    "quota budget (QuotaManager.sensors, with its 2 cache entries)": quota_budgets,
    "quota cache entries (QuotaManager._resolved + _sensor_of, per client-id)": quota_caches_only,
    "controller mutation budget (MutationQuotas._budgets)": mutation_budgets,
    "IP connection-rate sensor (ConnectionRates.ips)": ip_sensors,
    "fetch redirect (FetchRouting._redirected)": redirects,
    "per-client figures (ProxyStats.per_client, when tracked)": per_client,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000)
    args = parser.parse_args()
    for name, fill in STRUCTURES.items():
        print(f"{per_entry(args.n, fill):8.0f} B  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
