"""Cost of traffic capture: the proxy's throughput with capture on vs off, in one interleaved
run against one tansu broker (target: >= 0.95x), and how many records were written or dropped.

Run: python bench/capture_bench.py [--rounds N] [--messages M] [--quick]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import WORKLOAD_FAILURES
from quota_bench import interleaved, report_ratio, round_args, save_result

OFF, ON = "capture-off", "capture-on"


def main(argv: list[str] | None = None) -> int:
    args = round_args(__doc__, argv)
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
    ok = report_ratio("capture-on / capture-off", tp)
    print(f"  captured {records} records in {len(files)} files, {size / 1e6:.2f} MB")
    save_result("capture_bench",
                {"throughput": tp, "records": records, "files": len(files), "bytes": size})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
