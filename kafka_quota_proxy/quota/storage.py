"""Storage-aware throttling (seed 004): every broker's volume usage, shared through a compacted
topic, decides one cluster-wide state for producers. Pure: no I/O, time is passed in.

- A *limit* says when a volume is too full: ``ConsumedSpace`` (consumed bytes at or above the
  level), ``MinFreeBytes`` (free bytes at or below the level) or ``MinFreePercentage`` (free
  share of the capacity at or below the level, in percent). Each is turned into a threshold of
  consumed bytes for the volume's capacity.
- A volume is ``OPEN`` up to its soft threshold, ``THROTTLE`` past it, and ``PAUSE`` at or past
  its hard threshold. While throttled, its factor falls in proportion from 1 at the soft
  threshold to 0 at the hard one: ``(hard - consumed) / (hard - soft)``.
- The cluster takes the most constrained volume of any broker: the lowest factor, and
  ``PAUSE`` as soon as one volume is at or past its hard limit.
- A known broker whose snapshot is missing or older than ``stale_after_ms`` leaves the state
  unknown: the fail-safe applies (``PAUSE`` by default; ``OPEN`` ignores that broker).

Records are judged before they are trusted (``ClusterVolumes.update``/``tombstone``), since
anyone who can write to the topic could write them (``docs/security.md``):

- A snapshot stamped more than ``max_skew_ms`` (default 30 s) ahead of the reader's clock is
  refused and counted: it never takes hold, so it can neither pause producers until its date
  nor hide a full disk behind a "healthy" date far ahead.
- A newer snapshot replaces an older one; an older one (replayed) is ignored, except that any
  snapshot replaces a held one stamped ahead of the reader's clock (a clock that was ahead and
  came back does not freeze the broker's state until then). A held snapshot found stamped
  more than ``max_skew_ms`` ahead when the state is decided counts as no data (stale).
- Only the brokers in the cluster's metadata are waited for and counted; snapshots of other
  broker ids are kept (a broker may join before the metadata shows it) up to ``max_brokers``,
  and refused beyond it.
- A tombstone (a deleted record) is *not* taken to mean "no data now": the broker keeps its
  last snapshot, which goes stale ``stale_after_ms`` after its stamp as if its agent had
  stopped; only then does the fail-safe apply. (A broker that leaves the cluster leaves the
  metadata, and is no longer waited for.)

Limits a snapshot carries apply to its volumes (a volume's own, else the broker's); where it
carries none, the policy's defaults do.

The message is JSON, one per broker, keyed by broker id::

    {"brokerId": 1, "snapshotAt": "2026-11-22T16:00:00.000Z",
     "softLimit": {"type": "MinFreePercentage", "level": 20},
     "hardLimit": {"type": "MinFreePercentage", "level": 5},
     "volumes": [{"volumeName": "/var/lib/kafka", "capacity": 1000, "consumed": 500,
                  "softLimit": ..., "hardLimit": ...}]}

(``softLimit``/``hardLimit`` are optional at both levels.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any


class LimitType(Enum):
    CONSUMED_SPACE = "ConsumedSpace"
    MIN_FREE_BYTES = "MinFreeBytes"
    MIN_FREE_PERCENTAGE = "MinFreePercentage"


class State(Enum):
    OPEN = "OPEN"  # no effect
    THROTTLE = "THROTTLE"  # produce quotas scaled by the factor
    PAUSE = "PAUSE"  # no produce bytes admitted

    @property
    def level(self) -> int:
        """0, 1, 2: for metrics."""
        return {"OPEN": 0, "THROTTLE": 1, "PAUSE": 2}[self.value]


class SnapshotError(ValueError):
    """A volume-usage message that does not follow the schema."""


@dataclass(frozen=True, slots=True)
class Limit:
    type: LimitType
    level: float

    def threshold(self, capacity: int) -> float:
        """The consumed bytes at which this limit is reached on a volume of ``capacity``."""
        if self.type is LimitType.CONSUMED_SPACE:
            return self.level
        if self.type is LimitType.MIN_FREE_BYTES:
            return capacity - self.level
        return capacity * (1.0 - self.level / 100.0)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type.value, "level": self.level}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Limit | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise SnapshotError(f"{where}: expected an object with type and level")
        try:
            kind = LimitType(value.get("type"))
        except ValueError:
            raise SnapshotError(
                f"{where}.type: expected one of {', '.join(t.value for t in LimitType)}"
            ) from None
        level = value.get("level")
        if isinstance(level, bool) or not isinstance(level, int | float) or level < 0:
            raise SnapshotError(f"{where}.level: expected a number >= 0")
        if kind is LimitType.MIN_FREE_PERCENTAGE and level > 100:
            raise SnapshotError(f"{where}.level: a percentage is at most 100")
        return cls(kind, float(level))


@dataclass(frozen=True, slots=True)
class Volume:
    name: str
    capacity: int  # bytes
    consumed: int  # bytes in use
    soft: Limit | None = None  # overrides the broker's
    hard: Limit | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One broker's volume usage at ``snapshot_at_ms`` (wall clock, Unix ms)."""

    broker_id: int
    snapshot_at_ms: int
    volumes: tuple[Volume, ...]
    soft: Limit | None = None  # the broker's defaults for its volumes
    hard: Limit | None = None

    def to_json(self) -> bytes:
        def volume(v: Volume) -> dict[str, Any]:
            out: dict[str, Any] = {"volumeName": v.name, "capacity": v.capacity,
                                   "consumed": v.consumed}
            if v.soft is not None:
                out["softLimit"] = v.soft.to_json()
            if v.hard is not None:
                out["hardLimit"] = v.hard.to_json()
            return out

        doc: dict[str, Any] = {"brokerId": self.broker_id,
                               "snapshotAt": format_instant(self.snapshot_at_ms)}
        if self.soft is not None:
            doc["softLimit"] = self.soft.to_json()
        if self.hard is not None:
            doc["hardLimit"] = self.hard.to_json()
        doc["volumes"] = [volume(v) for v in self.volumes]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, broker_id: int, data: bytes | str) -> Snapshot:
        """The snapshot in a message keyed by ``broker_id``; ``SnapshotError`` says what is
        wrong with one that does not follow the schema."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise SnapshotError("expected a JSON object")
        if "brokerId" in doc and doc["brokerId"] != broker_id:
            raise SnapshotError(f"brokerId {doc['brokerId']!r} differs from the key {broker_id}")
        at = parse_instant(doc.get("snapshotAt"))
        volumes = doc.get("volumes")
        if not isinstance(volumes, list):
            raise SnapshotError("volumes: expected a list")
        parsed = []
        for i, v in enumerate(volumes):
            where = f"volumes[{i}]"
            if not isinstance(v, dict):
                raise SnapshotError(f"{where}: expected an object")
            name = v.get("volumeName")
            if not isinstance(name, str) or not name:
                raise SnapshotError(f"{where}.volumeName: expected a non-empty string")
            capacity, consumed = v.get("capacity"), v.get("consumed")
            for key, value in (("capacity", capacity), ("consumed", consumed)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise SnapshotError(f"{where}.{key}: expected a whole number of bytes >= 0")
            assert isinstance(capacity, int) and isinstance(consumed, int)
            parsed.append(Volume(name, capacity, consumed,
                                 Limit.from_json(v.get("softLimit"), f"{where}.softLimit"),
                                 Limit.from_json(v.get("hardLimit"), f"{where}.hardLimit")))
        return cls(broker_id, at, tuple(parsed),
                   Limit.from_json(doc.get("softLimit"), "softLimit"),
                   Limit.from_json(doc.get("hardLimit"), "hardLimit"))


def format_instant(ms: int) -> str:
    """ISO 8601, UTC, millisecond precision."""
    return datetime.fromtimestamp(ms / 1000.0, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def parse_instant(value: Any) -> int:
    if not isinstance(value, str):
        raise SnapshotError("snapshotAt: expected an ISO 8601 date-time")
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SnapshotError(f"snapshotAt: {value!r} is not an ISO 8601 date-time") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return round(at.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class VolumeVerdict:
    broker_id: int
    volume: Volume
    state: State
    factor: float


def volume_verdict(broker_id: int, volume: Volume, soft: Limit | None,
                   hard: Limit | None) -> VolumeVerdict:
    """A volume's state and factor under these limits (``hard`` None: never paused nor
    throttled, there being nothing to fall towards; ``soft`` None or not below ``hard``: no
    throttling band, straight from OPEN to PAUSE)."""
    consumed = volume.consumed
    h = hard.threshold(volume.capacity) if hard is not None else None
    if h is not None and consumed >= h:
        return VolumeVerdict(broker_id, volume, State.PAUSE, 0.0)
    s = soft.threshold(volume.capacity) if soft is not None else None
    if s is None or h is None or consumed <= s or s >= h:
        return VolumeVerdict(broker_id, volume, State.OPEN, 1.0)
    return VolumeVerdict(broker_id, volume, State.THROTTLE, (h - consumed) / (h - s))


@dataclass(frozen=True, slots=True)
class StoragePolicy:
    soft: Limit | None
    hard: Limit | None
    stale_after_ms: int = 120_000
    on_missing: State = State.PAUSE  # PAUSE or OPEN


@dataclass(frozen=True, slots=True)
class Verdict:
    """The cluster's storage state at one instant."""

    state: State
    factor: float  # produce quotas are scaled by this (0 when paused)
    constrained: VolumeVerdict | None  # the most constrained volume (fresh data only)
    volumes: tuple[VolumeVerdict, ...]  # every volume of every fresh snapshot
    stale: tuple[int, ...] = ()  # known brokers whose snapshot is too old
    missing: tuple[int, ...] = ()  # known brokers with no snapshot
    fail_safe: bool = False  # the state comes from the fail-safe, for lack of data


OPEN = Verdict(State.OPEN, 1.0, None, ())


MAX_CLOCK_SKEW_MS = 30_000  # what NTP-synced hosts are well within
MAX_BROKERS = 10_000  # broker ids whose snapshots are held


class Judgement(Enum):
    """What ``ClusterVolumes.update`` did with a snapshot."""

    TAKEN = "taken"
    OLDER = "older"  # older than the one held: ignored
    FUTURE = "future"  # stamped beyond the skew allowed: refused
    TOO_MANY_BROKERS = "too_many_brokers"  # a new broker id past ``max_brokers``: refused

    @property
    def refused(self) -> bool:
        return self in (Judgement.FUTURE, Judgement.TOO_MANY_BROKERS)


@dataclass
class ClusterVolumes:
    """The latest snapshot of every broker, as read from the topic, judged first (see the
    module's doc)."""

    policy: StoragePolicy
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    max_skew_ms: int = MAX_CLOCK_SKEW_MS
    max_brokers: int = MAX_BROKERS
    tombstones: int = 0

    def update(self, snapshot: Snapshot, now_ms: int) -> Judgement:
        """Take ``snapshot`` in at ``now_ms`` (the reader's wall clock, ms): refused when
        stamped more than ``max_skew_ms`` ahead of it; it replaces the held one when not
        older, or when the held one is stamped ahead of ``now_ms``."""
        if snapshot.snapshot_at_ms - now_ms > self.max_skew_ms:
            return Judgement.FUTURE
        old = self.snapshots.get(snapshot.broker_id)
        if old is None and len(self.snapshots) >= self.max_brokers:
            return Judgement.TOO_MANY_BROKERS
        if (old is None or snapshot.snapshot_at_ms >= old.snapshot_at_ms
                or old.snapshot_at_ms > now_ms):
            self.snapshots[snapshot.broker_id] = snapshot
            return Judgement.TAKEN
        return Judgement.OLDER

    def tombstone(self, broker_id: int) -> None:
        """A tombstone: the broker's record was deleted. Its last snapshot is kept, to go
        stale in its time (a deleted record is no data, not a verdict: see the module's
        doc)."""
        self.tombstones += 1

    def evaluate(self, now_ms: int, known_brokers: Iterable[int] = (),
                 read: bool = True) -> Verdict:
        """The state at ``now_ms`` (wall clock, ms) for ``known_brokers`` (from metadata;
        when none are known yet, the brokers with snapshots). ``read`` False: the topic has
        not been read yet, so nothing is known and the fail-safe applies."""
        snapshots = self.snapshots if read else {}
        known = sorted(set(known_brokers)) or sorted(snapshots)
        policy = self.policy
        stale: list[int] = []
        missing: list[int] = []
        verdicts: list[VolumeVerdict] = []
        for broker in known:
            snap = snapshots.get(broker)
            if snap is None:
                missing.append(broker)
                continue
            if (now_ms - snap.snapshot_at_ms > policy.stale_after_ms
                    or snap.snapshot_at_ms - now_ms > self.max_skew_ms):
                stale.append(broker)
                continue
            soft = snap.soft if snap.soft is not None else policy.soft
            hard = snap.hard if snap.hard is not None else policy.hard
            for v in snap.volumes:
                verdicts.append(volume_verdict(
                    broker, v, v.soft if v.soft is not None else soft,
                    v.hard if v.hard is not None else hard))
        constrained = min(verdicts, key=lambda v: (-v.state.level, v.factor), default=None)
        state = constrained.state if constrained is not None else State.OPEN
        factor = constrained.factor if constrained is not None else 1.0
        fail_safe = bool(stale or missing) or not read
        if fail_safe and policy.on_missing is State.PAUSE:
            state, factor = State.PAUSE, 0.0
        return Verdict(state, factor, constrained, tuple(verdicts), tuple(stale),
                       tuple(missing), fail_safe)
