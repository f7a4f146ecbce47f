"""Storage throttling's runtime without a cluster: records judged before they are trusted
(issue 26): future stamps refused and counted, tombstones counted and left to go stale,
records not signed with ``storage.secret`` refused."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.schema import StorageConfig
from kafka_quota_proxy.proxy.cluster_topics import mac_headers
from kafka_quota_proxy.proxy.features.storage.watch import StorageWatch
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.storage import Snapshot, State, Volume

NOW = 1_800_000_000_000
GB = 1_000_000_000


def watch(clock: list[int], **config: object) -> StorageWatch:
    cfg = StorageConfig.model_validate({"hard": {"type": "MinFreePercentage", "level": 5},
                                        "stale_after_seconds": 10, **config})
    w = StorageWatch(cfg, QuotaEnforcer(QuotaSettings()), [], lambda: {1},
                     clock=lambda: clock[0])
    w._reader_state(True, True)
    return w


def snap(at: int, consumed_gb: int) -> bytes:
    return Snapshot(1, at, (Volume("/data", 100 * GB, consumed_gb * GB),)).to_json()


def refused(w: StorageWatch) -> dict[str, float]:
    families = {m.name: m for m in w.metric_families()}
    return {s.labels["reason"]: s.value
            for s in families["kafka_proxy_storage_refused_snapshots"].samples}


def test_future_snapshots_refused_and_tombstones_left_to_go_stale(
        capsys: pytest.CaptureFixture[str]) -> None:
    clock = [NOW]
    w = watch(clock)
    w.observe(b"1", snap(NOW, 50))
    for _ in range(3):
        w.observe(b"1", snap(4_070_908_800_000, 99))  # 2099, full
    assert w.evaluate().state is State.OPEN
    assert refused(w)["future"] == 3
    assert capsys.readouterr().out.count("storage_snapshot_refused") == 1  # rate-limited
    w.observe(b"1", None)
    assert w.evaluate().state is State.OPEN and w.cluster.tombstones == 1
    clock[0] += 10_001
    v = w.evaluate()
    assert (v.state, v.stale) == (State.PAUSE, (1,))


def test_with_a_secret_only_signed_records_count() -> None:
    clock = [NOW]
    w = watch(clock, secret="volumes-shared-secret")
    sub = w.subscription()
    good = snap(NOW, 50)
    sub.deliver(b"1", good, 0, mac_headers(w.secret, sub.topic, b"1", good)["headers"])
    assert w.evaluate().state is State.OPEN
    full = snap(NOW + 1, 99)
    sub.deliver(b"1", full, 0, None)  # anyone's
    sub.deliver(b"1", None, 0, None)  # an unsigned tombstone
    assert w.evaluate().state is State.OPEN and w.cluster.tombstones == 0
    assert refused(w)["unsigned"] == 2
    sub.deliver(b"1", full, 0, mac_headers(w.secret, sub.topic, b"1", full)["headers"])
    assert w.evaluate().state is State.PAUSE
