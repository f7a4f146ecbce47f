"""Helpers shared by the tests: frame builders and strategies (frames), a proxy subprocess
and a raw Kafka wire client (e2e), a three-rack cluster (rack_cluster), hostile inputs."""
