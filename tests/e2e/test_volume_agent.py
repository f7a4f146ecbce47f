"""The volume agent against a real tansu broker: it publishes its broker's volumes to a
compacted topic, counts errors while the broker is down, and resumes when it is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
from kafka_quota_proxy.quota.storage import Limit, LimitType, Snapshot
from testkit.e2e import wait_for

pytestmark = pytest.mark.e2e

BROKER_ID = 7
SLACK = 64 * 1024 * 1024  # other processes may write to the filesystem meanwhile
PREFIX = "kafka_quota_proxy_volume_agent_"


def the_mount(path: Path) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


@dataclass
class Agent:
    process: subprocess.Popen[bytes]
    metrics_port: int
    log_path: Path
    topic: str
    log_dir: Path

    def metrics(self) -> dict[str, float]:
        """The agent's own samples; empty while the endpoint does not answer."""
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(PREFIX):
                name, _, value = line.rpartition(" ")
                values[name[len(PREFIX):]] = float(value)
        return values

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TansuBroker]:
    b = TansuBroker(port=free_port(), log_path=str(tmp_path / "tansu.log")).start()
    yield b
    b.stop()


@pytest.fixture
def agent(tmp_path: Path, broker: TansuBroker) -> Iterator[Agent]:
    log_dir = tmp_path / "kafka-logs"
    log_dir.mkdir()
    metrics_port = free_port()
    topic = f"volumes-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "agent.yaml"
    config.write_text(f"""upstream:
  bootstrap_servers: ["{broker.bootstrap}"]
logging:
  level: info
storage:
  topic: {topic}
  soft: {{type: MinFreePercentage, level: 20}}
  hard: {{type: MinFreePercentage, level: 5}}
  agent:
    broker_id: {BROKER_ID}
    log_dirs: ["{log_dir}"]
    interval_seconds: 0.5
    client_id: volume-agent-e2e
    metrics: "127.0.0.1:{metrics_port}"
    volume_limits:
      "{the_mount(log_dir)}": {{hard: {{type: MinFreeBytes, level: 1000000}}}}
""")
    log_path = tmp_path / "agent.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kafka_quota_proxy", "volume-agent", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    a = Agent(process, metrics_port, log_path, topic, log_dir)
    yield a
    a.stop()


def read_snapshots(bootstrap: str, topic: str, timeout: float = 20) -> list[tuple[bytes, bytes]]:
    """The messages on the topic up to its end when called (at least one), as (key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert end > 0, f"no message on {topic}"
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[tuple[int, tuple[bytes, bytes]]] = []
        deadline = time.monotonic() + timeout
        while not got or got[-1][0] < end - 1:
            assert time.monotonic() < deadline, f"read {len(got)} of {end} messages on {topic}"
            got += [(m.offset(), (m.key(), m.value())) for m in consumer.consume(100, 0.5)
                    if m.error() is None]
        return [message for _, message in got]
    finally:
        consumer.close()


def topic_configs(bootstrap: str, topic: str) -> tuple[int, str]:
    """The topic's partition count and cleanup.policy."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return partitions, future.result(timeout=10)["cleanup.policy"].value


def check_snapshot(key: bytes, value: bytes, log_dir: Path, since_ms: int) -> Snapshot:
    """A snapshot of ``log_dir``'s volume, measured since ``since_ms``, with the limits of the
    config."""
    assert key == str(BROKER_ID).encode()
    snap = Snapshot.from_json(BROKER_ID, value)
    assert since_ms <= snap.snapshot_at_ms <= time.time() * 1000 + 1
    assert snap.soft == Limit(LimitType.MIN_FREE_PERCENTAGE, 20)
    assert snap.hard == Limit(LimitType.MIN_FREE_PERCENTAGE, 5)
    (volume,) = snap.volumes
    mount = the_mount(log_dir)
    fs = os.statvfs(mount)
    assert volume.name == mount
    assert volume.capacity == fs.f_blocks * fs.f_frsize
    assert volume.consumed == pytest.approx((fs.f_blocks - fs.f_bfree) * fs.f_frsize, abs=SLACK)
    assert volume.hard == Limit(LimitType.MIN_FREE_BYTES, 1000000) and volume.soft is None
    return snap


def test_the_agent_publishes_counts_errors_while_the_broker_is_down_and_resumes(
        broker: TansuBroker, agent: Agent) -> None:
    started_ms = int(time.time() * 1000) - 1000

    # Up: published, acknowledged, the topic compacted with one partition.
    up = wait_for(lambda: (m := agent.metrics()).get("published_total", 0) >= 2 and m, 30,
                  what="snapshots published")
    assert up["connected"] == 1 and up["publish_errors_total"] == 0
    for key, value in read_snapshots(broker.bootstrap, agent.topic):
        snap = check_snapshot(key, value, agent.log_dir, started_ms)
    (volume,) = snap.volumes
    assert up[f'volume_bytes{{kind="capacity",volume="{volume.name}"}}'] == volume.capacity
    assert up[f'volume_bytes{{kind="consumed",volume="{volume.name}"}}'] == pytest.approx(
        volume.consumed, abs=SLACK)
    assert topic_configs(broker.bootstrap, agent.topic) == (1, "compact")

    # Down: errors counted, disconnected, still running.
    stopped_ms = int(time.time() * 1000)
    broker.stop()
    down = wait_for(lambda: (m := agent.metrics()).get("publish_errors_total", 0) >= 2
                    and m.get("connected") == 0 and m, 30,
                    what="publish errors counted while the broker is down")
    assert agent.process.poll() is None

    # Back on the same port, its memory storage empty: the agent creates the topic again and
    # publishes fresh snapshots (none measured before the broker went away).
    broker.start()
    back = wait_for(lambda: (m := agent.metrics()).get("published_total", 0)
                    > down["published_total"] and m.get("connected") == 1 and m, 30,
                    what="publishing resumed after the broker came back")
    wait_for(lambda: agent.metrics().get("published_total", 0) > back["published_total"], 10,
             what="one more snapshot")
    for key, value in read_snapshots(broker.bootstrap, agent.topic):
        check_snapshot(key, value, agent.log_dir, stopped_ms)
    assert topic_configs(broker.bootstrap, agent.topic) == (1, "compact")

    assert agent.stop() == 0
    events = agent.events()  # every line of output is a JSON event
    names = [e["event"] for e in events]
    assert names[0] == "volume_agent_started" and names[-1] == "volume_agent_stopped"
    assert names.count("volume_topic_created") == 2
    assert names.count("volume_agent_connected") == 2
    assert "volume_agent_disconnected" in names
    failures = [e for e in events if e["event"] == "volume_publish_failed"]
    assert failures and all(e["level"] == "warning" and e["error"] for e in failures)
