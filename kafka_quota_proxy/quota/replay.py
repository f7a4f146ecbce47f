"""Replay captured requests through the quota engine, exactly as the proxy recorded them.

The proxy keeps one ``QuotaManager`` per upstream broker and records each request (at
``quota_ms`` on its quota clock, in ``seq`` order) by ``quota.recording.record_request``,
the one recording rule. ``replay`` calls the same for the
requests of one broker, in order, and yields the throttle each quota type returns. Under the
config that was live at capture time this reproduces the proxy's throttles; under another it
answers "what would that config have done".

``let_through`` runs the same engine as a client that waits out its throttles would meet it:
which requests one enforcement point would have let through (for captures written by several
processes, ``spark_jobs.replay.single_point``).

Also here: ``settings_from_section``, the ``quotas`` config section (as a plain mapping, as
in YAML or the ``quotas-*.json`` files next to a capture) as ``QuotaSettings``. It trusts the
shape; the proxy's config loader validates it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka_quota_proxy.quota.entities import DEFAULT, DEFAULT_NAME, EntityKey, Name, QuotaType
from kafka_quota_proxy.quota.manager import ONE_HOUR_MS, QuotaManager, QuotaSettings
from kafka_quota_proxy.quota.recording import record_request
from kafka_quota_proxy.quota.request_time import RequestTimeModel

EXPIRE_EVERY_MS = 60_000  # the proxy's idle-sensor expiry loop
NEVER = 2**63


def settings_from_section(section: Mapping[str, Any]) -> QuotaSettings:
    window = section.get("window") or {}
    entities: dict[EntityKey, dict[QuotaType, float]] = {}

    def name(value: Any) -> Name | None:
        if value is None:
            return None
        return DEFAULT if value == DEFAULT_NAME else str(value)

    for e in section.get("entities") or []:
        key = EntityKey(name(e.get("user")), name(e.get("client-id", e.get("client_id"))))
        quotas = {qt: float(e[qt.value]) for qt in QuotaType if e.get(qt.value) is not None}
        if quotas:
            entities[key] = quotas
    return QuotaSettings(
        samples=int(window.get("samples", 11)),
        window_ms=int(float(window.get("size_seconds", 1)) * 1000),
        cap_byte_rate_throttle=bool(section.get("cap_byte_rate_throttle", False)),
        entities=entities,
        request_time=RequestTimeModel(**(section.get("request_time") or {})),
        pacing=str(section.get("pacing", "kafka")),
    )


def independent_by(configs: Iterable[QuotaSettings], storage: bool = False) -> str | None:
    """A capture column (``"user"`` or ``"client_id"``) whose different values never share a
    quota budget under any of ``configs``, so that requests can be replayed in separate groups
    by it, or ``None`` when budgets may span both.

    Budgets (``entities.metric_tags``) are per (user, client-id) pair, per user (a user-only
    entity: levels 3 and 6) or per client-id (a client-id-only entity: levels 7 and 8; and
    unlimited budgets, which never throttle, until storage throttling gives them its base rate:
    ``storage``)."""
    by_user, by_client = False, storage
    for settings in configs:
        for key in settings.entities:
            by_user |= key.client_id is None
            by_client |= key.user is None
    if by_user and by_client:
        return None
    return "user" if by_user else "client_id"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One captured request, as the replay needs it (capture schema v1 columns)."""

    seq: int
    quota_ms: int
    user: str
    client_id: str
    api_key: int
    request_bytes: int
    response_bytes: int  # -1: no response (acks=0)
    duration_us: int
    request_time_ms: float  # exact request time when the request quota recorded it, else 0
    follower: bool
    quota_generation: int = 0
    # the storage factor in force (None: none); for a Produce, when the proxy read it
    storage_scale: float | None = None


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """What storage-aware throttling applied besides its factor (the proxy's ``storage``
    section, written next to the capture): the produce rate of producers with no quota, and
    who is exempt."""

    unquoted_produce_bound: float
    exempt_users: frozenset[str] = frozenset()
    # captures of proxies from before exemptions by client-id were refused
    exempt_client_ids: frozenset[str] = frozenset()

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> StorageSettings:
        return cls(float(section["unquoted_producer_byte_rate"]),
                   frozenset(section.get("exempt_users") or ()),
                   frozenset(section.get("exempt_client_ids") or ()))


@dataclass(frozen=True, slots=True)
class Throttles:
    seq: int
    produce_ms: int
    fetch_ms: int
    request_ms: int

    @property
    def applied_ms(self) -> int:
        """What the client was held back for: the largest of the three."""
        return max(self.produce_ms, self.fetch_ms, self.request_ms)


def replay(requests: Iterable[Recorded],
           settings: QuotaSettings | Callable[[int], QuotaSettings],
           idle_expiry_ms: int = ONE_HOUR_MS,
           storage: StorageSettings | None = None) -> Iterator[Throttles]:
    """Throttles of one broker's requests (in ``quota_ms``, ``seq`` order). ``settings`` is
    one config, or the config of each ``quota_generation``; ``storage``: the capture's
    storage settings, needed where requests carry a ``storage_scale``."""
    listed = list(requests)
    rows = [(r.quota_ms, r.user, r.client_id, r.api_key, r.request_bytes, r.response_bytes,
             r.duration_us, r.request_time_ms, r.follower, r.quota_generation, r.storage_scale)
            for r in listed]
    produce, fetch, request = replay_rows(rows, settings, idle_expiry_ms, storage)
    for r, p, f, q in zip(listed, produce, fetch, request, strict=True):
        yield Throttles(r.seq, p, f, q)


Row = tuple[int, str, str, int, int, int, int, float, bool, int, float | None]


Throttled = tuple[list[int], list[int], list[int]]


def expiry_times(times: Sequence[int]) -> list[int]:
    """When ``replay_rows`` runs the idle-sensor expiry over rows recorded at ``times`` (in
    order): first at the first time at least ``EXPIRE_EVERY_MS`` after the first row's, then
    at the first at least that long after the previous run, and so on."""
    out: list[int] = []
    if not len(times):
        return out
    due = times[0] + EXPIRE_EVERY_MS
    i = 0
    while True:
        i = bisect_left(times, due, i)
        if i >= len(times):
            return out
        at = int(times[i])
        out.append(at)
        due = at + EXPIRE_EVERY_MS


def replay_rows(rows: Iterable[Row], settings: QuotaSettings | Callable[[int], QuotaSettings],
                idle_expiry_ms: int = ONE_HOUR_MS, storage: StorageSettings | None = None,
                results: Throttled | None = None,
                expire_at: Sequence[int] | None = None) -> Throttled:
    """The engine behind ``replay``, over plain tuples (quota_ms, user, client_id, api_key,
    request_bytes, response_bytes, duration_us, request_time_ms, follower, quota_generation,
    storage_scale) for speed: the produce, fetch and request throttles, one per row. A
    ``storage_scale`` that is None, NaN or negative means none was in force. ``results``:
    the three lists to append to (and return), so that a caller feeding ``rows`` lazily can
    read each row's throttles before it hands over the next (``let_through``).

    ``expire_at``: when to run the idle-sensor expiry (``expiry_times`` of every request of
    the broker), for a caller that leaves out rows whose budgets cannot throttle
    (``spark_jobs.replay``): each run happens before the first row given at or after its
    time, so the budgets of the rows given meet the same expiries as in a replay of them
    all. Default: the schedule of the rows given."""
    by_generation = settings if callable(settings) else None
    manager: QuotaManager | None = None
    generation = 0
    produce_on = fetch_on = request_on = False
    model = RequestTimeModel()
    produce, fetch, request = results if results is not None else ([], [], [])
    put_p, put_f, put_r = produce.append, fetch.append, request.append
    PRODUCE, FETCH, REQUEST = QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST

    def configure(s: QuotaSettings) -> None:
        nonlocal produce_on, fetch_on, request_on, model
        model = s.request_time
        produce_on = bool(s.for_type(PRODUCE))
        fetch_on = bool(s.for_type(FETCH))
        request_on = bool(s.for_type(REQUEST))

    next_expiry = 0
    schedule = iter(expire_at) if expire_at is not None else None
    scale: float | None = None
    for (now, user, cid, api_key, request_bytes, response_bytes, _duration_us, request_time,
         follower, gen, storage_scale) in rows:
        if manager is None:
            generation = gen
            first = by_generation(gen) if by_generation is not None else settings
            assert isinstance(first, QuotaSettings)
            manager = QuotaManager(first, idle_expiry_ms)
            if storage is not None:
                manager.unquoted_produce_bound = storage.unquoted_produce_bound
                manager.exempt_users = storage.exempt_users
                manager.exempt_client_ids = storage.exempt_client_ids
            configure(first)
            next_expiry = now + EXPIRE_EVERY_MS if schedule is None else next(schedule, NEVER)
        elif by_generation is not None and gen != generation:
            generation = gen
            new = by_generation(gen)
            manager.update(new)
            configure(new)
        if storage_scale is not None and not storage_scale >= 0:  # NaN or negative
            storage_scale = None
        if storage_scale != scale:
            if storage is None:
                raise ValueError("requests carry a storage_scale but no storage settings "
                                 "were given")
            scale = manager.produce_scale = storage_scale
        if now >= next_expiry:
            if schedule is None:
                manager.expire(now)
                next_expiry = now + EXPIRE_EVERY_MS
            else:
                while now >= next_expiry:
                    manager.expire(next_expiry)
                    next_expiry = next(schedule, NEVER)
        # (captures before schema v3 hold 0 where no request quota was on: the estimate)
        elapsed = (request_time if request_time > 0
                   else model.broker_ms(request_bytes, response_bytes))
        p, f, q = record_request(manager, user, cid, api_key, request_bytes, response_bytes,
                                 follower, elapsed, now, scale, produce_on or scale is not None,
                                 fetch_on, request_on)
        put_p(p)
        put_f(f)
        put_r(q)
    return produce, fetch, request


def let_through(rows: Sequence[Row], connections: Sequence[Hashable],
                settings: QuotaSettings | Callable[[int], QuotaSettings],
                idle_expiry_ms: int = ONE_HOUR_MS, storage: StorageSettings | None = None,
                ) -> list[bool]:
    """Which of ``rows`` (as ``replay_rows`` takes them: one quota engine's, in order, on its
    clock) the engine would have let through had every connection (``connections``: a key
    per row) waited out its throttles: a request that arrives while its connection is held
    back (an earlier request let through on it was throttled, the largest of its three
    throttles, until after this one's ``quota_ms``) is not let through and not recorded; the
    others are recorded, in order, as ``replay_rows`` records them.

    The capture is open loop (its requests came when they came): dropping the held ones is
    how this approximates the closed loop, a client whose demand exceeds its quota getting
    what the quota allows of it. It does not move a held request to later."""
    results: Throttled = ([], [], [])
    produce, fetch, request = results
    passed: list[bool] = []
    held_until: dict[Hashable, int] = {}

    def admitted() -> Iterator[Row]:
        for row, key in zip(rows, connections, strict=True):
            now = row[0]
            until = held_until.get(key)
            if until is not None and now < until:
                passed.append(False)
                continue
            passed.append(True)
            yield row
            # the engine has recorded the row (it asks for the next one only then)
            held = max(produce[-1], fetch[-1], request[-1])
            if held > 0:
                held_until[key] = now + held

    replay_rows(admitted(), settings, idle_expiry_ms, storage, results)
    return passed
