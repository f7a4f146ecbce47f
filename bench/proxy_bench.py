#!/usr/bin/env python
"""Throughput, latency and CPU cost of kafka-quota-proxy against a real tansu broker.

One run starts one tansu broker (memory storage) and, in front of it, this proxy and the
``tansu proxy`` (Rust) as reference. Every client path is measured in the same run,
interleaved round by round (order rotated each round; round 0 is a warm-up), because absolute
figures on a shared machine drift by up to ~25 % between runs: only the ratios to ``direct``
measured in one run mean anything. The reported figure is the median over the measured rounds.

    python bench/proxy_bench.py [--rounds N] [--messages M] [--quick] [--profile]
                                [--features none|all]

``--features all`` runs this proxy with every feature on that does not change the bytes (quotas
configured but not binding, capture, fetch routing with a rack rule that matches no client);
``none`` (the default) runs it bare. See ``feature_config``.

Importable: ``run_benchmark(Settings(...))`` returns a ``BenchResult``; ``format_report`` turns
it into the printed table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from harness import (
    HOST,
    MB,
    WORKLOAD_FAILURES,
    ClientLog,
    CpuMeter,
    ForeignCpu,
    ManagedProcess,
    Measurement,
    ProfileResult,
    Watchdog,
    WorkloadError,
    busy_parts,
    own_time_from_raw,
    percentile,
    pick_port_range,
    pyspy_record,
    run_interruptible,
    wait_ready,
)

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port, tansu_binary

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

DIRECT, PROXY, TANSU_PROXY = "direct", "proxy", "tansu-proxy"
PATHS = (DIRECT, PROXY, TANSU_PROXY)
TARGET_RATIO = 0.85

FEATURES_NONE, FEATURES_ALL = "none", "all"
FEATURE_SETS = (FEATURES_NONE, FEATURES_ALL)
NOT_BINDING_BYTE_RATE = 100 * 1024**3       # 100 GiB/s: far above what any machine here moves
NOT_BINDING_REQUEST_PERCENTAGE = 1_000_000  # % of one thread: 10,000 cores' worth
FEATURES_DESCRIPTION = {
    FEATURES_NONE: "none (no quotas, no capture, no fetch routing)",
    FEATURES_ALL: "all that leave the bytes unchanged (clients/<default> quotas not binding, "
                  "capture rotated every 10 s, rack-aware fetch routing whose one rack rule "
                  "matches no client)",
}


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    rounds: int = 5                   # measured rounds (round 0, the warm-up, comes on top)
    messages: int = 200_000           # per produce / fetch workload
    message_bytes: int = 1024
    latency_seconds: float = 5.0      # per path, split into two segments in alternating order
    latency_rate: float = 500.0       # messages per second
    latency_message_bytes: int = 100
    latency_warmup_messages: int = 50
    profile: bool = False
    quick: bool = False
    features: str = FEATURES_NONE          # FEATURE_SETS: what the proxy has on (feature_config)

    @classmethod
    def quick_mode(cls, **overrides: Any) -> Settings:
        base: dict[str, Any] = {"rounds": 2, "messages": 50_000, "latency_seconds": 2.0,
                                "quick": True}
        return cls(**(base | overrides))


# ---------------------------------------------------------------------------- environment


@dataclass
class Endpoint:
    """One way for a client to reach the broker."""

    name: str
    bootstrap: str
    middlebox: ManagedProcess | None = None   # the proxy process in between, if any
    _admin: AdminClient | None = field(default=None, init=False, repr=False)

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def close_admin(self) -> None:
        self._admin = None

    def check_alive(self) -> None:
        if self.middlebox is not None:
            self.middlebox.check_alive()


def feature_config(features: str, workdir: Path) -> dict[str, Any]:
    """The proxy's config sections for a feature set of ``FEATURE_SETS``.

    ``none``: none (a bare proxy). ``all``: every feature that does not change the bytes a
    client sends or receives, so that the proxy does all its per-request work while the
    clients see what a bare proxy gives them:

    - quotas: a ``clients/<default>`` producer and consumer byte rate of 100 GiB/s and a
      request percentage of 1,000,000 % (10,000 cores), so every client has a budget that is
      reserved, checked and recorded on every request and never throttles;
    - capture: into ``workdir/capture``, rotated every 10 s or 8 MB (a run writes several files);
    - fetch routing: ``rack-aware``, its one client rule a client-id nothing uses; no proxy
      rack. The bench's clients send no ``client.rack``, so every consumer fetch is parsed and
      decided (rack unknown: the leader) and nothing is redirected.
    """
    if features == FEATURES_NONE:
        return {}
    if features != FEATURES_ALL:
        raise ValueError(f"features: expected one of {FEATURE_SETS}, got {features!r}")
    return {
        "quotas": {"entities": [{
            "client-id": "<default>",
            "producer_byte_rate": NOT_BINDING_BYTE_RATE,
            "consumer_byte_rate": NOT_BINDING_BYTE_RATE,
            "request_percentage": NOT_BINDING_REQUEST_PERCENTAGE,
        }]},
        "capture": {"dir": str(workdir / "capture"), "rotate_mb": 8, "rotate_seconds": 10},
        "racks": {"selector": "rack-aware",
                  "clients": [{"client_id": "^no-such-client-", "rack": "no-such-rack"}]},
    }


def capture_summary(config: dict[str, Any]) -> dict[str, int] | None:
    """Files, records and bytes in the capture directory of ``config``, if it captures."""
    capture = config.get("capture")
    if not capture:
        return None
    import pyarrow.parquet as pq

    files = [f for f in Path(capture["dir"]).glob("*") if f.is_file()]
    parquet = [f for f in files if f.suffix == ".parquet"]
    return {"files": len(files), "parquet_files": len(parquet),
            "records": sum(pq.read_metadata(f).num_rows for f in parquet),
            "bytes": sum(f.stat().st_size for f in files)}


def start_environment(stack: contextlib.ExitStack, workdir: Path,
                      features: str = FEATURES_NONE) -> dict[str, Endpoint]:
    """Start tansu, this proxy (with ``features``, see ``feature_config``) and tansu's proxy;
    everything is stopped when ``stack`` closes."""
    broker = TansuBroker(log_path=str(workdir / "tansu-broker.log"))
    stack.callback(broker.stop)
    broker.start()

    proxy_port, tansu_proxy_port = free_port(), free_port()
    low, high = pick_port_range(100, avoid={broker.port, proxy_port, tansu_proxy_port})
    config = {
        "listeners": {"bootstrap": f"{HOST}:{proxy_port}", "advertised_host": HOST,
                      "broker_ports": f"{low}-{high}"},
        "upstream": {"bootstrap_servers": [broker.bootstrap]},
        "logging": {"level": "warning"},
        **feature_config(features, workdir),
    }
    config_path = workdir / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    ours = ManagedProcess.spawn(
        PROXY, [sys.executable, "-m", "kafka_quota_proxy", "run", "--config", str(config_path)],
        workdir)
    stack.callback(ours.stop)

    url = f"tcp://{HOST}:{tansu_proxy_port}"
    theirs = ManagedProcess.spawn(
        TANSU_PROXY, [tansu_binary(), "proxy", "--listener-url", url,
                      "--advertised-listener-url", url, "--origin-url", f"tcp://{broker.bootstrap}"],
        workdir)
    stack.callback(theirs.stop)

    endpoints = {
        DIRECT: Endpoint(DIRECT, broker.bootstrap),
        PROXY: Endpoint(PROXY, f"{HOST}:{proxy_port}", ours),
        TANSU_PROXY: Endpoint(TANSU_PROXY, f"{HOST}:{tansu_proxy_port}", theirs),
    }
    # librdkafka clients must go before the servers they talk to (ExitStack is LIFO)
    for endpoint in endpoints.values():
        stack.callback(endpoint.close_admin)

    wait_ready(ours, proxy_port)
    wait_ready(theirs, tansu_proxy_port)
    for endpoint in endpoints.values():
        endpoint.admin.list_topics(timeout=15)      # each path answers metadata
    return endpoints


def create_topic(endpoint: Endpoint, topic: str, partitions: int = 1) -> None:
    new_topic = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    futures = endpoint.admin.create_topics([new_topic], operation_timeout=15)
    try:
        futures[topic].result(timeout=30)
    except TimeoutError:
        raise WorkloadError(f"creating topic {topic}: no answer in 30s") from None


def delete_topic(endpoint: Endpoint, topic: str) -> None:
    """Best effort: frees the broker's memory between workloads."""
    with contextlib.suppress(Exception):
        endpoint.admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=15)


def produce_workload(bootstrap: str, topic: str, messages: int, message_bytes: int,
                     cpu: CpuMeter, log: ClientLog, *, partition: int = -1,
                     ready: Callable[[], object] | None = None) -> Measurement:
    """``partition`` -1: librdkafka's partitioner. ``ready`` is called once connected, just
    before the timing starts (concurrent clients wait there for each other)."""
    errors: list[str] = []

    def on_error_report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "logger": log,
        "acks": "1",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "delivery.report.only.error": True,   # no per-message Python callback on success
        "on_delivery": on_error_report,
    })
    producer.list_topics(topic, timeout=15)   # connect and learn the leader before timing
    if ready is not None:
        ready()
    payload = os.urandom(message_bytes)
    watchdog = Watchdog("produce", messages, log)

    cpu_before, start = cpu.read(), time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, payload, partition=partition)
                break
            except BufferError:               # local queue full: let librdkafka catch up
                producer.poll(0.005)
                watchdog.check(i - len(producer))
        if i % 10_000 == 0:
            producer.poll(0)
    while remaining := producer.flush(1.0):
        watchdog.check(messages - remaining)
    elapsed, cpu_after = time.perf_counter() - start, cpu.read()

    if errors:
        raise WorkloadError(f"{len(errors)} delivery errors, first: {errors[0]}")
    return Measurement.of(elapsed, messages, messages * message_bytes, cpu_before, cpu_after)


def fetch_workload(bootstrap: str, topic: str, messages: int, cpu: CpuMeter,
                   log: ClientLog, *, partition: int = 0,
                   ready: Callable[[], object] | None = None) -> Measurement:
    """Reads ``messages`` from ``partition``; ``ready`` as in ``produce_workload``."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "logger": log,
        "group.id": f"bench-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800,         # librdkafka defaults, spelt out
        "max.partition.fetch.bytes": 1_048_576,
        "fetch.wait.max.ms": 500,
        "queued.max.messages.kbytes": 65_536,
    })
    try:
        consumer.list_topics(topic, timeout=15)
        if ready is not None:
            ready()
        received = nbytes = 0
        watchdog = Watchdog("fetch", messages, log)
        cpu_before, start = cpu.read(), time.perf_counter()
        consumer.assign([TopicPartition(topic, partition, 0)])
        while received < messages:
            # never ask for more than remain: consume() would wait out its timeout for them
            for msg in consumer.consume(num_messages=min(10_000, messages - received),
                                        timeout=1.0):
                if msg.error():
                    raise WorkloadError(f"consume error after {received} messages: {msg.error()}")
                received += 1
                nbytes += len(msg.value() or b"")
            watchdog.check(received)
        elapsed, cpu_after = time.perf_counter() - start, cpu.read()
    finally:
        consumer.close()
    return Measurement.of(elapsed, received, nbytes, cpu_before, cpu_after)


def latency_workload(bootstrap: str, topic: str, seconds: float, rate: float,
                     message_bytes: int, warmup_messages: int) -> list[float]:
    """Produce at a fixed rate, one request in flight; delivery latencies in ms."""
    latencies: list[float] = []
    errors: list[str] = []
    log = ClientLog()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency() * 1000.0)   # produce() -> delivery report, in librdkafka

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "logger": log,
        "acks": "1",
        "linger.ms": 0,
        "max.in.flight.requests.per.connection": 1,
        "compression.type": "none",
    })
    producer.list_topics(topic, timeout=15)
    payload = os.urandom(message_bytes)
    interval = 1.0 / rate
    total = warmup_messages + round(seconds * rate)
    # This process's own collector would stop the sending loop and the delivery reports for
    # 15-20 ms at a time (a full collection of the bench's heap), whatever the path: the
    # loop makes no reference cycles, so it runs without it.
    gc.collect()
    gc.disable()
    try:
        next_send = time.perf_counter()
        for _ in range(total):
            while (wait := next_send - time.perf_counter()) > 0:
                producer.poll(wait)
            producer.produce(topic, payload, on_delivery=on_delivery)
            producer.poll(0)
            next_send += interval
        watchdog = Watchdog("latency produce", total, log)
        while remaining := producer.flush(1.0):
            watchdog.check(total - remaining)
    finally:
        gc.enable()
    if errors:
        raise WorkloadError(f"{len(errors)} delivery errors, first: {errors[0]}")
    return latencies[warmup_messages:]   # delivery reports come in order


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class RoundResult:
    round: int
    position: int                         # 0-based position of the path within the round
    path: str
    warmup: bool
    produce: Measurement | None
    fetch: Measurement | None
    error: str | None = None
    client_warnings: str | None = None    # librdkafka warnings, even if the workload succeeded


@dataclass(frozen=True)
class LatencyResult:
    path: str
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float


@dataclass
class BenchResult:
    settings: Settings
    environment: dict[str, Any]
    pids: dict[str, int]
    rounds: list[RoundResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    latency_errors: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, ProfileResult] = field(default_factory=dict)  # produce, fetch
    proxy_features: dict[str, Any] = field(default_factory=dict)  # the config sections of them
    capture: dict[str, int] | None = None   # what the capture wrote, when it was on
    started_at: str = ""
    duration_s: float = 0.0
    loadavg_at_end: tuple[float, float, float] | None = None
    measured_s: float = 0.0              # throughput rounds + latency
    foreign_cpu_s: float | None = None   # CPU used by other processes meanwhile


def rotated(paths: tuple[str, ...], by: int) -> list[str]:
    k = by % len(paths)
    return list(paths[k:] + paths[:k])


def run_throughput_round(endpoint: Endpoint, round_no: int, position: int,
                         settings: Settings) -> RoundResult:
    topic = f"bench-{endpoint.name}-r{round_no}-{uuid.uuid4().hex[:8]}"
    cpu = CpuMeter(endpoint.middlebox.pid if endpoint.middlebox else None)
    log = ClientLog()
    produce = fetch = None
    try:
        create_topic(endpoint, topic)
        produce = produce_workload(endpoint.bootstrap, topic, settings.messages,
                                   settings.message_bytes, cpu, log)
        fetch = fetch_workload(endpoint.bootstrap, topic, settings.messages, cpu, log)
        error = None
    except WORKLOAD_FAILURES as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        delete_topic(endpoint, topic)
    endpoint.check_alive()                # a dead proxy ends the run, with its log
    return RoundResult(round_no, position, endpoint.name, round_no == 0, produce, fetch, error,
                       log.summary(min_level=logging.WARNING))


def run_latency(endpoints: dict[str, Endpoint],
                settings: Settings) -> tuple[list[LatencyResult], dict[str, str]]:
    """Latency per path, and the error of each path that failed."""
    paths = list(PATHS)
    samples: dict[str, list[float]] = {p: [] for p in paths}
    errors: dict[str, str] = {}
    topics = {p: f"bench-latency-{p}-{uuid.uuid4().hex[:8]}" for p in paths}
    try:
        for segment, order in enumerate((paths, paths[::-1])):
            for p in order:
                if p in errors:
                    continue
                print(f"  latency segment {segment + 1}/2 {p:<12}", flush=True)
                try:
                    if segment == 0:
                        create_topic(endpoints[p], topics[p])
                    samples[p] += latency_workload(
                        endpoints[p].bootstrap, topics[p], settings.latency_seconds / 2,
                        settings.latency_rate, settings.latency_message_bytes,
                        settings.latency_warmup_messages)
                except WORKLOAD_FAILURES as exc:
                    errors[p] = f"{type(exc).__name__}: {exc}"
                    print(f"    ERROR {errors[p]}", flush=True)
                endpoints[p].check_alive()
    finally:
        for p in paths:
            delete_topic(endpoints[p], topics[p])
    results = [LatencyResult(p, len(v), percentile(v, 0.5), percentile(v, 0.99),
                             statistics.fmean(v), max(v))
               for p, v in samples.items() if v and p not in errors]
    return results, errors


def run_profile(endpoint: Endpoint, settings: Settings, stamp: str,
                workdir: Path) -> dict[str, ProfileResult]:
    """Extra, unscored proxy rounds under py-spy: one produce+fetch round for the SVG flame
    graph, then a produce and a fetch of one more topic, each recorded on its own as raw
    stacks to rank functions by own time. Returns the profiles by workload."""
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if pyspy is None or endpoint.middlebox is None:
        print("  --profile: py-spy not found (pip install py-spy); skipping the profile")
        return {}
    pid = endpoint.middlebox.pid
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    svg = RESULTS_DIR / f"profile-{stamp}.svg"
    duration = 60 + int(4 * settings.messages * settings.message_bytes / (20 * MB))

    def both() -> None:
        result = run_throughput_round(endpoint, -1, 0, settings)
        print(f"  profile      {endpoint.name:<12} {_round_cell(result)}", flush=True)

    native = True
    got_svg = pyspy_record(pyspy, pid, svg, "flamegraph", native, duration, both, workdir)
    if not got_svg:                       # --native needs ptrace and unwinding support
        native = False
        got_svg = pyspy_record(pyspy, pid, svg, "flamegraph", native, duration, both, workdir)

    topic = f"bench-profile-{uuid.uuid4().hex[:8]}"
    cpu, log = CpuMeter(pid), ClientLog()
    measured: dict[str, Measurement] = {}

    def one(kind: str) -> Callable[[], None]:
        def workload() -> None:
            try:
                if kind == "produce":
                    m = produce_workload(endpoint.bootstrap, topic, settings.messages,
                                         settings.message_bytes, cpu, log)
                else:
                    m = fetch_workload(endpoint.bootstrap, topic, settings.messages, cpu, log)
            except WORKLOAD_FAILURES as exc:
                print(f"  profile      {kind}: ERROR {type(exc).__name__}: {exc}", flush=True)
                return
            measured[kind] = m
            print(f"  profile      {endpoint.name:<12} {kind} {m.mb_per_s:7.1f} MB/s in "
                  f"{m.seconds:5.2f}s  (proxy cpu {_fmt(m.middlebox_cpu_s, '.2f')}s, "
                  f"{_fmt(m.middlebox_cpu_s_per_gb, '.2f')} s/GB)", flush=True)
        return workload

    profiles: dict[str, ProfileResult] = {}
    try:
        create_topic(endpoint, topic)
        for kind in ("produce", "fetch"):
            if kind == "fetch" and "produce" not in measured:
                break                      # nothing to read
            raw = RESULTS_DIR / f"profile-{stamp}-{kind}.txt"
            got_raw = pyspy_record(pyspy, pid, raw, "raw", native, duration, one(kind), workdir)
            text = raw.read_text() if got_raw else ""
            total, idle, waiting, top = own_time_from_raw(text)
            profiles[kind] = ProfileResult(str(svg) if got_svg else None,
                                           str(raw) if got_raw else None, native, total, idle,
                                           top, waiting, busy_parts(text))
    except WORKLOAD_FAILURES as exc:
        print(f"  profile: ERROR {type(exc).__name__}: {exc}", flush=True)
    finally:
        delete_topic(endpoint, topic)
    endpoint.check_alive()
    return profiles


def describe_environment() -> dict[str, Any]:
    def output(argv: list[str]) -> str | None:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10,
                                  cwd=BENCH_DIR).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "tansu": output([tansu_binary(), "--version"]),
        "git_commit": output(["git", "rev-parse", "HEAD"]),
        "git_dirty": bool(output(["git", "status", "--porcelain", "--", "protocol", "proxy"])),
        "loadavg_at_start": os.getloadavg(),
    }


def run_benchmark(settings: Settings, stamp: str | None = None) -> BenchResult:
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="proxy-bench-")))
        endpoints = start_environment(stack, workdir, settings.features)
        pids = {name: ep.middlebox.pid for name, ep in endpoints.items() if ep.middlebox}
        features = feature_config(settings.features, workdir)
        result = BenchResult(settings, describe_environment(), pids, started_at=stamp,
                             proxy_features=features)
        print(f"tansu {endpoints[DIRECT].bootstrap} | proxy {endpoints[PROXY].bootstrap} "
              f"(pid {pids[PROXY]}) | tansu-proxy {endpoints[TANSU_PROXY].bootstrap} "
              f"(pid {pids[TANSU_PROXY]})", flush=True)
        print(f"proxy features: {FEATURES_DESCRIPTION[settings.features]}", flush=True)

        foreign, measuring_since = ForeignCpu(), time.monotonic()
        for round_no in range(settings.rounds + 1):
            label = "warm-up" if round_no == 0 else f"round {round_no}/{settings.rounds}"
            for position, name in enumerate(rotated(PATHS, round_no)):
                r = run_throughput_round(endpoints[name], round_no, position, settings)
                result.rounds.append(r)
                print(f"  {label:<12} {name:<12} {_round_cell(r)}", flush=True)

        result.latency, result.latency_errors = run_latency(endpoints, settings)
        result.measured_s = time.monotonic() - measuring_since
        result.foreign_cpu_s = foreign.seconds()
        if settings.profile:
            result.profiles = run_profile(endpoints[PROXY], settings, stamp, workdir)
        ours = endpoints[PROXY].middlebox
        if "capture" in features and ours is not None:
            endpoints[PROXY].close_admin()
            ours.stop()                        # the capture closes its last file
            result.capture = capture_summary(features)
    result.duration_s = time.monotonic() - started
    result.loadavg_at_end = os.getloadavg()
    return result


# ---------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class PathSummary:
    path: str
    produce_mb_s: float | None           # median over measured rounds
    fetch_mb_s: float | None
    produce_ratio: float | None          # median over rounds of (path / direct in that round)
    fetch_ratio: float | None
    produce_cpu_s_per_gb: float | None   # median, of the proxy process in between
    fetch_cpu_s_per_gb: float | None
    failed_rounds: int


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def per_round_ratios(result: BenchResult, path: str, kind: str) -> list[float | None]:
    measured = [r for r in result.rounds if not r.warmup]
    by_round: dict[int, dict[str, RoundResult]] = {}
    for r in measured:
        by_round.setdefault(r.round, {})[r.path] = r
    ratios: list[float | None] = []
    for round_no in sorted(by_round):
        mine = getattr(by_round[round_no].get(path), kind, None)
        base = getattr(by_round[round_no].get(DIRECT), kind, None)
        ratios.append(mine.mb_per_s / base.mb_per_s if mine and base else None)
    return ratios


def summarize(result: BenchResult) -> list[PathSummary]:
    out = []
    for path in PATHS:
        rounds = [r for r in result.rounds if r.path == path and not r.warmup]
        produce = [r.produce for r in rounds]
        fetch = [r.fetch for r in rounds]
        out.append(PathSummary(
            path,
            _median([m.mb_per_s if m else None for m in produce]),
            _median([m.mb_per_s if m else None for m in fetch]),
            _median(per_round_ratios(result, path, "produce")),
            _median(per_round_ratios(result, path, "fetch")),
            _median([m.middlebox_cpu_s_per_gb if m else None for m in produce]),
            _median([m.middlebox_cpu_s_per_gb if m else None for m in fetch]),
            sum(1 for r in rounds if r.error),
        ))
    return out


def target_verdict(summaries: list[PathSummary]) -> tuple[bool, str]:
    ours = next(s for s in summaries if s.path == PROXY)
    parts, ok = [], ours.failed_rounds == 0
    for kind, ratio in (("produce", ours.produce_ratio), ("fetch", ours.fetch_ratio)):
        good = ratio is not None and ratio >= TARGET_RATIO
        ok = ok and good
        parts.append(f"{kind} {_fmt(ratio, '.2f')} {'PASS' if good else 'FAIL'}")
    if ours.failed_rounds:
        parts.append(f"{ours.failed_rounds} failed round(s)")
    return ok, ", ".join(parts)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _share(part: float | None, whole: float) -> float | None:
    return None if part is None or whole <= 0 else part / whole


def _loadavg(values: tuple[float, ...] | None) -> str:
    return "-" if values is None else "/".join(f"{v:.2f}" for v in values)


def _round_cell(r: RoundResult) -> str:
    if r.error:
        return f"ERROR {r.error}"
    warnings = f"  [{r.client_warnings}]" if r.client_warnings else ""
    p, f = r.produce, r.fetch
    assert p is not None and f is not None
    cpu = ""
    if p.middlebox_cpu_s is not None and f.middlebox_cpu_s is not None:
        cpu = f"  (proxy cpu {p.middlebox_cpu_s:.2f}s / {f.middlebox_cpu_s:.2f}s)"
    return (f"produce {p.mb_per_s:7.1f} MB/s in {p.seconds:5.2f}s  "
            f"fetch {f.mb_per_s:7.1f} MB/s in {f.seconds:5.2f}s{cpu}{warnings}")


def format_report(result: BenchResult) -> str:
    s = result.settings
    summaries = summarize(result)
    lines = [
        "",
        f"kafka-quota-proxy benchmark ({'quick, ' if s.quick else ''}1 warm-up + {s.rounds} "
        f"rounds, {s.messages} x {s.message_bytes} B per workload, 1 partition, acks=1, "
        f"linger.ms=5, batch.size=1MB; MB = 10^6 B; {result.environment['cpus']} CPUs)",
        f"proxy features: {FEATURES_DESCRIPTION.get(s.features, s.features)}",
        "",
        "throughput: median over rounds; ratio = median of the per-round ratios to direct",
        f"  {'path':<12} {'produce MB/s':>12} {'fetch MB/s':>11} {'produce/direct':>15} "
        f"{'fetch/direct':>13} {'failed':>7}",
    ]
    for p in summaries:
        lines.append(
            f"  {p.path:<12} {_fmt(p.produce_mb_s, '.1f'):>12} {_fmt(p.fetch_mb_s, '.1f'):>11} "
            f"{_fmt(p.produce_ratio, '.2f'):>15} {_fmt(p.fetch_ratio, '.2f'):>13} "
            f"{p.failed_rounds:>7}")

    lines += ["", "per round, MB/s produce / fetch (order = measuring order in that round)"]
    lines.append(f"  {'round':<6} {'order':<30} " + " ".join(f"{p:>15}" for p in PATHS))
    for round_no in sorted({r.round for r in result.rounds}):
        rs = sorted((r for r in result.rounds if r.round == round_no), key=lambda r: r.position)
        by_path = {r.path: r for r in rs}
        cells = []
        for path in PATHS:
            r = by_path.get(path)
            if r is None or r.error or r.produce is None or r.fetch is None:
                cells.append(f"{'ERROR':>15}")
            else:
                cells.append(f"{r.produce.mb_per_s:>7.1f}/{r.fetch.mb_per_s:<7.1f}")
        name = "warm" if round_no == 0 else str(round_no)
        lines.append(f"  {name:<6} {','.join(r.path for r in rs):<30} " + " ".join(cells))
    for path in (PROXY, TANSU_PROXY):
        for kind in ("produce", "fetch"):
            ratios = per_round_ratios(result, path, kind)
            lines.append(f"  {path + '/direct ' + kind:<30} per round: "
                         + " ".join(_fmt(x, '.2f') for x in ratios))

    lines += ["", f"latency: {s.latency_message_bytes} B messages at {s.latency_rate:.0f} msg/s, "
              f"linger.ms=0, acks=1, 1 in flight, {s.latency_seconds:.0f} s per path "
              "(produce() -> delivery report)"]
    lines.append(f"  {'path':<12} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
                 f"{'max ms':>8} {'p50/direct':>11} {'p99/direct':>11} {'p99 added ms':>13}")
    base = next((lat for lat in result.latency if lat.path == DIRECT), None)
    for lat in result.latency:
        r50 = lat.p50_ms / base.p50_ms if base else None
        r99 = lat.p99_ms / base.p99_ms if base else None
        added = lat.p99_ms - base.p99_ms if base else None
        lines.append(f"  {lat.path:<12} {lat.samples:>6} {lat.p50_ms:>8.3f} {lat.p99_ms:>8.3f} "
                     f"{lat.mean_ms:>8.3f} {lat.max_ms:>8.3f} {_fmt(r50, '.2f'):>11} "
                     f"{_fmt(r99, '.2f'):>11} {_fmt(added, '+.3f'):>13}")

    lines += ["", "proxy process CPU (user+sys) per GB forwarded, median over rounds"]
    lines.append(f"  {'path':<12} {'produce s/GB':>13} {'fetch s/GB':>11}")
    for p in summaries:
        if p.path != DIRECT:
            lines.append(f"  {p.path:<12} {_fmt(p.produce_cpu_s_per_gb, '.2f'):>13} "
                         f"{_fmt(p.fetch_cpu_s_per_gb, '.2f'):>11}")

    if result.capture is not None:
        c = result.capture
        lines.append(f"  capture wrote {c['records']} records in {c['parquet_files']} Parquet "
                     f"file(s) ({c['files']} files, {c['bytes'] / MB:.2f} MB)")

    for kind, prof in result.profiles.items():
        busy = max(prof.samples - prof.idle_samples - prof.waiting_samples, 1)
        lines += ["", f"py-spy profile of the proxy, {kind} (extra unscored round, "
                      f"{'with' if prof.native else 'without'} native frames): {prof.samples} "
                      f"samples of all threads, {prof.idle_samples} idle in epoll, "
                      f"{prof.waiting_samples} blocked on a lock, a queue or the GIL, {busy} "
                      "busy; top functions by own time, % of the busy samples"]
        for frame, count in prof.top_own:
            lines.append(f"  {100 * count / busy:5.1f}%  {frame}")
        if prof.parts:
            lines.append("  busy samples through each part (a sample may count in several): "
                         + ", ".join(f"{name} {100 * n / busy:.1f}%"
                                     for name, n in prof.parts.items()))
        lines.append(f"  raw stacks:  {prof.raw or '-'}")
    if result.profiles:
        svg = next(iter(result.profiles.values())).svg
        lines.append(f"  flame graph (produce + fetch): {svg or '-'}")

    errors = [f"  round {r.round} {r.path}: {r.error}" for r in result.rounds if r.error]
    errors += [f"  latency {path}: {error}" for path, error in result.latency_errors.items()]
    if errors:
        lines += ["", "errors:", *errors]

    ok, detail = target_verdict(summaries)
    lines += ["", f"target: proxy/direct >= {TARGET_RATIO} for produce and fetch (median): "
                  f"{'PASS' if ok else 'FAIL'} ({detail})",
              f"total time {result.duration_s:.0f} s; load average (1/5/15 min) at start "
              f"{_loadavg(result.environment['loadavg_at_start'])}, at end "
              f"{_loadavg(result.loadavg_at_end)}",
              f"other processes used {_fmt(result.foreign_cpu_s, '.1f')} CPU-s during the "
              f"{result.measured_s:.0f} s of measurements "
              f"({_fmt(_share(result.foreign_cpu_s, result.measured_s), '.0%')} of one core; "
              "should be near 0)"]
    return "\n".join(lines)


def result_to_json(result: BenchResult) -> dict[str, Any]:
    data = asdict(result)
    data["summary"] = [asdict(s) for s in summarize(result)]
    ok, detail = target_verdict(summarize(result))
    data["target"] = {"ratio": TARGET_RATIO, "pass": ok, "detail": detail}
    data["features"] = result.settings.features
    return data


def write_json(result: BenchResult) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "" if result.settings.features == FEATURES_NONE else f"-{result.settings.features}"
    path = RESULTS_DIR / f"proxy_bench{suffix}-{result.started_at}.json"
    path.write_text(json.dumps(result_to_json(result), indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="measured rounds after the warm-up (5)")
    parser.add_argument("--messages", type=int, help="messages per workload (200000)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 rounds of 50000 messages, 2 s latency per path")
    parser.add_argument("--latency-rate", type=float,
                        help="messages per second of the latency workload (500; issue 31's "
                        "target is at 50000)")
    parser.add_argument("--latency-seconds", type=float,
                        help="seconds of the latency workload per path (5)")
    parser.add_argument("--profile", action="store_true",
                        help="record the proxy with py-spy during extra, unscored rounds "
                        "(produce and fetch profiled apart)")
    parser.add_argument("--features", choices=FEATURE_SETS, default=FEATURES_NONE,
                        help="what the proxy has on: none (default), or all that leave the "
                        "bytes unchanged (quotas not binding, capture, fetch routing whose "
                        "rack rule matches no client)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"profile": args.profile, "features": args.features}
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.messages is not None:
        overrides["messages"] = args.messages
    if args.latency_rate is not None:
        overrides["latency_rate"] = args.latency_rate
    if args.latency_seconds is not None:
        overrides["latency_seconds"] = args.latency_seconds
    settings = Settings.quick_mode(**overrides) if args.quick else Settings(**overrides)
    if settings.rounds < 1 or settings.messages < 1:
        parser.error("--rounds and --messages must be at least 1")
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
