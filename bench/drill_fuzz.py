"""Fuzz drill: a million hostile frames while good clients keep moving keyed messages.

The drill itself is `testkit/drill_fuzz.py`, shared with the tests; this is its command line
(`python bench/drill_fuzz.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_fuzz import main

if __name__ == "__main__":
    sys.exit(main())
