"""The quota engine against a line-by-line transcription of Kafka's arithmetic
(``testkit/kafka_reference.py``), bit for bit: every rate, window, throttle time, request
percentage, connection throttle and token count equal, not within a tolerance. Windows that are
not whole seconds are where a different order of operations shows (``sum * 1000 / W`` and
``sum / (W / 1000.0)`` differ in the last bit for about a quarter of them)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.connection_rate import RateSensor
from kafka_quota_proxy.quota.entities import EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings, percent_of_thread
from kafka_quota_proxy.quota.mutation import MutationBudget, MutationThrottle, TokenBucket
from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.throttle import java_round, rate_per_second, throttle_time_ms
from testkit import kafka_reference as kafka

T0 = 1_764_000_000_000  # a wall-clock time, as Kafka's clock gives

shapes = st.tuples(st.integers(1, 15), st.integers(1, 2500))  # (samples, window ms)
bounds = st.floats(1.0, 5e6, allow_nan=False, allow_infinity=False)


INT32_MAX = 2**31 - 1


def narrowed(throttle: int) -> int:
    """Kafka's throttle as the proxy gives it: saturated at ``Integer.MAX_VALUE`` where Kafka's
    ``(int)`` would wrap (``kafka_reference.to_int``); the same below that."""
    return min(throttle, INT32_MAX)


def same(a: float, b: float) -> bool:
    """Equal to the last bit (NaN is NaN, as Java's ``Double.compare``)."""
    return a == b or (a != a and b != b)


def steps(window_max: int = 2500, value_max: int = 2_000_000) -> st.SearchStrategy[
        list[tuple[int, int, float | None]]]:
    """Records: (gap ms, value, a new bound or None)."""
    return st.lists(st.tuples(
        st.one_of(st.integers(0, 50), st.integers(0, 4 * window_max)),
        st.integers(0, value_max),
        st.one_of(st.none(), st.none(), st.none(), bounds)), min_size=1, max_size=60)


@given(st.floats(-1e7, 1e7, allow_nan=False) | st.sampled_from(
    [0.49999999999999994, -0.49999999999999994, 0.5, -0.5, 1.5, -1.5, 2.5, 4503599627370495.5,
     -4503599627370495.5, 1e300, -1e300, float("inf"), float("-inf"), float("nan")]))
def test_java_round_is_math_round(x: float) -> None:
    assert java_round(x) == kafka.math_round(x)


@given(st.floats(0, 1e12, allow_nan=False), st.integers(1, 10**7))
@example(2.0, 3)  # 2 * 1000.0 / 3 != 2 / (3 / 1000.0)
def test_rate_divides_as_kafka(total: float, window_ms: int) -> None:
    assert rate_per_second(total, window_ms) == total / kafka.convert_seconds(window_ms)


@settings(max_examples=400, deadline=None)
@given(shapes, bounds, steps())
@example((11, 1300), 1000.0, [(0, 1000, None), (1, 1, None), (1, 2, None)])
def test_byte_rate_quota_matches_kafka(shape: tuple[int, int], bound: float,
                                       records: list[tuple[int, int, float | None]]) -> None:
    """Produce (and fetch: the same maths) throttles, with bound changes on a live sensor
    (Kafka updates the sensor's quota in place)."""
    samples, window_ms = shape
    entity = EntityKey("u", None)

    def settings_for(b: float) -> QuotaSettings:
        return QuotaSettings(samples=samples, window_ms=window_ms,
                             entities={entity: {QuotaType.PRODUCE: b}})

    manager = QuotaManager(settings_for(bound))
    sensor = kafka.rate_sensor(bound, samples, window_ms)
    now = T0
    for gap, value, new_bound in records:
        now += gap
        if new_bound is not None:
            manager.update(settings_for(new_bound))
            sensor.config.quota = new_bound
        ours = manager.record(QuotaType.PRODUCE, "u", "c", float(value), now)
        theirs = kafka.record_and_get_throttle_time_ms(sensor, float(value), now)
        assert ours == narrowed(theirs), (now - T0, value)
        rate = next(iter(manager)).rate
        assert isinstance(sensor.stat, kafka.Rate)
        rate_ms, window = rate.measure(now)
        assert window == sensor.stat.window_size(sensor.config, now)
        assert same(rate_ms, sensor.stat.measure(sensor.config, now))


@settings(max_examples=300, deadline=None)
@given(shapes, st.floats(0.01, 400.0), st.lists(st.tuples(
    st.integers(0, 3000), st.integers(0, 80_000_000)), min_size=1, max_size=60))
def test_request_quota_matches_kafka(shape: tuple[int, int], bound: float,
                                     records: list[tuple[int, int]]) -> None:
    """Request-time quotas: the thread time as Kafka's percentage of a thread (from whole
    nanoseconds), the throttle bounded at one window."""
    samples, window_ms = shape
    manager = QuotaManager(QuotaSettings(samples=samples, window_ms=window_ms,
                                         entities={EntityKey("u", None): {QuotaType.REQUEST:
                                                                          bound}}))
    sensor = kafka.rate_sensor(bound, samples, window_ms)
    now = T0
    for gap, nanos in records:
        now += gap
        percent = percent_of_thread(nanos / 1_000_000)
        assert percent == nanos * kafka.NANOS_TO_PERCENTAGE_PER_SECOND
        ours = manager.record(QuotaType.REQUEST, "u", "c", percent, now)
        theirs = kafka.request_record_and_get_throttle_time_ms(sensor, nanos, now)
        assert ours == narrowed(theirs), (now - T0, nanos)


@settings(max_examples=300, deadline=None)
@given(shapes, st.integers(1, 50), st.lists(st.tuples(
    st.one_of(st.integers(0, 5), st.integers(0, 3000)), st.booleans()), min_size=1,
    max_size=120))
def test_connection_creation_rate_matches_kafka(shape: tuple[int, int], bound: int,
                                                 connections: list[tuple[int, bool]]) -> None:
    """``ConnectionQuotas``: one connection recorded, bounded throttle, and a throttled
    connection taken back (``record(-1.0, timeMs, false)``) when the caller says so."""
    samples, window_ms = shape
    ours = RateSensor(samples, window_ms, T0)
    sensor = kafka.rate_sensor(float(bound), samples, window_ms)
    now = T0
    for gap, unrecord in connections:
        now += gap
        mine = ours.record_and_throttle(float(bound), now, window_ms)
        theirs = kafka.connection_record_and_get_throttle_time_ms(sensor, now)
        assert mine == narrowed(theirs), now - T0
        if mine and unrecord:
            ours.unrecord(now)
            sensor.record(-1.0, now, False)
        assert isinstance(sensor.stat, kafka.Rate)
        assert same(ours.measure(now), sensor.stat.measure(sensor.config, now))


@settings(max_examples=300, deadline=None)
@given(st.tuples(st.integers(1, 15), st.integers(1, 2500)), st.floats(0.01, 100.0),
       st.lists(st.tuples(
           st.integers(0, 5000),  # gap before the request
           st.booleans(),  # strict (CreateTopics v6+ ...) or permissive
           st.lists(st.integers(1, 60), min_size=1, max_size=5),  # partitions per topic
           st.integers(0, 3000),  # when the response's throttle time is read, after
           st.one_of(st.none(), st.none(), st.floats(0.01, 100.0))),  # a new rate
           min_size=1, max_size=40))
def test_controller_mutation_bucket_matches_kafka(
        shape: tuple[int, int], rate: float,
        requests: list[tuple[int, bool, list[int], int, float | None]]) -> None:
    samples, window_ms = shape
    budget = MutationBudget(("u", ""), EntityKey("u", None), TokenBucket(rate, samples,
                                                                          window_ms))
    sensor = kafka.bucket_sensor(rate, samples, window_ms)
    now = T0
    for gap, strict, topics, later, new_rate in requests:
        now += gap
        if new_rate is not None:
            budget.bucket.reconfigure(new_rate, samples, window_ms, now)
            sensor.config.quota = new_rate
        throttle = MutationThrottle()
        quota = kafka.MutationQuota(sensor, strict)
        if strict:
            for permits in topics:
                accepted = budget.check(throttle, now)
                if accepted:
                    budget.record(float(permits), now)
                assert accepted == quota.record(float(permits), now)
        else:
            budget.record_permissive(float(sum(topics)), throttle, now)
            quota.record(float(sum(topics)), now)
        assert throttle.throttle_ms(now + later) == narrowed(quota.throttle_time(now + later))
        assert isinstance(sensor.stat, kafka.TokenBucket)
        assert budget.bucket.measure(now) == sensor.stat.measure(sensor.config, now)


@given(st.floats(0.0, 1e9), st.floats(1.0, 1e9), st.integers(1, 10**6))
def test_throttle_time_is_kafkas(observed: float, bound: float, window_ms: int) -> None:
    if observed <= bound:
        assert throttle_time_ms(observed, bound, window_ms) == 0
        return
    expected = kafka.math_round((observed - bound) / bound * window_ms)
    assert throttle_time_ms(observed, bound, window_ms) == narrowed(max(expected, 0))


def test_a_throttle_that_the_order_of_division_moves_by_one_ms() -> None:
    """Kafka's default window (11 x 1 s), 1 MiB/s: 11,468,800 bytes over W = 10,306 ms.
    ``sum * 1000.0 / W`` lands the throttle on 631 ms, Kafka's ``sum / (W / 1000.0)`` on 632."""
    manager = QuotaManager(QuotaSettings(entities={EntityKey("u", None): {
        QuotaType.PRODUCE: 1048576.0}}))
    sensor = kafka.rate_sensor(1048576.0, 11, 1000)
    got = []
    for at, value in ((T0, 1.0), (T0 + 10_306, 11_468_799.0)):
        got.append((manager.record(QuotaType.PRODUCE, "u", "c", value, at),
                    kafka.record_and_get_throttle_time_ms(sensor, value, at)))
    assert got == [(0, 0), (632, 632)]


def test_the_sampled_rate_of_the_finding() -> None:
    """The figures behind the 1 ms departures: a window that is not whole seconds."""
    r = SampledRate(11, 1000)
    r.record(2.0, 0)
    r.record(1.0, 10_003)
    # W = 10,003 ms: 3 / 10.003 in Kafka's order
    assert r.measure(10_003) == (3.0 / (10_003 / 1000.0), 10_003)
