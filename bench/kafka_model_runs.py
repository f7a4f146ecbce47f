"""The quota engine against an independent model of Kafka's arithmetic, over many live runs.

Runs ``tests/e2e/test_replay_exact.py`` (a throttled idempotent librdkafka producer at its
default batch size, a throttled consumer, an unquota'd producer, a hot reload halving the
quota, metrics scraped every 100 ms) ``--runs`` times against tansu, and adds up what each run
printed: the proxy's own replay (``exact replay: M/N``) and the model of
``testkit/kafka_reference.py``, which shares no code with ``quota/`` (``kafka model:
M/N``).

    python bench/kafka_model_runs.py --runs 20
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    totals = {"exact replay": [0, 0], "kafka model": [0, 0]}
    failed = 0
    for i in range(args.runs):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "tests/e2e/test_replay_exact.py"], cwd=ROOT, capture_output=True, text=True)
        failed += out.returncode != 0
        line = []
        for name, acc in totals.items():
            m = re.search(rf"{name}: (\d+)/(\d+)", out.stdout)
            if m:
                acc[0] += int(m.group(1))
                acc[1] += int(m.group(2))
                line.append(f"{name} {m.group(1)}/{m.group(2)}")
        print(f"run {i + 1}: {'; '.join(line) or 'no figures'}"
              f"{'' if out.returncode == 0 else ' (FAILED)'}", flush=True)
    for name, (agreed, total) in totals.items():
        print(f"{name}: {agreed}/{total} requests over {args.runs} runs")
    print(f"runs failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
