"""Churn drill: a million client-ids and a hundred thousand users through one proxy, then quiet:
every structure keyed by client-chosen names stays bounded while they come, and the proxy's
state goes back to where it started once they expire.

The drill itself is `testkit/drill_churn.py`, shared with the tests; this is its command line
(`python bench/drill_churn.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_churn import main

if __name__ == "__main__":
    sys.exit(main())
