#!/usr/bin/env python
"""What scale-out costs (issue 16): coordination's CPU, and 2 workers against 1.

One run starts one tansu broker (memory storage) and three proxies in front of it, each with a
``clients/<default>`` quota far above what the machine can move (every client has a limited
budget, so coordination reports it, but nothing is throttled):

- ``1w``: ``workers: 1``, coordination off;
- ``1w+coord``: ``workers: 1``, ``coordination.enabled: true``;
- ``2w``: ``workers: 2`` (coordination on, its default with more than one worker).

Each path, and ``direct`` (tansu), is measured with C concurrent librdkafka clients (default 4,
each in its own thread) on a topic of C partitions, one per client: produce (acks=1 and the
other settings of ``proxy_bench.py``), then fetch (each consumer assigned its partition). The
paths are interleaved round by round (order rotated, round 0 a warm-up); figures are medians
over the rounds, ratios medians of per-round ratios. CPU is user+sys of the proxy's whole
process tree (the supervisor and its workers) per GB moved.

Targets: core-s/GB of ``1w+coord`` within 1.10x of ``1w`` (produce and fetch); the ratios to
direct of ``2w`` are reported next to ``1w``'s.

    python bench/scale_out_bench.py [--rounds N] [--messages M] [--clients C] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import (
    WORKLOAD_FAILURES,
    ClientLog,
    CpuMeter,
    ForeignCpu,
    Measurement,
    TreeCpuMeter,
    run_interruptible,
)
from proxy_bench import (
    RESULTS_DIR,
    Endpoint,
    RoundResult,
    _fmt,
    _loadavg,
    _median,
    create_topic,
    delete_topic,
    describe_environment,
    fetch_workload,
    produce_workload,
    rotated,
)
from quota_bench import start_proxy

from kafka_quota_proxy.demo.embedded_broker import TansuBroker

DIRECT, W1, W1_COORD, W2 = "direct", "1w", "1w+coord", "2w"
PATHS = (DIRECT, W1, W1_COORD, W2)
WORKERS = {W1: 1, W1_COORD: 1, W2: 2}
NOT_BINDING = 10_000_000_000          # bytes/s: never reached here, but a limited budget
COORD_TARGET = 1.10                   # core-s/GB of 1w+coord / 1w, at most
IDLE_S = 4.0                          # the idle CPU measurement at the end
BARRIER_TIMEOUT_S = 60.0              # the clients of a workload wait this long for each other


def proxy_configs(run_id: str) -> dict[str, dict[str, Any]]:
    """The config sections of each proxy. Each coordinated proxy has its own usage topic, so
    that one proxy's reports are not read by another."""
    quota = {"quotas": {"entities": [{"client-id": "<default>",
                                      "producer_byte_rate": NOT_BINDING,
                                      "consumer_byte_rate": NOT_BINDING}]}}
    return {
        W1: {"workers": 1, "coordination": {"enabled": False}, **quota},
        W1_COORD: {"workers": 1,
                    "coordination": {"enabled": True, "instance": "bench-1w-coord",
                                     "topic": f"__bench_usage_1w_coord_{run_id}"},
                    **quota},
        W2: {"workers": 2,
             "coordination": {"instance": "bench-2w", "topic": f"__bench_usage_2w_{run_id}"},
             **quota},
    }


@dataclass(frozen=True)
class Settings:
    rounds: int = 5                   # measured rounds (round 0, the warm-up, comes on top)
    messages: int = 200_000           # per produce / fetch workload, split among the clients
    clients: int = 4                  # concurrent producers / consumers, one partition each
    message_bytes: int = 1024
    quick: bool = False


@dataclass
class Result:
    settings: Settings
    environment: dict[str, Any]
    pids: dict[str, int]
    processes: dict[str, int]         # processes in each proxy's tree (supervisor + workers)
    rounds: list[RoundResult] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    measured_s: float = 0.0
    foreign_cpu_s: float | None = None
    idle_cores: dict[str, float] = field(default_factory=dict)   # CPU-s/s, no traffic
    loadavg_at_end: tuple[float, float, float] | None = None


# ---------------------------------------------------------------------------- workloads


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def concurrent(clients: int, meter: TreeCpuMeter | None,
               work: Callable[[int, Callable[[], object]], Measurement]) -> Measurement:
    """``work(i, ready)`` in ``clients`` threads; each calls ``ready`` once connected, and the
    clock (each client's own) and the tree's CPU start when all have. Aggregate: the bytes of
    all over the time of the slowest; CPU until the last has finished."""
    cpu_before: list[float] = []

    def all_ready() -> None:
        if meter is not None:
            cpu_before.append(meter.read())

    barrier = threading.Barrier(clients, action=all_ready, timeout=BARRIER_TIMEOUT_S)
    results: list[Measurement | None] = [None] * clients
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            results[i] = work(i, barrier.wait)
        except Exception as exc:
            errors.append(exc)
            barrier.abort()               # the others stop waiting for this one

    threads = [threading.Thread(target=run, args=(i,), name=f"client-{i}", daemon=True)
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu_after = meter.read() if meter is not None else None
    if errors:   # the first real error, not the BrokenBarrierError of the clients it stopped
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    done = [m for m in results if m is not None]
    return Measurement.of(max(m.seconds for m in done), sum(m.messages for m in done),
                          sum(m.bytes for m in done), cpu_before[0] if cpu_before else None,
                          cpu_after)


def run_round(endpoint: Endpoint, meter: TreeCpuMeter | None, round_no: int, position: int,
              settings: Settings) -> RoundResult:
    topic = f"scale-{endpoint.name.replace('+', '-')}-r{round_no}-{uuid.uuid4().hex[:8]}"
    shares = split(settings.messages, settings.clients)
    no_cpu = CpuMeter(None)               # the clients time; the tree is read around them
    log = ClientLog()
    produce = fetch = None
    try:
        create_topic(endpoint, topic, partitions=settings.clients)
        produce = concurrent(settings.clients, meter, lambda i, ready: produce_workload(
            endpoint.bootstrap, topic, shares[i], settings.message_bytes, no_cpu, log,
            partition=i, ready=ready))
        fetch = concurrent(settings.clients, meter, lambda i, ready: fetch_workload(
            endpoint.bootstrap, topic, shares[i], no_cpu, log, partition=i, ready=ready))
        error = None
    except (*WORKLOAD_FAILURES, threading.BrokenBarrierError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        delete_topic(endpoint, topic)
    endpoint.check_alive()                # a dead proxy ends the run, with its log
    return RoundResult(round_no, position, endpoint.name, round_no == 0, produce, fetch, error,
                       log.summary(min_level=logging.WARNING))


def wait_for_workers(meter: TreeCpuMeter, endpoint: Endpoint, workers: int,
                     timeout: float = 30.0) -> None:
    """A supervisor serves once its first worker does; wait for all of them."""
    expected = 1 + workers if workers > 1 else 1
    deadline = time.monotonic() + timeout
    while meter.read() >= 0 and meter.processes < expected:
        endpoint.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{endpoint.name}: {meter.processes} processes after {timeout}s, "
                               f"expected {expected}")
        time.sleep(0.1)


def idle_cpu(meters: dict[str, TreeCpuMeter | None], seconds: float = IDLE_S) -> dict[str, float]:
    """CPU-s per second of each proxy tree with no client, right after the rounds (budgets
    used in the last quota window are still reported)."""
    live = {name: m for name, m in meters.items() if m is not None}
    before = {name: m.read() for name, m in live.items()}
    time.sleep(seconds)
    return {name: (m.read() - before[name]) / seconds for name, m in live.items()}


def run_benchmark(settings: Settings) -> Result:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-bench-")))
        broker = TansuBroker(log_path=str(workdir / "tansu-broker.log"))
        stack.callback(broker.stop)
        broker.start()
        endpoints = {DIRECT: Endpoint(DIRECT, broker.bootstrap)}
        stack.callback(endpoints[DIRECT].close_admin)
        for name, extra in proxy_configs(uuid.uuid4().hex[:8]).items():
            endpoints[name] = start_proxy(stack, workdir, name, broker, extra)
        endpoints[DIRECT].admin.list_topics(timeout=15)
        meters: dict[str, TreeCpuMeter | None] = {DIRECT: None}
        pids: dict[str, int] = {}
        for name, workers in WORKERS.items():
            process = endpoints[name].middlebox
            assert process is not None
            pids[name] = process.pid
            meter = meters[name] = TreeCpuMeter(process.pid)
            wait_for_workers(meter, endpoints[name], workers)
        processes = {name: m.processes for name, m in meters.items() if m is not None}
        result = Result(settings, describe_environment(), pids, processes, started_at=stamp)
        print(f"tansu {broker.bootstrap} | " + " | ".join(
            f"{n} {endpoints[n].bootstrap} (pid {pids[n]}, {processes[n]} processes)"
            for n in WORKERS), flush=True)

        foreign, measuring_since = ForeignCpu(), time.monotonic()
        for round_no in range(settings.rounds + 1):
            label = "warm-up" if round_no == 0 else f"round {round_no}/{settings.rounds}"
            for position, name in enumerate(rotated(PATHS, round_no)):
                r = run_round(endpoints[name], meters[name], round_no, position, settings)
                result.rounds.append(r)
                print(f"  {label:<12} {name:<9} {_round_cell(r)}", flush=True)
        result.measured_s = time.monotonic() - measuring_since
        result.foreign_cpu_s = foreign.seconds()
        result.idle_cores = idle_cpu(meters)
    result.duration_s = time.monotonic() - started
    result.loadavg_at_end = os.getloadavg()
    return result


# ---------------------------------------------------------------------------- summary


def _round_cell(r: RoundResult) -> str:
    if r.error:
        return f"ERROR {r.error}"
    p, f = r.produce, r.fetch
    assert p is not None and f is not None
    cpu = ""
    if p.middlebox_cpu_s_per_gb is not None and f.middlebox_cpu_s_per_gb is not None:
        cpu = (f"  (proxy tree {p.middlebox_cpu_s_per_gb:.2f} / "
               f"{f.middlebox_cpu_s_per_gb:.2f} core-s/GB)")
    warnings = f"  [{r.client_warnings}]" if r.client_warnings else ""
    return (f"produce {p.mb_per_s:7.1f} MB/s in {p.seconds:5.2f}s  "
            f"fetch {f.mb_per_s:7.1f} MB/s in {f.seconds:5.2f}s{cpu}{warnings}")


def _by_round(result: Result) -> dict[int, dict[str, RoundResult]]:
    out: dict[int, dict[str, RoundResult]] = {}
    for r in result.rounds:
        if not r.warmup:
            out.setdefault(r.round, {})[r.path] = r
    return dict(sorted(out.items()))


def per_round_ratios(result: Result, path: str, base: str, kind: str,
                     metric: str = "mb_per_s") -> list[float | None]:
    """Per measured round: ``metric`` of ``path``'s ``kind`` workload / the same of ``base``."""
    ratios: list[float | None] = []
    for rounds in _by_round(result).values():
        mine = getattr(rounds.get(path), kind, None)
        theirs = getattr(rounds.get(base), kind, None)
        a = getattr(mine, metric, None)
        b = getattr(theirs, metric, None)
        ratios.append(a / b if a is not None and b else None)
    return ratios


def _median_of(result: Result, path: str, kind: str, metric: str) -> float | None:
    return _median([getattr(getattr(r, kind), metric, None)
                    for r in result.rounds if r.path == path and not r.warmup])


def summarize(result: Result) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for path in PATHS:
        paths[path] = {"failed_rounds": sum(1 for r in result.rounds
                                            if r.path == path and not r.warmup and r.error)}
        for kind in ("produce", "fetch"):
            paths[path][kind] = {
                "mb_per_s": _median_of(result, path, kind, "mb_per_s"),
                "ratio_to_direct": _median(per_round_ratios(result, path, DIRECT, kind)),
                "core_s_per_gb": _median_of(result, path, kind, "middlebox_cpu_s_per_gb"),
            }
    comparisons: dict[str, Any] = {}
    for label, path, base, metric in (
            ("coord_cpu", W1_COORD, W1, "middlebox_cpu_s_per_gb"),
            ("2w_vs_1w_cpu", W2, W1, "middlebox_cpu_s_per_gb"),
            ("2w_vs_1w_mb_per_s", W2, W1, "mb_per_s")):
        comparisons[label] = {}
        for kind in ("produce", "fetch"):
            rounds = per_round_ratios(result, path, base, kind, metric)
            comparisons[label][kind] = {"median": _median(rounds), "per_round": rounds}
    return {"paths": paths, "comparisons": comparisons}


def target_verdict(summary: dict[str, Any]) -> tuple[bool, str]:
    ok, parts = True, []
    for kind in ("produce", "fetch"):
        ratio = summary["comparisons"]["coord_cpu"][kind]["median"]
        good = ratio is not None and ratio <= COORD_TARGET
        ok = ok and good
        parts.append(f"{kind} {_fmt(ratio, '.2f')} {'PASS' if good else 'FAIL'}")
    failed = sum(summary["paths"][p]["failed_rounds"] for p in (W1, W1_COORD))
    if failed:
        ok = False
        parts.append(f"{failed} failed round(s) of 1w / 1w+coord")
    return ok, ", ".join(parts)


def format_report(result: Result) -> str:
    s = result.settings
    summary = summarize(result)
    paths, comp = summary["paths"], summary["comparisons"]
    lines = [
        "",
        f"scale-out benchmark ({'quick, ' if s.quick else ''}1 warm-up + {s.rounds} rounds, "
        f"{s.clients} producers / consumers, {s.messages} x {s.message_bytes} B per workload "
        f"over {s.clients} partitions, acks=1, linger.ms=5, batch.size=1MB; MB = 10^6 B; "
        f"{result.environment['cpus']} CPUs)",
        "",
        "medians over rounds; /direct = median of the per-round ratios to direct; "
        "core-s/GB = user+sys CPU of the proxy's process tree per GB",
        f"  {'path':<9} {'produce MB/s':>12} {'/direct':>8} {'core-s/GB':>10}   "
        f"{'fetch MB/s':>10} {'/direct':>8} {'core-s/GB':>10} {'failed':>7}",
    ]
    for path in PATHS:
        p, f = paths[path]["produce"], paths[path]["fetch"]
        lines.append(
            f"  {path:<9} {_fmt(p['mb_per_s'], '.1f'):>12} {_fmt(p['ratio_to_direct'], '.2f'):>8}"
            f" {_fmt(p['core_s_per_gb'], '.2f'):>10}   {_fmt(f['mb_per_s'], '.1f'):>10} "
            f"{_fmt(f['ratio_to_direct'], '.2f'):>8} {_fmt(f['core_s_per_gb'], '.2f'):>10} "
            f"{paths[path]['failed_rounds']:>7}")

    lines += ["", "per round: produce / fetch MB/s, and core-s/GB of the proxies "
              "(order = measuring order)"]
    for round_no in sorted({r.round for r in result.rounds}):
        rs = sorted((r for r in result.rounds if r.round == round_no), key=lambda r: r.position)
        cells = []
        for r in rs:
            if r.error or r.produce is None or r.fetch is None:
                cells.append(f"{r.path} ERROR")
                continue
            cpu = ""
            if r.produce.middlebox_cpu_s_per_gb is not None:
                cpu = (f" ({_fmt(r.produce.middlebox_cpu_s_per_gb, '.2f')}/"
                       f"{_fmt(r.fetch.middlebox_cpu_s_per_gb, '.2f')})")
            cells.append(f"{r.path} {r.produce.mb_per_s:.0f}/{r.fetch.mb_per_s:.0f}{cpu}")
        lines.append(f"  {'warm' if round_no == 0 else round_no:<5} " + ", ".join(cells))

    def per_round(values: list[float | None]) -> str:
        return " ".join(_fmt(v, ".2f") for v in values)

    ok, detail = target_verdict(summary)
    lines += ["", "coordination: core-s/GB 1w+coord / 1w (median of per-round ratios)"]
    for kind in ("produce", "fetch"):
        c = comp["coord_cpu"][kind]
        lines.append(f"  {kind:<8} {_fmt(c['median'], '.2f')}   per round: "
                     f"{per_round(c['per_round'])}")
    lines += ["", "2 workers on this machine: ratio to direct, 1w next to 2w; 2w/1w per round"]
    for kind in ("produce", "fetch"):
        one, two = paths[W1][kind], paths[W2][kind]
        mb, cpu = comp["2w_vs_1w_mb_per_s"][kind], comp["2w_vs_1w_cpu"][kind]
        lines.append(f"  {kind:<8} 1w {_fmt(one['ratio_to_direct'], '.2f')}  "
                     f"2w {_fmt(two['ratio_to_direct'], '.2f')}   2w/1w MB/s "
                     f"{_fmt(mb['median'], '.2f')} (per round: {per_round(mb['per_round'])}), "
                     f"core-s/GB {_fmt(cpu['median'], '.2f')}")

    lines += ["", f"idle, {IDLE_S:.0f} s right after the rounds, no client traffic: "
              + ", ".join(f"{name} {100 * cores:.1f}%" for name, cores in
                          result.idle_cores.items()) + " of a core"]

    errors = [f"  round {r.round} {r.path}: {r.error}" for r in result.rounds if r.error]
    if errors:
        lines += ["", "errors:", *errors]
    share = (None if result.foreign_cpu_s is None or result.measured_s <= 0
             else result.foreign_cpu_s / result.measured_s)
    lines += ["", f"target: core-s/GB 1w+coord / 1w <= {COORD_TARGET} for produce and fetch "
                  f"(median): {'PASS' if ok else 'FAIL'} ({detail})",
              f"total time {result.duration_s:.0f} s; load average (1/5/15 min) at start "
              f"{_loadavg(result.environment['loadavg_at_start'])}, at end "
              f"{_loadavg(result.loadavg_at_end)}",
              f"other processes used {_fmt(result.foreign_cpu_s, '.1f')} CPU-s during the "
              f"{result.measured_s:.0f} s of measurements ({_fmt(share, '.0%')} of one core; "
              "should be near 0)"]
    return "\n".join(lines)


def write_json(result: Result) -> Path:
    summary = summarize(result)
    ok, detail = target_verdict(summary)
    data = asdict(result) | {"summary": summary,
                             "target": {"coord_cpu_ratio_max": COORD_TARGET, "pass": ok,
                                        "detail": detail}}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"scale_out_bench-{result.started_at}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="measured rounds after the warm-up (5)")
    parser.add_argument("--messages", type=int,
                        help="messages per workload, split among the clients (200000)")
    parser.add_argument("--clients", type=int, help="concurrent producers / consumers (4)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 rounds of 50000 messages")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {"rounds": 2, "messages": 50_000, "quick": True} if args.quick else {}
    values |= {k: v for k in ("rounds", "messages", "clients")
               if (v := getattr(args, k)) is not None}
    settings = Settings(**values)
    if settings.rounds < 1 or settings.clients < 1 or settings.messages < settings.clients:
        parser.error("--rounds and --clients must be at least 1, --messages at least --clients")
    return settings


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    result = run_interruptible(lambda: run_benchmark(settings))
    if result is None:
        return 130
    print(format_report(result))
    print(f"results: {write_json(result)}")
    ok, _ = target_verdict(summarize(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
