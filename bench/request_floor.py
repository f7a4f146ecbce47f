#!/usr/bin/env python
"""The floor of a proxy's CPU per GB for large Produce requests on this machine, and what
running Python per request costs in place.

One client sends Produce requests of about 1 MB (v9, acks=1, one partition, one record batch
of 1 KB records: librdkafka's default ``batch.size``), one in flight, to an embedded tansu
through a middle process. The middle's user + system CPU per GB of requests
(``/proc/<pid>/stat``) is measured for four middles, interleaved round by round:

- ``relay``: blocking sockets, no event loop, ~20 Python calls per request. A request's
  first 16 KiB are read and written on as the proxy reads them, the rest of its frame is
  spliced socket -> pipe -> socket, its response read whole and written back: about the
  proxy's system calls (a few reads and writes, 2 splices per request), with no parsing.
- ``relay+stream``: the same, with the proxy's own request stream
  (``protocol.request_stream.RequestStream``, the capture's measure and the topic guard
  following Produce frames) reading what it reads in the proxy: the first read, then what
  ``passable()`` leaves (the request's tail). The stream's own time per request is timed in
  place (by the clock, and by the thread's CPU clock: ``stream_in_place_cpu_us``) and,
  after the rounds, in a warm loop over the same bytes (``bench/wake_cost.py`` says why
  the two differ).
- ``relay+calls`` (only when asked, ``--middles``): the relay calling ``--calls`` distinct
  one-line functions per request, to tell calls from what the stream does.
- ``proxy``: ``kafka-quota-proxy`` with the test kit's default configuration.
- ``proxy-all``: with every feature that leaves the bytes unchanged (``proxy_bench``'s
  ``--features all``: quotas not binding, capture, fetch routing).

``--pin`` runs the middles on CPU 1 and the client and broker on CPU 0; ``--keep-awake``
(implies ``--pin``) also runs a spinner under ``SCHED_IDLE`` on CPU 1, which takes only the
time nothing else wants, so that CPU never idles between requests.

    python bench/request_floor.py [--requests 1000] [--rounds 3] [--clients 1] [--pin]
                                   [--keep-awake]

Needs the test extra (aiokafka builds the record batch): ``make .venv/.installed-test``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy_bench import FEATURES_ALL, feature_config

MIDDLES = ("relay", "relay+stream", "proxy", "proxy-all")
RELAYS = ("relay", "relay+stream", "relay+calls")
FIRST_READ = 16 * 1024      # the proxy's first read of a large request
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_TICK = os.sysconf("SC_CLK_TCK")


def produce_frame(topic: str, record_bytes: int) -> bytes:
    """A Produce v9 request frame (size prefix included) of one record batch of 1 KB records."""
    from datetime import timedelta

    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    from kafka_quota_proxy.protocol.headers import encode_request_header
    from kafka_quota_proxy.protocol.topic_fields import encode
    from testkit.frames import frame

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=record_bytes + 4096)
    for i in range(max(1, record_bytes // 1030)):
        builder.append(i, timestamp=None, key=None, value=b"x" * 1000, headers=[])
    m = __import__(load_request_schema(0, 9).__module__, fromlist=["ProduceRequest"])
    data = (m.TopicProduceData(name=topic, partition_data=(
        m.PartitionProduceData(index=0, records=bytes(builder.build())),)),)
    body = encode(m.ProduceRequest(transactional_id=None, acks=1,
                                   timeout=timedelta(seconds=30), topic_data=data))
    return frame(encode_request_header(0, 9, 1, "floor") + body)


# --- the relays (a subprocess each: ``--serve``) ---------------------------------------------

class _Stream:
    """The proxy's request stream with both Produce followers, timed per request."""

    def __init__(self) -> None:
        from kafka_quota_proxy.protocol.correlation import CorrelationTable
        from kafka_quota_proxy.protocol.request_stream import RequestStream
        from kafka_quota_proxy.protocol.topic_guard import ProduceTopics

        class _NothingRefused:
            def refuses_name(self, raw: bytes) -> bool:
                return False

            def refuses_id(self, raw: bytes) -> bool:
                return False

            def refuses_transaction(self, raw: bytes) -> bool:
                return False

        self.table = CorrelationTable()
        self.stream = RequestStream(self.table, measure_produce=True,
                                    watch_produce=lambda v: ProduceTopics(v, _NothingRefused()))
        self.in_place: list[float] = []
        self.in_place_cpu: list[float] = []
        self.last: tuple[bytes, bytes] = (b"", b"")

    def once(self) -> None:
        """The stream over the last request's bytes once, as the proxy reads them."""
        head, tail = self.last
        self.stream.feed(head)
        self.stream.passed(self.stream.passable())
        self.stream.feed(tail)
        self.table.pop(int.from_bytes(head[8:12], "big"))

    def warm_us(self, repeat: int = 300) -> float:
        """The stream's time per request over the last request's bytes, in a tight loop."""
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(repeat):
                self.once()
            runs.append((time.perf_counter() - t0) / repeat * 1e6)
        return statistics.median(runs)


def _recv_exactly(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n], n - got)
        if not k:
            raise EOFError
        got += k


def _splice(source: int, pipe: tuple[int, int], sink: int, n: int) -> None:
    r, w = pipe
    while n:
        moved = os.splice(source, w, min(n, PIPE_BYTES))
        if not moved:
            raise EOFError
        n -= moved
        while moved:
            moved -= os.splice(r, sink, moved)


def _calls(n: int) -> list[Any]:
    """``n`` distinct one-line functions."""
    space: dict[str, Any] = {}
    exec("\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(n)), space)
    return [space[f"f{i}"] for i in range(n)]


def serve(mode: str, port: int, broker: str, stats: Path, calls: int) -> None:
    """Relay one client connection to ``broker``, request by request (see the module doc)."""
    stream = _Stream() if mode == "relay+stream" else None
    functions = _calls(calls) if mode == "relay+calls" else []
    listener = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    client, _ = listener.accept()
    host, bport = broker.rsplit(":", 1)
    upstream = socket.create_connection((host, int(bport)))
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipe = os.pipe()
    fcntl.fcntl(pipe[1], _F_SETPIPE_SZ, PIPE_BYTES)
    cfd, ufd = client.fileno(), upstream.fileno()
    buf = bytearray(max(FIRST_READ + 4, 1 << 16))
    view = memoryview(buf)
    try:
        while True:
            try:
                _recv_exactly(client, view, 4)
            except EOFError:
                break
            frame = 4 + int.from_bytes(buf[:4], "big")
            first = min(frame, FIRST_READ + 4)
            _recv_exactly(client, view[4:], first - 4)
            if stream is None:
                upstream.sendall(view[:first])
                _splice(cfd, pipe, ufd, frame - first)
            else:
                head = bytes(view[:first])
                c0 = time.thread_time()
                t0 = time.perf_counter()
                forward, _ = stream.stream.feed(head)
                k = stream.stream.passable()
                stream.stream.passed(k)
                spent = time.perf_counter() - t0
                cpu = time.thread_time() - c0
                upstream.sendall(forward)
                _splice(cfd, pipe, ufd, k)
                rest = frame - first - k
                if rest > len(buf):
                    raise RuntimeError(f"the stream left {rest} B of the frame to read")
                _recv_exactly(client, view, rest)
                tail = bytes(view[:rest])
                c0 = time.thread_time()
                t0 = time.perf_counter()
                forward, _ = stream.stream.feed(tail)
                spent += time.perf_counter() - t0
                cpu += time.thread_time() - c0
                upstream.sendall(forward)
                stream.in_place.append(spent * 1e6)
                stream.in_place_cpu.append(cpu * 1e6)
                stream.last = (head, tail)
            x = 0
            for f in functions:
                x = f(x)
            _recv_exactly(upstream, view, 4)
            size = 4 + int.from_bytes(buf[:4], "big")
            response = bytearray(buf[:4])
            response += upstream.recv(size - 4, socket.MSG_WAITALL)
            if stream is not None:
                stream.table.pop(int.from_bytes(response[4:8], "big"))
            client.sendall(response)
    finally:
        client.close()
        upstream.close()
    doc: dict[str, Any] = {}
    if stream is not None and stream.in_place:
        doc = {"stream_in_place_us": statistics.median(stream.in_place),
               "stream_in_place_cpu_us": statistics.median(stream.in_place_cpu),
               "stream_warm_us": stream.warm_us()}
    stats.write_text(json.dumps(doc))


# --- the client and the rounds ----------------------------------------------------------------

def _cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def _pin(pid: int, cpu: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def start_spinner(cpu: int, idle: bool = True) -> subprocess.Popen[bytes]:
    """A process spinning on ``cpu``, under ``SCHED_IDLE`` if ``idle`` (it then takes only the
    time nothing else wants: the CPU never idles); kill it when done."""
    return subprocess.Popen([sys.executable, "-c", (
        f"import os; os.sched_setaffinity(0, {{{cpu}}})\n"
        + ("os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n" if idle else "")
        + "while True: pass")])


def drive(port: int, pid: int, frame: bytes, requests: int,
          clients: int = 1) -> dict[str, float]:
    """Send ``requests`` copies of ``frame`` to ``port`` from each of ``clients`` connections,
    one in flight on each; the CPU of ``pid`` per GB of all of them."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(clients)]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def one(s: socket.socket) -> None:
        head = bytearray(4)
        for _ in range(requests):
            s.sendall(frame)
            if s.recv_into(head, 4, socket.MSG_WAITALL) != 4:
                raise EOFError("the middle closed the connection")
            s.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)

    try:
        u0, k0 = _cpu(pid)
        t0 = time.monotonic()
        if clients == 1:
            one(socks[0])
        else:
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(one, socks))
        seconds = time.monotonic() - t0
        u1, k1 = _cpu(pid)
    finally:
        for s in socks:
            s.close()
    gb = len(frame) * requests * clients / 1e9
    return {"user": (u1 - u0) / gb, "sys": (k1 - k0) / gb, "cpu": (u1 - u0 + k1 - k0) / gb,
            "mb_s": gb * 1000 / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="per round and middle")
    parser.add_argument("--record-bytes", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--middles", default=",".join(MIDDLES))
    parser.add_argument("--calls", type=int, default=400, help="of relay+calls, per request")
    parser.add_argument("--clients", type=int, default=1,
                        help="connections at once, one request in flight on each (proxies only)")
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--keep-awake", action="store_true")
    parser.add_argument("--serve", nargs=4, metavar=("MODE", "PORT", "BROKER", "STATS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        mode, port, broker, stats = args.serve
        serve(mode, int(port), broker, Path(stats), args.calls)
        return 0

    from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port
    from testkit.e2e import ProxyProcess, new_topic

    pin = args.pin or args.keep_awake
    if pin:
        os.sched_setaffinity(0, {0})
    middles = args.middles.split(",")
    unknown = set(middles) - set(MIDDLES) - set(RELAYS)
    if unknown:
        parser.error(f"--middles: unknown {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix="request-floor-"))
    spinner = start_spinner(1) if args.keep_awake else None
    broker = TansuBroker().start()
    proxies: dict[str, ProxyProcess] = {}
    try:
        for name in middles:
            if name.startswith("proxy"):
                extra = "" if name == "proxy" else yaml.safe_dump(
                    feature_config(FEATURES_ALL, workdir / name))
                proxy = proxies[name] = ProxyProcess(broker.bootstrap, extra_yaml=extra,
                                                     log_level="warning").start()
                if pin and proxy.process is not None:
                    _pin(proxy.process.pid, 1)
        ports = {name: p.wait_broker_listener(111) for name, p in proxies.items()}
        topic = new_topic(broker.bootstrap, "floor")
        frame = produce_frame(topic, args.record_bytes)
        print(f"{args.requests} Produce requests of {len(frame):,} B per round and middle, "
              f"one in flight; load {os.getloadavg()[0]:.2f}; "
              f"{'pinned, ' if pin else ''}{'kept awake' if args.keep_awake else ''}")
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in middles}
        for r in range(args.rounds):
            for name in middles:
                relay = None
                if name in proxies:
                    proc = proxies[name].process
                    assert proc is not None
                    port, pid = ports[name], proc.pid
                else:
                    port = free_port()
                    stats = workdir / f"{name}-{r}.json"
                    relay = subprocess.Popen(
                        [sys.executable, __file__, "--serve", name, str(port),
                         broker.bootstrap, str(stats), "--calls", str(args.calls)],
                        stdout=subprocess.PIPE, text=True,
                        preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if pin else None)
                    assert relay.stdout is not None
                    relay.stdout.readline()
                    pid = relay.pid
                row = drive(port, pid, frame, args.requests,
                            args.clients if name in proxies else 1)
                if relay is not None:
                    relay.wait(30)
                    row.update(json.loads(stats.read_text()))
                rows[name].append(row)
                extra = "".join(f"  {k.removeprefix('stream_')} {v:.0f} us"
                                for k, v in row.items() if k.startswith("stream_"))
                print(f"round {r} {name:13s} {row['cpu']:.3f} core-s/GB (user {row['user']:.3f}"
                      f", sys {row['sys']:.3f}), {row['mb_s']:.0f} MB/s{extra}", flush=True)
        print("medians:")
        summary = {}
        for name, got in rows.items():
            summary[name] = {k: statistics.median(row[k] for row in got) for k in got[0]}
            print(f"  {name:13s} " + ", ".join(f"{k} {v:.3f}" for k, v in summary[name].items()))
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / f"request_floor-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(
            {"args": vars(args), "frame_bytes": len(frame), "rounds": rows,
             "medians": summary}, indent=2))
    finally:
        for p in proxies.values():
            p.stop()
        broker.stop()
        if spinner is not None:
            spinner.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
