"""Faults drill: the broker frozen, the proxy restarted, the broker killed, under producers and a
consumer group.

The drill itself is `testkit/drill_faults.py`, shared with the tests; this is its command line
(`python bench/drill_faults.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_faults import main

if __name__ == "__main__":
    sys.exit(main())
