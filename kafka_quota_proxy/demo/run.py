"""``kafka-quota-proxy demo``: a local tansu broker, the proxy in front of it and four clients
authenticating as their users, with quotas:

- alice's producer (``alice-loader``) offers 3 MB/s under a per-user quota of 1 MB/s, raised to
  2 MB/s by a hot reload of the config file half-way;
- ``demo-reader`` (user bob) reads the topic from the start under a per-client-id quota of
  1.5 MB/s;
- carol produces 1 MB/s under a per-user quota of 3 MB/s, and audits the topic (every
  acknowledged message consumed exactly once).

The producer quotas are mis-sized on purpose, as an operator meets them: alice is starved while
carol has headroom she never uses.

A live table shows each client's rate, its quota, the rate its quota budget measures, and the
throttles. At the end the capture is replayed through the quota engine and tuned (Spark job):
the recommendation moves producer budget from carol to alice at the same total, says why per
entity, and the throttled client-seconds before and after are printed with where the report
is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kafka_quota_proxy.config.loading import load_config
from kafka_quota_proxy.demo.clients import (
    TOPIC,
    ClientCounters,
    DemoClient,
    consume,
    create_topic,
    produce,
)
from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port, free_port_range
from kafka_quota_proxy.demo.table import BudgetView, Rates, summary_lines, table
from kafka_quota_proxy.proxy import logs
from kafka_quota_proxy.proxy.server import Proxy
from kafka_quota_proxy.security.credentials import add_user

# One writer per partition (see demo.clients): alice's partitions 0 and 1, carol's 2.
ALICE = DemoClient("alice-loader", "alice", "alice-secret", "producer", rate=3_000_000,
                   partitions=(0, 1))
READER = DemoClient("demo-reader", "bob", "bob-secret", "consumer")
CAROL = DemoClient("carol-app", "carol", "carol-secret", "producer", rate=1_000_000,
                   partitions=(2,))
AUDIT = DemoClient("carol-audit", "carol", "carol-secret", "consumer")
CLIENTS = (ALICE, READER, CAROL, AUDIT)
ALICE_QUOTA = 1_000_000
ALICE_RELOADED = 2_000_000
READER_QUOTA = 1_500_000
CAROL_QUOTA = 3_000_000
# The short capture of a demo is tuned from whole 10 s spans, half a minute of them at least
# (a real capture is asked for 5 whole minutes): the CLI's --span-seconds and --min-minutes.
SPAN_SECONDS = 10
MIN_MINUTES = 0.5


def quotas_yaml(alice: int) -> str:
    return f"""quotas:
  window: {{samples: 11, size_seconds: 1}}   # Kafka's defaults
  watch_seconds: 0.5
  entities:
    - {{user: alice, producer_byte_rate: {alice}}}
    - {{client-id: demo-reader, consumer_byte_rate: {READER_QUOTA}}}
    - {{user: carol, producer_byte_rate: {CAROL_QUOTA}}}
"""


def config_yaml(bootstrap_port: int, ports: tuple[int, int], upstream: str, out: Path,
                alice: int, log_level: str = "warning") -> str:
    return f"""listeners:
  bootstrap: "127.0.0.1:{bootstrap_port}"
  advertised_host: "127.0.0.1"
  broker_ports: "{ports[0]}-{ports[1]}"
  security:
    protocol: SASL_PLAINTEXT
    sasl:
      mode: terminate
      mechanisms: [SCRAM-SHA-256]
      credentials_file: "{out / 'users.yaml'}"
upstream:
  bootstrap_servers: ["{upstream}"]
logging: {{format: console, level: {log_level}}}
capture:
  dir: "{out / 'capture'}"
  rotate_seconds: 10
{quotas_yaml(alice)}"""


def _write_users(path: Path) -> None:
    text = ""
    for user, password in {(c.user, c.password) for c in CLIENTS}:
        text = add_user(text, user, password, iterations=4096)
    path.write_text(text)


async def _run(seconds: float, out: Path) -> tuple[int, bool]:
    """The live part: returns (exit code, whether a capture was written)."""
    broker = TansuBroker(log_path=str(out / "tansu.log")).start()
    first, last = free_port_range(10)
    bootstrap_port = free_port(outside=(first, last))
    _write_users(out / "users.yaml")
    config_path = out / "config.yaml"
    config_path.write_text(config_yaml(bootstrap_port, (first, last), broker.bootstrap, out,
                                       ALICE_QUOTA))
    proxy = Proxy(load_config(str(config_path)), str(config_path))
    proxy.stats.track_clients(len(CLIENTS) + 16)  # the table's per-client rates
    stop_producers, stop_consumers = threading.Event(), threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    counters = {c.client_id: ClientCounters() for c in CLIENTS}
    threads: list[threading.Thread] = []
    rates = Rates()
    reloaded_at: float | None = None
    try:
        await proxy.start()
        while not proxy.registry.by_node:
            await proxy.refresh_brokers()
        await proxy.wait_listening()
        bootstrap = f"127.0.0.1:{bootstrap_port}"
        print(f"tansu broker    : {broker.bootstrap}\n"
              f"proxy bootstrap : {bootstrap} (SASL_PLAINTEXT, SCRAM-SHA-256, terminated by "
              f"the proxy)\n"
              f"topic           : {TOPIC}\n"
              f"quotas          : user alice producer_byte_rate {ALICE_QUOTA / 1e6:.1f} MB/s; "
              f"client-id demo-reader consumer_byte_rate {READER_QUOTA / 1e6:.1f} MB/s; "
              f"user carol producer_byte_rate {CAROL_QUOTA / 1e6:.1f} MB/s (mis-sized on "
              f"purpose: alice starved, carol with headroom)\n"
              f"clients         : alice-loader (alice, offers {ALICE.rate / 1e6:.1f} MB/s), "
              f"demo-reader (bob, reads from the start), carol-app (carol, "
              f"{CAROL.rate / 1e6:.1f} MB/s), carol-audit (carol, checks every message)\n"
              f"half-way        : {config_path.name} is edited: alice's quota becomes "
              f"{ALICE_RELOADED / 1e6:.1f} MB/s (hot reload, no restart)\n"
              f"files           : {out}\n"
              + ("Press Ctrl-C to stop early.\n" if seconds else "Press Ctrl-C to stop.\n"),
              flush=True)
        await asyncio.to_thread(create_topic, CAROL, bootstrap)

        def audited() -> bool:
            produced = sum(counters[c.client_id].produced for c in CLIENTS
                           if c.role == "producer")
            return counters[AUDIT.client_id].consumed >= produced

        for c in CLIENTS:
            if c.role == "producer":
                target: Any = produce
                args: tuple[Any, ...] = (c, bootstrap, stop_producers, counters[c.client_id])
            else:
                target = consume
                args = (c, bootstrap, stop_consumers, counters[c.client_id],
                        audited if c is AUDIT else None)
            threads.append(threading.Thread(target=target, args=args, name=c.client_id))
        for t in threads:
            t.start()
        started = time.monotonic()
        interval = 2.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                break
            elapsed = time.monotonic() - started
            view = BudgetView.of(proxy)
            print(f"--- {elapsed:5.1f} s ---\n{table(proxy, view, rates, CLIENTS, elapsed)}",
                  flush=True)
            if reloaded_at is None and elapsed >= (seconds / 2 if seconds else 30):
                text = config_path.read_text()
                config_path.write_text(text.replace(
                    f"producer_byte_rate: {ALICE_QUOTA}}}",
                    f"producer_byte_rate: {ALICE_RELOADED}}}"))
                await proxy.reloads.reload_config()
                reloaded_at = elapsed
                print(f">>> {config_path.name} edited: alice's quota {ALICE_QUOTA / 1e6:.1f} -> "
                      f"{ALICE_RELOADED / 1e6:.1f} MB/s, reloaded live", flush=True)
            if seconds and elapsed >= seconds:
                break
    finally:
        # Producers stop first; the auditing consumer then catches up on everything
        # acknowledged.
        stop_producers.set()
        for t in threads:
            if t.name in (ALICE.client_id, CAROL.client_id):
                await asyncio.to_thread(t.join, 90)
        stop_consumers.set()
        for t in threads:
            await asyncio.to_thread(t.join, 90)
        await proxy.shutdown()
        broker.stop()
    for line in summary_lines(rates, reloaded_at, ALICE_QUOTA, ALICE_RELOADED, READER_QUOTA,
                              CAROL_QUOTA):
        print(line)
    produced = sum(counters[c.client_id].produced for c in CLIENTS if c.role == "producer")
    audit = counters[AUDIT.client_id]
    errors = sum(len(c.errors) for c in counters.values())
    lost = produced - len(audit.seen)
    print(f"\nproduced {produced} messages (acknowledged), audited {audit.consumed}, "
          f"duplicates {audit.duplicates}, producer errors {errors}")
    exact = lost == 0 and audit.duplicates == 0 and errors == 0 and not audit.skipped
    print("every acknowledged message was consumed exactly once" if exact
          else f"MISMATCH: {lost} not consumed, {audit.duplicates} duplicates, "
               f"errors {[e for c in counters.values() for e in c.errors][:3]}; the audit "
               "stopped at (position, high watermark) per partition "
               f"{dict(sorted(audit.positions.items()))}, was handed no message at offsets "
               f"(partition, last read, next read) {audit.skipped[:5]} "
               f"({len(audit.skipped)} jumps), consumer errors {audit.consume_errors[:3]}")
    return (0 if exact else 1), any((out / "capture").glob("capture-*.parquet"))


def _replay_and_tune(out: Path) -> bool:
    """The capture replayed through the quota engine and tuned (the Spark job); prints the
    recommended config. False if Spark could not run here (no Java)."""
    if shutil.which("java") is None:
        print("\n(replay skipped: the Spark jobs need Java 17+ on PATH; then run: "
              f"{_replay_command(out)})")
        return False
    from kafka_quota_proxy.spark_jobs.main import run
    from kafka_quota_proxy.spark_jobs.tune import TuneOptions

    print("\nreplaying the capture through the quota engine and tuning (Spark) ...", flush=True)
    report = out / "report"
    # What the printed command runs: the quotas of the demo's config file as the base (the
    # config last live), the short capture's spans.
    base = load_config(str(out / "config.yaml")).quotas.model_dump(exclude_none=True)
    options = TuneOptions(min_minutes=MIN_MINUTES, span_seconds=SPAN_SECONDS)
    facts = run(str(out / "capture"), str(report), base, master="local[2]", tune=True,
                options=options)
    # (the job's inputs as passed, beside its report: what the printed command passes too)
    (report / "replay-inputs.json").write_text(json.dumps(
        {"capture": str(out / "capture"), "base": base, "tune": True,
         "options": dataclasses.asdict(options)}, indent=1))
    for key, value in facts.items():
        if key in ("requests", "reproduction match") or key.startswith("throttled"):
            print(f"{key:<54}: {value}")
    print("\nwhy, per entity:\n" + "\n".join(f"  {w}" for w in facts.get("why, per entity", [])))
    recommended = report / "recommended-quotas.yaml"
    print(f"\nrecommended config ({recommended}):\n{recommended.read_text()}"
          f"report: {report / 'report.md'} (plots: rates.png, throttles.png, before_after.png)\n"
          f"the same from the command line: {_replay_command(out)}")
    return True


def _replay_command(out: Path) -> str:
    return (f"kafka-quota-proxy replay --capture {out / 'capture'} --config "
            f"{out / 'config.yaml'} --out {out / 'report'} --tune --span-seconds "
            f"{SPAN_SECONDS} --min-minutes {MIN_MINUTES:g}")


MARKER = ".kafka-quota-proxy-demo"


def run_demo(seconds: float = 60, out_dir: str | None = None, replay: bool = True) -> int:
    import uvloop

    logs.configure("console", "warning")
    out = Path(out_dir or "kafka-quota-proxy-demo").resolve()
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():  # never delete what an earlier demo did not write
            print(f"{out} exists and was not written by the demo: choose another --out")
            return 2
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by kafka-quota-proxy demo; replaced on each run\n")
    code, captured = uvloop.run(_run(seconds, out))
    if captured and replay:
        _replay_and_tune(out)
    return code
