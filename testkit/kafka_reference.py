"""Kafka's quota arithmetic, transcribed line by line from Kafka's Java and Scala sources, with
Java's types kept where they decide a result (long vs double, integer division, the order of
operations, ``Math.round``). The tests hold the proxy's quota engine against this, bit for bit.

Transcribed (Apache Kafka, trunk):
- ``org.apache.kafka.common.metrics.stats.SampledStat`` (``record``, ``advance``, ``current``,
  ``oldest``, ``purgeObsoleteSamples``, ``Sample``), ``WindowedSum`` (``update``, ``combine``),
  ``Rate`` (``measure``, ``windowSize``), ``MetricsUtils.convert``;
- ``Sensor.record`` + ``checkQuotas`` (a ``Rate`` compares with ``Quota.acceptable``, a
  ``TokenBucket`` is violated below 0);
- ``org.apache.kafka.server.quota.QuotaUtils.throttleTime`` / ``boundedThrottleTime``;
- ``ClientQuotaManager.recordAndGetThrottleTimeMs``, ``ClientRequestQuotaManager``
  (``NanosToPercentagePerSecond``, the throttle bounded at one window);
- ``ConnectionQuotas.recordAndGetThrottleTimeMs`` (bounded at one window);
- ``org.apache.kafka.common.metrics.stats.TokenBucket``,
  ``ControllerMutationQuotaManager.throttleTimeMs``, ``StrictControllerMutationQuota.record``
  and ``PermissiveControllerMutationQuota.record``;
- ``java.lang.Math.round(double)`` from its bit-level implementation (JDK 8+).

Nothing here imports the proxy: it is the independent side of the comparison.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)


# ------------------------------------------------------------------ java.lang
def _raw_bits(a: float) -> int:
    """``Double.doubleToRawLongBits`` as a signed long."""
    return struct.unpack("<q", struct.pack("<d", a))[0]


def _long(x: int) -> int:
    """Wrap to a Java long (two's complement)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _arith_shift(x: int, n: int) -> int:
    """``x >> n`` on a long (Python's >> on a negative int is arithmetic already)."""
    return _long(x) >> n


def _d2l(a: float) -> int:
    """The ``(long) a`` narrowing of a double (JLS 5.1.3): NaN is 0, saturates, truncates."""
    if a != a:
        return 0
    if a >= 9.223372036854775807e18:
        return LONG_MAX
    if a <= -9.223372036854775808e18:
        return LONG_MIN
    return int(a)


SIGNIFICAND_WIDTH = 53
EXP_BIAS = 1023
EXP_BIT_MASK = 0x7FF0000000000000
SIGNIF_BIT_MASK = 0x000FFFFFFFFFFFFF


def math_round(a: float) -> int:
    """``Math.round(double)``, JDK 8+::

        long longBits = Double.doubleToRawLongBits(a);
        long biasedExp = (longBits & DoubleConsts.EXP_BIT_MASK) >> (SIGNIFICAND_WIDTH - 1);
        long shift = (SIGNIFICAND_WIDTH - 2 + EXP_BIAS) - biasedExp;
        if ((shift & -64) == 0) {
            long r = ((longBits & SIGNIF_BIT_MASK) | (SIGNIF_BIT_MASK + 1));
            if (longBits < 0) r = -r;
            return ((r >> shift) + 1) >> 1;
        } else {
            return (long) a;
        }
    """
    long_bits = _raw_bits(a)
    biased_exp = (long_bits & EXP_BIT_MASK) >> (SIGNIFICAND_WIDTH - 1)
    shift = (SIGNIFICAND_WIDTH - 2 + EXP_BIAS) - biased_exp
    if (shift & -64) == 0:
        r = (long_bits & SIGNIF_BIT_MASK) | (SIGNIF_BIT_MASK + 1)
        if long_bits < 0:
            r = -r
        return _arith_shift(_arith_shift(r, shift) + 1, 1)
    return _d2l(a)


def ddiv(a: float, b: float) -> float:
    """Java's double division: by zero it gives an infinity or NaN, never an exception."""
    if b == 0.0:
        if a != a or a == 0.0:
            return math.nan
        negative = (a < 0) != (math.copysign(1.0, b) < 0)
        return -math.inf if negative else math.inf
    return a / b


def to_int(x: int) -> int:
    """Scala's ``Long.toInt`` / Java's ``(int)``: the low 32 bits. Kafka narrows every throttle
    time so; the functions below return the long before it, since the proxy saturates at
    ``Integer.MAX_VALUE`` instead of wrapping (a throttle past 24.8 days would wrap negative
    and not throttle at all): the one place where it departs on purpose."""
    x &= (1 << 32) - 1
    return x - (1 << 32) if x >= 1 << 31 else x


# ------------------------------------------------------------------ metrics
@dataclass
class MetricConfig:
    samples: int = 2
    time_window_ms: int = 30_000
    quota: float | None = None  # Quota.upperBound(bound): acceptable iff value <= bound
    event_window: int = LONG_MAX


def convert_seconds(time_ms: int) -> float:
    """``MetricsUtils.convert(timeMs, SECONDS)``: ``timeMs / 1000.0``."""
    return time_ms / 1000.0


class Sample:
    def __init__(self, initial_value: float, now: int) -> None:
        self.initial_value = initial_value
        self.event_count = 0
        self.start_time_ms = now
        self.last_event_ms = now
        self.value = initial_value

    def reset(self, now: int) -> None:
        self.event_count = 0
        self.start_time_ms = now
        self.last_event_ms = now
        self.value = self.initial_value

    def is_complete(self, time_ms: int, config: MetricConfig) -> bool:
        return (time_ms - self.start_time_ms >= config.time_window_ms
                or self.event_count >= config.event_window)


class WindowedSum:
    """``SampledStat`` with ``WindowedSum``'s ``update`` and ``combine``."""

    def __init__(self) -> None:
        self.initial_value = 0.0
        self.current = 0
        self.samples: list[Sample] = []

    def record(self, config: MetricConfig, value: float, time_ms: int) -> None:
        sample = self.current_sample(time_ms)
        if sample.is_complete(time_ms, config):
            sample = self.advance(config, time_ms)
        self.update(sample, config, value, time_ms)
        sample.event_count += 1
        sample.last_event_ms = time_ms

    def advance(self, config: MetricConfig, time_ms: int) -> Sample:
        max_samples = config.samples + 1
        self.current = (self.current + 1) % max_samples
        if self.current >= len(self.samples):
            sample = Sample(self.initial_value, time_ms)
            self.samples.append(sample)
            return sample
        sample = self.current_sample(time_ms)
        sample.reset(time_ms)
        return sample

    def measure(self, config: MetricConfig, now: int) -> float:
        self.purge_obsolete_samples(config, now)
        return self.combine(self.samples, config, now)

    def current_sample(self, time_ms: int) -> Sample:
        if not self.samples:
            self.samples.append(Sample(self.initial_value, time_ms))
        return self.samples[self.current]

    def oldest(self, now: int) -> Sample:
        if not self.samples:
            self.samples.append(Sample(self.initial_value, now))
        oldest = self.samples[0]
        for curr in self.samples[1:]:
            if curr.start_time_ms < oldest.start_time_ms:
                oldest = curr
        return oldest

    def purge_obsolete_samples(self, config: MetricConfig, now: int) -> None:
        expire_age = config.samples * config.time_window_ms
        for sample in self.samples:
            if now - sample.last_event_ms >= expire_age:
                sample.reset(now)

    @staticmethod
    def update(sample: Sample, config: MetricConfig, value: float, time_ms: int) -> None:
        sample.value += value

    @staticmethod
    def combine(samples: list[Sample], config: MetricConfig, now: int) -> float:
        total = 0.0
        for sample in samples:
            total += sample.value
        return total


class Rate:
    def __init__(self) -> None:
        self.stat = WindowedSum()

    def record(self, config: MetricConfig, value: float, time_ms: int) -> None:
        self.stat.record(config, value, time_ms)

    def measure(self, config: MetricConfig, now: int) -> float:
        value = self.stat.measure(config, now)
        return ddiv(value, convert_seconds(self.window_size(config, now)))

    def window_size(self, config: MetricConfig, now: int) -> int:
        self.stat.purge_obsolete_samples(config, now)
        total_elapsed_time_ms = now - self.stat.oldest(now).start_time_ms
        # (int) (long / long)
        num_full_windows = int(total_elapsed_time_ms // config.time_window_ms)
        min_full_windows = config.samples - 1
        if num_full_windows < min_full_windows:
            total_elapsed_time_ms += (min_full_windows - num_full_windows) * config.time_window_ms
        return total_elapsed_time_ms


class TokenBucket:
    def __init__(self) -> None:
        self.tokens = 0.0
        self.last_update_ms = 0

    def measure(self, config: MetricConfig, time_ms: int) -> float:
        if config.quota is None:
            return float(LONG_MAX)
        quota = config.quota
        burst = self.burst(config)
        self.refill(quota, burst, time_ms)
        return self.tokens

    def record(self, config: MetricConfig, value: float, time_ms: int) -> None:
        if config.quota is None:
            return
        quota = config.quota
        burst = self.burst(config)
        self.refill(quota, burst, time_ms)
        self.tokens = min(burst, self.tokens - value)

    def refill(self, quota: float, burst: float, time_ms: int) -> None:
        elapsed = convert_seconds(time_ms - self.last_update_ms)
        self.tokens = min(burst, self.tokens + quota * elapsed)
        self.last_update_ms = time_ms

    @staticmethod
    def burst(config: MetricConfig) -> float:
        assert config.quota is not None
        return config.samples * convert_seconds(config.time_window_ms) * config.quota


class QuotaViolation(Exception):
    def __init__(self, sensor: Sensor, value: float, bound: float) -> None:
        super().__init__(value, bound)
        self.sensor = sensor
        self.value = value
        self.bound = bound


class Sensor:
    """A sensor with one stat and its config (what the quota managers register)."""

    def __init__(self, stat: Rate | TokenBucket, config: MetricConfig) -> None:
        self.stat = stat
        self.config = config

    def record(self, value: float, time_ms: int, check_quotas: bool = True) -> None:
        self.stat.record(self.config, value, time_ms)
        if check_quotas:
            self.check_quotas(time_ms)

    def check_quotas(self, time_ms: int) -> None:
        quota = self.config.quota
        if quota is None:
            return
        value = self.stat.measure(self.config, time_ms)
        if isinstance(self.stat, TokenBucket):
            if value < 0:
                raise QuotaViolation(self, value, quota)
        elif not value <= quota:  # Quota.acceptable (upper bound)
            raise QuotaViolation(self, value, quota)


# ------------------------------------------------------------------ server quota managers
def throttle_time(e: QuotaViolation, time_ms: int) -> int:
    """``QuotaUtils.throttleTime``."""
    difference = e.value - e.bound
    assert isinstance(e.sensor.stat, Rate)
    throttle_time_ms = difference / e.bound * e.sensor.stat.window_size(e.sensor.config, time_ms)
    return math_round(throttle_time_ms)


def bounded_throttle_time(e: QuotaViolation, max_throttle_time: int, time_ms: int) -> int:
    return min(throttle_time(e, time_ms), max_throttle_time)


def rate_sensor(quota: float | None, samples: int, window_ms: int) -> Sensor:
    """``ClientQuotaManager.getQuotaMetricConfig`` + ``new Rate``."""
    return Sensor(Rate(), MetricConfig(samples=samples, time_window_ms=window_ms, quota=quota))


def record_and_get_throttle_time_ms(sensor: Sensor, value: float, time_ms: int) -> int:
    """``ClientQuotaManager.recordAndGetThrottleTimeMs`` (produce, fetch)."""
    try:
        sensor.record(value, time_ms, True)
        return 0
    except QuotaViolation as e:
        return throttle_time(e, time_ms)  # (Kafka then narrows it: ``(int)``, see to_int)


NANOS_TO_PERCENTAGE_PER_SECOND = 100.0 / 1_000_000_000  # 100.0 / TimeUnit.SECONDS.toNanos(1)


def request_record_and_get_throttle_time_ms(sensor: Sensor, thread_time_nanos: int,
                                            time_ms: int) -> int:
    """``ClientRequestQuotaManager``: the thread time as a percentage, the throttle bounded at
    one window (``maxThrottleTimeMs = quotaWindowSizeSeconds`` in ms)."""
    value = thread_time_nanos * NANOS_TO_PERCENTAGE_PER_SECOND
    try:
        sensor.record(value, time_ms, True)
        return 0
    except QuotaViolation as e:
        return bounded_throttle_time(e, sensor.config.time_window_ms, time_ms)


def connection_record_and_get_throttle_time_ms(sensor: Sensor, time_ms: int) -> int:
    """``ConnectionQuotas.recordAndGetThrottleTimeMs``: one connection, bounded at a window."""
    try:
        sensor.record(1.0, time_ms, True)
        return 0
    except QuotaViolation as e:
        return bounded_throttle_time(e, sensor.config.time_window_ms, time_ms)


def mutation_throttle_time_ms(e: QuotaViolation) -> int:
    """``ControllerMutationQuotaManager.throttleTimeMs``: ``Math.round(-value / bound * 1000)``."""
    return math_round(-e.value / e.bound * 1000)


class MutationQuota:
    """``StrictControllerMutationQuota`` / ``PermissiveControllerMutationQuota`` over one
    bucket sensor, with an explicit clock."""

    def __init__(self, sensor: Sensor, strict: bool) -> None:
        self.sensor = sensor
        self.strict = strict
        self.last_throttle_time_ms = 0
        self.last_recorded_time_ms = 0

    def _update_throttle_time(self, e: QuotaViolation, time_ms: int) -> None:
        self.last_throttle_time_ms = mutation_throttle_time_ms(e)
        self.last_recorded_time_ms = time_ms

    def record(self, permits: float, time_ms: int) -> bool:
        """Whether the permits were accepted (strict: False is THROTTLING_QUOTA_EXCEEDED)."""
        if self.strict:
            try:
                self.sensor.check_quotas(time_ms)
                self.sensor.record(permits, time_ms, False)
            except QuotaViolation as e:
                self._update_throttle_time(e, time_ms)
                return False
            return True
        try:
            self.sensor.record(permits, time_ms, True)
        except QuotaViolation as e:
            self._update_throttle_time(e, time_ms)
        return True

    def throttle_time(self, time_ms: int) -> int:
        delta_time_ms = time_ms - self.last_recorded_time_ms
        return max(0, self.last_throttle_time_ms - delta_time_ms)  # (then ``.toInt``)


def bucket_sensor(quota: float, samples: int, window_ms: int) -> Sensor:
    return Sensor(TokenBucket(), MetricConfig(samples=samples, time_window_ms=window_ms,
                                              quota=quota))


# ------------------------------------------------------------------ a capture, replayed
def replay_capture(rows: list[dict[str, Any]], quotas_by_generation: dict[int, dict[str, Any]]
                   ) -> tuple[int, int, list[tuple[Any, ...]]]:
    """The produce and fetch throttles Kafka would give the requests of a capture
    (``docs/capture-schema.md``), from this module alone: one ``Rate`` sensor per (run,
    broker, quota type, client-id), its quota set in place when the configuration changes.
    Only ``client_id`` entities (exact names) are modelled, which is what the capture's
    configuration must use. Returns (requests whose produce and fetch throttles equal the
    captured ones, requests, the first few that differ)."""
    sensors: dict[tuple[Any, ...], Sensor] = {}
    matched = total = 0
    differ: list[tuple[Any, ...]] = []
    ordered = sorted(rows, key=lambda r: (r["run"], r["broker"], r["quota_ms"], r["seq"]))
    for r in ordered:
        quotas = quotas_by_generation[int(r["quota_generation"])]
        window = quotas.get("window") or {}
        assert isinstance(window, dict)
        samples = int(window.get("samples", 11))
        window_ms = int(float(window.get("size_seconds", 1)) * 1000)
        limits: dict[tuple[str, str], float] = {}
        for entity in quotas.get("entities") or []:
            assert set(entity) - {"producer_byte_rate", "consumer_byte_rate"} == {"client_id"}
            for key in ("producer_byte_rate", "consumer_byte_rate"):
                if key in entity:
                    limits[(key, entity["client_id"])] = float(entity[key])
        got = {"producer_byte_rate": 0, "consumer_byte_rate": 0}
        api_key = r["api_key"]
        if api_key == 0:
            kind, value = "producer_byte_rate", float(r["request_bytes"]) - 4
        elif api_key == 1 and not r["follower"] and int(r["response_bytes"]) >= 0:
            kind, value = "consumer_byte_rate", float(r["response_bytes"]) - 4
        else:
            kind = ""
        # no quota: Kafka's quotaLimit is Long.MAX_VALUE (recorded, never exceeded)
        bound = limits.get((kind, str(r["client_id"])), float(LONG_MAX))
        if kind:
            key = (r["run"], r["broker"], kind, r["client_id"])
            sensor = sensors.get(key)
            if sensor is None or (sensor.config.samples, sensor.config.time_window_ms) != (
                    samples, window_ms):
                sensor = sensors[key] = rate_sensor(bound, samples, window_ms)
            sensor.config.quota = bound
            throttle = record_and_get_throttle_time_ms(sensor, value, int(r["quota_ms"]))
            got[kind] = min(throttle, 2**31 - 1)
        total += 1
        if (got["producer_byte_rate"], got["consumer_byte_rate"]) == (
                r["throttle_produce_ms"], r["throttle_fetch_ms"]):
            matched += 1
        elif len(differ) < 5:
            differ.append((r["seq"], r["client_id"], api_key, got, r["throttle_produce_ms"],
                           r["throttle_fetch_ms"]))
    return matched, total, differ
