"""Budgets shared across processes (issue 16): a deterministic simulation of the designs on
the real quota engine, to choose one (``docs/scale-out.md``): A, the one chosen, is
``quota/shared.py``'s; B, not part of the product, is ``testkit/shared_quotas.py``'s.

K proxy processes (workers of one host, or instances: the same here, as both exchange their
reports through the cluster), each with its own ``QuotaManager`` (``SharedQuotaManager``,
with the design's ``BudgetHook``). Every ``report_ms`` each process encodes its
``UsageReport``; every process, itself included, decodes it ``delay_ms`` later. Clients are
greedy producers: each connection sends one request at a time, its response comes
``RTT_MS`` later (recorded then, as the proxy records produce), and it sends the next once the
throttle it got has passed (KIP-219: muted). A client's connections are spread round-robin
over the processes. Kafka's default window: 11 x 1 s. Time in whole ms; no randomness.

Scenarios (one budget each, ``QUOTA`` bytes/s; ``ref-*``: the same clients on one process,
what one Kafka broker gives):

- ``a``: one client-id (``clients/app``), 8 connections over 2 processes; ``a4``: over 4
  (2 instances x 2 workers); ``asym``: 6 connections on one process, 2 on the other;
- ``skew``: 7 connections on one process and one on each of 7 others;
- ``lone``: 4 connections on 1 of 4 processes (coordination must cost nothing there);
- ``b``: 50 client-ids of one user (``users/alice``), one connection each, 4 KB requests, over
  2 processes; ``b16``: the same with 16 KB requests;
- ``c``: one client-id, 4 connections, all on process 1, then all on process 2;
  ``c-pause``: no move, the 4 connections pause 100 ms once (what any perturbation does);
- ``fallback``: scenario a while no process can read the reports.

Designs: ``none`` (each process on its own: today); ``A`` (global sum); ``A+`` (global sum,
lag compensated: the recommended one); ``B`` (demand share, own demand exact, floor 5 %);
``B+`` (demand share from the reports alone).

Figures, / quota: ``ratio``: bytes/s over every whole throttle cycle after ``WARMUP_S``;
``low``/``high``: the lowest and highest over 30 s or more of whole cycles begun at each
cycle. A cycle begins with a burst, as ``testkit/rates.py`` ``cycle_rate`` finds them,
after at least 5 s without one. For ``c``: ``excess``: after the move, the most bytes in one
quota window (11 s), more than the most without the move, in seconds of quota (``c-pause``
gives the same figure for a perturbation without a move); ``held``: how long after the move,
in report intervals, the process moved to last counted the others' usage more than 5 % of a
window short of what they had recorded (A only: B does not count it); both the worst of 24
moves spread over one window; ``after``: the ratio over whole cycles (>= 15 s) from the move.

Run: python bench/coordination_sim.py [--sweep A,A+,B,B+] [--json PATH]
(about 20 s; each design swept adds about 20 s)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.coordination_sim import (
    DURATION_S,
    QUOTA,
    REQUEST_BYTES,
    RTT_MS,
    SAMPLES,
    STALENESS_MS,
    SWEEP_MOVES,
    WINDOW_MS,
    Result,
    measure,
)


def fmt(r: Result) -> str:
    s = f"{r.ratio:6.3f} {r.low:6.3f} {r.high:6.3f}"
    if r.excess_s is not None and r.after is not None:
        held = "-" if r.held is None else f"{r.held:.1f}"
        s += f"  excess {r.excess_s:+6.2f} s  held {held:>4s}  after {r.after:5.3f}"
    return s


MAIN = {"ref-a": ("none",), "a": ("none", "A", "A+", "B", "B+", "A+s"),
        "a4": ("none", "A", "A+", "B", "B+", "A+s"),
        "asym": ("none", "A", "A+", "B", "B+", "A+s"),
        "skew": ("none", "A", "A+", "B", "B+", "A+s"),
        "lone": ("none", "A+", "A+s", "B+"),
        "ref-b": ("none",), "b": ("none", "A", "A+", "B", "B+", "A+s"),
        "ref-b16": ("none",), "b16": ("none", "A", "A+", "B", "B+", "A+s"),
        "c-pause": ("none",), "c": ("none", "A", "A+", "B", "B+", "A+s"),
        "fallback": ("A+",),
        "ref-p": ("none",), "p": ("none", "A+1s", "A+", "A+s", "B+"),
        "p4": ("none", "A+1s", "A+", "A+s", "B+"),
        "ref-m": ("none", "S-none"), "m": ("none", "A+", "A+s", "B+", "S-none", "S"),
        "m35": ("none", "A+", "A+s", "B+", "S")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sweep", default="", metavar="DESIGNS",
                    help="also sweep report_ms 100/250/500 x delay 0/50/200 ms for these "
                         "designs (comma-separated, e.g. A,A+,B+; about 20 s each)")
    ap.add_argument("--json", type=Path, help="write every result as JSON lines here")
    ap.add_argument("--only", default="", metavar="SCENARIOS",
                    help="run only these scenarios of the main table (comma-separated)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    results: list[Result] = []
    print(f"quota {QUOTA:.0f} B/s, requests {REQUEST_BYTES} B (b: 4096 B), rtt {RTT_MS} ms, "
          f"window {SAMPLES} x {WINDOW_MS} ms, staleness {STALENESS_MS} ms, "
          f"{DURATION_S:.0f} s a run")
    print("ratio, low, high: achieved / quota over whole throttle cycles; c: excess after the"
          " move (s of quota), held (report intervals), after (/ quota)")
    print("")
    print("report 250 ms, delay 50 ms")
    print(f"{'scenario':34s} {'design':6s} {'ratio':>6s} {'low':>6s} {'high':>6s}")
    only = set(args.only.split(",")) if args.only else set(MAIN)
    for key, variants in MAIN.items():
        if key not in only:
            continue
        for v in variants:
            r = measure(key, v, 250, 50)
            results.append(r)
            print(f"{r.scenario:34s} {v:6s} {fmt(r)}")
    if args.sweep:
        print("")
        print(f"sweep: ratio for a, a4, b; c: excess, held, after ({SWEEP_MOVES} moves)")
        print(f"{'design':6s} {'report':>6s} {'delay':>5s} {'a':>6s} {'a4':>6s} {'b':>6s}"
              f"  {'c':s}")
        for v in args.sweep.split(","):
            for report_ms in (100, 250, 500):
                for delay_ms in (0, 50, 200):
                    row = [measure(key, v, report_ms, delay_ms, SWEEP_MOVES)
                           for key in ("a", "a4", "b", "c")]
                    results.extend(row)
                    a, a4, b, c = row
                    assert c.excess_s is not None and c.after is not None
                    held = "-" if c.held is None else f"{c.held:.1f}"
                    print(f"{v:6s} {report_ms:6d} {delay_ms:5d} {a.ratio:6.3f} "
                          f"{a4.ratio:6.3f} {b.ratio:6.3f}  excess {c.excess_s:+5.2f} s  "
                          f"held {held:>3s}  after {c.after:5.3f}")
    print("")
    print(f"{len(results)} results in {time.perf_counter() - started:.1f} s")
    if args.json:
        with args.json.open("w") as f:
            for r in results:
                f.write(json.dumps(r.__dict__) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
