"""Cost of traffic capture: the proxy's throughput with capture on vs off, in one interleaved
run against one tansu broker (target: >= 0.95x), and how many records were written or dropped.

Run: python bench/capture_bench.py [--rounds N] [--messages M] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy_bench import WORKLOAD_FAILURES
from quota_bench import interleaved

OFF, ON = "capture-off", "capture-on"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 50,000 messages")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.messages = 2, 50_000
    with tempfile.TemporaryDirectory() as tmp:
        capture_dir = Path(tmp) / "capture"
        print(f"throughput, {args.rounds} rounds of {args.messages} x 1 KB (after a warm-up):")
        try:
            tp = interleaved(args.rounds, args.messages,
                             {OFF: {}, ON: {"capture": {"dir": str(capture_dir)}}}, Path(tmp))
        except (RuntimeError, *WORKLOAD_FAILURES) as exc:
            print(f"throughput run failed: {exc}")
            return 1
        import pyarrow.parquet as pq

        files = sorted(capture_dir.glob("*.parquet"))
        records = sum(pq.read_metadata(f).num_rows for f in files)
        size = sum(f.stat().st_size for f in files)
    ratio = tp["ratio"]
    assert isinstance(ratio, dict)
    ok = all(v >= 0.95 for v in ratio.values())
    print(f"  capture-on / capture-off (median of per-round ratios): produce "
          f"{ratio['produce']:.2f}, fetch {ratio['fetch']:.2f}  (target >= 0.95): "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"  captured {records} records in {len(files)} files, {size / 1e6:.2f} MB")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"capture_bench-{stamp}.json").write_text(json.dumps(
        {"throughput": tp, "records": records, "files": len(files), "bytes": size}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
