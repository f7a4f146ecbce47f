"""Cost of shadow quotas (``quotas.shadow``): proxy CPU per request with and without a shadow
config, the live quotas the same.

Two proxies in front of one tansu broker, differing only by the shadow section: both with a
live ``clients/<default>`` produce, fetch and request quota far above what the machine moves
(every request goes through the live quota path), one also with a shadow of the three quota
types that binds (its produce quota a tenth of what the producer sends: the throttle maths
runs too). Each round, on each proxy in turn (the order alternating; round 0 warms up): a
producer sending one 100-byte message per Produce request (linger.ms 0, one message per
batch, 5 in flight) to a topic of its own. The proxy's CPU (user+sys) over the round is
divided by the requests it forwarded in it (``kafka_proxy_requests_total``). (Produce only: a
consumer reading 20,000 single-message batches back through the proxy stalled, with or
without a shadow; a Fetch costs the shadow one record, as a Produce does.) The
figure is the median over rounds of the per-round ratio (shadow / without), since absolute
figures drift between rounds on a shared machine.

Run: python bench/shadow_bench.py [--rounds N] [--messages M] [--quick]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
from harness import HOST, CpuMeter
from proxy_bench import Endpoint
from quota_bench import round_args, save_result, start_proxy

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port

NOT_BINDING = 100 * 1024**3
LIVE = {"entities": [{"client-id": "<default>", "producer_byte_rate": NOT_BINDING,
                      "consumer_byte_rate": NOT_BINDING, "request_percentage": 100_000}]}
SHADOW = {"window": {"samples": 11, "size_seconds": 1}, "entities": [
    {"client-id": "<default>", "producer_byte_rate": 50_000, "consumer_byte_rate": 10_000_000,
     "request_percentage": 50}]}
WITHOUT, WITH = "without-shadow", "with-shadow"
MESSAGE = b"m" * 100


def hook_cost_us(shadow: bool, requests: int = 200_000) -> float:
    """Median microseconds per request of the quota filters' request and response hooks
    (the live ``QuotaFilter``, with the ``ShadowQuotaFilter`` after it when ``shadow``), in
    process, over 5 repetitions: Produce requests of 50 client-ids on one connection's
    filters, 1 ms apart."""
    from kafka_quota_proxy.protocol.correlation import InFlight
    from kafka_quota_proxy.proxy.features.quotas.filter import QuotaFilter
    from kafka_quota_proxy.proxy.features.shadow_quotas.filter import (
        ShadowQuotaFilter,
        ShadowSwitch,
    )
    from kafka_quota_proxy.proxy.metrics import ProxyStats
    from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
    from kafka_quota_proxy.quota.replay import settings_from_section
    from kafka_quota_proxy.quota.shadow import ShadowQuotas
    from testkit.filter_host import FakeFilterHost

    quotas = QuotaEnforcer(settings_from_section(LIVE))
    switch = ShadowSwitch()
    if shadow:
        switch.engine = ShadowQuotas(settings_from_section(SHADOW), storage=quotas.storage)
    host = FakeFilterHost("alice", scope=1)
    host.client.client_id = "c0"
    chain: list[object] = [QuotaFilter(host, quotas, ProxyStats())]  # type: ignore[arg-type]
    chain.append(ShadowQuotaFilter(host, switch, quotas))  # type: ignore[arg-type]
    requests_hooks = [f.request for f in chain]  # type: ignore[attr-defined]
    responses = [f.response for f in chain]  # type: ignore[attr-defined]
    entries = []
    for i in range(requests):
        e = InFlight(0, 9, i, f"c{i % 50}", 1_004, True)
        e.response_size = 60
        entries.append(e)
    runs = []
    for rep in range(5):
        now = 1_000_000 + rep * 10_000_000
        t0 = time.perf_counter()
        for i, e in enumerate(entries):
            e.recorded = None
            for hook in requests_hooks:
                hook(e)
            for response in responses:
                response(e, now + i, 0.5)
        runs.append((time.perf_counter() - t0) / requests * 1e6)
    return statistics.median(runs)


def requests_forwarded(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("kafka_proxy_requests_total{"))


def workload(endpoint: Endpoint, topic: str, messages: int) -> None:
    producer = Producer({"bootstrap.servers": endpoint.bootstrap, "acks": "1",
                         "linger.ms": 0, "batch.num.messages": 1,
                         "max.in.flight.requests.per.connection": 5,
                         "client.id": "shadow-bench", "delivery.report.only.error": True})
    for _ in range(messages):
        while True:
            try:
                producer.produce(topic, MESSAGE, partition=0)
                break
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("produce did not finish")


def main(argv: list[str] | None = None) -> int:
    args = round_args(__doc__, argv)
    if args.quick:
        args.messages = 5_000
    elif args.messages == 200_000:  # (round_args's default is for 1 KB batches)
        args.messages = 20_000
    hooks = {name: hook_cost_us(name == WITH) for name in (WITHOUT, WITH, WITHOUT, WITH)}
    print(f"quota hooks per Produce, in process: without shadow {hooks[WITHOUT]:.2f} us, "
          f"with {hooks[WITH]:.2f} us (+{hooks[WITH] - hooks[WITHOUT]:.2f} us)")
    per_request: dict[str, list[float]] = {WITHOUT: [], WITH: []}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker = TansuBroker(log_path=str(work / "tansu.log"))
        stack.callback(broker.stop)
        broker.start()
        ports: dict[str, int] = {}
        endpoints: dict[str, Endpoint] = {}
        for name, quotas in ((WITHOUT, LIVE), (WITH, {**LIVE, "shadow": SHADOW})):
            ports[name] = free_port()
            endpoints[name] = start_proxy(stack, work, name, broker, {
                "quotas": quotas, "metrics": {"listen": f"{HOST}:{ports[name]}"}})
        print(f"{args.rounds} rounds (after a warm-up) of {args.messages} produce requests "
              "per proxy:")
        for round_no in range(args.rounds + 1):
            order = [WITHOUT, WITH] if round_no % 2 == 0 else [WITH, WITHOUT]
            for name in order:
                endpoint = endpoints[name]
                assert endpoint.middlebox is not None
                cpu = CpuMeter(endpoint.middlebox.pid)
                topic = f"shadow-bench-{name}-{round_no}"
                for f in endpoint.admin.create_topics([NewTopic(topic, 1, 1)]).values():
                    f.result(30)
                before_cpu, before_n = cpu.read(), requests_forwarded(ports[name])
                workload(endpoint, topic, args.messages)
                after_cpu, after_n = cpu.read(), requests_forwarded(ports[name])
                assert before_cpu is not None and after_cpu is not None
                us = (after_cpu - before_cpu) / (after_n - before_n) * 1e6
                print(f"  round {round_no} {name:<15} {after_n - before_n:8.0f} requests "
                      f"{us:6.1f} us CPU per request", flush=True)
                if round_no:
                    per_request[name].append(us)
        with urllib.request.urlopen(f"http://{HOST}:{ports[WITH]}/metrics", timeout=10) as r:
            shadow_lines = [line for line in r.read().decode().splitlines()
                            if line.startswith("kafka_proxy_shadow_quota_throttled_requests")]
    ratios = [w / o for w, o in zip(per_request[WITH], per_request[WITHOUT], strict=True)]
    ratio = statistics.median(ratios)
    without = statistics.median(per_request[WITHOUT])
    with_ = statistics.median(per_request[WITH])
    print(f"\nproxy CPU per request, median: without shadow {without:.1f} us, with shadow "
          f"{with_:.1f} us; median of per-round ratios {ratio:.3f} "
          f"(+{(ratio - 1) * 100:.1f} %), per round {[round(r, 3) for r in ratios]}")
    print("  the shadow's would-be throttles meanwhile: " + "; ".join(shadow_lines))
    save_result("shadow_bench", {"messages": args.messages, "per_request_us": per_request,
                                 "hooks_us": hooks,
                                 "ratios": ratios, "ratio": ratio,
                                 "shadow_throttled": shadow_lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
