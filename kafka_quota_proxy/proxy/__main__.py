import sys

from kafka_quota_proxy.cli.main import main

sys.exit(main())
