"""Strict pacing over a budget shared by two proxy instances (``coordination``; README
"Strict pacing"): every process paces the whole budget's level, raised by the others' usage
reports as they arrive, so 8 librdkafka producers at their defaults, 4 through each instance,
get the quota within 5 % on a quiet machine (7 % allowed: a loaded one delays the reports)
where each instance pacing alone would let them through at twice it."""

from __future__ import annotations

import threading
import time

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.pacing import Traffic, produce, quotas_yaml

pytestmark = pytest.mark.e2e

QUOTA = 1_000_000  # bytes/s
RUN_S = 70.0
MEASURE_S = 40.0  # whole throttle cycles over at least this long, after the first window


SHARED_PRODUCERS = 8


def test_strict_pacing_holds_a_budget_shared_by_two_instances(tansu: TansuBroker) -> None:
    """One budget (client-id ``greedy-producer``) shared by two proxy instances
    (``coordination``, the usage topic on tansu): 8 librdkafka producers at their defaults
    (1 MB batches), 4 through each instance. Each instance alone would let its 4 through at
    the quota (2x together); every process pacing the whole budget's level holds the 8 to the
    quota within 5 % on a quiet machine (7 % allowed)."""
    shared = "coordination: {{enabled: true, instance: \"{name}\", report_ms: 250}}\n"
    proxies = [ProxyProcess(tansu.bootstrap, log_level="info",
                            extra_yaml=quotas_yaml("strict", QUOTA)
                            + shared.format(name=name)).start()
               for name in ("east", "west")]
    produced = Traffic()
    try:
        for p in proxies:
            p.wait_broker_listener(111)
        # The claim is about instances that read each other's reports: until an instance has
        # read the usage topic to its end it paces alone, at the whole quota (the fallback,
        # with the one process it knows of), which a loaded machine can stretch into the
        # measured cycles (a CI run measured 1.06 with 116 checks of one instance under it)
        wait_for(lambda: all(_coordinated(p) for p in proxies), 60,
                 what="both instances reading each other's usage reports")
        sink = new_topic(proxies[0].bootstrap, "paced-shared", partitions=SHARED_PRODUCERS)
        start = time.monotonic()
        threads = [threading.Thread(target=produce, args=(
            proxies[i % 2].bootstrap, sink, start, RUN_S, produced)) for i in range(
                SHARED_PRODUCERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_S + 60)
        metrics = [p.metrics() for p in proxies]
    finally:
        for p in proxies:
            p.stop()
    assert not produced.errors, produced.errors[:3]
    ratio = produced.cycles(QUOTA, MEASURE_S)
    print(f"\n{SHARED_PRODUCERS} producers over two instances, strict: {ratio:.3f} x quota")
    for name, m in zip(("east", "west"), metrics, strict=True):
        print(_coordination_seen(name, m))
    # (within 5 % on a quiet machine, 1.006-1.024; 1.050 in a loaded CI run whose reports
    # were up to 1 s old: each instance pours the other's bytes that much later. Pacing
    # alone, each instance would give 2x)
    assert ratio == pytest.approx(1.0, abs=0.07)
    # both instances throttled, and each read the other's reports
    for m in metrics:
        assert m['kafka_proxy_quota_throttled_requests_total{quota="produce"}'] > 0
        assert sum(v for k, v in m.items()
                   if k.startswith("kafka_proxy_shared_quota_reports_read_total")) > 10


def _coordinated(proxy: ProxyProcess) -> bool:
    """Out of the fallback (reading the usage topic, its own reports coming back) and seeing
    both instances live."""
    try:
        m = proxy.metrics()
    except OSError:
        return False

    def values(name: str) -> list[float]:
        return [v for k, v in m.items() if k == name or k.startswith(name + "{")]

    return (values("kafka_proxy_shared_quota_fallback") == [0]
            and values("kafka_proxy_shared_quota_live_processes") == [2])


def _coordination_seen(name: str, m: dict[str, float]) -> str:
    """What one instance saw of the other's usage reports (printed: where a ratio over the
    bound came from, a late or lost report, a fallback, a capped charge)."""
    def total(prefix: str) -> float:
        return sum(v for k, v in m.items() if k.startswith(prefix))

    read = total("kafka_proxy_shared_quota_reports_read_total")
    throttled = m.get('kafka_proxy_quota_throttled_requests_total{quota="produce"}', 0)
    age = total("kafka_proxy_shared_quota_report_age_seconds_total")
    return (f"{name}: reports written {total('kafka_proxy_shared_quota_reports_written_total'):.0f}"
            f", read {read:.0f}, mean age {1000 * age / max(read, 1):.0f} ms, max age "
            f"{1000 * total('kafka_proxy_shared_quota_report_age_max_seconds'):.0f} ms, skipped "
            f"{total('kafka_proxy_shared_quota_reports_skipped_total'):.0f}, ignored "
            f"{total('kafka_proxy_shared_quota_reports_ignored_total'):.0f}, fallback checks "
            f"{total('kafka_proxy_shared_quota_fallback_checks_total'):.0f}, capped checks "
            f"{total('kafka_proxy_shared_quota_capped_checks_total'):.0f}, produce throttled "
            f"{throttled:.0f}")
