"""Budgets shared by every process of every proxy instance (issue 16): the data and the maths
of coordination, without the transport. Pure: no I/O, time comes in as an argument (ms).

Each process keeps its own ``QuotaManager`` per broker, as before, and every ``report_ms``
publishes a ``UsageReport``: for each limited budget (broker, quota type, user tag, client-id
tag), the samples of its ``SampledRate`` that a quota check still counts, as ``(start, last
event, value)`` with times in ms *before* the report was made (no clock is shared). Every
process reads every report into a ``RemoteUsage`` (itself included: a process whose own
reports stop coming back is not counted by the others either), which drops a process whose
last report is ``staleness_ms`` old.

The design (A, global sum; chosen in ``docs/scale-out.md``): Kafka's maths on the union of
the samples, the process's own (exact) and the others' (as last reported):
``O = (own + others) / W``, ``W`` measured from the oldest start in the union and padded as
Kafka pads it; the bound is the quota. With ``compensate_lag`` (the default), each other
process that recorded into the budget within ``active_ms`` (default: the whole quota window)
before its last report is taken to have used, since that report, what this process used in
the same time, and (for the pipelining check) to have as much in flight: without it,
processes that see the budget free at the same moment (when a burst leaves the window) each
take the whole of it before they hear of the others. (With one sample window as the horizon,
a peer whose client sat out a long throttle before its report was missed: pipelined 64 KB
producers on 4 processes got 1.127 of the quota in ``bench/coordination_sim.py``, 0.999 with
the whole window.) The alternative compared with it there (B, demand share) is not part of
the product: ``testkit/shared_quotas.py`` builds it on this module's ``RemoteUsage`` and
``SharedBudgets`` by subclassing them (nothing here exists for it), for the simulation and its
tests.

While reports cannot be read (or the process's own stop coming back), a process enforces its
own samples against ``quota / live``, ``live`` being the processes known live when reports
were last read (itself included): the fallback.

The hook ``QuotaManager`` needs is a ``BudgetHook``, called in ``record`` right after the
sampled rate is recorded and measured: ``hook(sensor, value, rate, window_ms, now_ms)`` returns
the ``(rate, window_ms, bound)`` that Kafka's check and throttle formula then apply to.
``SharedBudgets.hooks`` gives it with the pipelining check's ``HeadroomHook``;
``QuotaEnforcer.share`` hands both to every broker's ``QuotaManager``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.manager import (
    BudgetHook,
    HeadroomHook,
    PaceHeadroomHook,
    PaceHook,
    QuotaManager,
    QuotaSettings,
    Sensor,
    level_headroom,
    pace_sensor,
    paced_throttle,
)
from kafka_quota_proxy.quota.sampled import SampledRate
from kafka_quota_proxy.quota.throttle import rate_per_second

# (broker, quota type, user tag, client-id tag): one budget as ``QuotaManager`` shares them
# (the tags are ``Sensor.tags``: "" where that part does not take part in sharing)
BudgetKey = tuple[int, QuotaType, str, str]
# one sample as reported: (start, last event) in ms before the report was made, value
ReportedSample = tuple[int, int, float]

REPORT_VERSION = 1
# version 2 adds each budget's cumulative value (``UsageReport.totals``): strict pacing
REPORT_VERSION_TOTALS = 2
_TYPE_CODES = {QuotaType.PRODUCE: 0, QuotaType.FETCH: 1, QuotaType.REQUEST: 2}
_CODE_TYPES = {v: k for k, v in _TYPE_CODES.items()}
_HEADER = struct.Struct(">BqqHI")  # version, seq, sent_ms, samples, window_ms
_COUNT = struct.Struct(">I")
_LEN = struct.Struct(">H")
_BUDGET = struct.Struct(">iBIIB")  # broker, quota type, user index, client-id index, samples
_SAMPLE = struct.Struct(">IId")  # start before, last before, value
_TOTAL = struct.Struct(">d")
_MAX_BEFORE = 2**32 - 1


class ReportError(ValueError):
    """Bytes that are not a usage report this code reads."""


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
    # version 2 (strict pacing): each budget's cumulative value recorded by the process since
    # it began using it (a smaller one than before: it began afresh); every budget of
    # ``totals`` is in ``budgets`` too, with no samples when none is live
    totals: Mapping[BudgetKey, float] | None = None

    @property
    def key(self) -> bytes:
        return self.process.encode()

    def encode(self) -> bytes:
        """Version 1, big-endian: version u8, seq i64, sent_ms i64, samples u16, window_ms
        u32; the process id (u16 length + UTF-8); a table of the user and client-id tags
        (u32 count, each u16 length + UTF-8); u32 budgets, each: broker i32, quota type u8
        (0 produce, 1 fetch, 2 request), user and client-id as u32 indexes into the table,
        u8 samples, each: start before u32, last event before u32, value f64. 16 bytes a
        sample: at most 12 x 16 + 14 bytes a budget with Kafka's default window.

        Version 2 (``totals`` given): the same, each budget followed by its cumulative value
        (f64; -1 for a budget without one)."""
        strings: dict[str, int] = {}
        totals = self.totals
        body = bytearray(_COUNT.pack(len(self.budgets)))
        for key, samples in self.budgets.items():
            broker, quota_type, user, client_id = key
            u = strings.setdefault(user, len(strings))
            c = strings.setdefault(client_id, len(strings))
            body += _BUDGET.pack(broker, _TYPE_CODES[quota_type], u, c, len(samples))
            for start, last, value in samples:
                body += _SAMPLE.pack(start, last, value)
            if totals is not None:
                body += _TOTAL.pack(totals.get(key, -1.0))
        version = REPORT_VERSION if totals is None else REPORT_VERSION_TOTALS
        out = bytearray(_HEADER.pack(version, self.seq, self.sent_ms, self.samples,
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
    if not len(view) or view[0] not in (REPORT_VERSION, REPORT_VERSION_TOTALS):
        raise ReportError(f"unknown report version {view[0] if len(view) else None}")
    version, seq, sent_ms, samples, window_ms = _HEADER.unpack_from(view, 0)
    totals: dict[BudgetKey, float] | None = {} if version == REPORT_VERSION_TOTALS else None
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
        if totals is not None:
            (total,) = _TOTAL.unpack_from(view, pos)
            pos += _TOTAL.size
            if total != -1.0:
                if not 0.0 <= total < float("inf"):
                    raise ReportError(f"bad total {total}")
                totals[key] = total
    if pos != len(view):
        raise ReportError(f"{len(view) - pos} bytes after the report")
    return UsageReport(process, seq, sent_ms, samples, window_ms, budgets, totals)


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
                 now_ms: int, min_fraction: float = 0.0,
                 settings: QuotaSettings | None = None,
                 totals: Mapping[BudgetKey, float] | None = None) -> UsageReport:
    """The report of a process whose quota managers (one per broker) are ``managers``, made
    at ``now_ms`` on their clock. Limited budgets with usage in the window only;
    ``min_fraction``: also leave out those whose own rate is below that fraction of their
    bound (the others then miss at most ``live * min_fraction`` of the quota). The quota
    window reported is the managers' (``settings``' while there is none: without it, Kafka's
    default, which a reader with another window ignores). ``totals`` (strict pacing:
    ``SharedBudgets.totals``): a version 2 report, with every budget of ``totals``."""
    defaults = settings if settings is not None else QuotaSettings()
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
    if totals is not None:
        for key in totals:
            budgets.setdefault(key, ())
    return UsageReport(process, seq, sent_ms, shape[0], shape[1], budgets,
                       None if totals is None else dict(totals))


# ---------------------------------------------------------------------- everyone's reports
# one sample as held by a reader: (start, expiry = last event + samples * window, value),
# on the reader's clock
_Held = tuple[int, int, float]

MAX_CLOCK_SKEW_MS = 30_000  # a report stamped further ahead of the reader's clock is refused
# A process makes at most this many reports a second (the runtime: one every ``report_ms``,
# at least 20 ms, and early ones at least 20 ms apart), so its ``seq`` grows at most this fast
# over its own ``sent_ms``, give or take ``SEQ_SLACK``.
MAX_REPORTS_PER_S = 100
SEQ_SLACK = 16
MAX_LINES = 8  # lines of reports held under one process id (see ``RemoteUsage``)
MAX_PROCESSES = 4096  # other processes held at once
MAX_REPORT_BUDGETS = 20_000  # budgets in one report
MAX_HELD_BUDGETS = 200_000  # budgets held over every line of every process
CHARGE_CAP_WINDOWS = 2.0  # ``SharedBudgets``: the others count at most this many windows


def plausible_seq_step(sent_delta_ms: int) -> int:
    """The most a process's ``seq`` can grow between two reports ``sent_delta_ms`` apart."""
    return SEQ_SLACK + max(0, sent_delta_ms) * MAX_REPORTS_PER_S // 1000


class Refusal(Enum):
    """Why ``RemoteUsage.observe`` refused a report (counted in ``RemoteUsage.refused``)."""

    FUTURE = "future"  # stamped more than ``max_skew_ms`` ahead of the reader's clock
    OWN_ID = "own_id"  # under this process's id, but not one it wrote
    OVERSIZED = "oversized"  # more budgets than ``max_report_budgets``
    FULL = "full"  # a new process past ``max_processes``, or no room for its budgets


@dataclass(slots=True)
class _Report:
    seq: int
    sent_ms: int
    as_of_ms: int
    budgets: dict[BudgetKey, list[_Held]]
    totals: Mapping[BudgetKey, float] | None = None  # (version 2)
    weight: int = 0  # budgets held for it (``max_held_budgets``): those of the report


# what a report adds to budgets' levels under strict pacing (``RemoteUsage.on_usage``):
# budget -> [(when on the reader's clock, value)]
Pours = dict[BudgetKey, list[tuple[int, float]]]


@dataclass(slots=True)
class _Peer:
    """The reports held under one process id: one line for each consistent sequence."""

    lines: list[_Report] = field(default_factory=list)
    stopped: bool = False  # a tombstone since its last report


class RemoteUsage:
    """The latest report of every process, on this process's clock, judged before it is
    trusted (anyone who can write to the topic can write a report: ``docs/security.md``).

    ``observe(report, as_of_ms, wall_ms)``: ``as_of_ms`` is when, on this process's quota
    clock, the report was made (the runtime estimates it from ``sent_ms``, see
    ``docs/scale-out.md``); ``wall_ms`` the reader's wall clock. A process whose last report is
    ``staleness_ms`` old or more counts no more: ``expire`` forgets it, and every answer
    ignores it even before.

    The rules (each refusal counted in ``refused``, by ``Refusal``):

    - **Future stamps**: a report whose ``sent_ms`` is more than ``max_skew_ms`` ahead of
      ``wall_ms`` is refused (it would otherwise count as just made for as long as it is
      re-sent, and outlive any real report).
    - **Own id**: a report under this process's own id is taken only if this process wrote
      it (``wrote``: same ``seq`` and ``sent_ms``); any other is refused. A process never
      takes another writer's word for its own usage, nor for whether its reports come back.
    - **Seq orders reports only within one line.** Reports under one process id form lines: a
      report extends a line when its ``seq`` is above the line's by no more than
      ``plausible_seq_step`` of the time between their ``sent_ms``, and it is not stamped
      earlier; the same report again is ignored. Any other report (a ``seq`` jumping
      absurdly, or going back, or a stamp going back) starts a line of its own (counted in
      ``conflicts``): a second writer under the id cannot shut out the real one, whose next
      report extends its own line or starts a new one. Each budget counts the most any
      fresh line of the process reports (a real process's newer report holds at least what
      its older ones do), so a line that reports less than the real one changes nothing.
      At most ``MAX_LINES`` lines per id: a new one replaces the line updated longest ago.
    - **Tombstones**: a tombstone takes the process out of the processes counted live (the
      fallback's divisor); its reported usage counts until it is stale, as the bytes it
      passed went through; a report after it brings it back. (A forged tombstone costs at
      most a report interval of that process in the live count.)
    - **Memory**: at most ``max_report_budgets`` budgets a report (more: refused), at most
      ``max_processes`` other processes and ``max_held_budgets`` budgets over every line held
      (a new process or line that does not fit is refused while the room is taken: the
      processes already counted are never pushed out).
    - What the others' reports can charge to one budget is bounded where it is counted:
      ``SharedBudgets(charge_cap_windows)``.

    Strict pacing (version 2 reports, with each budget's cumulative value): a report taken
    gives ``on_usage`` what the process recorded into each budget since the report its line
    held before (the increase of the cumulative value, at the report's time; all of it for
    a budget new in the line or begun afresh); the first report of a line gives its live
    samples instead, each at its last event (a process seen for the first time, or a reader
    just started, does not take hours of cumulative value as just done).

    The fallback applies while ``reading`` is off (the reports cannot be read, or have not
    been read up to the end of the topic yet) or while this process's own reports do not
    come back (within ``staleness_ms``: its writes fail, so the others no longer count it).
    ``fallback_processes`` is then the number of processes live when reports last came in,
    itself included (``initial_processes`` before they ever did)."""

    def __init__(self, me: str, samples: int = 11, window_ms: int = 1000,
                 staleness_ms: int = 2000, initial_processes: int = 1, *,
                 max_skew_ms: int = MAX_CLOCK_SKEW_MS, max_processes: int = MAX_PROCESSES,
                 max_report_budgets: int = MAX_REPORT_BUDGETS,
                 max_held_budgets: int = MAX_HELD_BUDGETS) -> None:
        self.me = me
        self.samples = samples
        self.window_ms = window_ms
        self.staleness_ms = staleness_ms
        self.max_skew_ms = max_skew_ms
        self.max_processes = max_processes
        self.max_report_budgets = max_report_budgets
        self.max_held_budgets = max_held_budgets
        self._expire = samples * window_ms
        self._peers: dict[str, _Peer] = {}
        self._own: _Report | None = None
        self._written: dict[int, int] = {}  # seq -> sent_ms of this process's recent reports
        # budget -> process -> its lines with usage of it: ``others`` only visits those
        self._index: dict[BudgetKey, dict[str, list[_Report]]] = {}
        self._held_budgets = 0
        self.reading = False
        self._known_live = max(1, initial_processes)
        self._recent_live: list[tuple[int, int]] = []  # (when, processes live), see _note_live
        self.ignored = 0  # reports made with another window, or seen already
        self.dropped = 0  # processes forgotten for staleness
        self.conflicts = 0  # reports that started a new line under a process id
        self.refused: dict[Refusal, int] = dict.fromkeys(Refusal, 0)
        self.on_usage: Callable[[Pours], None] | None = None  # strict pacing: the pours

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

    def wrote(self, report: UsageReport) -> None:
        """This process is writing ``report``: when read back, it is its own."""
        written = self._written
        written[report.seq] = report.sent_ms
        while len(written) > 256:
            del written[next(iter(written))]

    def _refuse(self, why: Refusal) -> bool:
        self.refused[why] += 1
        return False

    def observe(self, report: UsageReport, as_of_ms: int, wall_ms: int | None = None) -> bool:
        """Take a report in (the rules: the class's doc); False when it is ignored or
        refused. ``wall_ms``: the reader's wall clock (None: stamps are not checked)."""
        if (report.samples, report.window_ms) != (self.samples, self.window_ms):
            self.ignored += 1
            return False
        if wall_ms is not None and report.sent_ms - wall_ms > self.max_skew_ms:
            return self._refuse(Refusal.FUTURE)
        if report.process == self.me:
            if self._written.get(report.seq) != report.sent_ms:
                return self._refuse(Refusal.OWN_ID)
            own = self._own
            if own is not None and report.seq <= own.seq:
                self.ignored += 1
                return False
            self._own = self._held(report, as_of_ms)
            return True
        if len(report.budgets) > self.max_report_budgets:
            return self._refuse(Refusal.OVERSIZED)
        peer = self._peers.get(report.process)
        if peer is None and len(self._peers) >= self.max_processes:
            return self._refuse(Refusal.FULL)
        lines = peer.lines if peer is not None else []
        extends: _Report | None = None
        for line in lines:
            d_seq, d_sent = report.seq - line.seq, report.sent_ms - line.sent_ms
            if d_seq == 0 and d_sent == 0:  # the same report again
                self.ignored += 1
                return False
            if (0 < d_seq <= plausible_seq_step(d_sent) and d_sent >= 0
                    and (extends is None or (line.seq, line.sent_ms)
                         > (extends.seq, extends.sent_ms))):
                extends = line
        prior = extends  # the report this one follows in its line (None: a line begins)
        if extends is None and lines:  # a new line under a known id
            self.conflicts += 1
            if len(lines) >= MAX_LINES:
                extends = min(lines, key=lambda r: r.as_of_ms)  # replaced by the new line
        freed = extends.weight if extends is not None else 0
        if self._held_budgets - freed + len(report.budgets) > self.max_held_budgets:
            return self._refuse(Refusal.FULL)
        got = self._held(report, as_of_ms)
        if peer is None:
            peer = self._peers[report.process] = _Peer()
        peer.stopped = False
        if extends is not None:
            self._unindex(report.process, extends)
            peer.lines[peer.lines.index(extends)] = got
        else:
            peer.lines.append(got)
        self._held_budgets += got.weight - freed
        for key in got.budgets:
            self._index.setdefault(key, {}).setdefault(report.process, []).append(got)
        if got.totals is not None and self.on_usage is not None:
            self.on_usage(self._pours(got, prior))
        return True

    def _pours(self, got: _Report, prior: _Report | None) -> Pours:
        """What ``got`` adds to the budgets' levels (the class's doc, strict pacing)."""
        assert got.totals is not None
        as_of = got.as_of_ms
        pours: Pours = {}
        if prior is None or prior.totals is None:  # a line begins: its live samples
            expire = self._expire
            for key, samples in got.budgets.items():
                if key in got.totals:
                    pours[key] = [(expiry - expire, value) for _, expiry, value in samples
                                  if value > 0.0]
            return pours
        before = prior.totals
        for key, total in got.totals.items():
            last = before.get(key)
            added = total if last is None or total < last else total - last
            if added > 0.0:
                pours[key] = [(as_of, added)]
        return pours

    def _held(self, report: UsageReport, as_of_ms: int) -> _Report:
        expire = self._expire
        return _Report(report.seq, report.sent_ms, as_of_ms, {
            key: [(as_of_ms - start, as_of_ms - last + expire, value)
                  for start, last, value in samples]
            for key, samples in report.budgets.items() if samples}, report.totals,
            len(report.budgets))

    def stopped(self, process: str) -> None:
        """A tombstone for ``process``: it no longer counts as live; its usage counts until
        its reports are stale (see the class's doc). Ignored for this process's own id."""
        peer = self._peers.get(process)
        if peer is not None:
            peer.stopped = True

    def forget(self, process: str) -> None:
        """Forget a process (stale)."""
        peer = self._peers.pop(process, None)
        if peer is not None:
            for line in peer.lines:
                self._unindex(process, line)
                self._held_budgets -= line.weight

    def _unindex(self, process: str, report: _Report) -> None:
        for key in report.budgets:
            users = self._index.get(key)
            if users is None:
                continue
            lines = users.get(process)
            if lines is not None:
                lines[:] = [r for r in lines if r is not report]
                if not lines:
                    del users[process]
            if not users:
                del self._index[key]

    def expire(self, now_ms: int) -> list[str]:
        """Forget the processes whose last report is stale (and the stale lines of the
        others); return them. (Called at least every report interval: it also notes how many
        processes are live, for the fallback.)"""
        stale = []
        for p, peer in self._peers.items():
            if not any(self._fresh(r, now_ms) for r in peer.lines):
                stale.append(p)
            elif len(peer.lines) > 1:
                for r in [r for r in peer.lines if not self._fresh(r, now_ms)]:
                    self._unindex(p, r)
                    self._held_budgets -= r.weight
                    peer.lines.remove(r)
        for p in stale:
            self.forget(p)
        self.dropped += len(stale)
        if not self.fallback(now_ms):
            self._note_live(now_ms)
        return stale

    # ------------------------------------------------------------------ answers
    def _fresh(self, report: _Report, now_ms: int) -> bool:
        return now_ms - report.as_of_ms < self.staleness_ms

    def _live(self, peer: _Peer, now_ms: int) -> bool:
        return not peer.stopped and any(self._fresh(r, now_ms) for r in peer.lines)

    def live(self, now_ms: int) -> int:
        """The processes with a fresh report (and no tombstone since), this one included."""
        return 1 + sum(1 for peer in self._peers.values() if self._live(peer, now_ms))

    def peers(self, now_ms: int) -> list[str]:
        """The other processes with a fresh report (and no tombstone since)."""
        return sorted(p for p, peer in self._peers.items() if self._live(peer, now_ms))

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
        (samples whose last event is less than ``samples * window_ms`` old; for each process
        its line reporting the most), and the oldest start among those samples (``now_ms``
        when there is none)."""
        users = self._index.get(key)
        if not users:
            return 0.0, now_ms
        total = 0.0
        oldest = now_ms
        staleness = self.staleness_ms
        for lines in users.values():
            best, best_oldest = 0.0, now_ms
            for line in lines:
                if now_ms - line.as_of_ms >= staleness:
                    continue
                t, o = 0.0, now_ms
                for start, expiry, value in line.budgets[key]:
                    if now_ms < expiry:
                        t += value
                        if start < o:
                            o = start
                if t > best:
                    best, best_oldest = t, o
            total += best
            if best_oldest < oldest:
                oldest = best_oldest
        return total, oldest

    def active(self, key: BudgetKey, now_ms: int, active_ms: int) -> list[int]:
        """When the last reports were made of the other live processes that recorded into
        ``key`` within ``active_ms`` before their report."""
        return [as_of for as_of, _ in self.active_usage(key, now_ms, active_ms)]

    def active_usage(self, key: BudgetKey, now_ms: int, active_ms: int
                     ) -> list[tuple[int, float]]:
        """``active``, each with that process's usage of ``key`` in its report's samples
        with an event within ``active_ms`` before the report (one per process: its line
        reporting the most)."""
        users = self._index.get(key)
        if not users:
            return []
        expire = self._expire
        got = []
        for lines in users.values():
            best: tuple[int, float] | None = None
            for line in lines:
                as_of = line.as_of_ms
                samples = line.budgets[key]
                if (self._fresh(line, now_ms)
                        and max(e for _, e, _ in samples) - expire >= as_of - active_ms):
                    used = sum(v for _, e, v in samples if e - expire >= as_of - active_ms)
                    if best is None or used > best[1]:
                        best = (as_of, used)
            if best is not None:
                got.append(best)
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


# ---------------------------------------------------------------------- the design
def global_sum(rate: SampledRate, others_total: float, others_oldest: int, now_ms: int
               ) -> tuple[float, int]:
    """Design A: ``(O, W)``, Kafka's maths on the union of ``rate``'s samples at ``now_ms``
    and the others' (``RemoteUsage.others``)."""
    own_total, _ = rate.peek(now_ms)
    oldest = min(oldest_start(rate, now_ms), others_oldest)
    window = kafka_window(now_ms - oldest, rate.samples, rate.window_ms)
    return rate_per_second(own_total + others_total, window), window


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

    ``compensate_lag``, ``active_ms`` (default: the quota window): the lag compensation
    (module doc). ``coordinate=False``: each process on its own, as without coordination (to
    compare).

    ``charge_cap_windows`` (None: no cap): the others' usage of a budget, as reported and as
    the lag compensation adds to it, counts at most that many quota windows at the budget's
    bound (``bound * samples * window``; default 2). Every process enforces
    the same budget, so together the others cannot have passed more than about one window's
    worth in one window (the padded first window, and one request per connection past its
    bound); a report beyond it is a fault or a forgery, and counting it whole would throttle
    this process's clients for as long as it says (1e12 bytes: saturated throttles of days,
    outliving the report). Capped, a report can cost a budget about ``charge_cap_windows``
    windows of throttle while it is fresh. (A peer that really passed more, such as one
    fetch response of many windows' worth, is under-counted here; its own process throttles
    that client as Kafka would.)

    **Strict pacing** (``pace``, the ``PaceHook``): the process keeps each budget's level
    (``paced_until``, ``QuotaManager._strict_throttle``) for the whole budget: its own
    values raise it as they are recorded, the others' as their reports are read
    (``RemoteUsage.on_usage``: version 2 reports, with cumulative values; the process's own
    are ``totals``), each at the time it was done, at the bound ``bound_of`` gives
    (the budget's configured one: a report names a budget, not its bound). A lag only moves
    when a process learns of the others' values, never whether it counts them, so over whole
    throttle cycles the budget gets its quota (at the start each process may give the first
    window's burst before it hears of the others). What the others pour is bounded as the
    sampled design bounds it: a pour never takes the level further than
    ``(samples - 1) + charge_cap_windows x samples`` windows past its time (a forged report
    costs the budget at most that throttle while it goes on). Under the fallback each process
    paces its own values against ``bound / live``."""

    def __init__(self, remote: RemoteUsage, *, compensate_lag: bool = True,
                 active_ms: int | None = None, coordinate: bool = True,
                 scale_by_usage: bool = False,
                 charge_cap_windows: float | None = CHARGE_CAP_WINDOWS,
                 bound_of: Callable[[BudgetKey], float | None] | None = None) -> None:
        self.remote = remote
        # strict pacing: each budget's level (paced_until on the quota clock), the bound of
        # a budget as configured (None: the others' pours are not counted), pours capped
        self._levels: dict[BudgetKey, float] = {}
        self.bound_of = bound_of
        self.capped_pours = 0
        remote.on_usage = self._pour
        self.charge_cap_windows = charge_cap_windows
        self.capped_checks = 0  # quota checks where the others' usage was capped
        # A+: a peer's unseen usage is what this process did since the peer's report, times
        # the peer's usage over this process's in their last reports (connections spread
        # unevenly: 3 + 5)
        self.scale_by_usage = scale_by_usage
        self.compensate_lag = compensate_lag
        self.active_ms = remote.samples * remote.window_ms if active_ms is None else active_ms
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

    def hooks(self, broker: int) -> tuple[BudgetHook, HeadroomHook, PaceHook, PaceHeadroomHook]:
        """The hooks of ``broker``'s ``QuotaManager`` (``QuotaEnforcer.share``)."""
        def headroom(sensor: Sensor, now_ms: int, bound: float) -> bool:
            return self.headroom(broker, sensor, now_ms, bound)

        def paced(sensor: Sensor, value: float, now_ms: int, bound: float,
                  tolerance_ms: int) -> int:
            return self.pace(broker, sensor, value, now_ms, bound, tolerance_ms)

        def paced_headroom(sensor: Sensor, now_ms: int, bound: float, tolerance_ms: int
                           ) -> bool:
            return self.pace_headroom(broker, sensor, now_ms, bound, tolerance_ms)
        return self.hook(broker), headroom, paced, paced_headroom

    # ------------------------------------------------------------------ strict pacing
    def pace(self, broker: int, sensor: Sensor, value: float, now_ms: int, bound: float,
             tolerance_ms: int) -> int:
        """The throttle of a value recorded into a strictly paced budget (the class's doc)."""
        if not self.coordinate:
            return pace_sensor(sensor, value, now_ms, bound, tolerance_ms)
        key = (broker, sensor.quota_type, *sensor.tags)
        self._own_use(key, value, now_ms)
        level, throttle = paced_throttle(self._levels.get(key), value, now_ms, bound,
                                         tolerance_ms)
        self._levels[key] = level
        remote = self.remote
        if remote.fallback(now_ms):  # (the level still learns of its own values)
            self.fallback_checks += 1
            share = fallback_bound(bound, remote.fallback_processes)
            return pace_sensor(sensor, value, now_ms, share, tolerance_ms)
        if throttle:
            sensor.throttled_requests += 1
            sensor.throttle_ms_total += throttle
        return throttle

    def pace_headroom(self, broker: int, sensor: Sensor, now_ms: int, bound: float,
                      tolerance_ms: int) -> bool:
        """``QuotaManager.produce_headroom`` of a strictly paced budget: whether this
        process's values in flight, recorded now, would not be throttled (against the
        whole budget's level; under the fallback, its own at its share)."""
        if not self.coordinate:
            return level_headroom(sensor.paced_until, sensor.in_flight, now_ms, bound,
                                  tolerance_ms)
        remote = self.remote
        if remote.fallback(now_ms):
            return level_headroom(sensor.paced_until, sensor.in_flight, now_ms,
                                  fallback_bound(bound, remote.fallback_processes),
                                  tolerance_ms)
        key = (broker, sensor.quota_type, *sensor.tags)
        return level_headroom(self._levels.get(key), sensor.in_flight, now_ms, bound,
                              tolerance_ms)

    def level(self, key: BudgetKey) -> float | None:
        """A strictly paced budget's ``paced_until`` (None: never raised, or drained)."""
        return self._levels.get(key)

    def _pour(self, pours: Pours) -> None:
        """The others' values (``RemoteUsage.on_usage``) into the budgets' levels."""
        bound_of = self.bound_of
        if bound_of is None:
            return
        remote = self.remote
        cap_ms = None
        if self.charge_cap_windows is not None:
            cap_ms = ((remote.samples - 1) * remote.window_ms
                      + self.charge_cap_windows * remote.samples * remote.window_ms)
        levels = self._levels
        for key, values in pours.items():
            bound = bound_of(key)
            if bound is None or bound <= 0.0:
                continue
            level = levels.get(key)
            for when, value in values:
                base = when if level is None or level < when else level
                raised = base + value * 1000.0 / bound
                if cap_ms is not None and raised > when + cap_ms:
                    self.capped_pours += 1
                    raised = max(base, when + cap_ms)
                level = raised
            if level is not None:
                levels[key] = level

    def totals(self) -> dict[BudgetKey, float]:
        """What this process recorded into each budget it uses, since it began to (its
        version 2 report's cumulative values)."""
        return {key: own.total for key, own in self._own.items()}

    def _own_use(self, key: BudgetKey, value: float, now_ms: int) -> None:
        own = self._own.get(key)
        if own is None:
            own = self._own[key] = _Own()
            if self.on_first_use is not None:  # the others should hear of it at once
                self.on_first_use()
        own.total += value
        own.last_ms = now_ms

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
        others, oldest = remote.others(key, now_ms)
        in_flight = sensor.in_flight
        if self.compensate_lag:
            # each other process active in the budget is taken to have done what this one did
            # since its report, and to have as much in flight as this one has
            unseen, active = self._unseen(key, now_ms)
            others += unseen + active * in_flight
        others = self._capped(others, bound, sensor.rate)
        if others <= 0.0:
            return sensor.headroom(now_ms, bound)
        observed, _ = global_sum(sensor.rate, others + in_flight, oldest, now_ms)
        return observed < bound

    def measure(self, broker: int, sensor: Sensor, value: float, rate: float,
                window_ms: int, now_ms: int) -> tuple[float, int, float]:
        bound = sensor.bound
        assert bound is not None  # (only limited budgets are checked)
        if not self.coordinate:
            return rate, window_ms, bound
        key = (broker, sensor.quota_type, *sensor.tags)
        self._own_use(key, value, now_ms)
        remote = self.remote
        if remote.fallback(now_ms):
            self.fallback_checks += 1
            return rate, window_ms, fallback_bound(bound, remote.fallback_processes)
        others, oldest = remote.others(key, now_ms)
        if self.compensate_lag:
            others += self.unseen(key, now_ms)
        others = self._capped(others, bound, sensor.rate)
        if others <= 0.0:
            return rate, window_ms, bound
        observed, window = global_sum(sensor.rate, others, oldest, now_ms)
        return observed, window, bound

    def _capped(self, others: float, bound: float, rate: SampledRate) -> float:
        """``others`` within ``charge_cap_windows`` quota windows at ``bound``."""
        if self.charge_cap_windows is None:
            return others
        cap = self.charge_cap_windows * bound * rate.samples * rate.window_ms / 1000.0
        if others > cap:
            self.capped_checks += 1
            return cap
        return others

    def unseen(self, key: BudgetKey, now_ms: int) -> float:
        """The lag compensation's estimate of the others' usage of ``key`` since their last
        reports: for each other process active in it (``RemoteUsage.active``), what this
        process recorded into it since its own last report made before theirs (all it
        recorded, when it made none since it began using the budget)."""
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
        """The others' usage of ``key`` that ``measure`` counts at ``now_ms``."""
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
        levels = self._levels
        for key in [k for k, paced in levels.items() if paced < now_ms]:
            del levels[key]  # drained: the same as never raised
