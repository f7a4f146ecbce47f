"""Budgets shared across processes (``quota.shared``): the usage report and its encoding, the
others' reports (window, staleness, fallback), design A's maths, and design A holding a
client spread over two processes to its quota where each process on its own lets through
twice as much; and design B, the alternative the simulation compares it with
(``testkit.shared_quotas``)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import struct
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.entities import EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings
from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.shared import (
    CHARGE_CAP_WINDOWS,
    MAX_CLOCK_SKEW_MS,
    MAX_LINES,
    BudgetKey,
    Refusal,
    RemoteUsage,
    ReportError,
    SharedBudgets,
    UsageReport,
    fallback_bound,
    global_sum,
    kafka_window,
    usage_report,
)
from testkit.shared_quotas import (
    DemandReports,
    DemandShareBudgets,
    SharedQuotaManager,
    demand_share,
)

QUOTA = 1_000_000.0
APP = EntityKey(None, "app")
SETTINGS = QuotaSettings(entities={APP: {QuotaType.PRODUCE: QUOTA}})
KEY: BudgetKey = (1, QuotaType.PRODUCE, "", "app")
P = QuotaType.PRODUCE


def report(process: str, seq: int, budgets: dict[BudgetKey, tuple[tuple[int, int, float], ...]],
           samples: int = 11, window_ms: int = 1000) -> UsageReport:
    return UsageReport(process, seq, 1_700_000_000_000 + seq, samples, window_ms, budgets)


def see(remote: RemoteUsage, r: UsageReport, as_of_ms: int, wall_ms: int | None = None
        ) -> bool:
    """``remote.observe``; a report under its own id as one it wrote."""
    if r.process == remote.me:
        remote.wrote(r)
    return remote.observe(r, as_of_ms, wall_ms)


def reading(me: str = "me", staleness_ms: int = 2000, initial: int = 1,
            now: int = 0) -> RemoteUsage:
    """A ``RemoteUsage`` reading reports, its own last one seen at ``now``."""
    remote = RemoteUsage(me, 11, 1000, staleness_ms, initial_processes=initial)
    remote.set_reading(True, now)
    see(remote, report(me, 1, {}), now)
    return remote


# ---------------------------------------------------------------------- the report
def test_report_round_trip_and_key() -> None:
    r = report("host-a:4711:1", 42, {
        KEY: ((2500, 1200, 16384.0), (900, 3, 1.5)),
        (2, QuotaType.FETCH, "alice", ""): ((10, 0, 7.0),),
        (-1, QuotaType.REQUEST, "alice", "app"): ((0, 0, 0.25),),
    })
    data = r.encode()
    assert data[0] == 1  # the version
    assert UsageReport.decode(data) == r
    assert r.key == b"host-a:4711:1"
    # tags are written once: "alice" and "app" appear in the table, not with each budget
    assert data.count(b"alice") == 1 and data.count(b"app") == 1


texts = st.text(st.characters(codec="utf-8"), max_size=20)
reported_samples = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
              st.floats(0.0, 1e15, allow_nan=False, allow_infinity=False))
    .map(lambda s: (max(s[0], s[1]), min(s[0], s[1]), s[2])), max_size=12).map(tuple)
keys = st.tuples(st.integers(-(2**31), 2**31 - 1), st.sampled_from(list(QuotaType)), texts,
                 texts)
reports = st.builds(UsageReport, texts, st.integers(0, 2**63 - 1),
                    st.integers(-(2**63), 2**63 - 1), st.integers(1, 2**16 - 1),
                    st.integers(1, 2**32 - 1), st.dictionaries(keys, reported_samples,
                                                               max_size=8))


@settings(max_examples=300, deadline=None)
@given(reports)
def test_any_report_decodes_to_itself(r: UsageReport) -> None:
    assert UsageReport.decode(r.encode()) == r


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_report_error(data: bytes) -> None:
    with contextlib.suppress(ReportError):
        UsageReport.decode(data)


@pytest.mark.parametrize("mangle", [
    lambda d: b"",
    lambda d: b"\x03" + d[1:],  # a version this code does not read
    lambda d: d[:-1],  # truncated
    lambda d: d + b"\x00",  # trailing bytes
    # a sample whose last event is before its start (last "before" > start "before")
    lambda d: d[:-16] + struct.pack(">IId", 1, 2, 3.0),
    lambda d: d[:-8] + struct.pack(">d", float("nan")),
    lambda d: d[:-8] + struct.pack(">d", -1.0),
])
def test_malformed_reports_are_refused(mangle: object) -> None:
    data = report("p", 1, {KEY: ((5, 1, 10.0),)}).encode()
    assert UsageReport.decode(data).budgets[KEY] == ((5, 1, 10.0),)
    with pytest.raises(ReportError):
        UsageReport.decode(mangle(data))  # type: ignore[operator]


def test_usage_report_holds_the_live_samples_of_limited_budgets_relative_to_now() -> None:
    m = QuotaManager(QuotaSettings(samples=3, window_ms=1000,
                                   entities={APP: {P: QUOTA}}))
    m.record(P, "u", "app", 100, 1000)  # sample 1: starts 1000
    m.record(P, "u", "app", 50, 1800)  # same sample, last event 1800
    m.record(P, "u", "app", 70, 2500)  # sample 2: starts 2500
    m.record(P, "u", "other", 999, 2500)  # no quota: not reported
    r = usage_report("me", 7, 123, {1: m}, 4000)
    assert (r.process, r.seq, r.sent_ms, r.samples, r.window_ms) == ("me", 7, 123, 3, 1000)
    assert r.budgets == {KEY: ((3000, 2200, 150.0), (1500, 1500, 70.0))}
    # at 4800 the first sample's last event (1800) is 3 windows old: Kafka purges it
    assert usage_report("me", 8, 123, {1: m}, 4800).budgets == {KEY: ((2300, 2300, 70.0),)}
    # min_fraction: a budget below that share of its bound is left out
    assert usage_report("me", 9, 123, {1: m}, 4000, min_fraction=0.01).budgets == {}
    assert usage_report("me", 9, 123, {1: m}, 4000, min_fraction=1e-6).budgets != {}
    # no manager yet (no client): the window of the settings, that readers do not ignore
    empty = usage_report("me", 10, 123, {}, 4000, settings=m.settings)
    assert (empty.samples, empty.window_ms) == (3, 1000)


# ---------------------------------------------------------------------- the others' reports
def test_others_usage_within_the_window_ending_now() -> None:
    remote = reading(staleness_ms=60_000)
    # made at 10_000 (local clock): samples that started 3000 and 1000 ms before, with last
    # events 2000 and 0 ms before
    see(remote, report("b", 1, {KEY: ((3000, 2000, 400.0), (1000, 0, 100.0))}), 10_000)
    assert remote.others(KEY, 10_000) == (500.0, 7000)
    # a sample counts while its last event is less than samples x window old (Kafka purges
    # it then): the first one's last event is at 8000, so until 19_000 exclusive
    assert remote.others(KEY, 18_999) == (500.0, 7000)
    assert remote.others(KEY, 19_000) == (100.0, 9000)
    assert remote.others(KEY, 21_000) == (0.0, 21_000)
    assert remote.others((1, QuotaType.FETCH, "", "app"), 10_000) == (0.0, 10_000)


def test_own_report_is_not_counted_and_replays_are_ignored() -> None:
    remote = reading()
    see(remote, report("me", 2, {KEY: ((10, 0, 5.0),)}), 1000)
    assert remote.others(KEY, 1000) == (0.0, 1000)
    assert see(remote, report("b", 5, {KEY: ((10, 0, 5.0),)}), 1000)
    assert not see(remote, report("b", 5, {KEY: ((10, 0, 5.0),)}), 1100)  # the same again
    assert not see(remote, report("c", 1, {KEY: ((10, 0, 50.0),)}, window_ms=500), 1100)
    assert remote.ignored == 2
    assert remote.others(KEY, 1000)[0] == 5.0
    # a newer report replaces the older one, budgets it no longer holds included
    see(remote, report("b", 6, {}), 1200)
    assert remote.others(KEY, 1200) == (0.0, 1200)
    assert remote.conflicts == 0


def test_a_process_that_stops_reporting_is_dropped_after_the_staleness() -> None:
    remote = reading(staleness_ms=2000)
    see(remote, report("b", 1, {KEY: ((100, 0, 10.0),)}), 5000)
    see(remote, report("c", 1, {KEY: ((100, 0, 20.0),)}), 6000)
    see(remote, report("me", 2, {}), 6000)
    assert remote.live(6999) == 3
    assert remote.others(KEY, 6999)[0] == 30.0
    assert remote.peers(6999) == ["b", "c"]
    # b's last report is 2000 ms old at 7000: no longer counted, even before ``expire``
    assert remote.others(KEY, 7000)[0] == 20.0
    assert remote.live(7000) == 2
    assert remote.expire(7000) == ["b"]
    assert remote.dropped == 1
    assert remote.peers(7000) == ["c"]
    # b comes back: counted again
    see(remote, report("b", 2, {KEY: ((100, 0, 1.0),)}), 7100)
    assert remote.others(KEY, 7100)[0] == 21.0


def test_fallback_quota_over_the_processes_known_live() -> None:
    remote = RemoteUsage("me", staleness_ms=2000, initial_processes=2)
    # before the reports were ever read: the configured guess
    assert remote.fallback(0) and remote.fallback_processes == 2
    remote.set_reading(True, 0)
    assert remote.fallback(0)  # reading, but its own report has not come back yet
    for p in ("me", "b", "c"):
        see(remote, report(p, 1, {}), 100)
    assert not remote.fallback(100)
    # the topic cannot be read: quota / 3, even once the reports held go stale
    remote.set_reading(False, 500)
    assert remote.fallback(500) and remote.fallback_processes == 3
    remote.expire(5000)
    assert remote.live(5000) == 1 and remote.fallback_processes == 3
    assert fallback_bound(QUOTA, remote.fallback_processes) == QUOTA / 3
    # reading again, but this process's own reports stopped coming back: fallback as well
    remote.set_reading(True, 6000)
    see(remote, report("b", 2, {}), 6000)
    assert remote.fallback(6000)
    see(remote, report("me", 2, {}), 6000)
    assert not remote.fallback(6000)
    assert remote.fallback(8000)  # own report 2000 ms old


def test_the_fallback_throttles_against_quota_over_live_processes_and_counts_it() -> None:
    remote = RemoteUsage("me", initial_processes=4)
    shared = SharedBudgets(remote)
    m = SharedQuotaManager(SETTINGS, shared.hook(1))
    plain = QuotaManager(QuotaSettings(entities={APP: {P: QUOTA / 4}}))
    throttles = [(m.record(P, "u", "app", 100_000, t), plain.record(P, "u", "app", 100_000, t))
                 for t in range(0, 5000, 100)]
    assert any(a for a, _ in throttles)
    assert all(a == b for a, b in throttles)
    assert shared.fallback_checks == len(throttles)


# ---------------------------------------------------------------------- the maths
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2500), st.integers(0, 50_000)), min_size=1,
                max_size=40), st.integers(1, 6), st.integers(1, 3000))
def test_design_a_alone_is_kafkas_maths(steps: list[tuple[int, int]], samples: int,
                                        window_ms: int) -> None:
    """With no other process, the union of samples is the process's own: the same rate,
    window and throttle as ``QuotaManager``, whatever the window shape."""
    qs = QuotaSettings(samples=samples, window_ms=window_ms, entities={APP: {P: 10_000.0}})
    remote = RemoteUsage("me", samples, window_ms, staleness_ms=10**9)
    remote.set_reading(True, 0)
    see(remote, UsageReport("me", 1, 0, samples, window_ms, {}), 0)
    shared = SharedQuotaManager(qs, SharedBudgets(remote).hook(1))
    plain = QuotaManager(qs)
    now = 0
    for gap, value in steps:
        now += gap
        assert shared.record(P, "u", "app", value, now) == plain.record(P, "u", "app", value,
                                                                       now)
        rate = plain.sensor(P, "u", "app", now).rate
        assert global_sum(rate, 0.0, now, now) == rate.measure(now)


def test_kafka_window_pads_to_n_minus_one_windows() -> None:
    assert kafka_window(0, 11, 1000) == 10_000
    assert kafka_window(2500, 11, 1000) == 10_500  # as SampledRate: 2 full windows + 8 padded
    assert kafka_window(12_345, 11, 1000) == 12_345
    assert kafka_window(0, 1, 1000) == 0  # one sample, its window just begun (as Kafka)


def test_global_sum_counts_the_others_samples_and_their_oldest_start() -> None:
    own = SampledRate(11, 1000)
    own.record(1000, 20_000)
    # others: 11_000 bytes in samples starting at 8000: W from 8000 to 20_000 = 12 s
    assert global_sum(own, 11_000.0, 8000, 20_000) == (1000.0, 12_000)
    # others' samples more recent than the own: W is the own (padded) window
    assert global_sum(own, 9000.0, 19_000, 20_000) == (1000.0, 10_000)


def test_a_moved_client_is_throttled_at_once_by_the_new_process() -> None:
    """Process b recorded the client's usage; a's first request of it is throttled as one
    broker would (the union of samples), where uncoordinated it would go through free."""
    b = QuotaManager(SETTINGS)
    one = QuotaManager(SETTINGS)  # the client's whole traffic on one broker
    t = 0
    for t in range(0, 11_000, 100):
        b.record(P, "u", "app", 100_000, t)
        one.record(P, "u", "app", 100_000, t)
    remote = reading(now=t)
    see(remote, usage_report("b", 1, 0, {1: b}, t), t)

    def manager(coordinate: bool = True, compensate_lag: bool = True) -> SharedQuotaManager:
        return SharedQuotaManager(SETTINGS, SharedBudgets(
            remote, coordinate=coordinate, compensate_lag=compensate_lag).hook(1))

    now = t + 50
    expected = one.record(P, "u", "app", 100_000, now)
    assert expected == 150
    assert manager(coordinate=False).record(P, "u", "app", 100_000, now) == 0
    assert manager(compensate_lag=False).record(P, "u", "app", 100_000, now) == expected
    # with the lag compensation, b (active until its report) is taken to have sent as much
    # as a since: more, not less
    assert manager().record(P, "u", "app", 100_000, now) == 250


# ---------------------------------------------------------------------- two processes
def simulate(processes: int, conns: int, shared: dict[str, object] | None,
             seconds: int = 100, report_ms: int = 250, delay_ms: int = 50,
             size: int = 16_384, design_b: bool = False) -> float:
    """Greedy producers (one request at a time, 5 ms round trip, the next once the throttle
    has passed) with ``conns`` connections spread round-robin over ``processes``; reports
    every ``report_ms``, read ``delay_ms`` later; ``shared``: ``SharedBudgets`` options
    (None: each process on its own; ``design_b``: ``DemandShareBudgets`` options). Bytes/s
    over whole throttle cycles after 15 s, / quota."""
    names = [f"p{i}" for i in range(processes)]
    options = {"coordinate": False} if shared is None else shared

    def budgets_of(name: str) -> SharedBudgets:
        if design_b:
            return DemandShareBudgets(DemandReports(name, initial_processes=processes),
                                      **options)
        return SharedBudgets(RemoteUsage(name, initial_processes=processes), **options)

    budgets = [budgets_of(n) for n in names]
    remotes = [b.remote for b in budgets]
    managers = [SharedQuotaManager(SETTINGS, b.hook(1)) for b in budgets]
    for remote in remotes:
        remote.set_reading(True, 0)
    order = itertools.count()
    heap: list[tuple[int, int, int, int]] = [(i, next(order), 0, i) for i in range(conns)]
    heap += [(1 + p * report_ms // processes, next(order), 1, p) for p in range(processes)]
    heapq.heapify(heap)
    pending: dict[int, tuple[int, bytes]] = {}
    events: list[tuple[int, int]] = []
    while heap:
        t, _, kind, who = heapq.heappop(heap)
        if t >= seconds * 1000:
            break
        if kind == 0:  # a connection's request: recorded when its response comes
            heapq.heappush(heap, (t + 5, next(order), 2, who))
        elif kind == 2:
            throttle = managers[who % processes].record(P, "u", "app", size, t)
            events.append((t, size))
            heapq.heappush(heap, (t + throttle, next(order), 0, who))
        elif kind == 1:  # a process reports
            data = usage_report(names[who], t, t, {1: managers[who]}, t).encode()
            for q in range(processes):
                n = next(order)
                pending[n] = (q, data)
                heapq.heappush(heap, (t + delay_ms, n, 3, n))
            budgets[who].reported(t)
            remotes[who].expire(t)
            heapq.heappush(heap, (t + report_ms, next(order), 1, who))
        else:
            q, data = pending.pop(who)
            got = UsageReport.decode(data)
            see(remotes[q], got, got.sent_ms)
    # whole cycles: from the first burst after 15 s to the last one begun (a burst: a 250 ms
    # bucket above twice the quota after 5 s without one)
    buckets: dict[int, int] = {}
    for t, n in events:
        buckets[t // 250] = buckets.get(t // 250, 0) + n
    busy = 2 * QUOTA / 4
    starts = [b * 250 for b in sorted(buckets) if buckets[b] > busy and b * 250 >= 15_000
              and all(buckets.get(b - i, 0) <= busy for i in range(1, 21))]
    assert len(starts) >= 3, starts
    first, last = starts[0], starts[-1]
    return sum(n for t, n in events if first <= t < last) * 1000.0 / (last - first) / QUOTA


def test_design_a_holds_a_client_spread_over_two_processes_to_its_quota() -> None:
    """One client, 4 connections over 2 processes: each process on its own lets it through
    at about twice its quota; design A within 5 %, as one process does."""
    assert simulate(1, 4, None) == pytest.approx(1.0, abs=0.05)
    assert simulate(2, 4, None) == pytest.approx(2.0, abs=0.1)
    assert simulate(2, 4, {}) == pytest.approx(1.0, abs=0.05)


def test_lag_compensation_keeps_simultaneous_bursts_within_the_quota() -> None:
    """Over 4 processes, every process sees the budget free at the same moment and, without
    the compensation, each takes what is free before it hears of the others."""
    assert simulate(4, 8, {"compensate_lag": False}) > 1.05
    assert simulate(4, 8, {}) == pytest.approx(1.0, abs=0.05)


def test_produce_headroom_counts_the_others_usage_and_their_requests_in_flight() -> None:
    """Pipelining (``produce_headroom``) asks the shared budget: a request another process's
    usage leaves no room for is not read, where this process alone would read it; and each
    other process active in the budget is taken to have as much in flight as this one."""
    b = QuotaManager(SETTINGS)
    for t in range(0, 5_000, 100):
        b.record(P, "u", "app", 100_000, t)  # 5 MB in 5 s: half of what 10 s of quota allow
    t = 5_000
    remote = reading(now=t)
    see(remote, usage_report("b", 1, 0, {1: b}, t), t)
    shared = SharedBudgets(remote)
    hook, headroom, *_ = shared.hooks(1)
    a = QuotaManager(SETTINGS, hook=hook, headroom=headroom)
    alone = QuotaManager(SETTINGS)
    for m in (a, alone):
        m.sensor(P, "u", "app", t).in_flight = 3_000_000
    # alone: 3 MB in flight over the padded 10 s window is below 1 MB/s
    assert alone.produce_headroom("u", "app", t + 1)
    # shared: b's 5 MB, and b active, so taken to have 3 MB in flight too: 11 MB > 10 MB
    assert not a.produce_headroom("u", "app", t + 1)
    # without b's in flight (1 MB in flight here, 1 assumed for b): 7 MB < 10 MB
    a.sensor(P, "u", "app", t).in_flight = 1_000_000
    assert a.produce_headroom("u", "app", t + 1)
    # under the fallback: quota / 2 processes against this process's own usage only
    remote.set_reading(False, t + 2)
    a.sensor(P, "u", "app", t).in_flight = 6_000_000
    assert not a.produce_headroom("u", "app", t + 2)


def test_the_enforcer_gives_every_broker_manager_its_shared_hooks() -> None:
    from kafka_quota_proxy.quota.enforcer import QuotaEnforcer

    enforcer = QuotaEnforcer(SETTINGS)
    before = enforcer.manager(1)
    assert before.hook is None and before.headroom_hook is None and before.pace_hook is None
    seen: list[int] = []

    def hooks(scope: int) -> tuple:  # type: ignore[type-arg]
        seen.append(scope)
        return SharedBudgets(reading()).hooks(scope)

    enforcer.share(hooks)
    after = enforcer.manager(2)
    assert before.hook is not None and before.headroom_hook is not None
    assert after.hook is not None and after.headroom_hook is not None
    assert before.pace_hook is not None and after.pace_hook is not None
    assert seen == [1, 2]


def test_a_peer_with_usage_anywhere_in_the_window_counts_as_active() -> None:
    """The lag compensation counts every other process with usage in the quota window, not
    only those that recorded just before their report: a peer whose client sat out a long
    throttle comes back with the others when the window frees (pipelined producers on 4
    processes got 1.127 of the quota with a one-second horizon, in the simulation)."""
    t = 20_000
    remote = reading(now=t)
    # b's last record was 5 s before its report (its client throttled since)
    see(remote, report("b", 1, {KEY: ((8_000, 5_000, 500_000.0),)}), t)
    shared = SharedBudgets(remote)
    hook = shared.hook(1)
    m = SharedQuotaManager(SETTINGS, hook)
    m.record(P, "u", "app", 100_000, t + 10)
    assert shared.unseen(KEY, t + 20) == 100_000  # b is taken to have done as much since
    narrow = SharedBudgets(remote, active_ms=1000)  # the horizon first built
    SharedQuotaManager(SETTINGS, narrow.hook(1)).record(P, "u", "app", 100_000, t + 10)
    assert narrow.unseen(KEY, t + 20) == 0


def test_the_fallback_divisor_is_the_most_processes_live_before_reports_stopped() -> None:
    """The medium fails: every peer's reports stop at once but go stale one after the other,
    some before this process's own; the divisor is the four processes live just before, not
    the two left when its own report went stale."""
    remote = RemoteUsage("me", staleness_ms=2000, initial_processes=1)
    remote.set_reading(True, 0)
    see(remote, report("me", 1, {}), 1000)
    for p, at in (("b", 500), ("c", 600), ("d", 1000)):
        see(remote, report(p, 1, {}), at)
    remote.expire(1000)
    assert remote.live(1000) == 4 and remote.fallback_processes == 4
    remote.expire(2650)  # b and c stale already, its own still fresh
    assert remote.live(2650) == 2 and not remote.fallback(2650)
    assert remote.fallback(3000) and remote.fallback_processes == 4
    # a process that left (b, c) counts no more once the staleness has passed
    see(remote, report("me", 2, {}), 5000)
    see(remote, report("d", 2, {}), 5000)
    remote.expire(5000)
    assert remote.fallback_processes == 2


def test_scaled_by_usage_a_peer_is_taken_to_do_its_own_share_since_its_report() -> None:
    """``scale_by_usage``: a peer whose reports show three times this process's usage (5
    connections against 3, say) is taken to have done three times what this process did since
    its report, not as much (bounded at ten times)."""
    t = 20_000
    remote = reading(now=t - 100)
    see(remote, report("me", 2, {KEY: ((3_000, 100, 200_000.0),)}), t)
    see(remote, report("b", 1, {KEY: ((3_000, 100, 600_000.0),)}), t)
    see(remote, report("c", 1, {KEY: ((3_000, 100, 5_000_000.0),)}), t)
    scaled = SharedBudgets(remote, scale_by_usage=True)
    plain = SharedBudgets(remote)
    for shared in (scaled, plain):
        SharedQuotaManager(SETTINGS, shared.hook(1)).record(P, "u", "app", 100_000, t + 10)
    assert plain.unseen(KEY, t + 20) == 200_000  # b and c: as much as this process each
    assert scaled.unseen(KEY, t + 20) == pytest.approx(300_000 + 1_000_000)  # 3x, and 10x


# ---------------------------------------------------------------------- design B
# (``testkit.shared_quotas``: not part of the product, compared with A by the simulation)
def test_demand_share() -> None:
    assert demand_share(3.0, [1.0], floor=0.0) == 0.75
    assert demand_share(1.0, [3.0], floor=0.0) == 0.25
    # the floor, normalised: shares still add up to 1
    small = demand_share(1.0, [99.0], floor=0.1)
    big = demand_share(99.0, [1.0], floor=0.1)
    assert small == pytest.approx(0.1 / 1.09)
    assert small + big == pytest.approx(1.0)
    # nobody has demand yet: an equal share of the live processes
    assert demand_share(0.0, [], floor=0.05, live=4) == 0.25
    # a newcomer (no demand reported yet) gets the floor
    assert demand_share(0.0, [10.0], floor=0.05) == pytest.approx(0.05 / 1.05)


def test_design_b_bounds_each_process_by_its_share_of_the_reported_demand() -> None:
    remote = DemandReports("me", 11, 1000, 2000)
    remote.set_reading(True, 1000)
    see(remote, report("me", 1, {}), 1000)
    see(remote, report("me", 2, {KEY: ((500, 0, 1000.0),)}), 1000)
    see(remote, report("b", 1, {KEY: ((500, 0, 3000.0),)}), 1000)
    shared = DemandShareBudgets(remote, floor=0.0)
    m = SharedQuotaManager(SETTINGS, shared.hook(1))
    sensor = m.sensor(P, "u", "app", 1000)
    sensor.rate.record(1.0, 1000)
    assert shared.measure(1, sensor, 1.0, 0.1, 10_000, 1000)[2] == pytest.approx(QUOTA / 4)
    exact = DemandShareBudgets(remote, floor=0.0, shares_from_reports=False)
    # own demand exact (1 byte recorded here) against b's 3000
    assert exact.measure(1, sensor, 1.0, 0.1, 10_000, 1000)[2] == pytest.approx(
        QUOTA * 1 / 3001)


def test_design_b_holds_a_client_spread_over_two_processes_to_its_quota() -> None:
    assert simulate(2, 4, {}, design_b=True) == pytest.approx(1.0, abs=0.05)


# ---------------------------------------------------------------------- judging the reports
WALL = 1_800_000_000_000  # the reader's wall clock in these tests
VICTIM: BudgetKey = (1, P, "", "victim")


def stamped(process: str, seq: int, sent_ms: int,
            budgets: Mapping[BudgetKey, tuple[tuple[int, int, float], ...]] | None = None
            ) -> UsageReport:
    return UsageReport(process, seq, sent_ms, 11, 1000, budgets or {})


def test_a_report_stamped_beyond_the_skew_is_refused_and_counted() -> None:
    """Issue 26: a fake process charging 1e12 bytes, ``sent_ms`` in the future, re-sent every
    0.5 s, throttled its victim to 0."""
    remote = reading()
    forged = stamped("forger/0/1-2", 1, WALL + 3_600_000, {VICTIM: ((500, 0, 1e12),)})
    assert not see(remote, forged, 1000, WALL)
    assert remote.refused[Refusal.FUTURE] == 1
    assert remote.others(VICTIM, 1000) == (0.0, 1000) and remote.peers(1000) == []
    # a host whose clock is ahead by less than the skew allowed is counted
    assert see(remote, stamped("b/0/1-2", 1, WALL + MAX_CLOCK_SKEW_MS, {VICTIM: ((500, 0, 7.0),)}),
               1000, WALL)
    assert remote.others(VICTIM, 1000)[0] == 7.0


def test_reports_under_the_own_id_are_taken_only_as_written() -> None:
    """Issue 26: re-publishing a process's own id with a huge seq and no budgets shut its
    real reports out (and kept it out of the fallback). A process never takes another
    writer's report under its own id."""
    remote = RemoteUsage("me", 11, 1000, 2000)
    remote.set_reading(True, 0)
    assert not remote.observe(stamped("me", 2**62, WALL), 0, WALL)
    assert remote.refused[Refusal.OWN_ID] == 1
    assert remote.fallback(0)  # its own reports have not come back: the forgery is not one
    mine = stamped("me", 1, WALL)
    remote.wrote(mine)
    assert remote.observe(mine, 100, WALL) and not remote.fallback(100)
    # same seq, another stamp: not the report it wrote
    assert not remote.observe(stamped("me", 2, WALL + 250), 350, WALL + 250)
    assert remote.refused[Refusal.OWN_ID] == 2


def test_a_huge_seq_under_a_peers_id_does_not_shut_its_reports_out() -> None:
    """Issue 26: the real process ids re-published with a huge seq and no budgets made the
    instances ignore each other (a client over two got 2x its quota). The forgery starts a
    line of its own; the real reports go on counting, each budget the most any line says."""
    remote = reading()
    b = "b/0/1700000000000"
    see(remote, stamped(b, 10, WALL, {KEY: ((500, 0, 400.0),)}), 1000)
    assert not see(remote, stamped(b, 10, WALL), 1000)  # the same report again: ignored
    see(remote, stamped(b, 2**62, WALL + 10), 1010)  # the forgery: empty, seq absurd
    assert remote.conflicts == 1
    assert remote.others(KEY, 1010)[0] == 400.0
    assert see(remote, stamped(b, 11, WALL + 250, {KEY: ((750, 0, 600.0),)}), 1250)
    assert remote.others(KEY, 1250)[0] == 600.0  # b's line moved on
    assert remote.live(1250) == 2  # one process, however many lines
    # a plausible next seq forged (read off the topic) replaces b's line with nothing, until
    # b's own next report, which then starts a line of its own
    see(remote, stamped(b, 12, WALL + 260), 1260)
    see(remote, stamped(b, 12, WALL + 500, {KEY: ((1000, 0, 800.0),)}), 1500)
    assert remote.others(KEY, 1500)[0] == 800.0
    # seq going back with a later stamp (a second writer) is a line too, never a lock
    see(remote, stamped(b, 1, WALL + 600, {}), 1600)
    see(remote, stamped(b, 13, WALL + 750, {KEY: ((1250, 0, 900.0),)}), 1750)
    assert remote.others(KEY, 1750)[0] == 900.0
    # the forged lines go stale with the rest
    remote.expire(3750)
    assert remote.peers(3750) == [] and not remote._index


def test_lines_per_process_are_bounded() -> None:
    remote = reading()
    for i in range(3 * MAX_LINES):  # each starts a line: seq jumps by a million each time
        see(remote, stamped("b", 1 + i * 1_000_000, WALL, {KEY: ((10, 0, float(i)),)}), 1000)
    assert sum(len(lines) for lines in remote._index[KEY].values()) == MAX_LINES
    assert remote.others(KEY, 1000)[0] == 3 * MAX_LINES - 1.0  # the latest line is held


def test_a_tombstone_ends_liveness_not_usage() -> None:
    """A tombstone (a process's clean stop, or a forged one) takes it out of the processes
    live; the bytes it reported count until its report is stale; a report brings it back."""
    remote = reading()
    see(remote, stamped("b", 1, WALL, {KEY: ((500, 0, 400.0),)}), 1000)
    remote.stopped("b")
    remote.stopped("me")  # (its own: nothing to stop)
    assert remote.live(1100) == 1 and remote.peers(1100) == []
    assert remote.others(KEY, 1100)[0] == 400.0
    assert remote.others(KEY, 3000)[0] == 0.0  # stale
    see(remote, stamped("b", 2, WALL + 250, {KEY: ((500, 0, 10.0),)}), 1250)
    assert remote.peers(1250) == ["b"]


def test_what_the_others_charge_a_budget_is_capped() -> None:
    """A report charging 1e12 bytes (with a stamp in time) throttles the victim about
    ``CHARGE_CAP_WINDOWS`` windows, not for days; and the throttle ends when the report goes
    stale."""
    quota = 250_000.0
    qs = QuotaSettings(entities={EntityKey(None, "victim"): {P: quota}})

    def throttles(cap: float | None) -> list[int]:
        remote = reading(now=0)
        see(remote, stamped("me", 2, WALL), 0)
        see(remote, stamped("forger", 1, WALL, {VICTIM: ((500, 0, 1e12),)}), 0)
        shared = SharedBudgets(remote, charge_cap_windows=cap)
        m = SharedQuotaManager(qs, shared.hook(1))
        return [m.record(P, "u", "victim", 10_000, t) for t in (100, 200)]

    uncapped = throttles(None)
    assert uncapped[0] > 10**9  # 1e12 / 250 kB/s: weeks
    capped = throttles(CHARGE_CAP_WINDOWS)
    assert 0 < capped[0] <= (CHARGE_CAP_WINDOWS + 0.1) * 11_000
    remote = reading()
    shared = SharedBudgets(remote)
    see(remote, stamped("forger", 1, WALL, {VICTIM: ((500, 0, 1e12),)}), 0)
    m = SharedQuotaManager(qs, shared.hook(1))
    m.record(P, "u", "victim", 10_000, 100)
    assert shared.capped_checks == 1


def test_what_is_held_is_bounded() -> None:
    remote = RemoteUsage("me", 11, 1000, 2000, max_processes=2, max_report_budgets=3,
                         max_held_budgets=4)
    many = {(1, P, "", f"c{i}"): ((10, 0, 1.0),) for i in range(4)}
    assert not remote.observe(stamped("a", 1, WALL, many), 0)
    assert remote.refused[Refusal.OVERSIZED] == 1
    three = dict(list(many.items())[:3])
    assert remote.observe(stamped("a", 1, WALL, three), 0)
    assert not remote.observe(stamped("b", 1, WALL, three), 0)  # 6 budgets held: no room
    assert remote.observe(stamped("b", 1, WALL, {KEY: ((10, 0, 1.0),)}), 0)
    assert not remote.observe(stamped("c", 1, WALL), 0)  # a third process
    assert remote.refused[Refusal.FULL] == 2
    assert remote.observe(stamped("a", 2, WALL + 250, three), 250)  # a held one goes on
    remote.expire(5000)
    assert remote.observe(stamped("c", 1, WALL + 5000, three), 5000)  # room again

