#!/usr/bin/env python
"""Accuracy and reaction of budgets shared by several proxy processes (issue 16), live: real
proxy processes (workers and instances) in front of one tansu, real librdkafka producers.

Scenarios (each quota 1 MB/s unless ``--quota``, Kafka's 11 x 1 s window, 64 KB
batches unless ``--batch-bytes``):

- ``8conns-2workers``: one client-id, 8 producers, one instance of 2 workers (SO_REUSEPORT
  spreads their connections);
- ``8conns-2instances``: the same over 2 instances of 1 worker (4 producers on each);
- ``50clients-2instances``: 50 producers of one user (SASL SCRAM, a per-user quota), each its
  own client-id, 25 on each of 2 instances;
- ``move``: one producer on instance a for ``--move-after`` s, then on instance b for 30 s:
  the most bytes in one quota window (11 s) within 22 s after the move, against the same
  client staying on a (``still``): the excess, in seconds of quota (uncoordinated, b gives a
  fresh budget: about 10 s of quota more); and b's first throttle after its first request.

Each accuracy scenario runs in up to three variants: ``one`` (every producer on one process:
what one broker gives), ``none`` (the scenario's processes, no coordination: today's) and
``shared`` (coordination on). Figures: the achieved rate over whole throttle cycles after a
warm-up (``testkit.rates.cycle_rate``: the first two or so; ``all``: every whole cycle
of the run, with the lowest and highest over 30 s of cycles, as ``coordination_sim.py``) and
over the whole run against what one enforcement point allows a greedy client (its quota over
the run plus the padded first window), all as ratios to the quota.

    python bench/shared_budgets_bench.py [--seconds 60] [--scenarios a,b] [--variants shared]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.rates import Cycles, cycle_rate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordination_sim import most_in_a_window

QUOTA = 1_000_000
BATCH_BYTES = [65536]  # librdkafka batch.size of every producer (--batch-bytes)
VALUE = b"b" * 1000
WARMUP_S = 12.0
PASSWORD = "bench-secret"
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Scenario:
    instances: int
    workers: int
    clients: int
    per_user: bool


SCENARIOS = {
    "8conns-2workers": Scenario(1, 2, 8, False),
    "8conns-2instances": Scenario(2, 1, 8, False),
    "50clients-2instances": Scenario(2, 1, 50, True),
}


def _users(path: Path) -> Path:
    path.write_text(add_user("", "alice", PASSWORD, iterations=4096))
    return path


def _instance(tansu: TansuBroker, name: str, workers: int, coordinate: bool, users: Path,
              capture: Path | None = None) -> ProxyProcess:
    extra = f"""workers: {workers}
coordination: {{enabled: {str(coordinate).lower()}, instance: "{name}"}}
quotas:
  window: {{samples: 11, size_seconds: 1}}
  entities:
    - {{user: alice, producer_byte_rate: {QUOTA}}}
    - {{client-id: spread, producer_byte_rate: {QUOTA}}}
"""
    if capture is not None:
        extra += f'capture: {{dir: "{capture}", rotate_seconds: 5}}\n'
    proxy = ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      mechanisms: [SCRAM-SHA-256]
      credentials_file: "{users}"
""", extra_yaml=extra, log_level="info")
    return proxy


def _start(proxies: list[ProxyProcess]) -> None:
    for p in proxies:
        p.start()
    for p in proxies:
        p.wait_broker_listener(111, 60)


def _produce(bootstrap: str, client_id: str, topic: str, seconds: float,
             delivered: list[tuple[float, int]], errors: list[str],
             stop: threading.Event | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id,
                         "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                         "sasl.password": PASSWORD, "acks": "1", "linger.ms": 5,
                         "batch.size": BATCH_BYTES[0], "queue.buffering.max.kbytes": 2048})

    def done(err: object, msg: Any) -> None:
        if err is not None:
            if "Purged" not in str(err):
                errors.append(str(err))
        else:
            delivered.append((time.monotonic(), len(msg.value())))

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        try:
            producer.produce(topic, value=VALUE, on_delivery=done)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(60)


def run_accuracy(tansu: TansuBroker, name: str, variant: str, seconds: float,
                 work: Path) -> dict[str, Any]:
    s = SCENARIOS[name]
    instances, workers, coordinate = s.instances, s.workers, variant == "shared"
    if variant == "one":
        instances, workers = 1, 1
    users = _users(work / f"users-{name}-{variant}.yaml")
    proxies = [_instance(tansu, f"{n}", workers, coordinate, users)
               for n in "ab"[:instances]]
    _start(proxies)
    try:
        if workers > 1:  # every worker listening (else the first takes every connection)
            for p in proxies:
                wait_for(lambda p=p: _gauge(p, "kafka_proxy_workers") == [workers, 0]
                         or _gauge(p, "kafka_proxy_workers") == [0, workers], 60,
                         what="every worker ready")
        if coordinate:
            total = instances * workers
            for p in proxies:
                wait_for(lambda p=p: _gauge(p, "kafka_proxy_shared_quota_live_processes")
                         == [total] * workers, 60, what="every process seen")
        topic = new_topic(tansu.bootstrap, "bench", partitions=2)
        delivered: list[tuple[float, int]] = []
        errors: list[str] = []
        threads = []
        for i in range(s.clients):
            client_id = f"app-{i}" if s.per_user else "spread"
            threads.append(threading.Thread(target=_produce, args=(
                proxies[i % instances].bootstrap, client_id, topic, seconds, delivered,
                errors)))
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 120)
        events = [(t - start, n) for t, n in delivered]
        cycles = cycle_rate(events, WARMUP_S, QUOTA) / QUOTA
        whole, low, high = Cycles(sorted(events), QUOTA).whole(WARMUP_S)
        run = sum(n for _, n in events) / (QUOTA * (seconds + 10))
        stats = {}
        spread = []  # produce requests recorded by each process
        for p in proxies:
            m = p.metrics()
            stats[p.bootstrap] = {k: v for k, v in m.items()
                                  if "report_age_max" in k or "fallback_checks" in k}
            for w in range(workers):
                label = f'worker="{w}"' if workers > 1 else ""
                spread.append(int(sum(
                    v for k, v in m.items()
                    if k.startswith("kafka_proxy_requests_total{") and 'api="produce"' in k
                    and label in k)))
        return {"scenario": name, "variant": variant, "cycles": round(cycles, 3),
                "all_cycles": round(whole, 3), "low": round(low, 3), "high": round(high, 3),
                "run": round(run, 3), "errors": len(errors), "processes": instances * workers,
                "produce_requests_per_process": spread, "metrics": stats}
    finally:
        for p in proxies:
            p.stop()


def _gauge(proxy: ProxyProcess, name: str) -> list[float]:
    try:
        metrics = proxy.metrics()
    except OSError:
        return []
    return [v for k, v in metrics.items() if k.startswith(name + "{") or k == name]


def run_move(tansu: TansuBroker, variant: str, move_after: float, after_s: float, work: Path
             ) -> dict[str, Any]:
    """One client on instance a for ``move_after`` s, then on b for ``after_s`` s (``still``:
    on a throughout, coordinated: the reference). ``excess``: the most bytes in one quota
    window (11 s) within 22 s after the move, in seconds of quota: compared with ``still``,
    what the move let through."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    coordinate = variant != "none"
    users = _users(work / f"users-move-{variant}.yaml")
    capture = work / f"capture-move-{variant}"
    a = _instance(tansu, "a", 1, coordinate, users)
    b = _instance(tansu, "b", 1, coordinate, users, capture)
    _start([a, b])
    try:
        if coordinate:
            for p in (a, b):
                wait_for(lambda p=p: _gauge(p, "kafka_proxy_shared_quota_live_processes")
                         == [2], 60, what="both processes seen")
        topic = new_topic(tansu.bootstrap, "move", partitions=1)
        delivered: list[tuple[float, int]] = []
        errors: list[str] = []
        start = time.monotonic()
        if variant == "still":
            _produce(a.bootstrap, "spread", topic, move_after + after_s, delivered, errors)
            moved = start + move_after
        else:
            _produce(a.bootstrap, "spread", topic, move_after, delivered, errors)
            moved = time.monotonic()
            _produce(b.bootstrap, "spread", topic, after_s, delivered, errors)
    finally:
        for p in (a, b):
            p.stop()
    events = sorted((t - start, n) for t, n in delivered)
    move_s = moved - start
    most = most_in_a_window(events, move_s, move_s + 22.0, 11.0) / QUOTA
    result: dict[str, Any] = {"scenario": "move", "variant": variant,
                              "most_in_a_window_s": round(most, 2),
                              "cycles": round(cycle_rate(events, WARMUP_S, QUOTA) / QUOTA, 3)}
    files = list(capture.rglob("*.parquet"))
    if variant != "still" and files:
        rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
        rows = rows[(rows.api_key == 0) & (rows.broker >= 0)].sort_values("ts_ms")
        throttled = rows[rows.throttle_produce_ms > 0]
        if len(rows) and len(throttled):
            result["ms_to_first_throttle_on_b"] = int(throttled.ts_ms.iloc[0]
                                                      - rows.ts_ms.iloc[0])
    return result


def main(argv: list[str] | None = None) -> int:
    global QUOTA
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scenarios", default=",".join([*SCENARIOS, "move"]))
    parser.add_argument("--variants", default="one,none,shared")
    parser.add_argument("--move-after", type=float, default=20.0)
    parser.add_argument("--batch-bytes", type=int, default=65536,
                        help="librdkafka batch.size of the producers (65536)")
    parser.add_argument("--quota", type=int, default=QUOTA,
                        help="every scenario's quota in bytes/s (1000000)")
    args = parser.parse_args(argv)
    BATCH_BYTES[0] = args.batch_bytes
    QUOTA = args.quota
    work = Path(tempfile.mkdtemp(prefix="shared-bench-"))
    tansu = TansuBroker(log_path=str(work / "tansu.log")).start()
    results = []
    try:
        for name in args.scenarios.split(","):
            if name == "move":
                moves = [run_move(tansu, v, args.move_after, 30.0, work)
                         for v in ("still", "none", "shared") if v == "still"
                         or v in args.variants]
                still = next(r for r in moves if r["variant"] == "still")
                for r in moves:
                    r["excess_s"] = round(r["most_in_a_window_s"]
                                          - still["most_in_a_window_s"], 2)
                    print(json.dumps(r), flush=True)
                results.extend(moves)
                continue
            for variant in args.variants.split(","):
                r = run_accuracy(tansu, name, variant, args.seconds, work)
                print(json.dumps({k: v for k, v in r.items() if k != "metrics"}), flush=True)
                results.append(r)
    finally:
        tansu.stop()
    print()
    print(f"{'scenario':24} {'variant':8} {'cycles':>7} {'all':>7} {'low':>6} {'high':>6}"
          f" {'run':>7}")
    for r in results:
        if r["scenario"] != "move":
            print(f"{r['scenario']:24} {r['variant']:8} {r['cycles']:7.3f} "
                  f"{r['all_cycles']:7.3f} {r['low']:6.3f} {r['high']:6.3f} {r['run']:7.3f}")
        else:
            print(f"move {r['variant']:6}: most in one quota window after the move "
                  f"{r['most_in_a_window_s']:.2f} s of quota (excess {r['excess_s']:+.2f} s), "
                  f"cycles {r['cycles']:.3f}, first throttle on b after "
                  f"{r.get('ms_to_first_throttle_on_b', '-')} ms")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"shared_budgets-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
