"""Time the Spark jobs end to end on a synthetic capture: profile + replay + tune (and the
report) over 10 million requests from 5,000 client-ids on 6 brokers, in local mode.
Target: <= 120 s.

Run: python bench/replay_bench.py [--requests N] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.spark_jobs.main import run
from testkit.synth_capture import generate

CANDIDATE = {"entities": [{"client-id": "<default>", "producer_byte_rate": 1048576,
                           "consumer_byte_rate": 2097152}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--entities", type=int, default=5_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture"
        t = time.monotonic()
        generate(capture, args.requests, args.entities, 6)
        print(f"synthetic capture: {args.requests} requests, {args.entities} client-ids, "
              f"6 brokers ({time.monotonic() - t:.1f} s to generate)", flush=True)
        t = time.monotonic()
        facts = run(capture, Path(tmp) / "out", CANDIDATE, master=args.master, tune=True)
        elapsed = time.monotonic() - t
    ok = elapsed <= 120
    print(f"profile + replay + tune + report: {elapsed:.1f} s (target <= 120 s): "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"  by phase: {facts['seconds by phase']}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"replay_bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(
        json.dumps({"requests": args.requests, "seconds": elapsed, "facts": facts}, indent=2,
                   default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
