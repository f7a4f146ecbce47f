"""Only recording changes a quota budget: reads (the pipelining headroom check, the metrics'
busiest budgets, resolutions) at any times leave every throttle as it was, so a replay of the
recorded requests, which cannot know when those reads happened, gives the proxy's throttles."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings

CLIENTS = ("a", "b", "c")
SETTINGS = QuotaSettings(
    samples=5, window_ms=1000,
    entities={
        EntityKey(None, "a"): {QuotaType.PRODUCE: 20_000.0, QuotaType.REQUEST: 5.0},
        EntityKey(None, "b"): {QuotaType.FETCH: 30_000.0},
        EntityKey(None, DEFAULT): {QuotaType.PRODUCE: 50_000.0},
    })

record = st.tuples(st.just("record"), st.sampled_from(list(QuotaType)),
                   st.sampled_from(CLIENTS), st.integers(0, 40_000), st.integers(0, 3000))
read = st.tuples(st.sampled_from(["headroom", "top", "sensor_headroom", "resolve"]),
                 st.sampled_from(list(QuotaType)), st.sampled_from(CLIENTS),
                 st.integers(0, 0), st.integers(0, 12_000))
storage = st.tuples(st.just("storage"), st.just(QuotaType.PRODUCE), st.just(""),
                    st.sampled_from([-1, 0, 25, 50, 100]), st.integers(0, 0))


def _run(steps: list[tuple[str, QuotaType, str, int, int]], with_reads: bool) -> list[int]:
    enforcer = QuotaEnforcer(SETTINGS)
    enforcer.configure_storage(40_000.0, frozenset(), frozenset({"c"}))
    manager = enforcer.manager(7)
    now = 1_000_000
    throttles = []
    for kind, qt, client, value, gap in steps:
        if kind == "record":
            now += gap
            throttles.append(manager.record(qt, "ANONYMOUS", client, value, now))
        elif kind == "storage":
            enforcer.set_storage(None if value < 0 else value / 100)
        elif with_reads:
            at = now + gap  # a read at any time, before the next record
            if kind == "headroom":
                manager.produce_headroom("ANONYMOUS", client, at)
            elif kind == "top":
                enforcer.top_sensors(10, at)
            elif kind == "sensor_headroom":
                manager.sensor(qt, "ANONYMOUS", client, at).headroom(at)
            else:
                enforcer.limits("ANONYMOUS", client)
                manager.resolve(qt, "ANONYMOUS", client)
    return throttles


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(record, record, read, storage), max_size=120))
def test_reads_at_any_time_leave_every_throttle_unchanged(
        steps: list[tuple[str, QuotaType, str, int, int]]) -> None:
    assert _run(steps, with_reads=True) == _run(steps, with_reads=False)


def test_a_scrape_between_records_does_not_move_the_first_window() -> None:
    """The case seen from outside: a metrics scrape before a budget's first record used to
    start its first sample at the scrape, so the record after it landed in another window."""
    steps = [("headroom", QuotaType.PRODUCE, "a", 0, 0),
             ("record", QuotaType.PRODUCE, "a", 10_000, 990),
             ("record", QuotaType.PRODUCE, "a", 40_000, 20),
             ("record", QuotaType.PRODUCE, "a", 40_000, 20)]
    assert _run(steps, with_reads=True) == _run(steps, with_reads=False)
