"""A synthetic multi-tenant capture with known demand, for ``replay --tune``: a few users, each
with a producer or a consumer client-id at a steady rate (Poisson request times, log-normal
request sizes) and one short burst, on two brokers, recorded under a deliberately bad live
config, written the way the proxy writes a capture (``capture-*.parquet`` and the live
``quotas-<run>-<generation>.json``).

The drill itself is `testkit/synth_tenants.py`, shared with the tests; this is its command line
(`python bench/synth_tenants.py --help`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.synth_tenants import main

if __name__ == "__main__":
    sys.exit(main())
