"""Time the Spark jobs end to end on a synthetic capture: profile + replay + tune (and the
report) over 10 million requests from 5,000 client-ids on 6 brokers, in local mode, or on a
standalone cluster of N one-core workers started for the run (``--workers N``,
``testkit.spark_cluster``: the master, the workers and their executors each a JVM of its own).
Target: <= 60 s per 10 M requests in local mode.

Run: python bench/replay_bench.py [--requests N] [--instances I] [--master local[2]]
     [--workers N] [--capture DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.spark_jobs.main import run
from testkit.spark_cluster import StandaloneCluster, cluster_env
from testkit.synth_capture import generate

CANDIDATE = {"entities": [{"client-id": "<default>", "producer_byte_rate": 1048576,
                           "consumer_byte_rate": 2097152}]}
TARGET_S = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--entities", type=int, default=5_000)
    parser.add_argument("--instances", type=int, default=1,
                        help="proxy instances that wrote the capture side by side")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workers", type=int, default=0,
                        help="start a standalone cluster of this many one-core workers and "
                        "run on it (instead of --master)")
    parser.add_argument("--worker-memory", default="4g")
    parser.add_argument("--capture", type=Path,
                        help="the capture to read: generated there first when the directory "
                        "does not exist, reused as it is when it does (to time several runs, "
                        "or two versions of the code, on one capture)")
    parser.add_argument("--out", type=Path,
                        help="where the jobs write their report (kept; default: a temporary "
                        "directory)")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        capture = args.capture or Path(tmp) / "capture"
        if capture.exists():
            print(f"capture: {capture} (as it is)", flush=True)
        else:
            t = time.monotonic()
            generate(capture, args.requests, args.entities, 6, instances=args.instances)
            print(f"synthetic capture: {args.requests} requests, {args.entities} client-ids, "
                  f"6 brokers, {args.instances} instance(s) ({time.monotonic() - t:.1f} s to "
                  "generate)", flush=True)
        cluster = None
        master = args.master
        if args.workers:
            t = time.monotonic()
            cluster = StandaloneCluster.start(Path(tmp) / "cluster", workers=args.workers,
                                              memory=args.worker_memory)
            os.environ.update(cluster_env())
            os.environ.setdefault("KQP_SPARK_EXECUTOR_MEMORY",
                                  f"{max(1, int(args.worker_memory.rstrip('g')) - 1)}g")
            master = cluster.url
            print(f"standalone cluster: {args.workers} worker(s) of 1 core at {master} "
                  f"({time.monotonic() - t:.1f} s to start)", flush=True)
        try:
            load = os.getloadavg()
            t = time.monotonic()
            facts = run(capture, args.out or Path(tmp) / "out", CANDIDATE, master=master, tune=True)
            elapsed = time.monotonic() - t
        finally:
            if cluster is not None:
                cluster.stop()
    per_10m = elapsed * 10_000_000 / facts["requests"]
    where = f"{args.workers} worker(s)" if args.workers else master
    ok = per_10m <= TARGET_S
    print(f"profile + replay + tune + report on {where}: {elapsed:.1f} s, "
          f"{per_10m:.1f} s per 10 M requests (target <= {TARGET_S:.0f} s): "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"  by phase: {facts['seconds by phase']}")
    print(f"  load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"replay_bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps({"requests": facts["requests"], "instances": args.instances,
                    "master": master, "workers": args.workers, "seconds": elapsed,
                    "seconds_per_10m": per_10m, "load_before": load, "facts": facts},
                   indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
