"""``python -m kafka_quota_proxy``: the command line (``kafka-quota-proxy``)."""

import sys

# kio registers strategies for its types with hypothesis whenever hypothesis is importable
# (a development or test environment), which costs a quarter to half a second of every
# start; the command line has no use for them (``setdefault``: unless already imported)
sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

from kafka_quota_proxy.cli.main import main  # noqa: E402

raise SystemExit(main())
