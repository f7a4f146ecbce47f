"""Faults drill: the broker frozen, the proxy restarted, the broker killed, under producers and a
consumer group.

Each fault gets fresh good clients (``drill_common.GoodTraffic``): ``--producers`` idempotent
producers (``acks=all``) on topics of ``--partitions`` partitions, each with its consumer (the
first in a consumer group, the others assigned), every acknowledged key to be consumed exactly
once. They run ``--warmup`` seconds, the fault strikes, they run ``--after`` seconds more, then
every acknowledged key is waited for. Per fault: acknowledged, consumed, lost, duplicated, the
recovery time (from the broker or proxy being back to the first acknowledged produce and the
first consumed message of every client, the slowest client counted), whether the proxy is
alive, tracebacks in its log, its RSS and file descriptors.

1. **broker_stop**: the broker is frozen with SIGSTOP for ``--stop-seconds`` (default 20), then
   SIGCONT. It keeps its data: full accounting, 0 lost and 0 duplicated across the fault.
2. **proxy_restart**: the proxy gets SIGTERM, drains (its in-flight requests answered, exit
   status 0, ``proxy_stopped`` logged and no ``shutdown_timeout``) and is started again at the
   same addresses (bootstrap and broker ports); the clients reconnect on their own. The broker
   is untouched: full accounting, 0 lost and 0 duplicated across the fault.
3. **broker_kill**: the broker is killed with SIGKILL and started again on the same port.
   tansu runs with memory storage here, so the restarted broker is an empty one: no topic, no
   committed offset, no idempotent-producer state. The drill recreates the topics (as an
   operator would) and, because the broker lost its log, rewinds the consumers to its start
   (each gets a fresh consumer in a fresh group: tansu does not answer OFFSET_OUT_OF_RANGE to a
   position beyond its new log end but holds the fetch until the log reaches it, so a consumer
   left alone silently skips what is produced first). The producers get a fatal
   UNKNOWN_PRODUCER_ID from the new broker, as librdkafka must when a broker forgot its
   sequence numbers; as librdkafka requires, the application recreates the producer (its
   queued messages fail, unacknowledged, and are never re-sent). Accounting: messages
   acknowledged before the kill and not yet consumed are lost *with the broker* (reported, not
   the proxy's doing: the broker comes back with no topic); messages produced after the broker
   is back and the topics recreated must each be consumed exactly once; nothing may be
   consumed twice, ever.

    python bench/drill_faults.py                       # 3 producers, 20 s SIGSTOP, ~6 minutes
    python bench/drill_faults.py --faults proxy_restart --after 20
    # the suite's version: tests/e2e/test_drill_faults.py (5 s SIGSTOP, short traffic)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.drill_common import (
    GoodTraffic,
    ProcessWatch,
    ProxyProcess,
    print_figures,
    tansu_broker,
    traceback_lines,
    wait_for,
)

FAULTS = ("broker_stop", "proxy_restart", "broker_kill")
# A producer with messages queued and no acknowledgement this long after the broker lost its
# state is wedged (see FaultTraffic)
WEDGED_S = 8.0

NOTES = {
    "broker_stop": "broker frozen (SIGSTOP) and resumed; it keeps its data: full accounting.",
    "proxy_restart": "proxy SIGTERM (drain) and restarted at the same ports; broker untouched: "
                     "full accounting.",
    "broker_kill": "broker SIGKILLed and restarted EMPTY (tansu memory storage: no topic, "
                   "offset or producer state survives). lost_with_broker = acknowledged before "
                   "the kill, not yet consumed, gone with the broker. lost/duplicated count "
                   "the messages produced after the broker was back and the topics recreated; "
                   "duplicated counts every message consumed twice, ever. Producers were "
                   "recreated after librdkafka's fatal UNKNOWN_PRODUCER_ID, or when wedged "
                   "(messages queued, nothing acknowledged for 8 s: producers_unwedged), "
                   "consumers rewound to the new log's start.",
}


class FaultTraffic(GoodTraffic):
    """``GoodTraffic`` that survives a broker which lost its state.

    - The producer is recreated after a fatal error (librdkafka's contract: a fatal producer
      is unusable); its queued messages are purged, never acknowledged, never re-sent.
      ``fatal`` lists the fatal errors (none is expected unless the broker lost its state).
    - ``rewind()`` replaces the consumer by a fresh one in a fresh group, reading from the
      start of the log (after a broker restarted empty).
    - ``consumed_total`` counts every consumed message (for the recovery time).
    - Stopping flushes for at most ``flush_seconds``: after a broker restarted empty, an
      idempotent librdkafka producer can keep a partition's messages queued with no request
      outstanding (its sequence state no longer matches the broker's) and ``flush`` would wait
      for ``message.timeout.ms``. What is still queued then is purged and counted in
      ``unsettled``: never acknowledged, never re-sent.
    - Such a producer is wedged for good while it runs, not only at the end: once the broker
      has lost its state (``broker_lost_state()``), a producer with messages queued and no
      acknowledgement for ``WEDGED_S`` is replaced like a fatal one (its queue purged, never
      acknowledged, never re-sent) and counted in ``unwedged``. Only then: with a broker that
      kept its state, a wedged producer is the proxy's fault and fails the drill.
    """

    def __init__(self, *args: Any, session_timeout_ms: int | None = None,
                 flush_seconds: float = 300.0, **kwargs: Any) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.flush_seconds = flush_seconds
        self.unsettled = 0
        self.fatal: list[str] = []
        self.consumed_total = 0
        self.newest_consumed = -1  # the highest key sequence number consumed
        self.consumers = 0
        self.unwedged = 0
        self._lost_state_at: float | None = None
        self._acked_at_loss = 0
        self._rewind = threading.Event()
        super().__init__(*args, **kwargs)

    def rewind(self) -> None:
        self._rewind.set()

    def broker_lost_state(self) -> None:
        self._acked_at_loss = len(self.acked)
        self._lost_state_at = time.monotonic()

    def _wedged(self, producer: Any) -> bool:
        since = self._lost_state_at
        if since is None:
            return False
        if len(self.acked) > self._acked_at_loss:
            self._lost_state_at = None  # acknowledged again: not wedged
            return False
        return time.monotonic() - since > WEDGED_S and len(producer) > 0

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, "client.id": self.name,
                         "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 300_000,
                         # the drill recreates the topics after the broker restarts empty (a
                         # producer's Metadata request would create them with the broker's
                         # default partition count)
                         "allow.auto.create.topics": False})

    def _produce(self) -> None:
        from confluent_kafka import KafkaError, KafkaException

        def replace(producer: Any, exc: Exception | None) -> Any:
            if isinstance(exc, SystemError):
                # confluent-kafka can surface a fatal producer's pending error this way ("a
                # result with an exception set") from poll or flush: fatal all the same
                self.fatal.append(repr(exc))
            elif exc is not None:
                error = exc.args[0]
                if not (error.fatal() or error.code() == KafkaError._FATAL):
                    raise exc
                self.fatal.append(str(error))
            with contextlib.suppress(KafkaException, SystemError):
                producer.purge()
                producer.flush(10)  # serves the purged messages' delivery reports
            return self._new_producer()

        producer = self._new_producer()
        start = time.monotonic()
        while not self._stop.is_set():
            try:
                self._send_due(producer, start)
            except (KafkaException, SystemError) as exc:
                producer = replace(producer, exc)
            if self._wedged(producer):
                self.unwedged += 1
                producer = replace(producer, None)
                self.broker_lost_state()  # watched again from now
        deadline = time.monotonic() + self.flush_seconds
        while True:
            try:
                self.unsettled = producer.flush(max(deadline - time.monotonic(), 0))
                break
            except (KafkaException, SystemError) as exc:
                producer = replace(producer, exc)
        if self.unsettled:
            producer.purge()
            with contextlib.suppress(KafkaException):
                producer.flush(10)  # serves the purged messages' delivery reports

    def _consume(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        config = {"bootstrap.servers": self.bootstrap, "client.id": f"{self.name}-reader",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True}
        if self.session_timeout_ms:
            config["session.timeout.ms"] = self.session_timeout_ms
        while not self._stop_consuming.is_set():
            self._rewind.clear()
            consumer = Consumer({**config, "group.id": f"{self.name}-{uuid.uuid4().hex[:6]}"})
            self.consumers += 1
            if self.group:
                consumer.subscribe([self.topic])
            else:
                consumer.assign([TopicPartition(self.topic, p, 0)
                                 for p in range(self.partitions)])
            try:
                while not self._stop_consuming.is_set() and not self._rewind.is_set():
                    for m in consumer.consume(500, 0.2):
                        if m.error() is None:
                            self.consumed[m.key()] += 1
                            self.consumed_total += 1
                            self.newest_consumed = max(self.newest_consumed, _seq(m.key()))
            finally:
                consumer.close()

    def stop_producing(self) -> None:
        self._stop.set()
        self._threads[0].join(self.flush_seconds + 30)


def _seq(key: bytes) -> int:
    return int(key.rsplit(b"-", 1)[1])


@dataclass
class Settings:
    producers: int = 3
    rate: float = 300.0  # messages/s per producer
    partitions: int = 3
    warmup_seconds: float = 30.0  # traffic before the fault
    after_seconds: float = 60.0  # traffic after the fault
    stop_seconds: float = 20.0  # SIGSTOP length
    # The consumers' session.timeout.ms (None: librdkafka's 45 s). tansu makes a group join
    # take half of it (at least 3 s), through the proxy or not; it must outlast the SIGSTOP.
    session_timeout_ms: int | None = None
    recover_timeout: float = 60.0
    drain_seconds: float = 120.0  # for every acknowledged message to be consumed at the end
    flush_seconds: float = 300.0  # for the producers' queues at the end (then purged, counted)


class Recovery:
    """When every client has recovered since the fault ended (now): its first acknowledgement,
    and its first consumption of a message produced since (so fetched since: a message
    prefetched before the fault and consumed from the client's queue does not count)."""

    def __init__(self, traffic: list[FaultTraffic]) -> None:
        self.traffic = traffic
        self.since = time.monotonic()
        self.base = [(len(t.acked), t.sent) for t in traffic]
        self.acked_at: list[float | None] = [None] * len(traffic)
        self.read_at: list[float | None] = [None] * len(traffic)

    def _check(self) -> bool:
        now = time.monotonic()
        for i, t in enumerate(self.traffic):
            if self.acked_at[i] is None and len(t.acked) > self.base[i][0]:
                self.acked_at[i] = now
            if self.read_at[i] is None and t.newest_consumed >= self.base[i][1]:
                self.read_at[i] = now
        return None not in self.acked_at and None not in self.read_at

    def wait(self, timeout: float) -> dict[str, float | None]:
        with contextlib.suppress(AssertionError):
            wait_for(self._check, timeout, interval=0.02, what="every client to recover")

        def span(at: list[float | None]) -> float | None:
            done = [a for a in at if a is not None]
            return round(max(done) - self.since, 2) if len(done) == len(at) else None

        return {"recovery_produce_s": span(self.acked_at),
                "recovery_consume_s": span(self.read_at)}


def _log_events(proxy: ProxyProcess, offset: int) -> list[dict[str, Any]]:
    """The proxy's JSON log events after byte ``offset`` of its log."""
    with open(proxy.log_path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def _recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    seen: list[str] = []

    def created() -> bool:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=10)
        except Exception as exc:  # the broker or the proxy's connection to it may be starting
            seen.append(str(exc))
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                return False
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        seen.append(f"{meta.error} {len(meta.partitions)} partitions")
        return meta.error is None and len(meta.partitions) >= partitions

    try:
        wait_for(created, 30, interval=0.2, what=f"topic {topic} recreated")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen[-3:]}") from None


def _topics(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient

    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).topics
    return sum(1 for n in names if not n.startswith("__"))


def _broker_stop(broker: TansuBroker, s: Settings) -> dict[str, Any]:
    assert broker.process is not None
    pid = broker.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(s.stop_seconds)  # the fault's length, not a wait for a condition
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"fault_seconds": s.stop_seconds}


def _proxy_restart(proxy: ProxyProcess) -> dict[str, Any]:
    offset = proxy.log_path.stat().st_size
    ports = (proxy.bootstrap_port, proxy.ports)
    start = time.monotonic()
    exit_code = proxy.stop(signal.SIGTERM, timeout=60)
    drain = time.monotonic() - start
    events = [e.get("event") for e in _log_events(proxy, offset)]
    proxy.start()
    assert (proxy.bootstrap_port, proxy.ports) == ports  # the clients' addresses
    return {"fault_seconds": round(time.monotonic() - start, 2),
            "drain_seconds": round(drain, 2), "exit_code": exit_code,
            "drained": "proxy_stopped" in events and "shutdown_timeout" not in events}


def _run_fault(fault: str, broker: TansuBroker, proxy: ProxyProcess, s: Settings
               ) -> dict[str, Any]:
    tracebacks = traceback_lines(proxy)
    assert proxy.process is not None
    watches = [ProcessWatch(proxy.process.pid).start()]
    traffic = [FaultTraffic(proxy.bootstrap, rate=s.rate, partitions=s.partitions,
                            group=i == 0, name=f"{fault.replace('_', '')}{i}",
                            session_timeout_ms=s.session_timeout_ms,
                            flush_seconds=s.flush_seconds)
               for i in range(s.producers)]
    for t in traffic:
        t.start()
    try:
        wait_for(lambda: all(t.acked and t.consumed_total for t in traffic), 60, interval=0.1,
                 what="every client producing and consuming")
        time.sleep(s.warmup_seconds)  # traffic before the fault, not a wait for a condition
        figures: dict[str, Any] = {}
        acked_at_kill = [0] * len(traffic)
        sent_at_back = [0] * len(traffic)
        if fault == "broker_stop":
            figures.update(_broker_stop(broker, s))
            recovery = Recovery(traffic)
        elif fault == "proxy_restart":
            figures.update(_proxy_restart(proxy))
            recovery = Recovery(traffic)
            watches.append(ProcessWatch(proxy.process.pid).start())
        elif fault == "broker_kill":
            assert broker.process is not None
            acked_at_kill = [len(t.acked) for t in traffic]
            start = time.monotonic()
            broker.process.kill()
            broker.process.wait(10)
            broker.process = None
            broker.start()  # same port, memory storage: empty
            figures["fault_seconds"] = round(time.monotonic() - start, 2)
            recovery = Recovery(traffic)
            figures["topics_after_restart"] = _topics(proxy.bootstrap)
            for t in traffic:
                _recreate_topic(proxy.bootstrap, t.topic, t.partitions)
            for i, t in enumerate(traffic):
                sent_at_back[i] = t.sent
                t.rewind()
                t.broker_lost_state()
        else:
            raise ValueError(f"unknown fault {fault!r}")
        figures.update(recovery.wait(s.recover_timeout))
        time.sleep(s.after_seconds)  # traffic after the fault, not a wait for a condition
    finally:
        for t in traffic:
            t.stop_producing()
    figures["proxy_alive"] = proxy.alive

    # Every message that must be consumed, waited for (then the tallies).
    def must(i: int, t: FaultTraffic) -> list[bytes]:
        if fault != "broker_kill":
            return t.acked
        return [k for k in t.acked if _seq(k) >= sent_at_back[i]]

    needed = [must(i, t) for i, t in enumerate(traffic)]
    with contextlib.suppress(AssertionError):
        wait_for(lambda: all(k in t.consumed for t, keys in zip(traffic, needed, strict=True)
                             for k in keys), s.drain_seconds, interval=0.2,
                 what="every acknowledged message consumed")
    tallies = [t.stop(drain_seconds=0) for t in traffic]
    watched = [w.stop() for w in watches]

    acked = sum(x.acked for x in tallies)
    out: dict[str, Any] = {"fault_seconds": figures.pop("fault_seconds")}
    if fault == "broker_stop":
        out["sigstop_seconds"] = out.pop("fault_seconds")
    out |= {"producers": s.producers, "partitions": s.partitions,
            "sent": sum(x.sent for x in tallies), "acknowledged": acked,
            "consumed": sum(x.consumed for x in tallies)}
    if fault == "broker_kill":
        before = [set(t.acked[:n]) for t, n in zip(traffic, acked_at_kill, strict=True)]
        after = [set(keys) for keys in needed]
        around = [{k for k in t.acked[n:] if _seq(k) < b}
                  for t, n, b in zip(traffic, acked_at_kill, sent_at_back, strict=True)]
        out |= {
            "topics_after_restart": figures.pop("topics_after_restart"),
            "acked_before_kill": sum(len(b) for b in before),
            "lost_with_broker": sum(1 for t, b in zip(traffic, before, strict=True)
                                    for k in b if k not in t.consumed),
            "acked_around_kill": sum(len(a) for a in around),
            "around_kill_consumed": sum(1 for t, a in zip(traffic, around, strict=True)
                                        for k in a if k in t.consumed),
            "acked_after_back": sum(len(a) for a in after),
            "lost": sum(1 for t, a in zip(traffic, after, strict=True)
                        for k in a if k not in t.consumed),
            "duplicated": sum(x.duplicated for x in tallies),
            "producers_recreated": sum(len(t.fatal) for t in traffic),
            "producers_unwedged": sum(t.unwedged for t in traffic),
            "consumers_rewound": sum(t.consumers - 1 for t in traffic),
        }
    else:
        out |= {"lost": sum(x.lost for x in tallies),
                "duplicated": sum(x.duplicated for x in tallies),
                "producer_fatal_errors": sum(len(t.fatal) for t in traffic)}
    out["not_acknowledged"] = out["sent"] - acked
    out["unsettled_at_stop"] = sum(t.unsettled for t in traffic)
    out["delivery_errors"] = sum(len(t.errors) for t in traffic)
    out |= figures
    out |= {"produce_p99_ms": round(max(x.produce_latency_p99_ms for x in tallies), 1),
            "tracebacks": traceback_lines(proxy) - tracebacks,
            "rss_start_mb": round(watched[0]["rss_start_mb"], 1),
            "rss_peak_mb": round(max(w["rss_peak_mb"] for w in watched), 1),
            "rss_end_mb": round(watched[-1]["rss_end_mb"], 1),
            "fds_peak": max(int(w["fds_peak"]) for w in watched),
            "fds_end": int(watched[-1]["fds_end"])}
    kinds = Counter(_error_code(e) for t in traffic for e in t.errors + t.fatal)
    out["error_kinds"] = ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "none"
    return out


def _error_code(error: str) -> str:
    match = re.search(r"code=([A-Z_]+)", error)
    return ("fatal " if "FATAL" in error else "") + (match.group(1) if match else error[:60])


def run(faults: tuple[str, ...] | list[str] = FAULTS, *, workdir: Path | None = None,
        progress: Callable[[str], None] | None = None, **settings: Any) -> dict[str, Any]:
    """Run ``faults`` in turn against one broker and one proxy; returns ``{fault: figures}``.
    ``settings`` are the fields of ``Settings``."""
    s = Settings(**settings)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="drill-faults-"))
    results: dict[str, Any] = {}
    with tansu_broker(str(workdir / "tansu.log")) as broker:
        proxy = ProxyProcess(broker.bootstrap, workdir=workdir)
        proxy.start()
        try:
            proxy.wait_broker_listener(111)
            for fault in faults:
                if progress:
                    progress(f"{fault} ...")
                results[fault] = _run_fault(fault, broker, proxy, s)
        finally:
            proxy.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, from {', '.join(FAULTS)}")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=300.0, help="messages/s per producer")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the fault")
    parser.add_argument("--after", type=float, default=60.0, help="seconds after the fault")
    parser.add_argument("--stop-seconds", type=float, default=20.0, help="SIGSTOP length")
    parser.add_argument("--session-timeout-ms", type=int, default=None,
                        help="the consumers' session.timeout.ms (default librdkafka's 45 s)")
    args = parser.parse_args()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    started = time.monotonic()
    results = run(faults, producers=args.producers, rate=args.rate,
                  partitions=args.partitions, warmup_seconds=args.warmup,
                  after_seconds=args.after, stop_seconds=args.stop_seconds,
                  session_timeout_ms=args.session_timeout_ms,
                  progress=lambda m: print(m, flush=True))
    for fault, figures in results.items():
        print_figures(f"{fault}: {NOTES[fault]}", figures)
    print(f"\n{time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    main()
