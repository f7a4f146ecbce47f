"""Cost of quota enforcement.

1. Throughput with quotas configured but not binding (a `clients/<default>` quota far above what
   the machine can move, so every request goes through the quota path: reservations, headroom
   checks, recording) vs the same proxy with no quotas, in one interleaved run against one
   tansu broker. Target: >= 0.95x. Rounds swing by +-15% on a shared 2-core machine, hence the
   median of per-round ratios over 9 rounds.
2. Per-request cost of the quota path (`QuotaManager.record`) with 1,000 and with 100,000
   distinct client-ids, each with its own budget. Target: flat.

With ``--features all`` the throughput part compares a bare proxy with one that has every
feature on that leaves the bytes unchanged (``proxy_bench.feature_config``: the quotas above
plus a request percentage, capture, fetch routing whose rack rule matches no client).

Run: python bench/quota_bench.py [--rounds N] [--messages M] [--quick] [--features none|all]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import (
    HOST,
    WORKLOAD_FAILURES,
    ManagedProcess,
    Measurement,
    pick_port_range,
    wait_ready,
)
from proxy_bench import (
    FEATURE_SETS,
    FEATURES_ALL,
    FEATURES_NONE,
    Endpoint,
    Settings,
    feature_config,
    run_throughput_round,
)

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings

NO_QUOTAS, QUOTAS = "no-quotas", "quotas-not-binding"
NO_FEATURES, ALL_FEATURES = "no-features", "all-features"
NOT_BINDING = 100 * 1024**3  # 100 GiB/s


def record_cost_us(entities: int, records: int = 200_000) -> float:
    """Median microseconds per ``QuotaManager.record`` over 5 repetitions."""
    settings = QuotaSettings(entities={EntityKey(None, DEFAULT): {QuotaType.PRODUCE: 1e9}})
    manager = QuotaManager(settings)
    ids = [f"client-{i}" for i in range(entities)]
    for cid in ids:  # every budget exists already: measure the steady state
        manager.record(QuotaType.PRODUCE, "ANONYMOUS", cid, 1000, 0)
    order = [random.choice(ids) for _ in range(records)]
    runs = []
    for rep in range(5):
        t0 = time.perf_counter()
        now = 1 + rep * 10
        for i, cid in enumerate(order):
            manager.record(QuotaType.PRODUCE, "ANONYMOUS", cid, 1000, now + i // 1000)
        runs.append((time.perf_counter() - t0) / records * 1e6)
    assert len(manager.sensors) == entities
    return statistics.median(runs)


def _cpu(m: Measurement) -> str:
    return "?" if m.middlebox_cpu_s_per_gb is None else f"{m.middlebox_cpu_s_per_gb:.2f}"


def start_proxy(stack: contextlib.ExitStack, workdir: Path, name: str, broker: TansuBroker,
                extra: dict[str, object] | None = None) -> Endpoint:
    """A proxy subprocess in front of ``broker``, with ``extra`` config sections."""
    port = free_port()
    low, high = pick_port_range(100, avoid={broker.port, port})
    config: dict[str, object] = {
        "listeners": {"bootstrap": f"{HOST}:{port}", "advertised_host": HOST,
                      "broker_ports": f"{low}-{high}"},
        "upstream": {"bootstrap_servers": [broker.bootstrap]},
        "logging": {"level": "warning"},
        **(extra or {}),
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    process = ManagedProcess.spawn(
        name, [sys.executable, "-m", "kafka_quota_proxy", "run", "--config", str(path)], workdir)
    stack.callback(process.stop)
    wait_ready(process, port)
    endpoint = Endpoint(name, f"{HOST}:{port}", process)
    stack.callback(endpoint.close_admin)
    endpoint.admin.list_topics(timeout=15)
    return endpoint


def interleaved(rounds: int, messages: int, configs: dict[str, dict[str, object]],
                workdir: Path | None = None) -> dict[str, object]:
    """Produce and fetch throughput of proxies that differ only by ``configs`` (two of them:
    the first is the baseline), alternating their order each round, against one tansu.
    Ratios are the medians of per-round ratios (second / first)."""
    settings = Settings(rounds=rounds, messages=messages)
    base, other = list(configs)
    results: dict[str, list[tuple[float, float]]] = {base: [], other: []}
    cpu: dict[str, list[tuple[float | None, float | None]]] = {base: [], other: []}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = workdir or Path(tmp)
        broker = TansuBroker(log_path=str(work / "tansu.log"))
        stack.callback(broker.stop)
        broker.start()
        endpoints = {name: start_proxy(stack, work, name, broker, extra)
                     for name, extra in configs.items()}
        for round_no in range(rounds + 1):  # round 0 warms up
            order = [base, other] if round_no % 2 == 0 else [other, base]
            for position, name in enumerate(order):
                result = run_throughput_round(endpoints[name], round_no, position, settings)
                if result.error or result.produce is None or result.fetch is None:
                    raise RuntimeError(f"{name} round {round_no}: {result.error}")
                print(f"  round {round_no} {name:<20} produce {result.produce.mb_per_s:7.1f} "
                      f"MB/s  fetch {result.fetch.mb_per_s:7.1f} MB/s  proxy CPU "
                      f"{_cpu(result.produce)}/{_cpu(result.fetch)} s/GB", flush=True)
                if round_no:
                    results[name].append((result.produce.mb_per_s, result.fetch.mb_per_s))
                    cpu[name].append((result.produce.middlebox_cpu_s_per_gb,
                                      result.fetch.middlebox_cpu_s_per_gb))
    ratios = {
        kind: statistics.median(q[i] / n[i] for q, n in zip(results[other], results[base],
                                                            strict=True))
        for i, kind in enumerate(("produce", "fetch"))
    }
    cpu_median = {
        name: {kind: _median_of(c[i] for c in values)
               for i, kind in enumerate(("produce", "fetch"))}
        for name, values in cpu.items()
    }
    return {"rounds": results, "ratio": ratios, "cpu_s_per_gb": cpu,
            "cpu_s_per_gb_median": cpu_median}


def _median_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def throughput(rounds: int, messages: int,
               features: str = FEATURES_NONE) -> tuple[str, str, dict[str, object]]:
    """(baseline, other, ``interleaved``'s result): no quotas against quotas not binding, or
    with ``features`` "all", a bare proxy against one with every feature that leaves the
    bytes unchanged."""
    if features == FEATURES_ALL:
        with tempfile.TemporaryDirectory(prefix="quota-bench-") as tmp:
            configs = {NO_FEATURES: {}, ALL_FEATURES: feature_config(FEATURES_ALL, Path(tmp))}
            return NO_FEATURES, ALL_FEATURES, interleaved(rounds, messages, configs)
    quotas: dict[str, object] = {"quotas": {"entities": [{"client-id": "<default>",
                                                          "producer_byte_rate": NOT_BINDING,
                                                          "consumer_byte_rate": NOT_BINDING}]}}
    return NO_QUOTAS, QUOTAS, interleaved(rounds, messages, {NO_QUOTAS: {}, QUOTAS: quotas})


def round_args(doc: str, argv: list[str] | None, features: bool = False) -> argparse.Namespace:
    """--rounds, --messages and --quick, for the interleaved throughput benchmarks (and
    ``features``: --features)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 50,000 messages")
    if features:
        parser.add_argument("--features", choices=FEATURE_SETS, default=FEATURES_NONE,
                            help="none (default): no quotas against quotas not binding; all: a "
                            "bare proxy against every feature that leaves the bytes unchanged")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.messages = 2, 50_000
    return args


def report_ratio(label: str, tp: dict[str, object]) -> bool:
    """Print the median per-round ratios of ``interleaved``; whether both meet 0.95."""
    ratio = tp["ratio"]
    assert isinstance(ratio, dict)
    ok = all(v >= 0.95 for v in ratio.values())
    print(f"  {label} (median of per-round ratios): produce {ratio['produce']:.2f}, fetch "
          f"{ratio['fetch']:.2f}  (target >= 0.95): {'PASS' if ok else 'FAIL'}")
    cpu = tp.get("cpu_s_per_gb_median")
    if isinstance(cpu, dict):
        for name, kinds in cpu.items():
            print(f"  {name:<20} proxy CPU, median: produce "
                  f"{_fmt_cpu(kinds['produce'])}, fetch {_fmt_cpu(kinds['fetch'])} core-s/GB")
    return ok


def _fmt_cpu(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def save_result(name: str, doc: dict[str, object]) -> None:
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"{name}-{stamp}.json").write_text(json.dumps(doc, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = round_args(__doc__, argv, features=True)

    print("quota path cost (QuotaManager.record, one budget per client-id):")
    cost = {n: record_cost_us(n) for n in (1_000, 10_000, 100_000)}
    for n, us in cost.items():
        print(f"  {n:>7} entities: {us:6.2f} us per record")
    flat = cost[100_000] / cost[1_000]
    # Every step is a constant-time dict lookup; what grows with 100x the entities is only
    # memory locality (CPU cache misses). "Flat": at most 2x for 100x the entities.
    print(f"  100k / 1k = {flat:.2f}  (target: flat, <= 2.0 for 100x the entities): "
          f"{'PASS' if flat <= 2.0 else 'FAIL'}")

    print(f"\nthroughput, {args.rounds} rounds of {args.messages} x 1 KB (after a warm-up), "
          f"features {args.features}:")
    try:
        base, other, tp = throughput(args.rounds, args.messages, args.features)
    except (RuntimeError, *WORKLOAD_FAILURES) as exc:
        print(f"throughput run failed: {exc}")
        return 1
    ok = report_ratio(f"{other} / {base}", tp)
    save_result("quota_bench", {"features": args.features, "record_cost_us": cost,
                                "throughput": tp})
    return 0 if ok and flat <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
