"""The demo's live table: per client, its rate, its quota, the rate its quota budget measures
(what the proxy holds to the quota, over Kafka's 11 x 1 s window) and its throttles."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# A client's rate is measured this long after a quota change (or the start), once the burst a
# new budget allows has been paid back
SETTLE_S = 10.0


@dataclass(frozen=True)
class Budget:
    quota_type: str  # "produce" / "fetch" / "request"
    user: str  # Kafka's user tag ("" when the budget is not per user)
    client_id: str  # Kafka's client-id tag
    rate: float  # measured over the quota window (bytes/s)
    bound: float | None
    throttled: int
    throttle_ms: int

    @property
    def name(self) -> str:
        if self.user and self.client_id:
            return f"user {self.user}, client-id {self.client_id}"
        return f"user {self.user}" if self.user else f"client-id {self.client_id}"


@dataclass
class BudgetView:
    budgets: list[Budget]

    @classmethod
    def of(cls, proxy: Any) -> BudgetView:
        """The proxy's budgets, summed over its per-broker quota managers."""
        merged: dict[tuple[str, str, str], list[Any]] = {}
        for _broker, kind, user, cid, rate, bound, throttled, ms in proxy.stats.quota_entities():
            m = merged.setdefault((kind, user, cid), [0.0, bound, 0, 0])
            m[0] = max(m[0], rate)
            m[2] += throttled
            m[3] += ms
        return cls([Budget(k, u, c, r, b, t, ms) for (k, u, c), (r, b, t, ms) in merged.items()])

    def of_client(self, client: Any) -> Budget | None:
        """The budget this client's traffic is held to (None: it has no quota)."""
        kind = "produce" if client.role == "producer" else "fetch"
        for b in self.budgets:
            if b.quota_type != kind or b.bound is None:
                continue
            if b.user == client.user and b.client_id in ("", client.client_id):
                return b
            if not b.user and b.client_id == client.client_id:
                return b
        return None


@dataclass
class Rates:
    """Each client's bytes (to the broker for producers, to the client for consumers) at each
    tick, and its throttles."""

    ticks: list[float] = field(default_factory=list)
    volume: dict[str, list[int]] = field(default_factory=dict)
    throttles: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, t: float, client_id: str, total: int) -> float:
        """Record ``total`` bytes at ``t``; the rate since the previous tick."""
        series = self.volume.setdefault(client_id, [])
        series.append(total)
        if len(self.ticks) < 2 or len(series) < 2:
            return total / t if t else 0.0
        return (series[-1] - series[-2]) / (self.ticks[-1] - self.ticks[-2])

    def average(self, client_id: str, start: float, end: float) -> float | None:
        """Bytes/s between the first tick at or after ``start`` and the last at or before
        ``end``."""
        series = self.volume.get(client_id, [])
        picked = [i for i, t in enumerate(self.ticks[:len(series)]) if start <= t <= end]
        if len(picked) < 2:
            return None
        a, b = picked[0], picked[-1]
        return (series[b] - series[a]) / (self.ticks[b] - self.ticks[a])


def table(proxy: Any, view: BudgetView, rates: Rates, clients: Iterable[Any],
          elapsed: float) -> str:
    rates.ticks.append(elapsed)
    lines = [f"{'client-id':<14}{'user':<7}{'quota':<34}{'MB/s':>6}{'budget MB/s':>13}"
             f"{'throttled':>11}{'held back':>11}"]
    for c in clients:
        req, resp, _ = proxy.stats.per_client.get(c.client_id, (0, 0, 0))
        rate = rates.add(elapsed, c.client_id, req if c.role == "producer" else resp)
        budget = view.of_client(c)
        if budget is None:
            quota, measured, throttled, held = "none", "", "", ""
        else:
            before = rates.throttles.get(c.client_id, (0, 0))
            rates.throttles[c.client_id] = (budget.throttled, budget.throttle_ms)
            assert budget.bound is not None
            quota = f"{budget.bound / 1e6:.1f} MB/s ({budget.name})"
            measured = f"{budget.rate / 1e6:.2f}"
            throttled = str(budget.throttled - before[0])
            held = f"{(budget.throttle_ms - before[1]) / 1000:.1f} s"
        lines.append(f"{c.client_id:<14}{c.user:<7}{quota:<34}{rate / 1e6:>6.2f}{measured:>13}"
                     f"{throttled:>11}{held:>11}")
    return "\n".join(lines)


def summary_lines(rates: Rates, reloaded_at: float | None, alice_quota: int,
                  alice_reloaded: int, reader_quota: int, carol_quota: int) -> list[str]:
    """Each client's average rate once settled, against its quota."""
    end = rates.ticks[-1] if rates.ticks else 0.0
    first_end = reloaded_at if reloaded_at is not None else end
    lines = ["", "averages once settled (after the first "
             f"{SETTLE_S:.0f} s of each quota):"]

    def line(client_id: str, start: float, stop: float, quota: float | None) -> None:
        avg = rates.average(client_id, start, stop)
        if avg is None:
            return
        against = (f"quota {quota / 1e6:.2f} MB/s ({avg / quota:.0%})" if quota
                   else "no quota")
        lines.append(f"  {client_id:<14}{start:5.0f}-{stop:3.0f} s  {avg / 1e6:6.2f} MB/s  "
                     f"{against}")

    line("alice-loader", SETTLE_S, first_end, alice_quota)
    if reloaded_at is not None:
        line("alice-loader", reloaded_at + SETTLE_S, end, alice_reloaded)
    line("demo-reader", SETTLE_S, end, reader_quota)
    line("carol-app", SETTLE_S, end, carol_quota)
    return lines
