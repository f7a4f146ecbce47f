#!/usr/bin/env python
"""Strict pacing against Kafka's maths, live (issue 32): for each case, two proxies in front of
one tansu broker, one with ``quotas.pacing: kafka`` and one with ``strict``, and the same
greedy librdkafka clients through each at the same time; the achieved rate over whole
throttle cycles after the first window (``testkit.rates.cycle_rate``), as a ratio to the
quota (key and value bytes: about 1 % under what the quota counts).

Cases: producers at each ``--batch-sizes`` (librdkafka's default is 1,000,000) with 1 and
``--producers`` connections on one budget; consumers at librdkafka's default fetch sizes
(fetch.max.bytes 50 MB, max.partition.fetch.bytes 1 MB) over 1 and 8 partitions.

    python bench/pacing_bench.py [--seconds 90] [--quota 1000000]
        [--batch-sizes 16384,131072,1000000] [--producers 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic
from testkit.pacing import WARMUP_S, Traffic, consume, fill, produce, quotas_yaml

MODES = ("kafka", "strict")


def _case(tansu: TansuBroker, quota: int, seconds: float, *, batch: int = 0,
          producers: int = 0, partitions: int = 0, source: str = "") -> dict[str, float]:
    """One case, both modes side by side: mode -> achieved / quota."""
    proxies = {m: ProxyProcess(tansu.bootstrap, extra_yaml=quotas_yaml(m, quota),
                               log_level="warning").start() for m in MODES}
    traffic = {m: Traffic() for m in MODES}
    try:
        for p in proxies.values():
            p.wait_broker_listener(111)
        threads = []
        start = time.monotonic() + 2.0  # (topics created first)
        for m, p in proxies.items():
            if producers:
                topic = new_topic(p.bootstrap, f"paced-{m}")
                config = {} if batch == 1_000_000 else {"batch.size": batch}
                threads += [threading.Thread(target=produce, args=(
                    p.bootstrap, topic, start, seconds, traffic[m]), kwargs=config)
                    for _ in range(producers)]
            else:
                threads.append(threading.Thread(target=consume, args=(
                    p.bootstrap, source, partitions, start, seconds, traffic[m])))
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 90)
    finally:
        for p in proxies.values():
            p.stop()
    out = {}
    for m in MODES:
        if traffic[m].errors:
            print(f"  {m}: errors {traffic[m].errors[:3]}", flush=True)
        try:
            out[m] = traffic[m].cycles(quota, (seconds - WARMUP_S) * 0.6)
        except AssertionError as exc:  # no whole cycle in the run
            print(f"  {m}: {exc}", flush=True)
            out[m] = float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--quota", type=int, default=1_000_000)
    parser.add_argument("--batch-sizes", default="16384,131072,1000000")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--skip-fetch", action="store_true")
    args = parser.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f}; quota {args.quota} B/s; {args.seconds:.0f} s a "
          "case, the first window's payback excluded", flush=True)
    rows = []
    with TansuBroker() as tansu:
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for n in sorted({1, args.producers}):
                got = _case(tansu, args.quota, args.seconds, batch=batch, producers=n)
                default = " (default)" if batch == 1_000_000 else ""
                label = (f"produce, batch.size {batch:,}{default}, {n} "
                         f"producer{'s' if n > 1 else ''}")
                rows.append((label, got))
                print(f"{label}: kafka {got['kafka']:.3f}, strict {got['strict']:.3f}",
                      flush=True)
        if not args.skip_fetch:
            for partitions in (1, 8):
                # enough for both consumers at 1.5x the quota
                messages = int(args.quota * args.seconds * 1.5 / 1000)
                source = fill(tansu.bootstrap, messages, partitions)
                got = _case(tansu, args.quota, args.seconds, partitions=partitions,
                            source=source)
                label = (f"fetch, librdkafka's default fetch sizes, {partitions} "
                         f"partition{'s' if partitions > 1 else ''}")
                rows.append((label, got))
                print(f"{label}: kafka {got['kafka']:.3f}, strict {got['strict']:.3f}",
                      flush=True)
    print("\n| case | kafka | strict |\n|---|---|---|")
    for label, got in rows:
        print(f"| {label} | {got['kafka']:.3f} | {got['strict']:.3f} |")
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
