"""Synthetic traffic captures (the current capture schema, one process) for benchmarking the Spark
jobs: millions of requests from thousands of client-ids over several brokers, with realistic
bursts.

The drill itself is `testkit/synth_capture.py`, shared with the tests; this is its command line
(`python bench/synth_capture.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.synth_capture import main

if __name__ == "__main__":
    sys.exit(main())
