"""``python -m kafka_quota_proxy``: the command line (``kafka-quota-proxy``)."""

from kafka_quota_proxy.cli.main import main

raise SystemExit(main())
