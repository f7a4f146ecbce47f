#!/usr/bin/env python
"""The cost of TLS in kafka-quota-proxy: throughput and the proxy's CPU per GB, TLS vs plaintext.

Two paths, each with its own tansu broker (memory storage) behind a front (the test-only
``testkit.secure_front``, since tansu does not speak TLS) and its own proxy process:

- ``plaintext``: librdkafka -> proxy (PLAINTEXT listener) -> front (plain TCP) -> tansu
- ``tls``: librdkafka (security.protocol SSL) -> proxy (SSL listener, upstream.tls with
  check_hostname) -> front (terminates TLS) -> tansu

Both go through the same kind of front, so the difference between them is TLS: the proxy
decrypts what the client sends and encrypts it again toward the front, and back. Each front runs
in its own process (this script, ``--front``), on uvloop like the proxy, so its CPU is neither
the benchmark's nor the proxy's. The workloads are proxy_bench's (1 KB messages, 1 partition,
acks=1, linger.ms=5, batch.size=1 MB, librdkafka's default fetch sizes), interleaved round by
round with the order alternating (round 0 warms up). Reported: medians of MB/s, of the
per-round ratios tls/plaintext, of the proxy's CPU seconds per GB moved, and of the per-round
differences tls - plaintext of the latter: what TLS costs the proxy, in core-s/GB.
Target: <= 3 core-s/GB on top of plaintext, for produce and for fetch.

    python bench/tls_bench.py [--rounds N] [--messages M] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import proxy_bench
from harness import (
    GB,
    HOST,
    CpuMeter,
    ForeignCpu,
    ManagedProcess,
    pick_port_range,
    run_interruptible,
    wait_ready,
)
from proxy_bench import (
    Endpoint,
    RoundResult,
    Settings,
    describe_environment,
    rotated,
    run_throughput_round,
)

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port

if TYPE_CHECKING:   # made at run time only: trustme is a test dependency
    from testkit.certs import Certs

SCRIPT = Path(__file__).resolve()
RESULTS_DIR = SCRIPT.parent / "results"

PLAINTEXT, TLS = "plaintext", "tls"
PATHS = (PLAINTEXT, TLS)
TARGET_EXTRA_CPU_S_PER_GB = 3.0


# ---------------------------------------------------------------------------- the front


def run_front(tansu_port: int, port: int, pem: tuple[str, str] | None) -> int:
    """``--front``: a SecureFront before tansu, TLS with ``pem`` (cert, key), until killed."""
    import uvloop

    from testkit.secure_front import SecureFront

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())   # SecureFront makes its own loop
    context = None
    if pem is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*pem)
    SecureFront(tansu_port, port, tls=context).start()
    print(f"front {HOST}:{port} -> tansu {HOST}:{tansu_port}, "
          f"{'TLS' if context else 'plaintext'}", flush=True)
    threading.Event().wait()        # the front serves from its thread; SIGTERM ends us
    return 0


# ---------------------------------------------------------------------------- environment


@contextlib.contextmanager
def secured_clients(settings_by_bootstrap: dict[str, dict[str, str]]) -> Iterator[None]:
    """proxy_bench's workloads and Endpoint make their librdkafka clients from a bootstrap
    address alone. For as long as this lasts, its Producer, Consumer and AdminClient add the
    settings registered here for that address (security.protocol, ssl.ca.location)."""
    names = ("Producer", "Consumer", "AdminClient")
    originals = {name: getattr(proxy_bench, name) for name in names}

    def secured(cls: Callable[..., Any]) -> Callable[..., Any]:
        def make(conf: dict[str, Any], **kwargs: Any) -> Any:
            extra = settings_by_bootstrap.get(conf.get("bootstrap.servers", ""), {})
            return cls({**conf, **extra}, **kwargs)
        return make

    for name, cls in originals.items():
        setattr(proxy_bench, name, secured(cls))
    try:
        yield
    finally:
        for name, cls in originals.items():
            setattr(proxy_bench, name, cls)


@dataclass
class BenchPath:
    endpoint: Endpoint               # the proxy, as clients reach it
    front: ManagedProcess
    client_settings: dict[str, str]  # librdkafka settings on top of bootstrap.servers


def start_path(stack: contextlib.ExitStack, workdir: Path, name: str,
               certs: tuple[Certs, Certs] | None) -> BenchPath:
    """tansu, its front and a proxy before the front; with ``certs`` (the proxy's and the
    broker side's ``Certs``), TLS from the client to the front."""
    front_port, proxy_port = free_port(), free_port()
    broker = TansuBroker(advertised_port=front_port, log_path=str(workdir / f"tansu-{name}.log"))
    stack.callback(broker.stop)
    broker.start()

    front_argv = [sys.executable, str(SCRIPT), "--front", str(broker.port), str(front_port)]
    listeners: dict[str, Any] = {"bootstrap": f"{HOST}:{proxy_port}", "advertised_host": HOST}
    upstream: dict[str, Any] = {"bootstrap_servers": [f"{HOST}:{front_port}"]}
    client_settings: dict[str, str] = {}
    if certs is not None:
        proxy_certs, broker_certs = certs
        broker_pem, proxy_pem = broker_certs.server("broker"), proxy_certs.server()
        front_argv += ["--front-tls", str(broker_pem.cert), str(broker_pem.key)]
        listeners["security"] = {"protocol": "SSL", "tls": {"cert_file": str(proxy_pem.cert),
                                                             "key_file": str(proxy_pem.key)}}
        upstream["tls"] = {"ca_file": str(broker_certs.ca_file), "check_hostname": True}
        client_settings = {"security.protocol": "SSL",
                           "ssl.ca.location": str(proxy_certs.ca_file)}

    front = ManagedProcess.spawn(f"front-{name}", front_argv, workdir)
    stack.callback(front.stop)
    wait_ready(front, front_port)

    low, high = pick_port_range(100, avoid={broker.port, front_port, proxy_port})
    listeners["broker_ports"] = f"{low}-{high}"
    config = {"listeners": listeners, "upstream": upstream, "logging": {"level": "warning"}}
    config_path = workdir / f"proxy-{name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    proxy = ManagedProcess.spawn(
        f"proxy-{name}",
        [sys.executable, "-m", "kafka_quota_proxy", "run", "--config", str(config_path)], workdir)
    stack.callback(proxy.stop)
    wait_ready(proxy, proxy_port)
    endpoint = Endpoint(name, f"{HOST}:{proxy_port}", proxy)
    stack.callback(endpoint.close_admin)     # before the servers (ExitStack is LIFO)
    return BenchPath(endpoint, front, client_settings)


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Round:
    result: RoundResult
    front_cpu_s_per_gb: float | None     # the front process, produce + fetch together


@dataclass
class TlsBenchResult:
    settings: Settings
    environment: dict[str, Any]
    pids: dict[str, int]
    rounds: list[Round] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    measured_s: float = 0.0
    foreign_cpu_s: float | None = None
    loadavg_at_end: tuple[float, float, float] | None = None


def measure_round(path: BenchPath, round_no: int, position: int, settings: Settings) -> Round:
    front_cpu = CpuMeter(path.front.pid)
    before = front_cpu.read()
    result = run_throughput_round(path.endpoint, round_no, position, settings)
    after = front_cpu.read()
    path.front.check_alive()
    moved = sum(m.bytes for m in (result.produce, result.fetch) if m is not None)
    front = None if before is None or after is None or not moved else (after - before) / (
        moved / GB)
    return Round(result, front)


def run_benchmark(settings: Settings) -> TlsBenchResult:
    from testkit.certs import Certs

    stamp = time.strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tls-bench-")))
        certs = (Certs(workdir, "proxy"), Certs(workdir, "broker"))
        paths = {PLAINTEXT: start_path(stack, workdir, PLAINTEXT, None),
                 TLS: start_path(stack, workdir, TLS, certs)}
        stack.enter_context(secured_clients(
            {p.endpoint.bootstrap: p.client_settings for p in paths.values()}))
        for p in paths.values():
            p.endpoint.admin.list_topics(timeout=15)     # each path answers metadata
        pids = {f"{name} {role}": process.pid for name, p in paths.items()
                for role, process in (("proxy", p.endpoint.middlebox), ("front", p.front))
                if process is not None}
        result = TlsBenchResult(settings, describe_environment(), pids, started_at=stamp)
        print(" | ".join(f"{name}: proxy {p.endpoint.bootstrap} (pid {pids[name + ' proxy']}), "
                         f"front pid {p.front.pid}" for name, p in paths.items()), flush=True)

        foreign, measuring_since = ForeignCpu(), time.monotonic()
        for round_no in range(settings.rounds + 1):
            label = "warm-up" if round_no == 0 else f"round {round_no}/{settings.rounds}"
            for position, name in enumerate(rotated(PATHS, round_no)):
                r = measure_round(paths[name], round_no, position, settings)
                result.rounds.append(r)
                print(f"  {label:<12} {name:<10} {_round_cell(r)}", flush=True)
        result.measured_s = time.monotonic() - measuring_since
        result.foreign_cpu_s = foreign.seconds()
    result.duration_s = time.monotonic() - started
    result.loadavg_at_end = os.getloadavg()
    return result


# ---------------------------------------------------------------------------- summary


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _round_cell(r: Round) -> str:
    res = r.result
    if res.error or res.produce is None or res.fetch is None:
        return f"ERROR {res.error}"
    p, f = res.produce, res.fetch
    warnings = f"  [{res.client_warnings}]" if res.client_warnings else ""
    return (f"produce {p.mb_per_s:6.1f} MB/s {_fmt(p.middlebox_cpu_s_per_gb, '5.2f')} s/GB  "
            f"fetch {f.mb_per_s:6.1f} MB/s {_fmt(f.middlebox_cpu_s_per_gb, '5.2f')} s/GB  "
            f"(proxy CPU; front {_fmt(r.front_cpu_s_per_gb, '.2f')} s/GB){warnings}")


def _figure(r: Round | None, kind: str, figure: str) -> float | None:
    m = getattr(r.result, kind) if r is not None and not r.result.error else None
    return None if m is None else getattr(m, figure)


def per_round(result: TlsBenchResult) -> dict[int, dict[str, Round]]:
    by_round: dict[int, dict[str, Round]] = {}
    for r in result.rounds:
        if not r.result.warmup:
            by_round.setdefault(r.result.round, {})[r.result.path] = r
    return dict(sorted(by_round.items()))


def per_round_ratios(result: TlsBenchResult, kind: str) -> list[float | None]:
    out: list[float | None] = []
    for paths in per_round(result).values():
        tls, plain = (_figure(paths.get(p), kind, "mb_per_s") for p in (TLS, PLAINTEXT))
        out.append(tls / plain if tls is not None and plain else None)
    return out


def per_round_extra_cpu(result: TlsBenchResult, kind: str) -> list[float | None]:
    """TLS's extra proxy CPU in core-s/GB, round by round: tls - plaintext."""
    out: list[float | None] = []
    for paths in per_round(result).values():
        tls, plain = (_figure(paths.get(p), kind, "middlebox_cpu_s_per_gb")
                      for p in (TLS, PLAINTEXT))
        out.append(tls - plain if tls is not None and plain is not None else None)
    return out


def summarize(result: TlsBenchResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in PATHS:
        rounds: list[Round | None] = [paths.get(path) for paths in per_round(result).values()]
        out[path] = {
            **{f"{kind}_mb_s": _median([_figure(r, kind, "mb_per_s") for r in rounds])
               for kind in ("produce", "fetch")},
            **{f"{kind}_cpu_s_per_gb": _median([_figure(r, kind, "middlebox_cpu_s_per_gb")
                                                for r in rounds])
               for kind in ("produce", "fetch")},
            "front_cpu_s_per_gb": _median([r.front_cpu_s_per_gb if r else None
                                           for r in rounds]),
            "failed_rounds": sum(1 for r in rounds if r is None or r.result.error),
        }
    out["ratio"] = {kind: _median(per_round_ratios(result, kind))
                    for kind in ("produce", "fetch")}
    out["extra_cpu_s_per_gb"] = {kind: _median(per_round_extra_cpu(result, kind))
                                 for kind in ("produce", "fetch")}
    return out


def target_verdict(summary: dict[str, Any]) -> tuple[bool, str]:
    failed = sum(summary[p]["failed_rounds"] for p in PATHS)
    ok, parts = failed == 0, []
    for kind, extra in summary["extra_cpu_s_per_gb"].items():
        good = extra is not None and extra <= TARGET_EXTRA_CPU_S_PER_GB
        ok = ok and good
        parts.append(f"{kind} {_fmt(extra, '+.2f')} {'PASS' if good else 'FAIL'}")
    if failed:
        parts.append(f"{failed} failed round(s)")
    return ok, ", ".join(parts)


def format_report(result: TlsBenchResult) -> str:
    s, env = result.settings, result.environment
    summary = summarize(result)
    lines = [
        "",
        f"kafka-quota-proxy TLS cost ({'quick, ' if s.quick else ''}1 warm-up + {s.rounds} "
        f"rounds, {s.messages} x {s.message_bytes} B per workload, 1 partition, acks=1, "
        "linger.ms=5, batch.size=1MB; MB = 10^6 B, GB = 10^9 B)",
        f"machine: {env['host']}, {env['cpus']} CPUs, Python {env['python']}, librdkafka "
        f"{env['librdkafka']}, {env['tansu'] or 'tansu ?'}, commit "
        f"{(env['git_commit'] or '?')[:10]}{' (dirty)' if env['git_dirty'] else ''}",
        "",
        "throughput: median over rounds; ratio = median of the per-round ratios tls/plaintext",
        f"  {'path':<14} {'produce MB/s':>12} {'fetch MB/s':>11} {'failed':>7}",
    ]
    for path in PATHS:
        p = summary[path]
        lines.append(f"  {path:<14} {_fmt(p['produce_mb_s'], '.1f'):>12} "
                     f"{_fmt(p['fetch_mb_s'], '.1f'):>11} {p['failed_rounds']:>7}")
    ratio = summary["ratio"]
    lines.append(f"  {'tls/plaintext':<14} {_fmt(ratio['produce'], '.2f'):>12} "
                 f"{_fmt(ratio['fetch'], '.2f'):>11}")

    lines += ["", "proxy process CPU (user+sys) per GB moved, core-s/GB, median over rounds",
              f"  {'path':<14} {'produce':>12} {'fetch':>11}   front process (produce+fetch)"]
    for path in PATHS:
        p = summary[path]
        lines.append(f"  {path:<14} {_fmt(p['produce_cpu_s_per_gb'], '.2f'):>12} "
                     f"{_fmt(p['fetch_cpu_s_per_gb'], '.2f'):>11}   "
                     f"{_fmt(p['front_cpu_s_per_gb'], '.2f')}")
    extra = summary["extra_cpu_s_per_gb"]
    lines.append(f"  {'tls - plain':<14} {_fmt(extra['produce'], '+.2f'):>12} "
                 f"{_fmt(extra['fetch'], '+.2f'):>11}   (median of per-round differences)")

    lines += ["", "per round: MB/s produce / fetch; tls/plaintext; TLS's extra proxy core-s/GB",
              f"  {'round':<6} {'order':<15} {PLAINTEXT:>15} {TLS:>15} {'ratio':>11} "
              f"{'extra s/GB':>13}"]
    ratios = {k: per_round_ratios(result, k) for k in ("produce", "fetch")}
    extras = {k: per_round_extra_cpu(result, k) for k in ("produce", "fetch")}
    warm = [r for r in result.rounds if r.result.warmup]
    rows = [(0, {r.result.path: r for r in warm}, None), *(
        (round_no, paths, i) for i, (round_no, paths) in enumerate(per_round(result).items()))]
    for round_no, paths, i in rows:
        order = ",".join(r.result.path for r in sorted(paths.values(),
                                                       key=lambda r: r.result.position))
        cells = []
        for path in PATHS:
            pm, fm = (_figure(paths.get(path), k, "mb_per_s") for k in ("produce", "fetch"))
            cells.append(f"{'ERROR':>15}" if pm is None or fm is None
                         else f"{pm:>7.1f}/{fm:<7.1f}")
        pair = ("", "") if i is None else (
            f"{_fmt(ratios['produce'][i], '.2f')}/{_fmt(ratios['fetch'][i], '.2f')}",
            f"{_fmt(extras['produce'][i], '+.2f')}/{_fmt(extras['fetch'][i], '+.2f')}")
        lines.append((f"  {'warm' if i is None else str(round_no):<6} {order:<15} "
                      + " ".join(cells) + f" {pair[0]:>11} {pair[1]:>13}").rstrip())

    errors = [f"  round {r.result.round} {r.result.path}: {r.result.error}"
              for r in result.rounds if r.result.error]
    if errors:
        lines += ["", "errors:", *errors]

    ok, detail = target_verdict(summary)
    share = (None if result.foreign_cpu_s is None or result.measured_s <= 0
             else result.foreign_cpu_s / result.measured_s)
    load_start, load_end = env["loadavg_at_start"], result.loadavg_at_end
    lines += [
        "",
        f"target: TLS adds <= {TARGET_EXTRA_CPU_S_PER_GB:.0f} core-s/GB to the proxy, produce "
        f"and fetch (median): {'PASS' if ok else 'FAIL'} ({detail})",
        f"total time {result.duration_s:.0f} s; load average (1/5/15 min) at start "
        f"{'/'.join(f'{v:.2f}' for v in load_start)}, at end "
        f"{'-' if load_end is None else '/'.join(f'{v:.2f}' for v in load_end)}",
        f"other processes used {_fmt(result.foreign_cpu_s, '.1f')} CPU-s during the "
        f"{result.measured_s:.0f} s of measurements ({_fmt(share, '.0%')} of one core; "
        "should be near 0)",
    ]
    return "\n".join(lines)


def write_json(result: TlsBenchResult) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"tls_bench-{result.started_at}.json"
    summary = summarize(result)
    ok, detail = target_verdict(summary)
    data = asdict(result) | {"summary": summary, "target": {
        "max_extra_cpu_s_per_gb": TARGET_EXTRA_CPU_S_PER_GB, "pass": ok, "detail": detail}}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="measured rounds after the warm-up (5)")
    parser.add_argument("--messages", type=int, help="messages per workload (200000)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 rounds of 50000 messages (CPU figures are "
                        "coarse: psutil counts in 10 ms steps, 0.2 s/GB at 50 MB)")
    parser.add_argument("--front", nargs=2, type=int, metavar=("TANSU_PORT", "PORT"),
                        help="internal: serve a front before tansu (until killed)")
    parser.add_argument("--front-tls", nargs=2, metavar=("CERT", "KEY"),
                        help="internal: the front's TLS certificate chain and key (PEM)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.messages is not None:
        overrides["messages"] = args.messages
    if args.quick:
        args.settings = Settings.quick_mode(**overrides)
    else:
        args.settings = Settings(**overrides)
    if args.settings.rounds < 1 or args.settings.messages < 1:
        parser.error("--rounds and --messages must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.front is not None:
        return run_front(*args.front, tuple(args.front_tls) if args.front_tls else None)
    result = run_interruptible(lambda: run_benchmark(args.settings))
    if result is None:
        return 130
    print(format_report(result))
    print(f"results: {write_json(result)}")
    ok, _ = target_verdict(summarize(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
