"""The supervisor's pure parts: how many workers, who a worker is, one metrics endpoint from
the workers' own."""

from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.proxy.workers import (
    WORKER_ENV,
    merge_worker_metrics,
    worker_count,
    worker_identity,
)

BASE = """listeners: {bootstrap: "127.0.0.1:9192", advertised_host: h, broker_ports: "9193-9200"}
upstream: {bootstrap_servers: ["127.0.0.1:9092"]}
"""


def test_worker_count_is_the_config_or_the_cores() -> None:
    assert worker_count(parse_config(BASE, "<t>")) == 1
    assert worker_count(parse_config(BASE + "workers: 3\n", "<t>")) == 3
    assert worker_count(parse_config(BASE + "workers: auto\n", "<t>")) == len(
        os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", ["0", "-1", "257", "many", "1.5"])
def test_a_bad_worker_count_names_the_field(bad: str) -> None:
    from kafka_quota_proxy.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"workers"):
        parse_config(BASE + f"workers: {bad}\n", "<t>")


def test_worker_identity_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_ENV, raising=False)
    assert worker_identity() is None
    monkeypatch.setenv(WORKER_ENV, "3:17")
    assert worker_identity() == (3, 17)


def _exposition(connections: int, latency: list[float], brokers: int) -> str:
    registry = CollectorRegistry()
    c = Counter("kafka_proxy_connections_accepted", "accepted", ["listener"], registry=registry)
    c.labels("bootstrap").inc(connections)
    h = Histogram("kafka_proxy_upstream_latency_seconds", "latency", registry=registry)
    for v in latency:
        h.observe(v)
    Gauge("kafka_proxy_upstream_brokers", "brokers", registry=registry).set(brokers)
    return generate_latest(registry).decode()


def test_merged_metrics_label_every_sample_with_its_worker() -> None:
    merged = merge_worker_metrics([(0, _exposition(3, [0.01], 1)),
                                   (1, _exposition(5, [0.2, 0.3], 1))])

    class Merged:
        def collect(self) -> list:  # type: ignore[type-arg]
            return merged

    registry = CollectorRegistry()
    registry.register(Merged())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    # one family each (a valid exposition), every sample with its worker
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE kafka_proxy_connections_accepted_total counter\n") == 1
    accepted = {s.labels["worker"]: s.value for s in families[
        "kafka_proxy_connections_accepted"].samples if s.name.endswith("_total")}
    assert accepted == {"0": 3.0, "1": 5.0}
    counts = {s.labels["worker"]: s.value for s in families[
        "kafka_proxy_upstream_latency_seconds"].samples if s.name.endswith("_count")}
    assert counts == {"0": 1.0, "1": 2.0}
    assert all("worker" in s.labels for f in families.values() for s in f.samples)


class _Reloaded:
    """What a reload changes of a worker process (``proxy.reload.Reloaded``)."""

    def __init__(self, config: object, worker: bool) -> None:
        from kafka_quota_proxy.proxy.metrics import ProxyStats
        from kafka_quota_proxy.proxy.server import as_worker

        self.as_worker = as_worker
        self.worker = worker
        self.config = as_worker(config) if worker else config  # type: ignore[arg-type]
        self.stats = ProxyStats()
        self.features: list[object] = []

    def reconfigure(self) -> None:
        pass

    def as_run(self, config: object) -> object:
        return self.as_worker(config) if self.worker else config

    def spawn(self, coro: object) -> None:
        raise AssertionError("not spawned")


@pytest.mark.parametrize("worker", [False, True])
def test_reloading_an_unchanged_file_needs_no_restart_in_a_worker_either(worker: bool) -> None:
    """A worker runs its metrics on a port of its own: an unchanged file is not a change of
    ``metrics`` (once warned ``restart_needed_for=['metrics']`` at every SIGHUP)."""
    from kafka_quota_proxy.proxy.reload import ConfigReload

    config = parse_config(BASE + "workers: 2\nmetrics: {listen: '127.0.0.1:9300'}\n", "<t>")
    proxy = _Reloaded(config, worker)
    reload = ConfigReload(proxy, None)  # type: ignore[arg-type]
    reload.apply(config)
    assert reload.restart_needed == []
    reload.apply(parse_config(BASE + "workers: 3\nmetrics: {listen: '127.0.0.1:9300'}\n", "<t>"))
    assert reload.restart_needed == ["workers"]
