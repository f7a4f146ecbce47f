"""Budgets shared by every process of every proxy instance (issue 16): the data and the maths
of coordination, without the transport. Pure: no I/O, time comes in as an argument (ms).

Each process keeps its own ``QuotaManager`` per broker, as before, and every ``report_ms``
publishes a ``UsageReport``: for each limited budget (broker, quota type, user tag, client-id
tag), the samples of its ``SampledRate`` that a quota check still counts, as ``(start, last
event, value)`` with times in ms *before* the report was made (no clock is shared). Every
process reads every report into a ``RemoteUsage`` (itself included: a process whose own
reports stop coming back is not counted by the others either), which drops a process whose
last report is ``staleness_ms`` old. ``docs/scale-out.md`` compares two designs with
``bench/coordination_sim.py``:

- ``Design.GLOBAL_SUM`` (A): Kafka's maths on the union of the samples, the process's own
  (exact) and the others' (as last reported): ``O = (own + others) / W``, ``W`` measured from
  the oldest start in the union and padded as Kafka pads it; the bound is the quota. With
  ``compensate_lag`` (the default), each other process that recorded into the budget within
  ``active_ms`` (default: the whole quota window) before its last report is taken to have
  used, since that report, what this process used in the same time, and (for the pipelining
  check) to have as much in flight: without it, processes that see the budget free at the
  same moment (when a burst leaves the window) each take the whole of it before they hear of
  the others. (With one sample window as the horizon, a peer whose client sat out a long
  throttle before its report was missed: pipelined 64 KB producers on 4 processes got 1.127
  of the quota in ``bench/coordination_sim.py``, 0.999 with the whole window.)
- ``Design.DEMAND_SHARE`` (B): Kafka's maths on the process's own samples, against
  ``quota * share``, ``share = max(floor, d_own / sum d)`` normalised so that the shares of
  the processes with demand add up to 1; a demand is what a process recorded into the budget
  within the window. ``shares_from_reports`` (the default) takes the process's own demand
  from its own last report, as the others see it, so that every process computes the same
  shares; otherwise its own is exact.

While reports cannot be read (or the process's own stop coming back), a process enforces its
own samples against ``quota / live``, ``live`` being the processes known live when reports
were last read (itself included): the fallback.

The hook ``QuotaManager`` needs is a ``BudgetHook``, called in ``record`` right after the
sampled rate is recorded and measured: ``hook(sensor, value, rate, window_ms, now_ms)`` returns
the ``(rate, window_ms, bound)`` that Kafka's check and throttle formula then apply to.
``SharedQuotaManager`` is ``QuotaManager`` with it, for the simulation and the tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from quota.entities import QuotaType
from quota.manager import (
    ONE_HOUR_MS,
    BudgetHook,
    HeadroomHook,
    QuotaManager,
    QuotaSettings,
    Sensor,
    StorageScaling,
)
from quota.sampled import SampledRate
from quota.throttle import rate_per_second

# (broker, quota type, user tag, client-id tag): one budget as ``QuotaManager`` shares them
# (the tags are ``Sensor.tags``: "" where that part does not take part in sharing)
BudgetKey = tuple[int, QuotaType, str, str]
# one sample as reported: (start, last event) in ms before the report was made, value
ReportedSample = tuple[int, int, float]

REPORT_VERSION = 1
_TYPE_CODES = {QuotaType.PRODUCE: 0, QuotaType.FETCH: 1, QuotaType.REQUEST: 2}
_CODE_TYPES = {v: k for k, v in _TYPE_CODES.items()}
_HEADER = struct.Struct(">BqqHI")  # version, seq, sent_ms, samples, window_ms
_COUNT = struct.Struct(">I")
_LEN = struct.Struct(">H")
_BUDGET = struct.Struct(">iBIIB")  # broker, quota type, user index, client-id index, samples
_SAMPLE = struct.Struct(">IId")  # start before, last before, value
_MAX_BEFORE = 2**32 - 1


class ReportError(ValueError):
    """Bytes that are not a usage report this code reads."""


class Design(Enum):
    GLOBAL_SUM = "global-sum"  # A
    DEMAND_SHARE = "demand-share"  # B


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One process's usage of the budgets it reports, as of when it was made.

    ``process``: the sender's id, and the record's key on the topic (compaction keeps one
    report per process); ``seq``: grows with each report of the process (a reader keeps the
    highest); ``sent_ms``: the sender's wall clock, for a reader's estimate of the report's
    age; ``samples``, ``window_ms``: the sender's quota window (a reader ignores reports made
    with another)."""

    process: str
    seq: int
    sent_ms: int
    samples: int
    window_ms: int
    budgets: Mapping[BudgetKey, tuple[ReportedSample, ...]] = field(default_factory=dict)

    @property
    def key(self) -> bytes:
        return self.process.encode()

    def encode(self) -> bytes:
        """Version 1, big-endian: version u8, seq i64, sent_ms i64, samples u16, window_ms
        u32; the process id (u16 length + UTF-8); a table of the user and client-id tags
        (u32 count, each u16 length + UTF-8); u32 budgets, each: broker i32, quota type u8
        (0 produce, 1 fetch, 2 request), user and client-id as u32 indexes into the table,
        u8 samples, each: start before u32, last event before u32, value f64. 16 bytes a
        sample: at most 12 x 16 + 14 bytes a budget with Kafka's default window."""
        strings: dict[str, int] = {}
        body = bytearray(_COUNT.pack(len(self.budgets)))
        for (broker, quota_type, user, client_id), samples in self.budgets.items():
            u = strings.setdefault(user, len(strings))
            c = strings.setdefault(client_id, len(strings))
            body += _BUDGET.pack(broker, _TYPE_CODES[quota_type], u, c, len(samples))
            for start, last, value in samples:
                body += _SAMPLE.pack(start, last, value)
        out = bytearray(_HEADER.pack(REPORT_VERSION, self.seq, self.sent_ms, self.samples,
                                     self.window_ms))
        _put_str(out, self.process)
        out += _COUNT.pack(len(strings))
        for s in strings:
            _put_str(out, s)
        out += body
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> UsageReport:
        try:
            return _decode(memoryview(data))
        except (struct.error, UnicodeDecodeError, IndexError, KeyError) as exc:
            raise ReportError(f"not a usage report: {exc}") from exc


def _put_str(out: bytearray, s: str) -> None:
    raw = s.encode()
    out += _LEN.pack(len(raw))
    out += raw


def _decode(view: memoryview) -> UsageReport:
    if not len(view) or view[0] != REPORT_VERSION:
        raise ReportError(f"unknown report version {view[0] if len(view) else None}")
    _, seq, sent_ms, samples, window_ms = _HEADER.unpack_from(view, 0)
    if samples < 1 or window_ms < 1:
        raise ReportError("the quota window must be positive")
    pos = _HEADER.size

    def text() -> str:
        nonlocal pos
        (n,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        if pos + n > len(view):
            raise ReportError("truncated string")
        s = bytes(view[pos:pos + n]).decode()
        pos += n
        return s

    def count() -> int:
        nonlocal pos
        (n,) = _COUNT.unpack_from(view, pos)
        pos += _COUNT.size
        return int(n)

    process = text()
    table = [text() for _ in range(count())]
    budgets: dict[BudgetKey, tuple[ReportedSample, ...]] = {}
    for _ in range(count()):
        broker, code, u, c, n = _BUDGET.unpack_from(view, pos)
        pos += _BUDGET.size
        got = []
        for _ in range(n):
            start, last, value = _SAMPLE.unpack_from(view, pos)
            pos += _SAMPLE.size
            if last > start or not 0.0 <= value < float("inf"):
                raise ReportError(f"bad sample {(start, last, value)}")
            got.append((start, last, value))
        key = (broker, _CODE_TYPES[code], table[u], table[c])
        if key in budgets:
            raise ReportError(f"budget {key} twice")
        budgets[key] = tuple(got)
    if pos != len(view):
        raise ReportError(f"{len(view) - pos} bytes after the report")
    return UsageReport(process, seq, sent_ms, samples, window_ms, budgets)


# ---------------------------------------------------------------------- one process's samples
def live_samples(rate: SampledRate, now_ms: int) -> list[tuple[int, int, float]]:
    """``SampledRate.samples_at``: the samples a quota check at ``now_ms`` counts."""
    return rate.samples_at(now_ms)


def oldest_start(rate: SampledRate, now_ms: int) -> int:
    """``SampledRate.oldest_start``: the oldest start a quota check at ``now_ms`` keeps."""
    return rate.oldest_start(now_ms)


def kafka_window(elapsed_ms: int, samples: int, window_ms: int) -> int:
    """Kafka's ``Rate.windowSize`` for ``elapsed_ms`` since the oldest sample's start: padded
    with whole windows up to ``samples - 1`` of them while fewer have elapsed (0 is possible
    with one sample: ``quota.throttle.rate_per_second``)."""
    full = elapsed_ms // window_ms
    if full < samples - 1:
        elapsed_ms += (samples - 1 - full) * window_ms
    return elapsed_ms


def usage_report(process: str, seq: int, sent_ms: int, managers: Mapping[int, QuotaManager],
                 now_ms: int, min_fraction: float = 0.0) -> UsageReport:
    """The report of a process whose quota managers (one per broker) are ``managers``, made
    at ``now_ms`` on their clock. Limited budgets with usage in the window only;
    ``min_fraction``: also leave out those whose own rate is below that fraction of their
    bound (the others then miss at most ``live * min_fraction`` of the quota)."""
    defaults = QuotaSettings()
    shape = (defaults.samples, defaults.window_ms)
    budgets: dict[BudgetKey, tuple[ReportedSample, ...]] = {}
    for broker, manager in managers.items():
        shape = (manager.settings.samples, manager.settings.window_ms)
        for sensor in manager:
            if sensor.bound is None:
                continue
            samples = live_samples(sensor.rate, now_ms)
            if not samples:
                continue
            if min_fraction > 0.0:
                total, window = sensor.rate.peek(now_ms)
                if rate_per_second(total, window) < min_fraction * sensor.bound:
                    continue
            budgets[(broker, sensor.quota_type, *sensor.tags)] = tuple(
                (min(now_ms - s, _MAX_BEFORE), min(now_ms - last, _MAX_BEFORE), v)
                for s, last, v in samples)
    return UsageReport(process, seq, sent_ms, shape[0], shape[1], budgets)


# ---------------------------------------------------------------------- everyone's reports
# one sample as held by a reader: (start, expiry = last event + samples * window, value),
# on the reader's clock
_Held = tuple[int, int, float]


@dataclass(slots=True)
class _Report:
    seq: int
    as_of_ms: int
    budgets: dict[BudgetKey, list[_Held]]


class RemoteUsage:
    """The latest report of every process, on this process's clock.

    ``observe(report, as_of_ms)``: ``as_of_ms`` is when, on this process's quota clock, the
    report was made (the runtime estimates it from ``sent_ms``, see ``docs/scale-out.md``).
    A process whose last report is ``staleness_ms`` old or more counts no more: ``expire``
    forgets it, and every answer ignores it even before.

    The fallback applies while ``reading`` is off (the reports cannot be read, or have not
    been read up to the end of the topic yet) or while this process's own reports do not
    come back (within ``staleness_ms``: its writes fail, so the others no longer count it).
    ``fallback_processes`` is then the number of processes live when reports last came in,
    itself included (``initial_processes`` before they ever did)."""

    def __init__(self, me: str, samples: int = 11, window_ms: int = 1000,
                 staleness_ms: int = 2000, initial_processes: int = 1) -> None:
        self.me = me
        self.samples = samples
        self.window_ms = window_ms
        self.staleness_ms = staleness_ms
        self._expire = samples * window_ms
        self._peers: dict[str, _Report] = {}
        self._own: _Report | None = None
        # budget -> process -> its samples: ``others`` only visits the processes using it
        self._index: dict[BudgetKey, dict[str, list[_Held]]] = {}
        self.reading = False
        self._known_live = max(1, initial_processes)
        self._recent_live: list[tuple[int, int]] = []  # (when, processes live), see _note_live
        self.ignored = 0  # reports made with another window, or older than one held
        self.dropped = 0  # processes forgotten for staleness

    # ------------------------------------------------------------------ input
    def set_reading(self, reading: bool, now_ms: int) -> None:
        """The reader's state: reading the reports, caught up with the topic's end."""
        if self.reading and not reading and not self._own_missing(now_ms):
            self._note_live(now_ms)
        self.reading = reading

    def _note_live(self, now_ms: int) -> None:
        """The fallback's divisor: the most processes live at once over the last
        ``staleness_ms`` while reports flowed. (When the medium fails, every peer's reports
        stop together but go stale one after the other, some before this process's own: the
        count at the last moment would be too low.)"""
        recent = self._recent_live
        recent.append((now_ms, self.live(now_ms)))
        while recent and now_ms - recent[0][0] > self.staleness_ms:
            recent.pop(0)
        self._known_live = max(n for _, n in recent)

    def observe(self, report: UsageReport, as_of_ms: int) -> bool:
        """Take a report in; False when it is ignored."""
        if (report.samples, report.window_ms) != (self.samples, self.window_ms):
            self.ignored += 1
            return False
        mine = report.process == self.me
        held = self._own if mine else self._peers.get(report.process)
        if held is not None and (report.seq <= held.seq or as_of_ms < held.as_of_ms):
            self.ignored += 1
            return False
        expire = self._expire
        got = _Report(report.seq, as_of_ms, {
            key: [(as_of_ms - start, as_of_ms - last + expire, value)
                  for start, last, value in samples]
            for key, samples in report.budgets.items() if samples})
        if mine:
            self._own = got
            return True
        if held is not None:
            self._unindex(report.process, held)
        self._peers[report.process] = got
        for key, samples in got.budgets.items():
            self._index.setdefault(key, {})[report.process] = samples
        return True

    def forget(self, process: str) -> None:
        """Forget a process (stale, or it said it stopped: a tombstone on the topic)."""
        held = self._peers.pop(process, None)
        if held is not None:
            self._unindex(process, held)

    def _unindex(self, process: str, report: _Report) -> None:
        for key in report.budgets:
            users = self._index.get(key)
            if users is not None:
                users.pop(process, None)
                if not users:
                    del self._index[key]

    def expire(self, now_ms: int) -> list[str]:
        """Forget the processes whose last report is stale; return them. (Called at least
        every report interval: it also notes how many processes are live, for the
        fallback.)"""
        stale = [p for p, r in self._peers.items() if not self._fresh(r, now_ms)]
        for p in stale:
            self.forget(p)
        self.dropped += len(stale)
        if not self.fallback(now_ms):
            self._note_live(now_ms)
        return stale

    # ------------------------------------------------------------------ answers
    def _fresh(self, report: _Report, now_ms: int) -> bool:
        return now_ms - report.as_of_ms < self.staleness_ms

    def live(self, now_ms: int) -> int:
        """The processes with a fresh report, this one included."""
        return 1 + sum(1 for r in self._peers.values() if self._fresh(r, now_ms))

    def peers(self, now_ms: int) -> list[str]:
        """The other processes with a fresh report."""
        return sorted(p for p, r in self._peers.items() if self._fresh(r, now_ms))

    def _own_missing(self, now_ms: int) -> bool:
        return self._own is None or not self._fresh(self._own, now_ms)

    def fallback(self, now_ms: int) -> bool:
        """Whether budgets are enforced as ``quota / fallback_processes`` now."""
        return not self.reading or self._own_missing(now_ms)

    @property
    def fallback_processes(self) -> int:
        return self._known_live

    def others(self, key: BudgetKey, now_ms: int) -> tuple[float, int]:
        """The other live processes' usage of ``key`` that a quota check at ``now_ms`` counts
        (samples whose last event is less than ``samples * window_ms`` old), and the oldest
        start among those samples (``now_ms`` when there is none)."""
        users = self._index.get(key)
        if not users:
            return 0.0, now_ms
        total = 0.0
        oldest = now_ms
        peers = self._peers
        for process, samples in users.items():
            if now_ms - peers[process].as_of_ms >= self.staleness_ms:
                continue
            for start, expiry, value in samples:
                if now_ms < expiry:
                    total += value
                    if start < oldest:
                        oldest = start
        return total, oldest

    def active(self, key: BudgetKey, now_ms: int, active_ms: int) -> list[int]:
        """When the last reports were made of the other live processes that recorded into
        ``key`` within ``active_ms`` before their report."""
        return [as_of for as_of, _ in self.active_usage(key, now_ms, active_ms)]

    def active_usage(self, key: BudgetKey, now_ms: int, active_ms: int
                     ) -> list[tuple[int, float]]:
        """``active``, each with that process's usage of ``key`` in its report's samples
        with an event within ``active_ms`` before the report."""
        users = self._index.get(key)
        if not users:
            return []
        peers = self._peers
        expire = self._expire
        got = []
        for process, samples in users.items():
            report = peers[process]
            as_of = report.as_of_ms
            if (self._fresh(report, now_ms)
                    and max(e for _, e, _ in samples) - expire >= as_of - active_ms):
                got.append((as_of, sum(v for _, e, v in samples
                                       if e - expire >= as_of - active_ms)))
        return got

    def own_usage(self, key: BudgetKey, active_ms: int) -> float:
        """This process's usage of ``key`` as its own last report, read back, gave it: in the
        samples with an event within ``active_ms`` before that report (``active_usage``)."""
        own = self._own
        if own is None:
            return 0.0
        expire = self._expire
        return sum(v for _, e, v in own.budgets.get(key, ())
                   if e - expire >= own.as_of_ms - active_ms)

    def _demand(self, samples: Sequence[_Held], now_ms: int, horizon_ms: int | None
                ) -> float:
        expire = self._expire
        return sum(v for _, expiry, v in samples if now_ms < expiry
                   and (horizon_ms is None or now_ms - (expiry - expire) < horizon_ms))

    def demands(self, key: BudgetKey, now_ms: int, horizon_ms: int | None = None
                ) -> list[float]:
        """Each other live process's usage of ``key`` (``horizon_ms``: in samples with an
        event within it), for those with some."""
        users = self._index.get(key)
        if not users:
            return []
        got = []
        for process, samples in users.items():
            if self._fresh(self._peers[process], now_ms):
                d = self._demand(samples, now_ms, horizon_ms)
                if d > 0.0:
                    got.append(d)
        return got

    def own_demand(self, key: BudgetKey, now_ms: int, horizon_ms: int | None = None) -> float:
        """This process's usage of ``key`` as its own last report, read back, gave it."""
        own = self._own
        if own is None:
            return 0.0
        return self._demand(own.budgets.get(key, ()), now_ms, horizon_ms)


# ---------------------------------------------------------------------- the designs
def global_sum(rate: SampledRate, others_total: float, others_oldest: int, now_ms: int
               ) -> tuple[float, int]:
    """Design A: ``(O, W)``, Kafka's maths on the union of ``rate``'s samples at ``now_ms``
    and the others' (``RemoteUsage.others``)."""
    own_total, _ = rate.peek(now_ms)
    oldest = min(oldest_start(rate, now_ms), others_oldest)
    window = kafka_window(now_ms - oldest, rate.samples, rate.window_ms)
    return rate_per_second(own_total + others_total, window), window


def demand_share(own: float, others: Sequence[float], floor: float, live: int = 1) -> float:
    """Design B: this process's share of a quota: ``max(floor, own / total)`` over the sum of
    the same for every process with demand (the shares add up to 1); ``1 / live`` when no
    process has any."""
    total = own + sum(others)
    if total <= 0.0:
        return 1.0 / max(1, live)
    mine = max(floor, own / total)
    return mine / (mine + sum(max(floor, d / total) for d in others if d > 0.0))


def fallback_bound(bound: float, live: int) -> float:
    """The fallback: an equal share of the quota for each process known live."""
    return bound / max(1, live)


@dataclass(slots=True)
class _Own:
    """What this process recorded into one budget: in all, and at its recent reports."""

    total: float = 0.0
    last_ms: int = 0
    ticks: list[tuple[int, float]] = field(default_factory=list)  # (report time, total)


SCALE_BOUND = 10.0  # ``scale_by_usage``: a peer counts 1/10 to 10 times this process


class SharedBudgets:
    """The coordination one process applies to its budgets; ``hook(broker)`` is the
    ``BudgetHook`` of that broker's ``QuotaManager``. ``reported(now)`` is called each time
    the process makes its report.

    Design A: ``compensate_lag``, ``active_ms`` (default: the quota window). Design B:
    ``floor``, ``demand_horizon_ms`` (None: the whole quota window), ``shares_from_reports``.
    ``coordinate=False``: each process on its own, as without coordination (to compare)."""

    def __init__(self, remote: RemoteUsage, design: Design = Design.GLOBAL_SUM, *,
                 compensate_lag: bool = True, active_ms: int | None = None,
                 floor: float = 0.05, demand_horizon_ms: int | None = None,
                 shares_from_reports: bool = True, coordinate: bool = True,
                 scale_by_usage: bool = False) -> None:
        self.remote = remote
        # A+: a peer's unseen usage is what this process did since the peer's report, times
        # the peer's usage over this process's in their last reports (connections spread
        # unevenly: 3 + 5)
        self.scale_by_usage = scale_by_usage
        self.design = design
        self.compensate_lag = compensate_lag
        self.active_ms = remote.samples * remote.window_ms if active_ms is None else active_ms
        self.floor = floor
        self.demand_horizon_ms = demand_horizon_ms
        self.shares_from_reports = shares_from_reports
        self.coordinate = coordinate
        self._own: dict[BudgetKey, _Own] = {}
        self.fallback_checks = 0  # quota checks made under the fallback
        # called when this process records into a budget it had not used (lately): the
        # runtime reports at once rather than at the next interval, so that processes that
        # all see a new client at the same moment learn of each other within the delivery
        # delay, not a report interval later
        self.on_first_use: Callable[[], None] | None = None

    def hook(self, broker: int) -> BudgetHook:
        def measure(sensor: Sensor, value: float, rate: float, window_ms: int, now_ms: int
                    ) -> tuple[float, int, float]:
            return self.measure(broker, sensor, value, rate, window_ms, now_ms)
        return measure

    def hooks(self, broker: int) -> tuple[BudgetHook, HeadroomHook]:
        """Both hooks of ``broker``'s ``QuotaManager`` (``QuotaEnforcer.share``)."""
        def headroom(sensor: Sensor, now_ms: int, bound: float) -> bool:
            return self.headroom(broker, sensor, now_ms, bound)
        return self.hook(broker), headroom

    def headroom(self, broker: int, sensor: Sensor, now_ms: int, bound: float) -> bool:
        """``Sensor.headroom`` over every process: whether this process's values in flight,
        recorded now, would leave the budget below ``bound`` counting the others' usage as
        ``measure`` does (without it, a client could pipeline past its first throttle)."""
        if not self.coordinate:
            return sensor.headroom(now_ms, bound)
        key = (broker, sensor.quota_type, *sensor.tags)
        remote = self.remote
        if remote.fallback(now_ms):
            return sensor.headroom(now_ms, fallback_bound(bound, remote.fallback_processes))
        if self.design is Design.GLOBAL_SUM:
            others, oldest = remote.others(key, now_ms)
            in_flight = sensor.in_flight
            if self.compensate_lag:
                # each other process active in the budget is taken to have done what this one
                # did since its report, and to have as much in flight as this one has
                unseen, active = self._unseen(key, now_ms)
                others += unseen + active * in_flight
            if others <= 0.0:
                return sensor.headroom(now_ms, bound)
            observed, _ = global_sum(sensor.rate, others + in_flight, oldest, now_ms)
            return observed < bound
        mine = remote.own_demand(key, now_ms, self.demand_horizon_ms)
        share = demand_share(mine, remote.demands(key, now_ms, self.demand_horizon_ms),
                             self.floor, remote.live(now_ms))
        return sensor.headroom(now_ms, bound * share)

    def measure(self, broker: int, sensor: Sensor, value: float, rate: float,
                window_ms: int, now_ms: int) -> tuple[float, int, float]:
        bound = sensor.bound
        assert bound is not None  # (only limited budgets are checked)
        if not self.coordinate:
            return rate, window_ms, bound
        key = (broker, sensor.quota_type, *sensor.tags)
        own = self._own.get(key)
        if own is None:
            own = self._own[key] = _Own()
            if self.on_first_use is not None:  # the others should hear of it at once
                self.on_first_use()
        own.total += value
        own.last_ms = now_ms
        remote = self.remote
        if remote.fallback(now_ms):
            self.fallback_checks += 1
            return rate, window_ms, fallback_bound(bound, remote.fallback_processes)
        if self.design is Design.GLOBAL_SUM:
            others, oldest = remote.others(key, now_ms)
            if self.compensate_lag:
                others += self.unseen(key, now_ms)
            if others <= 0.0:
                return rate, window_ms, bound
            observed, window = global_sum(sensor.rate, others, oldest, now_ms)
            return observed, window, bound
        horizon = self.demand_horizon_ms
        if self.shares_from_reports:
            mine = remote.own_demand(key, now_ms, horizon)
        elif horizon is None:
            mine = sensor.rate.peek(now_ms)[0]
        else:
            mine = sum(v for _, last, v in live_samples(sensor.rate, now_ms)
                       if now_ms - last < horizon)
        share = demand_share(mine, remote.demands(key, now_ms, horizon), self.floor,
                             remote.live(now_ms))
        return rate, window_ms, bound * share

    def unseen(self, key: BudgetKey, now_ms: int) -> float:
        """Design A's estimate of the others' usage of ``key`` since their last reports: for
        each other process active in it (``RemoteUsage.active``), what this process recorded
        into it since its own last report made before theirs (all it recorded, when it made
        none since it began using the budget)."""
        return self._unseen(key, now_ms)[0]

    def _unseen(self, key: BudgetKey, now_ms: int) -> tuple[float, int]:
        """``unseen``, and how many other processes are active in ``key``."""
        active = self.remote.active_usage(key, now_ms, self.active_ms)
        own = self._own.get(key)
        if own is None:
            return 0.0, len(active)
        mine = self.remote.own_usage(key, self.active_ms) if self.scale_by_usage else 0.0
        got = 0.0
        ticks = own.ticks
        for as_of, theirs in active:
            before = 0.0
            for t, total in ticks:
                if t > as_of:
                    break
                before = total
            done = own.total - before
            if mine > 0.0:  # scaled by how much the peer did against this process, lately
                done *= min(max(theirs / mine, 1 / SCALE_BOUND), SCALE_BOUND)
            got += done
        return got, len(active)

    def others_counted(self, key: BudgetKey, now_ms: int) -> float:
        """The others' usage of ``key`` that design A counts at ``now_ms``."""
        others = self.remote.others(key, now_ms)[0]
        if self.compensate_lag:
            others += self.unseen(key, now_ms)
        return others

    def reported(self, now_ms: int) -> None:
        """This process made its report at ``now_ms``: note its totals then (for
        ``unseen``) and forget budgets it has not used for ``staleness_ms`` and a window."""
        keep = self.remote.staleness_ms
        idle = keep + self.remote.samples * self.remote.window_ms
        gone = []
        for key, own in self._own.items():
            if now_ms - own.last_ms > idle:
                gone.append(key)
                continue
            ticks = own.ticks
            if not ticks or ticks[-1][1] != own.total:
                ticks.append((now_ms, own.total))
            while len(ticks) > 1 and now_ms - ticks[1][0] >= keep:
                del ticks[0]
        for key in gone:
            del self._own[key]


class SharedQuotaManager(QuotaManager):
    """``QuotaManager`` with a ``BudgetHook`` where ``record`` checks the quota. Produce
    budgets paced by storage scaling are left as ``QuotaManager`` paces them (an open
    question of ``docs/scale-out.md``)."""

    def __init__(self, settings: QuotaSettings, hook: BudgetHook | None,
                 headroom: HeadroomHook | None = None, idle_expiry_ms: int = ONE_HOUR_MS,
                 storage: StorageScaling | None = None) -> None:
        super().__init__(settings, idle_expiry_ms, storage, hook, headroom)
