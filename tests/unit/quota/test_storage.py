"""Storage-aware throttling, the pure part: limits, each volume's state and factor, the
cluster's most constrained volume, freshness and the fail-safe, and the message schema."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.storage import (
    MAX_CLOCK_SKEW_MS,
    ClusterVolumes,
    Judgement,
    Limit,
    LimitType,
    Snapshot,
    SnapshotError,
    State,
    StoragePolicy,
    Volume,
    volume_verdict,
)

GB = 1_000_000_000
PCT_SOFT, PCT_HARD = Limit(LimitType.MIN_FREE_PERCENTAGE, 20), Limit(
    LimitType.MIN_FREE_PERCENTAGE, 5)


def vol(consumed: int, capacity: int = 100 * GB, name: str = "/data") -> Volume:
    return Volume(name, capacity, consumed)


# (soft, hard) per limit type, on a 100 GB volume: thresholds at 80 GB and 95 GB consumed.
LIMITS = {
    LimitType.CONSUMED_SPACE: (Limit(LimitType.CONSUMED_SPACE, 80 * GB),
                               Limit(LimitType.CONSUMED_SPACE, 95 * GB)),
    LimitType.MIN_FREE_BYTES: (Limit(LimitType.MIN_FREE_BYTES, 20 * GB),
                               Limit(LimitType.MIN_FREE_BYTES, 5 * GB)),
    LimitType.MIN_FREE_PERCENTAGE: (PCT_SOFT, PCT_HARD),
}


@pytest.mark.parametrize("kind", list(LimitType))
@pytest.mark.parametrize(("consumed_gb", "state", "factor"), [
    (10, State.OPEN, 1.0),  # well below soft
    (80, State.OPEN, 1.0),  # at soft: not over it yet
    (83, State.THROTTLE, 0.8),  # 3 of the 15 GB between soft and hard used: 12/15 left
    (87.5, State.THROTTLE, 0.5),  # half way
    (94, State.THROTTLE, 1 / 15),
    (95, State.PAUSE, 0.0),  # at hard
    (100, State.PAUSE, 0.0),  # past hard (full)
])
def test_each_limit_type_at_below_between_and_past(kind: LimitType, consumed_gb: float,
                                                   state: State, factor: float) -> None:
    soft, hard = LIMITS[kind]
    got = volume_verdict(1, vol(int(consumed_gb * GB)), soft, hard)
    assert got.state is state
    assert got.factor == pytest.approx(factor, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 10**13), a=st.floats(0, 1), b=st.floats(0, 1),
       kind=st.sampled_from(list(LimitType)))
def test_factor_falls_monotonically_from_soft_to_hard(capacity: int, a: float, b: float,
                                                      kind: LimitType) -> None:
    soft, hard = LIMITS[kind]
    if kind is not LimitType.MIN_FREE_PERCENTAGE:  # scale the byte limits to the capacity
        soft, hard = (Limit(kind, capacity * 0.8), Limit(kind, capacity * 0.95)) if (
            kind is LimitType.CONSUMED_SPACE) else (
            Limit(kind, capacity * 0.2), Limit(kind, capacity * 0.05))
    lo, hi = sorted((a, b))
    f_lo = volume_verdict(1, vol(int(lo * capacity), capacity), soft, hard).factor
    f_hi = volume_verdict(1, vol(int(hi * capacity), capacity), soft, hard).factor
    assert 0.0 <= f_hi <= f_lo <= 1.0


def test_no_band_when_soft_is_not_below_hard_and_nothing_without_hard() -> None:
    hard = Limit(LimitType.MIN_FREE_PERCENTAGE, 20)
    soft = Limit(LimitType.MIN_FREE_PERCENTAGE, 10)  # reached after the hard one
    assert volume_verdict(1, vol(85 * GB), soft, hard).state is State.PAUSE
    assert volume_verdict(1, vol(79 * GB), soft, hard).state is State.OPEN
    assert volume_verdict(1, vol(99 * GB), PCT_SOFT, None).state is State.OPEN


def policy(on_missing: State = State.PAUSE) -> StoragePolicy:
    return StoragePolicy(PCT_SOFT, PCT_HARD, stale_after_ms=120_000, on_missing=on_missing)


def take(cluster: ClusterVolumes, snapshot: Snapshot) -> Judgement:
    """``cluster.update`` as of the snapshot's own stamp (a reader whose clock agrees)."""
    return cluster.update(snapshot, snapshot.snapshot_at_ms)


def snap(broker: int, at: int, *consumed_gb: float, **kw: object) -> Snapshot:
    volumes = tuple(vol(int(c * GB), name=f"/d{i}") for i, c in enumerate(consumed_gb))
    return Snapshot(broker, at, volumes, **kw)  # type: ignore[arg-type]


def test_the_most_constrained_volume_in_the_cluster_wins() -> None:
    cluster = ClusterVolumes(policy())
    take(cluster, snap(1, 1000, 10, 50))
    take(cluster, snap(2, 1000, 30, 87.5, 83))  # broker 2's second volume: factor 0.5
    take(cluster, snap(3, 1000, 60))
    v = cluster.evaluate(2000, [1, 2, 3])
    assert v.state is State.THROTTLE and v.factor == pytest.approx(0.5)
    assert v.constrained is not None
    assert (v.constrained.broker_id, v.constrained.volume.name) == (2, "/d1")
    assert not v.fail_safe
    take(cluster, snap(3, 1500, 60, 96))  # any volume past hard: PAUSE
    v = cluster.evaluate(2000, [1, 2, 3])
    assert (v.state, v.factor, v.constrained and v.constrained.broker_id) == (
        State.PAUSE, 0.0, 3)


def test_limits_carried_by_a_snapshot_override_the_policy_per_broker_and_per_volume() -> None:
    cluster = ClusterVolumes(policy())
    # Broker-wide: hard at 50% free, so 60 GB used pauses; the second volume overrides that.
    loose = Limit(LimitType.MIN_FREE_PERCENTAGE, 1)
    take(cluster, Snapshot(1, 0, (vol(60 * GB, name="/a"),
                                   Volume("/b", 100 * GB, 60 * GB, None, loose)),
                            None, Limit(LimitType.MIN_FREE_PERCENTAGE, 50)))
    v = cluster.evaluate(0, [1])
    assert [(x.volume.name, x.state) for x in v.volumes] == [
        ("/a", State.PAUSE), ("/b", State.OPEN)]


@pytest.mark.parametrize("on_missing", [State.PAUSE, State.OPEN])
def test_stale_and_missing_brokers_apply_the_fail_safe(on_missing: State) -> None:
    cluster = ClusterVolumes(policy(on_missing))
    take(cluster, snap(1, 0, 83))  # throttling on its own: factor 0.8
    take(cluster, snap(2, 100_000, 10))
    fresh = cluster.evaluate(110_000, [1, 2])
    assert (fresh.state, fresh.fail_safe) == (State.THROTTLE, False)
    stale = cluster.evaluate(125_000, [1, 2])  # broker 1's snapshot is 125 s old
    assert stale.stale == (1,) and stale.fail_safe
    missing = cluster.evaluate(110_000, [1, 2, 3])  # broker 3 never published
    assert missing.missing == (3,) and missing.fail_safe
    if on_missing is State.PAUSE:
        assert (stale.state, stale.factor) == (State.PAUSE, 0.0)
        assert (missing.state, missing.factor) == (State.PAUSE, 0.0)
    else:  # OPEN: the brokers without fresh data are left out
        assert (stale.state, stale.factor) == (State.OPEN, 1.0)  # only broker 2 is fresh
        assert missing.state is State.THROTTLE
    # Brokers not in the metadata (gone from the cluster) are not waited for.
    assert cluster.evaluate(110_000, [2]).state is State.OPEN


def test_transitions_open_throttle_pause_open() -> None:
    cluster = ClusterVolumes(policy())
    states = []
    for t, used in enumerate([50, 85, 90, 96, 99, 70]):
        take(cluster, snap(1, t * 1000, used))
        states.append(cluster.evaluate(t * 1000 + 10, [1]).state)
    assert states == [State.OPEN, State.THROTTLE, State.THROTTLE, State.PAUSE, State.PAUSE,
                      State.OPEN]


def test_older_snapshots_are_ignored() -> None:
    cluster = ClusterVolumes(policy())
    take(cluster, snap(1, 5000, 96))
    assert cluster.update(snap(1, 4000, 10), 5000) is Judgement.OLDER  # replayed
    assert cluster.evaluate(5000, [1]).state is State.PAUSE


YEAR_2099 = 4_070_908_800_000
NOW = 1_800_000_000_000  # 2027


def test_a_snapshot_stamped_beyond_the_skew_never_takes_hold() -> None:
    """Issue 26: a full disk dated 2099 paused every producer and shut out the agent's fresh
    snapshots (only a newer stamp replaced it); a "healthy" one dated 2100 hid a full disk."""
    cluster = ClusterVolumes(policy())
    take(cluster, snap(1, NOW - 1000, 50))
    assert cluster.update(snap(1, YEAR_2099, 99.9), NOW) is Judgement.FUTURE
    assert cluster.evaluate(NOW, [1]).state is State.OPEN
    assert take(cluster, snap(1, NOW + 1000, 50)) is Judgement.TAKEN  # the agent's next
    take(cluster, snap(1, NOW + 2000, 99))  # the disk fills: PAUSE ...
    assert cluster.update(snap(1, YEAR_2099 + 365 * 86_400_000, 10), NOW + 2500) \
        is Judgement.FUTURE  # ... and a "healthy" 2100 cannot hide it
    assert cluster.evaluate(NOW + 2500, [1]).state is State.PAUSE
    # Within the skew allowed (hosts' clocks a little apart) a snapshot is taken.
    assert cluster.update(snap(1, NOW + 2500 + MAX_CLOCK_SKEW_MS, 50), NOW + 2500) \
        is Judgement.TAKEN
    assert cluster.update(snap(2, NOW + MAX_CLOCK_SKEW_MS + 1, 50), NOW) is Judgement.FUTURE
    assert Judgement.FUTURE.refused and not Judgement.OLDER.refused


def test_a_fresh_snapshot_replaces_one_stamped_ahead_of_the_reader() -> None:
    """A snapshot stamped ahead (within the skew: a clock ahead that came back) is replaced by
    the agent's next one, though that one is older by its stamp; and one held while the
    reader's clock was far behind counts as no data once it is beyond the skew."""
    cluster = ClusterVolumes(policy())
    take(cluster, snap(1, NOW, 99))
    assert cluster.update(snap(1, NOW - 20_000, 50), NOW - 25_000) is Judgement.TAKEN
    assert cluster.evaluate(NOW - 25_000, [1]).state is State.OPEN
    # (held when it was fresh; the reader's clock then set back by a minute)
    v = cluster.evaluate(NOW - 20_000 - MAX_CLOCK_SKEW_MS - 1, [1])
    assert v.stale == (1,) and v.fail_safe and v.state is State.PAUSE


@pytest.mark.parametrize("on_missing", [State.PAUSE, State.OPEN])
def test_a_tombstone_is_no_data_only_after_the_staleness(on_missing: State) -> None:
    """Issue 26: a tombstone forced the fail-safe PAUSE at once. It is counted; the broker's
    last snapshot holds until it is stale, as if its agent had stopped, then the fail-safe."""
    cluster = ClusterVolumes(policy(on_missing))
    take(cluster, snap(1, NOW, 50))
    cluster.tombstone(1)
    assert cluster.tombstones == 1
    v = cluster.evaluate(NOW + 1000, [1])
    assert (v.state, v.fail_safe) == (State.OPEN, False)
    v = cluster.evaluate(NOW + 120_001, [1])
    assert v.stale == (1,) and v.fail_safe
    assert v.state is on_missing
    take(cluster, snap(1, NOW + 120_500, 50))  # the agent again
    assert not cluster.evaluate(NOW + 121_000, [1]).fail_safe


def test_brokers_not_in_the_metadata_are_not_counted_and_are_bounded() -> None:
    cluster = ClusterVolumes(policy(), max_brokers=3)
    take(cluster, snap(1, NOW, 50))
    take(cluster, snap(999, NOW, 99.9))  # no such broker in the cluster
    assert cluster.evaluate(NOW, [1]).state is State.OPEN
    take(cluster, snap(998, NOW, 10))
    assert take(cluster, snap(997, NOW, 10)) is Judgement.TOO_MANY_BROKERS
    assert sorted(cluster.snapshots) == [1, 998, 999]
    assert take(cluster, snap(1, NOW + 1, 10)) is Judgement.TAKEN  # a held broker: still


LIMITS_ST = st.one_of(st.none(), st.builds(
    Limit, st.sampled_from(list(LimitType)), st.integers(0, 100).map(float)))


@settings(max_examples=100, deadline=None)
@given(broker=st.integers(0, 10_000), at=st.integers(0, 4_000_000_000_000),
       volumes=st.lists(st.builds(Volume, st.text(min_size=1, max_size=10),
                                  st.integers(0, 2**53), st.integers(0, 2**53), LIMITS_ST,
                                  LIMITS_ST), max_size=4),
       soft=LIMITS_ST, hard=LIMITS_ST)
def test_message_round_trips(broker: int, at: int, volumes: list[Volume], soft: Limit | None,
                             hard: Limit | None) -> None:
    s = Snapshot(broker, at, tuple(volumes), soft, hard)
    assert Snapshot.from_json(broker, s.to_json()) == s


def test_message_follows_the_seed_schema() -> None:
    s = Snapshot(2, 1_795_000_000_123, (Volume("/dev/sda1", 1000, 400),), PCT_SOFT, PCT_HARD)
    doc = json.loads(s.to_json())
    assert doc == {
        "brokerId": 2, "snapshotAt": "2026-11-18T11:06:40.123Z",
        "softLimit": {"type": "MinFreePercentage", "level": 20.0},
        "hardLimit": {"type": "MinFreePercentage", "level": 5.0},
        "volumes": [{"volumeName": "/dev/sda1", "capacity": 1000, "consumed": 400}]}


@pytest.mark.parametrize(("text", "complaint"), [
    (b"nope", "not JSON"),
    (b"[]", "expected a JSON object"),
    (b'{"snapshotAt": "yesterday", "volumes": []}', "snapshotAt"),
    (b'{"snapshotAt": "2026-11-22T10:00:00Z"}', "volumes: expected a list"),
    (b'{"snapshotAt": "2026-11-22T10:00:00Z", "volumes": [{"volumeName": "a", "capacity": -1,'
     b' "consumed": 0}]}', "volumes[0].capacity"),
    (b'{"snapshotAt": "2026-11-22T10:00:00Z", "volumes": [], "hardLimit": {"type": "Lots",'
     b' "level": 1}}', "hardLimit.type"),
    (b'{"snapshotAt": "2026-11-22T10:00:00Z", "volumes": [], "softLimit": {"type":'
     b' "MinFreePercentage", "level": 120}}', "at most 100"),
    (b'{"brokerId": 9, "snapshotAt": "2026-11-22T10:00:00Z", "volumes": []}', "differs"),
])
def test_malformed_messages_say_what_is_wrong(text: bytes, complaint: str) -> None:
    with pytest.raises(SnapshotError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        Snapshot.from_json(1, text)


@pytest.mark.parametrize("on_missing", [State.PAUSE, State.OPEN])
def test_before_the_topic_is_read_the_fail_safe_applies(on_missing: State) -> None:
    cluster = ClusterVolumes(policy(on_missing))
    take(cluster, snap(1, 0, 10))
    for known in ([1, 2], []):  # with or without metadata yet
        v = cluster.evaluate(0, known, read=False)
        assert v.fail_safe and v.missing == tuple(known)
        assert (v.state, v.factor) == ((State.PAUSE, 0.0) if on_missing is State.PAUSE
                                       else (State.OPEN, 1.0))
    assert not cluster.evaluate(0, [1]).fail_safe
