"""Floods drill: connections past the file-descriptor limit, and abusive config files, while good
clients move keyed messages through the proxy.

The drill itself is `testkit/drill_floods.py`, shared with the tests; this is its command line
(`python bench/drill_floods.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.drill_floods import main

if __name__ == "__main__":
    sys.exit(main())
