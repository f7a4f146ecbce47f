"""The volume agent without a broker: measuring real directories, the snapshot it publishes,
the publish path against a stand-in Kafka client, and the command line."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka.admin
import pytest

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.config.loading import load_agent_config
from kafka_quota_proxy.config.schema import AgentFile, VolumeLimitsConfig
from kafka_quota_proxy.proxy.cluster_topics import signed
from kafka_quota_proxy.quota.storage import Limit, LimitType, Snapshot, Volume
from kafka_quota_proxy.volume_agent import agent as volume_agent
from kafka_quota_proxy.volume_agent.agent import (
    AgentError,
    AgentMetrics,
    VolumeAgent,
    VolumeError,
    measure_volumes,
    run_agent,
    snapshot,
)

REPO = Path(__file__).resolve().parents[3]
SLACK = 64 * 1024 * 1024  # other processes may write to the filesystem between two reads


def the_mount(path: Path) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def usage(path: str) -> tuple[int, int]:
    fs = os.statvfs(path)
    return fs.f_blocks * fs.f_frsize, (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def assert_measures(volume: Volume, mount: str, before: tuple[int, int],
                    after: tuple[int, int]) -> None:
    assert volume.name == mount
    assert volume.capacity == before[0] == after[0]
    low, high = sorted((before[1], after[1]))
    assert low - SLACK <= volume.consumed <= high + SLACK
    assert 0 < volume.consumed <= volume.capacity


def limits(**by_volume: dict[str, Any]) -> dict[str, VolumeLimitsConfig]:
    return {name: VolumeLimitsConfig.model_validate(v) for name, v in by_volume.items()}


def write_config(tmp_path: Path, log_dirs: list[str], bootstrap: str = "127.0.0.1:9",
                 extra: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    dirs = ", ".join(f'"{d}"' for d in log_dirs)
    path.write_text(f"""upstream:
  bootstrap_servers: ["{bootstrap}"]
storage:
  topic: volumes-under-test
  soft: {{type: MinFreePercentage, level: 20}}
  hard: {{type: MinFreeBytes, level: 1048576}}
  agent:
    broker_id: 5
    log_dirs: [{dirs}]
    interval_seconds: 0.05
    client_id: agent-under-test
{extra}""")
    return path


# ------------------------------------------------------------------ measuring


def test_a_log_dir_is_measured_as_its_mount(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka-logs"
    log_dir.mkdir()
    mount = the_mount(log_dir)
    before = usage(mount)
    (volume,) = measure_volumes([str(log_dir)])
    assert_measures(volume, mount, before, usage(mount))
    assert volume.soft is None and volume.hard is None


def test_log_dirs_on_one_filesystem_are_one_volume(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b" / "nested"
    a.mkdir()
    b.mkdir(parents=True)
    assert a.stat().st_dev == b.stat().st_dev
    mount = the_mount(a)
    before = usage(mount)
    (volume,) = measure_volumes([str(a), str(b)])
    assert_measures(volume, mount, before, usage(mount))


def other_filesystem(than: Path) -> str | None:
    for candidate in ("/dev/shm", "/run", "/dev", "/sys/fs/cgroup", "/proc"):
        if os.path.isdir(candidate) and os.stat(candidate).st_dev != than.stat().st_dev:
            return candidate
    return None


def test_log_dirs_on_two_filesystems_are_two_volumes_in_order(tmp_path: Path) -> None:
    other = other_filesystem(tmp_path)
    if other is None:
        pytest.skip("no second filesystem mounted here")
    first, second = measure_volumes([str(tmp_path), other, str(tmp_path / ".")])
    assert first.name == the_mount(tmp_path)
    assert second.name == the_mount(Path(other))
    assert (second.capacity, second.consumed) == pytest.approx(usage(other), abs=SLACK)


def test_a_volume_limit_lands_on_its_volume_only(tmp_path: Path) -> None:
    mount = the_mount(tmp_path)
    (volume,) = measure_volumes([str(tmp_path)], limits(**{
        mount: {"hard": {"type": "MinFreeBytes", "level": 4096}},
        "/elsewhere": {"soft": {"type": "ConsumedSpace", "level": 1}},
    }))
    assert volume.hard == Limit(LimitType.MIN_FREE_BYTES, 4096)
    assert volume.soft is None
    (both,) = measure_volumes([str(tmp_path)], limits(**{mount: {
        "soft": {"type": "MinFreePercentage", "level": 30},
        "hard": {"type": "MinFreePercentage", "level": 10}}}))
    assert (both.soft, both.hard) == (Limit(LimitType.MIN_FREE_PERCENTAGE, 30),
                                      Limit(LimitType.MIN_FREE_PERCENTAGE, 10))


def test_a_missing_log_dir_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "not-there"
    with pytest.raises(VolumeError, match=f"log dir {missing}: No such file or directory"):
        measure_volumes([str(tmp_path), str(missing)])


def test_a_file_is_not_a_log_dir(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(VolumeError, match=f"log dir {file}: not a directory"):
        measure_volumes([str(file)])


# ------------------------------------------------------------------ the snapshot


def agent_file(tmp_path: Path, log_dirs: list[str], extra: str = "") -> AgentFile:
    return load_agent_config(write_config(tmp_path, log_dirs, extra=extra))


def test_the_snapshot_carries_the_broker_the_limits_and_the_volumes(tmp_path: Path) -> None:
    mount = the_mount(tmp_path)
    file = agent_file(tmp_path, [str(tmp_path)], extra=f"""    volume_limits:
      "{mount}": {{hard: {{type: ConsumedSpace, level: 123456}}}}
""")
    assert file.storage.agent is not None
    before = usage(mount)
    snap = snapshot(file.storage.agent, file.storage, 1_795_000_000_123)
    assert snap.broker_id == 5
    assert snap.snapshot_at_ms == 1_795_000_000_123
    assert snap.soft == Limit(LimitType.MIN_FREE_PERCENTAGE, 20)
    assert snap.hard == Limit(LimitType.MIN_FREE_BYTES, 1048576)
    (volume,) = snap.volumes
    assert_measures(volume, mount, before, usage(mount))
    assert volume.hard == Limit(LimitType.CONSUMED_SPACE, 123456)
    assert Snapshot.from_json(5, snap.to_json()) == snap


# ------------------------------------------------------------------ publishing


class FakeAdmin:
    """Stands in for ``AIOKafkaAdminClient``: answers CreateTopics with ``codes`` in turn."""

    codes: list[int] = []
    created: list[tuple[str, int, int, dict[str, str]]] = []
    closed = 0

    def __init__(self, **config: Any) -> None:
        self.config = config

    async def start(self) -> None:
        pass

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": n} for n in range(5)]}

    async def create_topics(self, topics: list[Any]) -> Any:
        (t,) = topics
        FakeAdmin.created.append((t.name, t.num_partitions, t.replication_factor,
                                  dict(t.topic_configs)))
        code = FakeAdmin.codes.pop(0) if FakeAdmin.codes else 0
        return SimpleNamespace(topic_errors=[(t.name, code, "refused" if code else None)])

    async def close(self) -> None:
        FakeAdmin.closed += 1


class FakeProducer:
    """Stands in for ``AIOKafkaProducer``: records what is sent; fails while ``failing``."""

    instances: list[FakeProducer] = []
    failing = False

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []
        self.started = self.stopped = False
        FakeProducer.instances.append(self)

    async def start(self) -> None:
        self.started = True

    async def send_and_wait(self, topic: str, value: bytes, key: bytes,
                            headers: list[tuple[str, bytes]] | None = None) -> Any:
        if FakeProducer.failing:
            raise ConnectionError("broker gone")
        self.sent.append((topic, key, value))
        self.headers.append(headers)
        return SimpleNamespace(partition=0, offset=len(self.sent) - 1)

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    FakeAdmin.codes, FakeAdmin.created, FakeAdmin.closed = [], [], 0
    FakeProducer.instances, FakeProducer.failing = [], False
    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", FakeAdmin)
    monkeypatch.setattr(volume_agent, "AIOKafkaProducer", FakeProducer)
    yield


def sample(metrics: AgentMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(f"kafka_quota_proxy_volume_agent_{name}")


async def test_publish_creates_the_compacted_topic_and_sends_the_snapshot_keyed_by_broker(
        tmp_path: Path, fake_kafka: None) -> None:
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert await agent.publish_once()
    assert FakeAdmin.created == [("volumes-under-test", 1, 3, {"cleanup.policy": "compact"})]
    assert FakeAdmin.closed == 1
    (producer,) = FakeProducer.instances
    assert producer.config["client_id"] == "agent-under-test"
    assert producer.config["bootstrap_servers"] == ["127.0.0.1:9"]
    assert producer.config["acks"] == "all"
    ((topic, key, value),) = producer.sent
    assert (topic, key) == ("volumes-under-test", b"5")
    snap = Snapshot.from_json(5, value)
    assert [v.name for v in snap.volumes] == [the_mount(tmp_path)]
    assert sample(agent.metrics, "connected") == 1
    assert sample(agent.metrics, "published_total") == 1
    assert sample(agent.metrics, "publish_errors_total") == 0
    volume = snap.volumes[0]
    assert agent.metrics.registry.get_sample_value(
        "kafka_quota_proxy_volume_agent_volume_bytes",
        {"volume": volume.name, "kind": "capacity"}) == volume.capacity
    assert agent.metrics.registry.get_sample_value(
        "kafka_quota_proxy_volume_agent_volume_bytes",
        {"volume": volume.name, "kind": "consumed"}) == volume.consumed

    assert await agent.publish_once()  # the same producer, the topic not created again
    assert len(FakeProducer.instances) == 1 and len(producer.sent) == 2
    assert len(FakeAdmin.created) == 1
    await agent.close()
    assert producer.stopped


async def test_the_bootstrap_servers_of_the_agent_win_over_upstream(
        tmp_path: Path, fake_kafka: None) -> None:
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)], extra="""    bootstrap_servers:
      ["broker-a:9093", "broker-b:9093"]
"""))
    assert await agent.publish_once()
    assert FakeProducer.instances[0].config["bootstrap_servers"] == ["broker-a:9093",
                                                                     "broker-b:9093"]
    await agent.close()


@pytest.mark.parametrize("code", [0, 36])
async def test_an_existing_topic_is_fine(tmp_path: Path, fake_kafka: None, code: int) -> None:
    FakeAdmin.codes = [code]
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert await agent.publish_once()
    assert len(FakeAdmin.created) == 1
    await agent.close()


async def test_a_broker_refusing_the_topic_configs_gets_the_topic_without_them(
        tmp_path: Path, fake_kafka: None) -> None:
    FakeAdmin.codes = [40]  # INVALID_CONFIG, then created
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert await agent.publish_once()
    assert [configs for *_, configs in FakeAdmin.created] == [{"cleanup.policy": "compact"}, {}]
    assert len(FakeProducer.instances[0].sent) == 1
    await agent.close()


async def test_a_topic_that_cannot_be_created_is_a_publish_error(
        tmp_path: Path, fake_kafka: None) -> None:
    FakeAdmin.codes = [40, 29]  # INVALID_CONFIG, then TOPIC_AUTHORIZATION_FAILED
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert not await agent.publish_once()
    assert FakeProducer.instances == []
    assert sample(agent.metrics, "publish_errors_total") == 1
    assert sample(agent.metrics, "connected") == 0
    assert await agent.publish_once()  # the next tick tries again
    await agent.close()


async def test_a_failed_send_is_counted_and_the_next_tick_starts_afresh(
        tmp_path: Path, fake_kafka: None) -> None:
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert await agent.publish_once()
    FakeProducer.failing = True
    assert not await agent.publish_once()
    assert not await agent.publish_once()
    assert sample(agent.metrics, "publish_errors_total") == 2
    assert sample(agent.metrics, "connected") == 0
    assert sample(agent.metrics, "published_total") == 1
    assert all(p.stopped for p in FakeProducer.instances)
    FakeProducer.failing = False
    assert await agent.publish_once()
    assert sample(agent.metrics, "connected") == 1
    assert sample(agent.metrics, "published_total") == 2
    # A new producer, and the topic made sure of again (a broker may have restarted empty).
    assert len(FakeProducer.instances) == 3 and FakeProducer.instances[-1].sent
    assert len(FakeAdmin.created) == 3
    await agent.close()


async def test_a_missing_log_dir_is_a_publish_error_not_a_crash(
        tmp_path: Path, fake_kafka: None) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    agent = VolumeAgent(agent_file(tmp_path, [str(log_dir)]))
    log_dir.rmdir()
    assert not await agent.publish_once()
    assert sample(agent.metrics, "publish_errors_total") == 1
    assert FakeProducer.instances == []
    log_dir.mkdir()
    assert await agent.publish_once()
    await agent.close()


# ------------------------------------------------------------------ the loop


async def test_the_loop_keeps_going_without_a_broker_and_stops_when_told(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    file = load_agent_config(write_config(tmp_path, [str(tmp_path)], f"127.0.0.1:{port}"))
    metrics = AgentMetrics()
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(file, stop, metrics))
    for _ in range(400):
        if (sample(metrics, "publish_errors_total") or 0) >= 3 or task.done():
            break
        await asyncio.sleep(0.025)
    assert not task.done()
    assert (sample(metrics, "publish_errors_total") or 0) >= 3
    assert sample(metrics, "connected") == 0
    assert sample(metrics, "published_total") == 0
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_the_loop_publishes_at_start_and_every_interval(
        tmp_path: Path, fake_kafka: None) -> None:
    file = agent_file(tmp_path, [str(tmp_path)])
    metrics = AgentMetrics()
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(file, stop, metrics))
    for _ in range(400):
        if (sample(metrics, "published_total") or 0) >= 4:
            break
        await asyncio.sleep(0.025)
    stop.set()
    await asyncio.wait_for(task, 10)
    (producer,) = FakeProducer.instances
    assert len(producer.sent) >= 4 and producer.stopped
    times = [Snapshot.from_json(5, value).snapshot_at_ms for *_, value in producer.sent]
    # The first at start, the k-th not before k intervals (50 ms) later.
    assert times[-1] - times[0] >= (len(times) - 1) * 50 - 5


async def test_the_first_snapshot_does_not_wait_for_the_interval(
        tmp_path: Path, fake_kafka: None) -> None:
    path = write_config(tmp_path, [str(tmp_path)])
    path.write_text(path.read_text().replace("interval_seconds: 0.05", "interval_seconds: 600"))
    metrics = AgentMetrics()
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(load_agent_config(path), stop, metrics))
    for _ in range(400):
        if sample(metrics, "published_total"):
            break
        await asyncio.sleep(0.025)
    stop.set()
    await asyncio.wait_for(task, 10)  # the stop does not wait for the interval either
    assert sample(metrics, "published_total") == 1


async def test_a_busy_metrics_address_stops_the_agent(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        file = agent_file(tmp_path, [str(tmp_path)], extra=f'    metrics: "127.0.0.1:{port}"\n')
        with pytest.raises(AgentError, match=f"metrics: cannot listen on 127.0.0.1:{port}"):
            await run_agent(file, asyncio.Event())


# ------------------------------------------------------------------ the command line


def test_a_bad_config_is_reported_and_exits_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, [str(tmp_path)]).with_name("bad.yaml")
    path.write_text(write_config(tmp_path, [str(tmp_path)]).read_text()
                    .replace("interval_seconds: 0.05", "interval_seconds: -1"))
    assert main(["volume-agent", "--config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{path}: invalid configuration (1 error(s)):"
    assert err[1].startswith(f"  {path}:10:") and "storage.agent.interval_seconds" in err[1]


def test_a_config_without_the_agent_section_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text('upstream:\n  bootstrap_servers: ["127.0.0.1:9092"]\n'
                    "storage:\n  hard: {type: MinFreePercentage, level: 5}\n")
    proc = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "volume-agent", "--config",
                           str(path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert "storage.agent is required for the volume agent" in proc.stderr


async def test_with_a_secret_each_snapshot_is_signed(tmp_path: Path, fake_kafka: None) -> None:
    """``storage.secret``: the agent signs each snapshot (HMAC-SHA256 in a record header) so
    that proxies with the same secret can tell its snapshots from anyone else's."""
    agent = VolumeAgent(agent_file(tmp_path, [str(tmp_path)],
                                   extra='  secret: "volumes-shared-secret"\n'))
    assert await agent.publish_once()
    (producer,) = FakeProducer.instances
    (topic, key, value), = producer.sent
    assert signed(b"volumes-shared-secret", topic, key, value, producer.headers[0])
    assert not signed(b"another-secret-entirely", topic, key, value, producer.headers[0])
    unsigned = VolumeAgent(agent_file(tmp_path, [str(tmp_path)]))
    assert await unsigned.publish_once()
    assert FakeProducer.instances[-1].headers == [None]

