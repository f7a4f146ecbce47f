"""Shadow quotas with a real broker (tansu) and librdkafka: a producer at its default batch
size, paced at RATE, under a live quota that does not bind and a shadow quota a quarter of its
rate. The producer gets its rate and never sees a throttle (librdkafka's own throttle stats,
the live throttle metrics); the shadow metrics show what the candidate would have imposed;
a reload switches the shadow off (its totals stop) and on again (they go on); and the Spark
replay of the capture under the shadow's section (``kafka-quota-proxy replay --config``)
gives the shadow's throttled requests and throttle time for the producer, to the request and
the ms, as does the quota engine's replay (``quota.replay``) per budget."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import KafkaError, Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.quota.shadow import capture_by_broker, replayed_budgets
from testkit.e2e import ProxyProcess, new_topic

pytestmark = pytest.mark.e2e

RATE = 600_000  # bytes/s the producers offer
LIVE = 50_000_000  # the live quota: far above
SHADOW_RATE = 150_000  # the candidate: a quarter of what they offer
SHADOW = {"window": {"samples": 5, "size_seconds": 1},
          "entities": [{"client-id": "<default>", "producer_byte_rate": SHADOW_RATE}]}
ENTITY = re.compile(r'^kafka_proxy_shadow_quota_entity_(throttled_requests|throttle_seconds)'
                    r'_total\{(.*)\}$')
LABEL = re.compile(r'(\w+)="([^"]*)"')
TOTAL_N = 'kafka_proxy_shadow_quota_throttled_requests_total{quota="produce"}'
TOTAL_S = 'kafka_proxy_shadow_quota_throttle_seconds_total{quota="produce"}'
LIVE_N = 'kafka_proxy_quota_throttled_requests_total{quota="produce"}'


class Paced:
    """A librdkafka producer at its defaults (batch.size, linger.ms), 1 KB messages at
    RATE; its throttle stats and what it got delivered."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        self.throttle_max_ms = 0
        self.throttled = 0  # responses librdkafka saw a throttle_time_ms > 0 in
        self.stats = 0
        self.delivered = 0
        self.errors: list[KafkaError] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all",
            "statistics.interval.ms": 500, "stats_cb": self._stats})

    def _stats(self, text: str) -> None:
        self.stats += 1
        for broker in json.loads(text).get("brokers", {}).values():
            throttle = broker.get("throttle", {})
            self.throttle_max_ms = max(self.throttle_max_ms, throttle.get("max", 0))
            self.throttled += throttle.get("cnt", 0)

    def _done(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered += len(msg.value())

    def run(self, topic: str, seconds: float) -> float:
        """Produce for ``seconds`` at RATE, flush; the rate delivered (bytes/s)."""
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < seconds:
            if sent > RATE * elapsed:
                self.producer.poll(0.002)
                continue
            self.producer.produce(topic, value=b"s" * 1000, on_delivery=self._done)
            sent += 1000
            self.producer.poll(0)
        assert self.producer.flush(30) == 0
        self.producer.poll(0.6)  # (one more stats callback)
        return self.delivered / seconds


def _shadow_budgets(metrics: dict[str, float]) -> dict[tuple[str, str], tuple[int, int]]:
    """(broker, client-id) -> the shadow's (throttled requests, throttle ms) of each produce
    budget in the per-entity metrics."""
    found: dict[tuple[str, str], list[int]] = {}
    for name, value in metrics.items():
        m = ENTITY.match(name)
        if m:
            kind = m.group(1)
            labels = dict(LABEL.findall(m.group(2)))
            if labels["quota"] != "produce":
                continue
            slot = found.setdefault((labels["broker"], labels["client_id"]), [0, 0])
            if kind == "throttled_requests":
                slot[0] = int(value)
            else:
                slot[1] = round(value * 1000)
    return {k: (n, ms) for k, (n, ms) in found.items()}


def test_a_shadow_quota_shows_its_throttles_without_applying_them_and_a_replay_agrees(
        tansu: TansuBroker, tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    shadow_yaml = yaml.safe_dump({"shadow": {"enabled": True, **SHADOW}}, sort_keys=False)
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  entities:
    - {{client-id: "<default>", producer_byte_rate: {LIVE}}}
  watch_seconds: 0.5
""" + "".join(f"  {line}\n" for line in shadow_yaml.splitlines()) + f"""capture:
  dir: "{capture_dir}"
  rotate_seconds: 2
""").start()
    producers: list[Paced] = []
    try:
        proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "shadow")
        assert proxy.metrics()["kafka_proxy_shadow_quota_enabled"] == 1
        # 1. on: the producer at its rate, untouched; the shadow would have throttled it
        first = Paced(proxy.bootstrap, "shadow-a")
        producers.append(first)
        achieved = first.run(topic, 8)
        metrics = proxy.metrics()
        budgets = _shadow_budgets(metrics)
        shadow_a = {k: v for k, v in budgets.items() if k[1] == "shadow-a"}
        n_a = sum(n for n, _ in shadow_a.values())
        ms_a = sum(ms for _, ms in shadow_a.values())
        print(f"\nshadow-a: {achieved:.0f} B/s delivered of {RATE}; shadow throttles "
              f"{n_a} requests, {ms_a} ms; librdkafka throttle max {first.throttle_max_ms} ms "
              f"({first.stats} stats callbacks)")
        assert achieved >= RATE * 0.9, achieved
        assert not first.errors, first.errors[:3]
        assert first.stats >= 5 and (first.throttle_max_ms, first.throttled) == (0, 0)
        assert metrics.get(LIVE_N, 0) == 0
        assert metrics.get("kafka_proxy_quota_held_first_requests_total", 0) == 0
        # what the shadow would have imposed: its quota is a quarter of the rate, so
        # throttles worth at least a few seconds of the run
        assert n_a >= 10 and ms_a >= 3000, shadow_a
        assert metrics[TOTAL_N] == n_a and round(metrics[TOTAL_S] * 1000) == ms_a

        # 2. off by reload: the totals stop
        proxy.edit_config("enabled: true", "enabled: false")
        metrics = proxy.metrics()
        assert metrics["kafka_proxy_shadow_quota_enabled"] == 0
        assert not _shadow_budgets(metrics)
        second = Paced(proxy.bootstrap, "shadow-b")
        producers.append(second)
        assert second.run(topic, 3) >= RATE * 0.9
        metrics = proxy.metrics()
        assert (metrics[TOTAL_N], round(metrics[TOTAL_S] * 1000)) == (n_a, ms_a)
        # 3. on again: they go on (a fresh engine: nothing was recorded while off)
        proxy.edit_config("enabled: false", "enabled: true")
        assert second.run(topic, 5) >= RATE * 0.9
        metrics = proxy.metrics()
        assert metrics["kafka_proxy_shadow_quota_enabled"] == 1
        assert metrics[TOTAL_N] > n_a + 5
        assert any(k[1] == "shadow-b" for k in _shadow_budgets(metrics))
        assert (second.throttle_max_ms, second.throttled) == (0, 0)
        assert metrics.get(LIVE_N, 0) == 0
        events = [e["event"] for e in proxy.events() if e.get("event", "").startswith(
            "shadow_quotas_")]
        assert events == ["shadow_quotas_enabled", "shadow_quotas_disabled",
                          "shadow_quotas_enabled"], events
    finally:
        for p in producers:
            p.producer.flush(10)
            p.producer = None  # type: ignore[assignment]  # (destroyed now: it refers to p)
        proxy.stop()

    # 4. the capture replayed under the shadow's section: the same would-be throttles. Only
    # shadow-a's budget saw all its requests under one shadow (shadow-b's ran while it was
    # off): its rows alone are the budget's (a budget per client-id).
    rows = [r for f in sorted(capture_dir.glob("capture-*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    docs = [json.loads(f.read_text()) for f in capture_dir.glob("quotas-*.json")]
    assert docs and all("shadow" not in d["quotas"] for d in docs)  # the live config only
    settings = settings_from_section(SHADOW)
    replayed = replayed_budgets(
        capture_by_broker([r for r in rows if r["client_id"] == "shadow-a"]), settings)
    assert {(("bootstrap" if b < 0 else str(b)), tags[1]): v
            for (b, qt, tags), v in replayed.items() if qt is QuotaType.PRODUCE} == shadow_a

    # ... and by the Spark job, as an operator runs it: the proxy's config with the shadow
    # section as its quotas
    config = yaml.safe_load(proxy.config_path.read_text())
    config["quotas"] = SHADOW
    config.pop("capture")
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(yaml.safe_dump(config, sort_keys=False))
    out = tmp_path / "replay"
    proc = subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", "replay", "--capture", str(capture_dir),
         "--config", str(candidate), "--out", str(out), "--master", "local[2]"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "replay.csv").open() as f:
        spark = {r["client_id"]: r for r in csv.DictReader(f)}
    print(f"spark replay, shadow-a: {spark['shadow-a']}")
    assert (int(spark["shadow-a"]["throttled_requests"]),
            int(float(spark["shadow-a"]["throttle_ms"]))) == (n_a, ms_a)
