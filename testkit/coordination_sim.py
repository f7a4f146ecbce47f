"""The coordination simulation's engine (``bench/coordination_sim.py`` prints its tables;
the tests run it): K proxy processes on the real quota engine, each with its own
``QuotaManager`` and the design's hooks, exchanging their usage reports with a delay, and
greedy clients. The scenarios, designs and figures are described in the bench's doc."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace
from typing import Any

from kafka_quota_proxy.quota.entities import EntityKey, QuotaType, quota_limit
from kafka_quota_proxy.quota.manager import KAFKA, STRICT, QuotaSettings
from kafka_quota_proxy.quota.shared import (
    BudgetKey,
    RemoteUsage,
    SharedBudgets,
    UsageReport,
    live_samples,
    usage_report,
)
from testkit.rates import Cycles
from testkit.shared_quotas import DemandReports, DemandShareBudgets, SharedQuotaManager

QUOTA = 1_000_000.0  # bytes/s
REQUEST_BYTES = 16_384
RTT_MS = 5
SAMPLES, WINDOW_MS = 11, 1000
DURATION_S = 150.0
WARMUP_S = 15.0
MOVE_S = 30.0
SPAN_S = 22.0  # c: how long after the move the runs with and without it are compared
MOVES = 24  # c: moves at as many times, spread over one quota window
SWEEP_MOVES = 8
STALENESS_MS = 2000
HELD = 0.05  # c: held once the others' usage is counted within 5 % of a quota window
BROKER = 1

SEND, RESPONSE, REPORT, DELIVER = 0, 1, 2, 3


@dataclass(frozen=True)
class Conn:
    user: str
    client_id: str
    process: int
    moved_to: int | None = None  # the process it uses after the move


@dataclass(frozen=True)
class Scenario:
    name: str
    processes: int
    conns: tuple[Conn, ...]
    entity: EntityKey
    request_bytes: int = REQUEST_BYTES
    move: bool = False
    reading: bool = True
    reconnect_ms: int = 0  # how long a connection pauses when it moves
    # requests a connection may have in flight (as librdkafka pipelines): the next is sent
    # while the proxy's produce headroom allows it (``QuotaManager.produce_headroom``) and the
    # connection is not muted; 1: one at a time, the next once the throttle has passed
    pipeline: int = 1
    rtt_ms: int = RTT_MS


@dataclass(frozen=True)
class Variant:
    name: str
    coordinate: bool = True
    demand_share: bool = False  # design B (else A)
    compensate_lag: bool = False
    shares_from_reports: bool = False  # B+
    active_ms: int | None = None  # A+: how recent a peer's last record must be to count
    scale_by_usage: bool = False  # A+s: a peer's unseen usage scaled by its usage over ours
    strict: bool = False  # quotas.pacing: strict (the levels of ``SharedBudgets.pace``)


VARIANTS = {
    "none": Variant("none", coordinate=False),
    "A": Variant("A"),
    "A+": Variant("A+", compensate_lag=True),
    "A+s": Variant("A+s", compensate_lag=True, scale_by_usage=True),
    "B": Variant("B", demand_share=True),
    "B+": Variant("B+", demand_share=True, shares_from_reports=True),
    # A+ as first built: a peer counts as active when it recorded within one sample window
    # before its report (under pipelining and long throttles that misses peers: p4)
    "A+1s": Variant("A+1s", compensate_lag=True, active_ms=WINDOW_MS),
    # strict pacing: every process paces the whole budget's level (``SharedBudgets.pace``);
    # S-none: each process paces its own, as without coordination
    "S": Variant("S", strict=True),
    "S-none": Variant("S-none", coordinate=False, strict=True),
}


def scenarios() -> dict[str, Scenario]:
    app = EntityKey(None, "app")  # clients/app: one budget per client-id
    alice = EntityKey("alice", None)  # users/alice: one budget for all her client-ids

    def spread(n: int, k: int) -> tuple[Conn, ...]:
        return tuple(Conn("ANONYMOUS", "app", i % k) for i in range(n))

    def users(k: int) -> tuple[Conn, ...]:
        return tuple(Conn("alice", f"c{i}", i % k) for i in range(50))

    moving = tuple(Conn("ANONYMOUS", "app", 0, 1) for _ in range(4))
    return {
        "ref-a": Scenario("ref a: 8 conns / 1 proc", 1, spread(8, 1), app),
        "a": Scenario("a: 1 client, 8 conns / 2 procs", 2, spread(8, 2), app),
        "a4": Scenario("a4: 1 client, 8 conns / 4 procs", 4, spread(8, 4), app),
        "asym": Scenario("asym: 1 client, 6 + 2 conns", 2,
                         tuple(Conn("ANONYMOUS", "app", int(i >= 6)) for i in range(8)), app),
        "skew": Scenario("skew: 7 conns + 7 x 1 / 8 procs", 8,
                         tuple(Conn("ANONYMOUS", "app", max(0, i - 6)) for i in range(14)),
                         app),
        "lone": Scenario("lone: 4 conns on 1 of 4 procs", 4, spread(4, 1), app),
        "ref-b": Scenario("ref b: 50 clients / 1 proc", 1, users(1), alice, 4096),
        "b": Scenario("b: 50 clients of 1 user / 2 procs", 2, users(2), alice, 4096),
        "ref-b16": Scenario("ref b16: b, 16 KB, 1 proc", 1, users(1), alice),
        "b16": Scenario("b16: b with 16 KB requests", 2, users(2), alice),
        "c": Scenario("c: 1 client moves proc 1 -> 2", 2, moving, app, move=True),
        "c-pause": Scenario("c-pause: 1 proc, 100 ms pause", 1,
                            tuple(replace(c, moved_to=0) for c in moving), app, move=True,
                            reconnect_ms=100),
        "fallback": Scenario("fallback: a, reports unreadable", 2, spread(8, 2), app,
                             reading=False),
        # as tests/e2e/test_shared_quotas.py: 4 librdkafka producers, 64 KB batches pipelined
        "ref-p": Scenario("ref p: 4 pipelined 64 KB / 1 proc", 1, spread(4, 1), app, 65536,
                          pipeline=5, rtt_ms=20),
        "p": Scenario("p: 4 pipelined 64 KB / 2 procs", 2, spread(4, 2), app, 65536,
                      pipeline=5, rtt_ms=20),
        "p4": Scenario("p4: 4 pipelined 64 KB / 4 procs", 4, spread(4, 4), app, 65536,
                       pipeline=5, rtt_ms=20),
        # librdkafka's default batch.size (1,000,000): each request a second of quota, as
        # bench/shared_budgets_bench.py --batch-bytes 1000000 (SO_REUSEPORT split 3 + 5)
        "ref-m": Scenario("ref m: 8 pipelined 1 MB / 1 proc", 1, spread(8, 1), app,
                          1_000_000, pipeline=5, rtt_ms=20),
        "m": Scenario("m: 8 pipelined 1 MB / 2 procs 4 + 4", 2, spread(8, 2), app, 1_000_000,
                      pipeline=5, rtt_ms=20),
        "m35": Scenario("m35: 8 pipelined 1 MB / 3 + 5", 2,
                        tuple(Conn("ANONYMOUS", "app", int(i >= 3)) for i in range(8)), app,
                        1_000_000, pipeline=5, rtt_ms=20),
    }


@dataclass
class Run:
    events: list[tuple[float, float]]  # (s, bytes) of every request recorded
    fallback_checks: int
    # after the move: the last time (ms after it) the process moved to counted the others'
    # usage of the budget more than ``HELD`` of a quota window short of what they recorded
    unheld_ms: int = 0


def simulate(sc: Scenario, variant: Variant, report_ms: int, delay_ms: int,
             duration_s: float = DURATION_S, move_s: float | None = MOVE_S) -> Run:
    settings = QuotaSettings(samples=SAMPLES, window_ms=WINDOW_MS,
                             entities={sc.entity: {QuotaType.PRODUCE: QUOTA}},
                             pacing=STRICT if variant.strict else KAFKA)

    def bound_of(key: BudgetKey) -> float | None:
        return quota_limit(settings.for_type(key[1]), (key[2], key[3]))[0]
    k = sc.processes
    names = [f"p{i}" for i in range(k)]

    def budgets(name: str) -> SharedBudgets:
        if variant.demand_share:
            return DemandShareBudgets(
                DemandReports(name, SAMPLES, WINDOW_MS, STALENESS_MS, initial_processes=k),
                shares_from_reports=variant.shares_from_reports, coordinate=variant.coordinate)
        return SharedBudgets(
            RemoteUsage(name, SAMPLES, WINDOW_MS, STALENESS_MS, initial_processes=k),
            compensate_lag=variant.compensate_lag, active_ms=variant.active_ms,
            coordinate=variant.coordinate, scale_by_usage=variant.scale_by_usage,
            bound_of=bound_of)

    shared = [budgets(n) for n in names]
    remotes = [s.remote for s in shared]
    managers = [SharedQuotaManager(settings, *s.hooks(BROKER)) for s in shared]
    for r in remotes:
        r.set_reading(sc.reading, 0)
    end_ms = int(duration_s * 1000)
    move_ms = int(move_s * 1000) if move_s is not None and sc.move else end_ms
    held_check = not variant.demand_share or not variant.coordinate
    window_bytes = QUOTA * SAMPLES * WINDOW_MS / 1000.0
    events: list[tuple[float, float]] = []
    unheld_ms = 0
    heap: list[tuple[int, int, int, Any]] = []
    order = itertools.count()

    def push(t: int, kind: int, what: Any) -> None:
        heapq.heappush(heap, (t, next(order), kind, what))

    for i in range(len(sc.conns)):
        push(i, SEND, i)
    for p in range(k):
        push(1 + p * report_ms // k, REPORT, p)
    seqs = [0] * k
    reconnected: set[int] = set()
    in_flight = [0] * len(sc.conns)  # (pipeline > 1)
    muted = [0] * len(sc.conns)
    while heap:
        t, _, kind, what = heapq.heappop(heap)
        if t >= end_ms:
            break
        if kind == SEND and sc.pipeline > 1:
            i = what
            c = sc.conns[i]
            p = c.moved_to if c.moved_to is not None and t >= move_ms else c.process
            if t < muted[i] or in_flight[i] >= sc.pipeline:
                continue  # (a response or the end of the mute sends again)
            m = managers[p]
            if in_flight[i] and not m.produce_headroom(c.user, c.client_id, t):
                continue
            in_flight[i] += 1
            m.sensor(QuotaType.PRODUCE, c.user, c.client_id, t).in_flight += sc.request_bytes
            push(t + sc.rtt_ms, RESPONSE, (i, p))
            push(t + 1, SEND, i)
        elif kind == RESPONSE and sc.pipeline > 1:
            i, p = what
            c = sc.conns[i]
            in_flight[i] -= 1
            m = managers[p]
            m.sensor(QuotaType.PRODUCE, c.user, c.client_id, t).in_flight -= sc.request_bytes
            throttle = m.record(QuotaType.PRODUCE, c.user, c.client_id, sc.request_bytes, t)
            events.append((t / 1000.0, sc.request_bytes))
            if throttle:
                muted[i] = max(muted[i], t + throttle)
            push(max(t, muted[i]), SEND, i)
        elif kind == SEND:
            c = sc.conns[what]
            if t >= move_ms and what not in reconnected:
                reconnected.add(what)
                if sc.reconnect_ms:
                    push(t + sc.reconnect_ms, SEND, what)
                    continue
            p = c.moved_to if c.moved_to is not None and t >= move_ms else c.process
            push(t + RTT_MS, RESPONSE, (what, p))
        elif kind == RESPONSE:
            i, p = what
            c = sc.conns[i]
            throttle = managers[p].record(QuotaType.PRODUCE, c.user, c.client_id,
                                          sc.request_bytes, t)
            events.append((t / 1000.0, sc.request_bytes))
            push(t + throttle, SEND, i)
            if held_check and t >= move_ms and p == c.moved_to and k > 1:
                sensor = managers[p].sensor(QuotaType.PRODUCE, c.user, c.client_id, t)
                key = (BROKER, QuotaType.PRODUCE, *sensor.tags)
                exact = sum(v for q in range(k) if q != p
                            for _, _, v in live_samples(managers[q].sensor(
                                QuotaType.PRODUCE, c.user, c.client_id, t).rate, t))
                if exact - shared[p].others_counted(key, t) > HELD * window_bytes:
                    unheld_ms = t - move_ms
        elif kind == REPORT:
            seqs[what] += 1
            if variant.coordinate and sc.reading:
                made = usage_report(names[what], seqs[what], t, {BROKER: managers[what]}, t,
                                    totals=shared[what].totals() if variant.strict else None)
                remotes[what].wrote(made)  # its own, when read back
                data = made.encode()
                for q in range(k):
                    push(t + delay_ms, DELIVER, (q, data))
            shared[what].reported(t)
            remotes[what].expire(t)
            push(t + report_ms, REPORT, what)
        else:
            q, data = what
            report = UsageReport.decode(data)
            remotes[q].observe(report, report.sent_ms)  # one clock in the simulation
    return Run(events, sum(s.fallback_checks for s in shared), unheld_ms)


# ---------------------------------------------------------------------- measures
def most_in_a_window(events: list[tuple[float, float]], since: float, until: float,
                     window_s: float) -> float:
    """The most bytes recorded in any ``window_s`` ending in ``[since, until)``."""
    best = total = 0.0
    lo = 0
    for t, n in events:
        if t >= until:
            break
        total += n
        while events[lo][0] <= t - window_s:
            total -= events[lo][1]
            lo += 1
        if t >= since:
            best = max(best, total)
    return best


def after_move(sc: Scenario, v: Variant, report_ms: int, delay_ms: int, moves: int
               ) -> tuple[float, float | None]:
    """(excess in seconds of quota, held in report intervals), the worst of ``moves`` moves
    spread over one quota window after ``MOVE_S``, so that some land in a burst."""
    window = SAMPLES * WINDOW_MS / 1000.0
    times = [MOVE_S + i * window / moves for i in range(moves)]
    still = simulate(sc, v, report_ms, delay_ms, times[-1] + SPAN_S + 1, move_s=None).events
    worst = -float("inf")
    unheld = 0
    for m in times:
        run = simulate(sc, v, report_ms, delay_ms, m + SPAN_S + 1, move_s=m)
        extra = (most_in_a_window(run.events, m, m + SPAN_S, window)
                 - most_in_a_window(still, m, m + SPAN_S, window))
        worst = max(worst, extra / QUOTA)
        unheld = max(unheld, run.unheld_ms)
    counted = sc.processes > 1 and (not v.demand_share or not v.coordinate)
    return worst, unheld / report_ms if counted else None


@dataclass
class Result:
    scenario: str
    variant: str
    report_ms: int
    delay_ms: int
    ratio: float
    low: float
    high: float
    excess_s: float | None = None
    held: float | None = None
    after: float | None = None
    fallback_checks: int = 0


def measure(key: str, variant: str, report_ms: int, delay_ms: int,
            moves: int = MOVES) -> Result:
    sc = scenarios()[key]
    v = VARIANTS[variant]
    run = simulate(sc, v, report_ms, delay_ms)
    cycles = Cycles(run.events, QUOTA)
    res = Result(sc.name, variant, report_ms, delay_ms, *cycles.whole(WARMUP_S),
                 fallback_checks=run.fallback_checks)
    if sc.move:
        res.excess_s, res.held = after_move(sc, v, report_ms, delay_ms, moves)
        res.after = cycles.rate(MOVE_S)
    return res
