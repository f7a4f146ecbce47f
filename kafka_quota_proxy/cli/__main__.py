from kafka_quota_proxy.cli.main import main

raise SystemExit(main())
