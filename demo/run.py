"""``kafka-quota-proxy demo``: a local tansu broker, the proxy in front of it, two producers and
a consumer going through the proxy, and a live table of what flows per client."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.loading import parse_config
from demo.embedded_broker import TansuBroker, free_port, free_port_range
from proxy import logs
from proxy.server import Proxy

TOPIC = "demo-events"


@dataclass
class ClientCounters:
    produced: int = 0
    consumed: int = 0
    errors: list[str] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)
    duplicates: int = 0


def _producer(
    bootstrap: str,
    client_id: str,
    rate: int,
    stop: threading.Event,
    counters: ClientCounters,
    burst: bool,
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            counters.produced += 1
        else:
            counters.errors.append(str(err))

    payload = b"x" * 1000
    seq = 0
    start = last = time.monotonic()
    allowance = 0.0
    while not stop.is_set():
        now = time.monotonic()
        # The bursty client sends 4x the rate for 2 s out of every 6 s, nothing otherwise.
        bursting = (now - start) % 6 < 2
        target_rate = (rate * 4 if bursting else 0) if burst else rate
        allowance = min(allowance + target_rate * (now - last), rate)
        last = now
        while allowance >= 1:
            key = b"%s-%09d" % (client_id.encode(), seq)
            try:
                producer.produce(TOPIC, key=key, value=payload, on_delivery=delivered)
            except BufferError:
                break
            seq += 1
            allowance -= 1
        producer.poll(0.02)
    producer.flush(10)


def _consumer(
    bootstrap: str, stop: threading.Event, counters: ClientCounters, produced: Any
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "demo-consumer",
            "group.id": "demo",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
    try:
        # After ``stop``, keep reading until everything acknowledged has arrived (or 20 s).
        deadline = None
        while True:
            if stop.is_set():
                deadline = deadline or time.monotonic() + 20
                if counters.consumed >= produced() or time.monotonic() > deadline:
                    break
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is None:
                    key = msg.key() or b""
                    if key in counters.seen:
                        counters.duplicates += 1
                    counters.seen.add(key)
                    counters.consumed += 1
    finally:
        consumer.close()


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "demo-admin"})
    admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(timeout=30)


def _table(proxy: Proxy, previous: dict[str, list[int]], interval: float) -> str:
    rows = []
    for client_id, (req_bytes, resp_bytes, requests) in sorted(proxy.stats.per_client.items()):
        before = previous.get(client_id, [0, 0, 0])
        rows.append(
            (
                client_id or "(none)",
                (req_bytes - before[0]) / interval / 1e6,
                (resp_bytes - before[1]) / interval / 1e6,
                (requests - before[2]) / interval,
            )
        )
        previous[client_id] = [req_bytes, resp_bytes, requests]
    lines = [f"{'client-id':<28}{'to broker MB/s':>16}{'to client MB/s':>16}{'requests/s':>12}"]
    lines += [f"{c:<28}{i:>16.2f}{o:>16.2f}{r:>12.1f}" for c, i, o, r in rows]
    return "\n".join(lines)


async def _run(seconds: float, rate: int, workdir: Path) -> int:
    broker = TansuBroker(log_path=str(workdir / "tansu.log")).start()
    first, last = free_port_range(10)
    bootstrap_port = free_port(outside=(first, last))
    config = parse_config(
        f"""
listeners:
  bootstrap: "127.0.0.1:{bootstrap_port}"
  advertised_host: "127.0.0.1"
  broker_ports: "{first}-{last}"
upstream:
  bootstrap_servers: ["{broker.bootstrap}"]
logging: {{format: console, level: warning}}
""",
        "<demo>",
    )
    proxy = Proxy(config)
    stop_producers = threading.Event()
    stop_consumer = threading.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    threads: list[threading.Thread] = []
    counters = {
        "demo-steady": ClientCounters(),
        "demo-bursty": ClientCounters(),
        "demo-consumer": ClientCounters(),
    }
    try:
        await proxy.start()
        while not proxy.registry.by_node:
            await proxy.refresh_brokers()
        await proxy.wait_listening()
        bootstrap = f"127.0.0.1:{bootstrap_port}"
        print(
            f"tansu broker      : {broker.bootstrap} (pid {broker.process.pid})"  # type: ignore[union-attr]
            f"\nproxy bootstrap   : {bootstrap}"
            f"\nproxy broker ports: "
            + ", ".join(
                f"node {b.node_id} -> {b.proxy_port}" for b in proxy.registry.by_node.values()
            )
            + f"\ntopic             : {TOPIC} (3 partitions)\n"
            "clients           : demo-steady (steady producer), demo-bursty (bursts), "
            "demo-consumer\nPress Ctrl-C to stop.\n",
            flush=True,
        )
        await asyncio.to_thread(_create_topic, bootstrap)

        def produced_count() -> int:
            return counters["demo-steady"].produced + counters["demo-bursty"].produced

        threads = [
            threading.Thread(
                target=_producer,
                args=(
                    bootstrap,
                    "demo-steady",
                    rate,
                    stop_producers,
                    counters["demo-steady"],
                    False,
                ),
            ),
            threading.Thread(
                target=_producer,
                args=(
                    bootstrap,
                    "demo-bursty",
                    rate,
                    stop_producers,
                    counters["demo-bursty"],
                    True,
                ),
            ),
            threading.Thread(
                target=_consumer,
                args=(bootstrap, stop_consumer, counters["demo-consumer"], produced_count),
            ),
        ]
        for t in threads:
            t.start()
        started = time.monotonic()
        previous: dict[str, list[int]] = {}
        interval = 2.0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                break
            elapsed = time.monotonic() - started
            print(f"--- {elapsed:5.1f} s ---\n{_table(proxy, previous, interval)}", flush=True)
            if seconds and elapsed >= seconds:
                break
    finally:
        # Producers stop first; the consumer then catches up on everything acknowledged.
        stop_producers.set()
        for t in threads[:2]:
            await asyncio.to_thread(t.join, 30)
        stop_consumer.set()
        for t in threads[2:]:
            await asyncio.to_thread(t.join, 30)
        await proxy.shutdown()
        broker.stop()
    produced = counters["demo-steady"].produced + counters["demo-bursty"].produced
    consumer = counters["demo-consumer"]
    print(
        f"\nproduced {produced} messages (acknowledged), consumed {consumer.consumed}, "
        f"duplicates {consumer.duplicates}, producer errors "
        f"{sum(len(c.errors) for c in counters.values())}"
    )
    lost = produced - len(consumer.seen)
    print(
        "every acknowledged message was consumed exactly once"
        if lost == 0 and consumer.duplicates == 0
        else f"MISMATCH: {lost} not consumed"
    )
    return 0 if consumer.duplicates == 0 and lost == 0 else 1


def run_demo(seconds: float = 0, messages_per_second: int = 2000) -> int:
    import uvloop

    logs.configure("console", "warning")
    with tempfile.TemporaryDirectory(prefix="kafka-quota-proxy-demo-") as tmp:
        result: int = uvloop.run(_run(seconds, messages_per_second, Path(tmp)))
    return result
