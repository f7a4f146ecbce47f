#!/usr/bin/env python
"""Cost of ACL enforcement on the data path: a proxy with 10,000 ACL bindings loaded against
the same proxy without ACLs, plaintext, librdkafka at the bench's defaults (1 KB messages,
1 MB batches, default fetch sizes), interleaved round by round against one tansu broker.

The clients are ``User:ANONYMOUS`` (a plaintext listener); the ACLs let them write, read,
describe, create and delete the bench's topics (a PREFIXED binding) and read its groups, among
9,996 other bindings (LITERAL and PREFIXED topics and groups of other users), so every
Produce and Fetch is checked topic by topic. Reported: proxy CPU per GB (produce and fetch)
and throughput, as medians of per-round ratios (ACLs / none). Target: CPU per GB within +10 %.

    python bench/acl_proxy_bench.py [--rounds N] [--messages M] [--quick]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import WORKLOAD_FAILURES
from proxy_bench import Settings, run_throughput_round
from quota_bench import round_args, save_result, start_proxy

from kafka_quota_proxy.demo.embedded_broker import TansuBroker

NO_ACLS, ACLS = "no-acls", "10k-acls"
BINDINGS = 10_000
CPU_TARGET = 1.10


def acl_config(total: int = BINDINGS) -> dict[str, object]:
    """``acls:`` with ``total`` bindings, four of them the bench clients'."""
    ours = [
        {"principal": "User:ANONYMOUS", "operation": ["Write", "Read", "Describe", "Create",
                                                       "Delete"],
         "topic": "bench-", "pattern_type": "prefixed"},
        {"principal": "User:ANONYMOUS", "operation": "Read", "group": "bench-",
         "pattern_type": "prefixed"},
        {"principal": "User:ANONYMOUS", "operation": "Describe", "cluster": True},
        {"principal": "User:*", "operation": "All", "permission": "deny",
         "topic": "bench-secret", "pattern_type": "prefixed"},
    ]
    # (short names: the config file is read up to 1 MiB, and 10,000 bindings in YAML's block
    # style come close)
    others: list[dict[str, object]] = []
    for i in range(total - len(ours)):
        tenant = f"User:t{i % 2500}"
        if i % 4 == 0:
            others.append({"principal": tenant, "operation": "Write", "topic": f"t{i}"})
        elif i % 4 == 1:
            others.append({"principal": tenant, "operation": "Read", "topic": f"t{i}-",
                           "pattern_type": "prefixed"})
        elif i % 4 == 2:
            others.append({"principal": tenant, "operation": "Read", "group": f"t{i}"})
        else:
            others.append({"principal": tenant, "operation": "Read", "permission": "deny",
                           "topic": f"bench-{i}", "host": f"10.0.{i % 250}.1"})
    return {"acls": {"bindings": ours + others}}


def main(argv: list[str] | None = None) -> int:
    args = round_args(__doc__, argv)
    settings = Settings(rounds=args.rounds, messages=args.messages)
    configs = {NO_ACLS: {}, ACLS: acl_config()}
    rows: dict[str, list[tuple[float, float, float, float]]] = {NO_ACLS: [], ACLS: []}
    print(f"ACLs on the data path: {args.rounds} rounds of {args.messages} x 1 KB after a "
          f"warm-up, {BINDINGS} bindings")
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker = TansuBroker(log_path=str(work / "tansu.log"))
        stack.callback(broker.stop)
        broker.start()
        endpoints = {name: start_proxy(stack, work, name, broker, extra)
                     for name, extra in configs.items()}
        for round_no in range(args.rounds + 1):  # round 0 warms up
            order = [NO_ACLS, ACLS] if round_no % 2 == 0 else [ACLS, NO_ACLS]
            for position, name in enumerate(order):
                try:
                    r = run_throughput_round(endpoints[name], round_no, position, settings)
                except WORKLOAD_FAILURES as exc:
                    print(f"round {round_no} {name}: {exc}")
                    return 1
                if r.error or r.produce is None or r.fetch is None:
                    print(f"round {round_no} {name}: {r.error}")
                    return 1
                p, f = r.produce, r.fetch
                if p.middlebox_cpu_s_per_gb is None or f.middlebox_cpu_s_per_gb is None:
                    print("proxy CPU not measured")
                    return 1
                print(f"  round {round_no} {name:<8} produce {p.mb_per_s:7.1f} MB/s "
                      f"{p.middlebox_cpu_s_per_gb:.3f} core-s/GB  fetch {f.mb_per_s:7.1f} MB/s "
                      f"{f.middlebox_cpu_s_per_gb:.3f} core-s/GB", flush=True)
                if round_no:
                    rows[name].append((p.mb_per_s, f.mb_per_s, p.middlebox_cpu_s_per_gb,
                                       f.middlebox_cpu_s_per_gb))

    def ratio(i: int) -> float:
        return statistics.median(a[i] / b[i] for a, b in zip(rows[ACLS], rows[NO_ACLS],
                                                            strict=True))

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    cpu = {"produce": ratio(2), "fetch": ratio(3)}
    throughput = {"produce": ratio(0), "fetch": ratio(1)}
    ok = all(v <= CPU_TARGET for v in cpu.values())
    print(f"\nproxy CPU per GB, no ACLs: produce {median(NO_ACLS, 2):.3f}, fetch "
          f"{median(NO_ACLS, 3):.3f} core-s/GB; {BINDINGS} ACLs: produce "
          f"{median(ACLS, 2):.3f}, fetch {median(ACLS, 3):.3f}")
    print(f"ACLs / none (median of per-round ratios): CPU per GB produce {cpu['produce']:.3f}, "
          f"fetch {cpu['fetch']:.3f} (target <= {CPU_TARGET:.2f}): {'PASS' if ok else 'FAIL'}; "
          f"throughput produce {throughput['produce']:.3f}, fetch {throughput['fetch']:.3f}")
    save_result("acl_proxy_bench", {"bindings": BINDINGS, "rows": rows, "cpu_ratio": cpu,
                                    "throughput_ratio": throughput})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
