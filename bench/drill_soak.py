"""Soak drill: a long run with quotas, capture and rack routing on, watching for drift.

The drill itself is `testkit/drill_soak.py`, shared with the tests; this is its command line
(`python bench/drill_soak.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_soak import main

if __name__ == "__main__":
    sys.exit(main())
