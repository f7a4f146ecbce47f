"""Budgets shared across processes, for ``bench/coordination_sim.py`` and the tests: what the
product (``quota/shared.py``, design A+) does not use.

- ``SharedQuotaManager``: ``QuotaManager`` with the shared hooks as its second and third
  arguments.
- Design B (demand share), the alternative ``docs/scale-out.md`` compares A with: each process
  applies Kafka's maths to its own samples against ``quota * share``,
  ``share = max(floor, d_own / sum d)`` normalised so that the shares of the processes with
  demand add up to 1; a demand is what a process recorded into the budget within the window.
  ``shares_from_reports`` (the default, B+) takes the process's own demand from its own last
  report, as the others see it, so that every process computes the same shares; otherwise
  (B) its own is exact. Built on ``quota.shared`` by subclassing: ``DemandReports`` is a
  ``RemoteUsage`` that also answers each process's demand (from the reports it holds),
  ``DemandShareBudgets`` a ``SharedBudgets`` whose quota check, once coordinated and out of
  the fallback, bounds the process by its share instead of summing everyone's samples.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafka_quota_proxy.quota.manager import (
    ONE_HOUR_MS,
    BudgetHook,
    HeadroomHook,
    PaceHeadroomHook,
    PaceHook,
    QuotaManager,
    QuotaSettings,
    Sensor,
    StorageScaling,
)
from kafka_quota_proxy.quota.shared import BudgetKey, RemoteUsage, SharedBudgets, live_samples


class SharedQuotaManager(QuotaManager):
    """``QuotaManager`` with a ``BudgetHook`` where ``record`` checks the quota (and a
    ``PaceHook`` where strict pacing paces it). Produce budgets paced by storage scaling are
    left as ``QuotaManager`` paces them (an open question of ``docs/scale-out.md``)."""

    def __init__(self, settings: QuotaSettings, hook: BudgetHook | None,
                 headroom: HeadroomHook | None = None, pace: PaceHook | None = None,
                 pace_headroom: PaceHeadroomHook | None = None,
                 idle_expiry_ms: int = ONE_HOUR_MS,
                 storage: StorageScaling | None = None) -> None:
        super().__init__(settings, idle_expiry_ms, storage, hook, headroom, pace,
                         pace_headroom)


# ---------------------------------------------------------------------- design B
def demand_share(own: float, others: Sequence[float], floor: float, live: int = 1) -> float:
    """This process's share of a quota: ``max(floor, own / total)`` over the sum of the same
    for every process with demand (the shares add up to 1); ``1 / live`` when no process has
    any."""
    total = own + sum(others)
    if total <= 0.0:
        return 1.0 / max(1, live)
    mine = max(floor, own / total)
    return mine / (mine + sum(max(floor, d / total) for d in others if d > 0.0))


class DemandReports(RemoteUsage):
    """``RemoteUsage`` that also gives each process's demand of a budget, as its reports
    held here say (samples as held: ``(start, expiry, value)`` on this process's clock)."""

    def _demand(self, samples: Sequence[tuple[int, int, float]], now_ms: int,
                horizon_ms: int | None) -> float:
        expire = self._expire
        return sum(v for _, expiry, v in samples if now_ms < expiry
                   and (horizon_ms is None or now_ms - (expiry - expire) < horizon_ms))

    def demands(self, key: BudgetKey, now_ms: int, horizon_ms: int | None = None
                ) -> list[float]:
        """Each other live process's usage of ``key`` (``horizon_ms``: in samples with an
        event within it), for those with some (for each process its line with the most)."""
        users = self._index.get(key)
        if not users:
            return []
        got = []
        for lines in users.values():
            d = max((self._demand(line.budgets[key], now_ms, horizon_ms) for line in lines
                     if self._fresh(line, now_ms)), default=0.0)
            if d > 0.0:
                got.append(d)
        return got

    def own_demand(self, key: BudgetKey, now_ms: int, horizon_ms: int | None = None) -> float:
        """This process's usage of ``key`` as its own last report, read back, gave it."""
        own = self._own
        if own is None:
            return 0.0
        return self._demand(own.budgets.get(key, ()), now_ms, horizon_ms)


class DemandShareBudgets(SharedBudgets):
    """Design B: ``floor`` (the least share of a process with demand), ``demand_horizon_ms``
    (None: the whole quota window), ``shares_from_reports`` (module doc). Uncoordinated
    (``coordinate=False``) and under the fallback, as ``SharedBudgets``; otherwise it keeps
    no running totals of its own (``unseen`` is design A's) and never calls ``on_first_use``
    (the runtime's, which runs design A only)."""

    def __init__(self, remote: DemandReports, *, floor: float = 0.05,
                 demand_horizon_ms: int | None = None, shares_from_reports: bool = True,
                 coordinate: bool = True) -> None:
        super().__init__(remote, coordinate=coordinate)
        self.reports = remote
        self.floor = floor
        self.demand_horizon_ms = demand_horizon_ms
        self.shares_from_reports = shares_from_reports

    def _share(self, key: BudgetKey, mine: float, now_ms: int) -> float:
        reports = self.reports
        return demand_share(mine, reports.demands(key, now_ms, self.demand_horizon_ms),
                            self.floor, reports.live(now_ms))

    def headroom(self, broker: int, sensor: Sensor, now_ms: int, bound: float) -> bool:
        if not self.coordinate or self.reports.fallback(now_ms):
            return super().headroom(broker, sensor, now_ms, bound)
        key = (broker, sensor.quota_type, *sensor.tags)
        mine = self.reports.own_demand(key, now_ms, self.demand_horizon_ms)
        return sensor.headroom(now_ms, bound * self._share(key, mine, now_ms))

    def measure(self, broker: int, sensor: Sensor, value: float, rate: float,
                window_ms: int, now_ms: int) -> tuple[float, int, float]:
        if not self.coordinate or self.reports.fallback(now_ms):
            return super().measure(broker, sensor, value, rate, window_ms, now_ms)
        bound = sensor.bound
        assert bound is not None  # (only limited budgets are checked)
        key = (broker, sensor.quota_type, *sensor.tags)
        horizon = self.demand_horizon_ms
        if self.shares_from_reports:
            mine = self.reports.own_demand(key, now_ms, horizon)
        elif horizon is None:
            mine = sensor.rate.peek(now_ms)[0]
        else:
            mine = sum(v for _, last, v in live_samples(sensor.rate, now_ms)
                       if now_ms - last < horizon)
        return rate, window_ms, bound * self._share(key, mine, now_ms)
