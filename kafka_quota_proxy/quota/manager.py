"""The quota manager: one sensor (sampled rate + bound) per shared budget, per quota type.

``record`` is Kafka's ``recordAndGetThrottleTimeMs``: record the value, measure, and return the
throttle time (0 when within quota). Config changes apply to live sensors: bounds are updated,
and since the budget a connection records into is resolved on every record, an entity whose
matching level changes moves to its new shared budget at once. Sensors idle for
``idle_expiry_ms`` (Kafka: one hour) are dropped by ``expire``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from kafka_quota_proxy.quota.entities import (
    EntityKey,
    QuotaType,
    Resolution,
    Tags,
    quota_limit,
    resolve,
)
from kafka_quota_proxy.quota.request_time import RequestTimeModel
from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.throttle import (
    INT32_MAX,
    java_round,
    rate_per_second,
    throttle_time_ms,
)

ONE_HOUR_MS = 3_600_000
KAFKA, STRICT = "kafka", "strict"  # ``QuotaSettings.pacing``
# Entries the (quota type, user, client-id) caches hold at most: past it they start afresh
# (client-ids and users are the clients' to choose; entities sharing one budget, e.g. every
# client-id of a user with a user quota, never let that budget's sensor expire)
CACHE_LIMIT = 100_000


class Current:
    """``QuotaManager.record``'s default scale: the one in force now."""


CURRENT = Current()


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    samples: int = 11  # Kafka quota.window.num
    window_ms: int = 1000  # Kafka quota.window.size.seconds
    # Kafka bounds request-time throttles at one window and leaves byte-rate throttles unbounded.
    cap_byte_rate_throttle: bool = False
    entities: Mapping[EntityKey, Mapping[QuotaType, float]] = field(default_factory=dict)
    # what a request costs a request quota (``quota.request_time``)
    request_time: RequestTimeModel = field(default_factory=RequestTimeModel)
    # ``quotas.pacing``: "kafka" (Kafka's sampled-rate throttle) or "strict" (produce and
    # fetch byte-rate budgets paced: ``QuotaManager._strict_throttle``)
    pacing: str = KAFKA

    def for_type(self, quota_type: QuotaType) -> dict[EntityKey, float]:
        return {k: v[quota_type] for k, v in self.entities.items() if quota_type in v}


@dataclass(slots=True)
class Sensor:
    quota_type: QuotaType
    tags: Tags
    rate: SampledRate
    bound: float | None
    entity: EntityKey | None
    last_record_ms: int
    throttled_requests: int = 0
    throttle_ms_total: int = 0
    # Values read but not yet recorded (produce requests awaiting their response): the proxy
    # keeps reading a client only while the rate counting them stays below the bound.
    in_flight: float = 0.0
    # Storage scaling (produce budgets): the time up to which what it recorded under a
    # scale is paid for at the scaled bound (``QuotaManager._paced_throttle``)
    paced_until: float | None = None

    def headroom(self, now_ms: int, bound: float | None = None) -> bool:
        """Whether the rate, counting the values in flight as if recorded now, is below the
        bound (``bound``: another than the sensor's; always, when unlimited)."""
        if bound is None:
            bound = self.bound
        if bound is None:
            return True
        total, window = self.rate.peek(now_ms)
        if not window:  # (one sample, a window just begun)
            return total + self.in_flight <= 0.0
        return rate_per_second(total + self.in_flight, window) < bound


# (sensor, value recorded, rate measured, window ms, now ms) -> (rate, window ms, bound)
BudgetHook = Callable[["Sensor", float, float, int, int], tuple[float, int, float]]
# (sensor, now ms, bound in force) -> whether the values in flight, recorded now, would still
# be below the bound (``Sensor.headroom`` over every process sharing the budget)
HeadroomHook = Callable[["Sensor", int, float], bool]
# (sensor, value, now ms, bound, tolerance ms) -> throttle ms: strict pacing of a budget whose
# level every process sharing it raises (``quota.shared``)
PaceHook = Callable[["Sensor", float, int, float, int], int]
# (sensor, now ms, bound, tolerance ms) -> whether the values in flight, recorded now, would
# not be throttled (``produce_headroom`` of a strictly paced budget shared with others)
PaceHeadroomHook = Callable[["Sensor", int, float, int], bool]


# ClientQuotaManager.NanosToPercentagePerSecond = 100.0 / TimeUnit.SECONDS.toNanos(1)
NANOS_TO_PERCENTAGE_PER_SECOND = 100.0 / 1_000_000_000


def percent_of_thread(request_time_ms: float) -> float:
    """Kafka records request time as a percentage of one thread (10 ms per second = 1%), from
    the thread time in whole nanoseconds: ``requestThreadTimeNanos * NanosToPercentagePerSecond``.
    The time charged (ms, ``quota.request_time``) is taken to whole nanoseconds first, so the
    value recorded is the one Kafka would record for that thread time, to the last bit."""
    return java_round(request_time_ms * 1_000_000.0) * NANOS_TO_PERCENTAGE_PER_SECOND


class StorageScaling:
    """Storage-aware throttling (``quota.storage``), as the quota managers apply it: while
    ``scale`` is set, every produce bound is scaled by it, clients without a produce quota get
    ``unquoted_produce_bound`` scaled alike, and exempt users and client-ids keep their own. 0
    (paused) throttles nothing here: the proxy admits no produce bytes at all then. One object,
    shared by the managers of every broker (not copied into each)."""

    __slots__ = ("exempt_client_ids", "exempt_users", "scale", "unquoted_produce_bound")

    def __init__(self) -> None:
        self.scale: float | None = None
        self.unquoted_produce_bound = 0.0
        self.exempt_users: frozenset[str] = frozenset()
        self.exempt_client_ids: frozenset[str] = frozenset()

    def exempt(self, user: str, client_id: str) -> bool:
        """Never throttled by storage (``storage.exempt_users`` / ``exempt_client_ids``)."""
        return user in self.exempt_users or client_id in self.exempt_client_ids


class QuotaManager:
    def __init__(self, settings: QuotaSettings, idle_expiry_ms: int = ONE_HOUR_MS,
                 storage: StorageScaling | None = None, hook: BudgetHook | None = None,
                 headroom: HeadroomHook | None = None, pace: PaceHook | None = None,
                 pace_headroom: PaceHeadroomHook | None = None) -> None:
        # ``hook``: where a limited budget is checked, turns this process's measure into the
        # one enforced (the usage of every process sharing the budget: ``quota.shared``);
        # ``headroom``: the same for the pipelining check of produce budgets; ``pace``: the
        # same under strict pacing (``pace_headroom``: its pipelining check)
        self.hook = hook
        self.headroom_hook = headroom
        self.pace_hook = pace
        self.pace_headroom_hook = pace_headroom
        self.idle_expiry_ms = idle_expiry_ms
        self.sensors: dict[tuple[QuotaType, Tags], Sensor] = {}
        self.settings = settings
        self._by_type = {qt: settings.for_type(qt) for qt in QuotaType}
        self._strict = settings.pacing == STRICT
        # (quota type, user, client-id) -> resolution, and -> the sensor of its budget (one
        # lookup on the hot path); both cleared on config change and at every expiry run, and
        # each when it reaches CACHE_LIMIT entries
        self._resolved: dict[tuple[QuotaType, str, str], Resolution] = {}
        # (keyed by quota type, user, then client-id: no tuple to build on the hot path, and
        # a connection's own user and client-id strings match by identity)
        self._sensor_of: dict[QuotaType, dict[str, dict[str, Sensor]]] = {
            qt: {} for qt in QuotaType}
        self._sensor_entries = 0
        self.storage = StorageScaling() if storage is None else storage

    # The storage scaling's fields, as the manager's own (a replay sets them so).
    @property
    def produce_scale(self) -> float | None:
        return self.storage.scale

    @produce_scale.setter
    def produce_scale(self, scale: float | None) -> None:
        self.storage.scale = scale

    @property
    def unquoted_produce_bound(self) -> float:
        return self.storage.unquoted_produce_bound

    @unquoted_produce_bound.setter
    def unquoted_produce_bound(self, bound: float) -> None:
        self.storage.unquoted_produce_bound = bound

    @property
    def exempt_users(self) -> frozenset[str]:
        return self.storage.exempt_users

    @exempt_users.setter
    def exempt_users(self, users: frozenset[str]) -> None:
        self.storage.exempt_users = users

    @property
    def exempt_client_ids(self) -> frozenset[str]:
        return self.storage.exempt_client_ids

    @exempt_client_ids.setter
    def exempt_client_ids(self, client_ids: frozenset[str]) -> None:
        self.storage.exempt_client_ids = client_ids

    # ------------------------------------------------------------------ configuration
    def update(self, settings: QuotaSettings) -> None:
        """Apply new quotas to live sensors (a new window shape starts sensors afresh)."""
        reshape = (settings.samples, settings.window_ms) != (
            self.settings.samples, self.settings.window_ms)
        self.settings = settings
        self._by_type = {qt: settings.for_type(qt) for qt in QuotaType}
        self._strict = settings.pacing == STRICT
        self._resolved.clear()
        self._forget_sensors()
        if reshape:
            self.sensors.clear()
            return
        for sensor in self.sensors.values():
            sensor.bound, sensor.entity = quota_limit(self._by_type[sensor.quota_type],
                                                      sensor.tags)

    def resolve(self, quota_type: QuotaType, user: str, client_id: str) -> Resolution:
        key = (quota_type, user, client_id)
        found = self._resolved.get(key)
        if found is None:
            if len(self._resolved) >= CACHE_LIMIT:
                self._resolved.clear()
            found = self._resolved[key] = resolve(
                self._by_type[quota_type], quota_type, user, client_id)
        return found

    def enabled(self, quota_type: QuotaType) -> bool:
        """Whether any entity has a quota of this type (if not, nothing can be throttled)."""
        return bool(self._by_type[quota_type])

    # ------------------------------------------------------------------ recording
    def sensor(self, quota_type: QuotaType, user: str, client_id: str, now_ms: int) -> Sensor:
        by_user = self._sensor_of[quota_type].get(user)
        if by_user is not None:
            sensor = by_user.get(client_id)
            if sensor is not None:
                return sensor
        resolution = self.resolve(quota_type, user, client_id)
        key = (quota_type, resolution.tags)
        sensor = self.sensors.get(key)
        if sensor is None:
            sensor = self.sensors[key] = Sensor(
                quota_type, resolution.tags,
                SampledRate(self.settings.samples, self.settings.window_ms,
                            integral=quota_type is not QuotaType.REQUEST),  # (bytes)
                resolution.limit, resolution.entity, now_ms)
        if self._sensor_entries >= CACHE_LIMIT:
            self._forget_sensors()
        self._sensor_of[quota_type].setdefault(user, {})[client_id] = sensor
        self._sensor_entries += 1
        return sensor

    def record(self, quota_type: QuotaType, user: str, client_id: str, value: float,
               now_ms: int, scale: float | Current | None = CURRENT) -> int:
        """Record ``value`` (bytes, or percent-of-thread for request quotas) and return the
        throttle time in ms. ``scale`` (produce): the storage scale in force when the request
        was read, when that is not the one in force now (``produce_scale``)."""
        by_user = self._sensor_of[quota_type].get(user)
        sensor = by_user.get(client_id) if by_user is not None else None
        if sensor is None:
            sensor = self.sensor(quota_type, user, client_id, now_ms)
        sensor.last_record_ms = now_ms
        bound = sensor.bound
        if quota_type is QuotaType.PRODUCE:
            storage = self.storage
            if isinstance(scale, Current):
                scale = storage.scale
            if scale is not None and not storage.exempt(user, client_id):
                return self._paced_throttle(sensor, value, now_ms, scale)
        if bound is None:
            sensor.rate.record(value, now_ms)
            return 0
        if self._strict and quota_type is not QuotaType.REQUEST:
            return self._strict_throttle(sensor, value, now_ms, bound)
        rate, window = sensor.rate.record_and_measure(value, now_ms)
        if self.hook is not None:  # budgets shared with other processes (``quota.shared``)
            rate, window, bound = self.hook(sensor, value, rate, window, now_ms)
        if rate <= bound:
            return 0
        cap = None
        if quota_type is QuotaType.REQUEST or self.settings.cap_byte_rate_throttle:
            cap = self.settings.window_ms
        throttle = throttle_time_ms(rate, bound, window, cap)
        if throttle:
            sensor.throttled_requests += 1
            sensor.throttle_ms_total += throttle
        return throttle

    def _strict_throttle(self, sensor: Sensor, value: float, now_ms: int, bound: float) -> int:
        """The throttle of a produce or fetch budget under ``pacing: strict``.

        Kafka's throttle for the first request of a budget, measured over the padded window
        of ``samples - 1`` windows, is ``value / bound - (samples - 1) x window``: a
        generic cell rate algorithm with that tolerance gives the same, and keeps giving it.
        Each value is paid for at the bound: the budget is paced up to ``max(paced_until,
        now) + value / bound``, and the throttle is what lies beyond ``(samples - 1)``
        windows from now. So the first window's burst is Kafka's, and after it a greedy
        client gets the bound whatever its request size: a request worth seconds of quota is
        paid for in full instead of leaving the samples before its throttle is over (which
        lets Kafka's maths through at 1.2-1.3x with 1 MB batches at 1 MB/s). A client that
        sends less than the bound earns back at most that tolerance. ``cap_byte_rate_throttle``
        does not apply (a bounded throttle cannot pay for a larger request; the config
        refuses the two together). The sampled rate records every value (metrics; Kafka's
        maths again if ``pacing`` goes back). Only what was recorded decides the throttle: a
        replay gives the same. Shared with other processes (``pace_hook``), the level is the
        whole budget's (``quota.shared.SharedBudgets.pace``)."""
        sensor.rate.record(value, now_ms)
        settings = self.settings
        tolerance = (settings.samples - 1) * settings.window_ms
        if self.pace_hook is not None:
            return self.pace_hook(sensor, value, now_ms, bound, tolerance)
        return pace_sensor(sensor, value, now_ms, bound, tolerance)

    def _paced_throttle(self, sensor: Sensor, value: float, now_ms: int, scale: float) -> int:
        """The throttle of a produce budget while storage scaling applies to it.

        Each request is paid for at the scaled bound T: the budget is paced up to
        ``max(paced_until, now) + value / T``, and the throttle is what lies beyond one
        window from now (one window of bytes at T may go at once, as Kafka's window allows).
        Whatever the request size, the rate over any span is T plus at most that one window.
        Kafka's sampled rate cannot promise that: a request of more than (N-1) windows of
        bytes at T is purged from the samples before its throttle is over, so with few
        windows large batches go through faster than T; and capping its throttle at a window
        lets one batch through per window whatever T.

        Requests read before scaling began are not paced, even when their responses (and so
        their records) come after: what a producer sent at the rate allowed then, pipelined
        requests included, freezes nothing. Pacing owed from an earlier THROTTLE is still
        owed until its time has passed. The sampled rate records every request (metrics, and
        Kafka's throttle once scaling ends). Only what was recorded, with the scale each
        request was read under, decides the throttle: a replay gives the same."""
        sensor.rate.record(value, now_ms)
        configured = sensor.bound
        bound = (self.storage.unquoted_produce_bound if configured is None else configured) * scale
        if bound <= 0:  # paused: the proxy admits nothing; nothing is owed
            paced = sensor.paced_until
            if paced is None or paced < now_ms:
                sensor.paced_until = now_ms
            return 0
        return pace_sensor(sensor, value, now_ms, bound, self.settings.window_ms)

    def storage_exempt(self, user: str, client_id: str) -> bool:
        return self.storage.exempt(user, client_id)

    def produce_bound(self, bound: float | None, user: str, client_id: str) -> float | None:
        """The produce bound in force for a budget whose configured bound is ``bound``."""
        storage = self.storage
        scale = storage.scale
        if scale is None or storage.exempt(user, client_id):
            return bound
        return (storage.unquoted_produce_bound if bound is None else bound) * scale

    def produce_headroom(self, user: str, client_id: str, now_ms: int) -> bool:
        """``Sensor.headroom`` of this client's produce budget, under the bound in force;
        while storage scaling paces it: whether the requests in flight, once recorded, would
        still not be throttled."""
        sensor = self.sensor(QuotaType.PRODUCE, user, client_id, now_ms)
        bound = self.produce_bound(sensor.bound, user, client_id)
        if self.storage.scale is None or self.storage.exempt(user, client_id):
            if self._strict and bound is not None:
                # paced: read on while the values in flight would not be throttled (a
                # sampled rate would let a backlog of seconds of quota in, each of its
                # requests then throttled one after the other)
                return self._paced_headroom(sensor, now_ms, bound)
            if self.headroom_hook is not None and bound is not None:
                return self.headroom_hook(sensor, now_ms, bound)
            return sensor.headroom(now_ms, bound)
        if bound is None or bound <= 0:
            return False
        return level_headroom(sensor.paced_until, sensor.in_flight, now_ms, bound,
                              self.settings.window_ms)

    def fetch_headroom(self, user: str, client_id: str, now_ms: int) -> bool:
        """Whether this client's fetch budget is within its quota now (a new connection's
        first fetch waits until it is): its sampled rate below the bound, or, paced
        strictly, its level within the tolerance (a budget paced seconds ahead may have a
        sampled rate below the bound: a consumer reconnecting would otherwise get a fetch
        through on each new connection)."""
        sensor = self.sensor(QuotaType.FETCH, user, client_id, now_ms)
        if self._strict and sensor.bound is not None:
            return self._paced_headroom(sensor, now_ms, sensor.bound)
        return sensor.headroom(now_ms)

    def _paced_headroom(self, sensor: Sensor, now_ms: int, bound: float) -> bool:
        tolerance = (self.settings.samples - 1) * self.settings.window_ms
        if self.pace_headroom_hook is not None:
            return self.pace_headroom_hook(sensor, now_ms, bound, tolerance)
        return level_headroom(sensor.paced_until, sensor.in_flight, now_ms, bound, tolerance)

    def expire(self, now_ms: int) -> int:
        """Drop sensors with no record for ``idle_expiry_ms``; return how many."""
        idle = [k for k, s in self.sensors.items()
                if now_ms - s.last_record_ms >= self.idle_expiry_ms]
        for k in idle:
            del self.sensors[k]
        # The caches start afresh at every run, budgets expired or not: a manager that only
        # resolves (``QuotaEnforcer.limits``) has no budget to expire, and the (user,
        # client-id) pairs it has seen are worth nothing once gone.
        self._resolved.clear()
        self._forget_sensors()
        if len(idle) > len(self.sensors):  # (a dict never shrinks its table by itself)
            self.sensors = dict(self.sensors)
        return len(idle)

    def cache_entries(self) -> int:
        """Entries of the (quota type, user, client-id) caches (each at most CACHE_LIMIT)."""
        return len(self._resolved) + self._sensor_entries

    def _forget_sensors(self) -> None:
        for by_user in self._sensor_of.values():
            by_user.clear()
        self._sensor_entries = 0

    def __iter__(self) -> Iterator[Sensor]:
        return iter(self.sensors.values())


def pace_sensor(sensor: Sensor, value: float, now_ms: int, bound: float,
                tolerance_ms: int) -> int:
    """Pacing (a generic cell rate algorithm): ``value`` paid for at ``bound`` (> 0), the
    budget paced up to ``max(paced_until, now) + value / bound``; the throttle is what lies
    beyond ``tolerance_ms`` from now (counted in the sensor)."""
    sensor.paced_until, throttle = paced_throttle(sensor.paced_until, value, now_ms, bound,
                                                  tolerance_ms)
    if throttle:
        sensor.throttled_requests += 1
        sensor.throttle_ms_total += throttle
    return throttle


def level_headroom(paced_until: float | None, in_flight: float, now_ms: int, bound: float,
                   tolerance_ms: int) -> bool:
    """Whether ``in_flight``, paid for at ``bound`` on a level paced up to ``paced_until``,
    would still be within ``tolerance_ms`` from now (not throttled)."""
    paced = now_ms if paced_until is None or paced_until < now_ms else paced_until
    return paced + in_flight * 1000.0 / bound - now_ms < tolerance_ms


def paced_throttle(paced_until: float | None, value: float, now_ms: int, bound: float,
                   tolerance_ms: int) -> tuple[float, int]:
    """``pace``'s maths on a level: the new ``paced_until`` and the throttle (ms, >= 0)."""
    paced = now_ms if paced_until is None or paced_until < now_ms else paced_until
    paced += value * 1000.0 / bound
    throttle = min(java_round(paced - now_ms - tolerance_ms), INT32_MAX)
    return paced, max(throttle, 0)
