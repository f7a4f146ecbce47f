#!/usr/bin/env python
"""What the same code costs after the process has waited, on this machine, interpreted and
compiled.

A proxy with one request in flight waits between requests: for the client's next bytes, for
the broker's answer. ``request_floor.py`` found the proxy's request stream taking 130-200 us
of CPU per 1 MB Produce request in place against 15-25 us in a tight loop. This bench asks
why, in one process, with no sockets and no other process on the CPU:

- ``loop``: a 10,000-step Python loop (a few cache lines of data, one code object);
- ``stream``: ``protocol.request_stream.RequestStream`` with both Produce followers over a
  1 MB Produce request cut as the proxy reads it (``request_floor``'s ``_Stream``);

each timed by the thread's own CPU clock (``time.thread_time``: time this thread ran, not
time it waited), warm (back to back) and after ``time.sleep`` of 1 ms and 5 ms. With
``--spinner idle`` a ``SCHED_IDLE`` process spins on the same CPU so that it never idles while
the measured process sleeps; ``--spinner normal``, a spinner of normal priority (with either,
the measured process runs on that CPU too).

``--compiled`` runs the same measures a second time on a copy of the package whose request
path (``COMPILED``: the stream, its followers and skims, framing, headers, correlation, the
topic guard) is compiled to C by mypyc, which ships with mypy: the same source, no
interpreter in those modules. The two trees alternate round by round.

    python bench/wake_cost.py [--rounds 3] [--compiled] [--spinner none|idle|normal]

Needs the test extra (aiokafka builds the record batch): ``make .venv/.installed-test``;
``--compiled`` needs a C compiler and the Python headers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ("primitives", "skim", "incremental", "framing", "request_stream",
            "response_stream", "correlation", "headers", "topic_guard")
WAITS_US = (0, 1000, 5000)
REPEAT = 200


def _loop() -> Callable[[], None]:
    def work() -> None:
        s = 0
        for i in range(10_000):
            s += i
    return work


def _stream() -> Callable[[], None]:
    import kafka_quota_proxy.protocol.request_stream  # noqa: F401  (the tree asked for first)
    sys.path.insert(1, str(ROOT / "bench"))
    from request_floor import FIRST_READ, _Stream, produce_frame

    frame = produce_frame("wake", 1_000_000)
    s = _Stream()
    head = frame[:FIRST_READ + 4]
    s.stream.feed(head)
    k = s.stream.passable()
    s.stream.passed(k)
    tail = frame[FIRST_READ + 4 + k:]
    s.stream.feed(tail)
    s.table.pop(int.from_bytes(head[8:12], "big"))
    s.last = (head, tail)
    return s.once


def measure() -> dict[str, dict[str, float]]:
    """Median thread-CPU microseconds of each work after each wait (this process's tree)."""
    out: dict[str, dict[str, float]] = {}
    for name, make in (("loop", _loop), ("stream", _stream)):
        work = make()
        for _ in range(REPEAT):  # warm every path once
            work()
        out[name] = {}
        for wait in WAITS_US:
            runs = []
            for _ in range(REPEAT):
                if wait:
                    time.sleep(wait / 1e6)
                c0 = time.thread_time()
                work()
                runs.append((time.thread_time() - c0) * 1e6)
            out[name][str(wait)] = statistics.median(runs)
    return out


def compile_copy(into: Path) -> Path:
    """A copy of the package with ``COMPILED`` compiled by mypyc; its root."""
    shutil.copytree(ROOT / "kafka_quota_proxy", into / "kafka_quota_proxy",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    mypyc = Path(sys.executable).with_name("mypyc")
    subprocess.run([str(mypyc), *(f"kafka_quota_proxy/protocol/{m}.py" for m in COMPILED)],
                   cwd=into, check=True, stdout=subprocess.DEVNULL)
    return into


def run_in(tree: Path | None, cpu: int | None) -> dict[str, dict[str, float]]:
    env = dict(os.environ)
    if tree is not None:
        env["WAKE_TREE"] = str(tree)
    got = subprocess.run([sys.executable, __file__, "--measure"], env=env, check=True,
                         capture_output=True, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None
                         else None)
    return json.loads(got.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--spinner", choices=("none", "idle", "normal"), default="none")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        sys.path.insert(0, os.environ.get("WAKE_TREE", str(ROOT)))
        sys.path.insert(1, str(ROOT))
        print(json.dumps(measure()))
        return 0
    spinner = None
    cpu = 1 if args.spinner != "none" else None
    if cpu is not None:
        sys.path.insert(0, str(ROOT / "bench"))
        from request_floor import start_spinner
        spinner = start_spinner(cpu, idle=args.spinner == "idle")
    trees: dict[str, Path | None] = {"interpreted": None}
    with tempfile.TemporaryDirectory(prefix="wake-cost-") as tmp:
        try:
            if args.compiled:
                trees["compiled"] = compile_copy(Path(tmp))
            print(f"thread CPU us per call, median of {REPEAT}; load "
                  f"{os.getloadavg()[0]:.2f}; spinner {args.spinner}")
            rows: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in trees}
            for r in range(args.rounds):
                for tree, path in trees.items():
                    got = run_in(path, cpu)
                    rows[tree].append(got)
                    print(f"round {r} {tree:11s} " + "  ".join(
                        f"{work} " + "/".join(f"{got[work][str(w)]:.0f}" for w in WAITS_US)
                        for work in got), flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
    print(f"medians, us after waiting {'/'.join(f'{w / 1000:g}' for w in WAITS_US)} ms:")
    summary = {}
    for tree, runs in rows.items():
        summary[tree] = {work: {str(w): statistics.median(g[work][str(w)] for g in runs)
                                for w in WAITS_US} for work in runs[0]}
        print(f"  {tree:11s} " + "  ".join(
            f"{work} " + "/".join(f"{v:.1f}" for v in summary[tree][work].values())
            for work in summary[tree]))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"wake_cost-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(
        {"args": vars(args), "rounds": rows, "medians": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
