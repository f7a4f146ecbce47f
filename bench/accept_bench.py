"""How ``workers: N`` should share the listeners: SO_REUSEPORT in every worker, or a parent that
accepts and hands each socket to a worker. Both measured in isolation, in one run, with the
same minimal worker.

- ``upstream``: one uvloop process answering Kafka-like frames (4-byte big-endian size +
  payload) with a 16-byte response frame.
- ``workers``: N uvloop processes, each a minimal byte-forwarding proxy (protocol based:
  ``data_received`` -> the other side's ``transport.write``, one upstream connection per client
  connection, back-pressure by pausing the other side).
- strategy ``reuseport``: every worker binds the same port with SO_REUSEPORT (uvloop's server,
  accept in C); the kernel spreads connections by a hash of the 4-tuple.
- strategy ``handoff``: a parent process accepts (non-blocking, draining the backlog after each
  epoll wake-up) and sends each fd round robin to a worker over a SOCK_SEQPACKET Unix socket
  (``socket.send_fds``, SCM_RIGHTS; one message per worker per wake-up, up to 64 fds); the worker
  adopts it with ``loop.connect_accepted_socket``.
- load generators (separate uvloop processes):
  ``churn``: connect, one 64-byte request, its response, close (SO_LINGER 0, so neither side
  piles up TIME_WAIT), repeat: connections/s and p50/p99 of connect + first response;
  ``steady``: C long-lived connections doing request/response with 16 KiB requests: MB/s
  (request bytes) and requests/s.

Per phase it also reports how the connections were spread over the workers (each worker counts
what it accepted) and the CPU seconds (user+sys) of the workers and of the accepting parent.
Both stacks run side by side on two ports (the idle one costs nothing) and the phases are
interleaved: churn on each strategy, then steady on each. The load generators, the upstream
and the workers share the machine's cores, so read the ratios handoff/reuseport and the CPU
per connection or per GB rather than the absolute rates.

Run: python bench/accept_bench.py [--workers 2] [--seconds 10] [--strategy both|reuseport|handoff]
     [--loadgens 2] [--churn-concurrency 32] [--connections 16] [--request-size 16384]
     [--json OUT]
(2 phases per strategy, each seconds + about 1 s: ~23 s for --seconds 5 with both)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import json
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, cast

import uvloop

HOST = "127.0.0.1"
RESPONSE = struct.pack(">i", 12) + b"r" * 12  # the upstream's answer to every frame
CHURN_REQUEST_SIZE = 64
MAX_FDS = 64  # fds per SCM_RIGHTS message (the kernel allows 253)
LINGER_0 = struct.pack("ii", 1, 0)
WARMUP_S = 0.5
OP_TIMEOUT_S = 5.0  # churn: a connection without its response by then counts as an error
STEADY_SETTLE_S = 1.0  # steady: time to open the connections before the window opens
CTX = multiprocessing.get_context("fork")

# ---------------------------------------------------------------------------- plumbing


def _die_with_parent() -> None:
    """A child gets SIGKILL when the benchmark process goes, however it goes (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(coro_fn: Callable[[], Any]) -> Any:
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


def _cpu_reader() -> Callable[[int], float]:
    try:
        import psutil  # type: ignore[import-untyped]

        def with_psutil(pid: int) -> float:
            t = psutil.Process(pid).cpu_times()
            return float(t.user + t.system)
        return with_psutil
    except ImportError:
        tick = os.sysconf("SC_CLK_TCK")

        def with_proc(pid: int) -> float:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return with_proc


cpu_seconds = _cpu_reader()


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


# ---------------------------------------------------------------------------- upstream


class Sink(asyncio.Protocol):
    """Counts frames without keeping their payload; one RESPONSE per complete frame."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.header = bytearray()
        self.skip = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        i, n, done = 0, len(data), 0
        while i < n:
            if self.skip:
                take = min(self.skip, n - i)
                self.skip -= take
                i += take
                if not self.skip:
                    done += 1
                continue
            part = data[i:i + 4 - len(self.header)]
            self.header += part
            i += len(part)
            if len(self.header) == 4:
                self.skip = int.from_bytes(self.header, "big")
                self.header.clear()
                if not self.skip:
                    done += 1
        if done and self.transport is not None:
            self.transport.write(RESPONSE * done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def upstream_main(listener: socket.socket) -> None:
    _die_with_parent()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Sink, sock=listener, backlog=4096)
        await loop.create_future()
    _run(serve)


# ---------------------------------------------------------------------------- worker

_tasks: set[asyncio.Task[Any]] = set()


def keep(task: asyncio.Task[Any]) -> None:
    """Hold a reference to a task until it ends (the loop keeps only weak ones)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)



class Downstream(asyncio.Protocol):
    """The client side of one proxied connection."""

    def __init__(self, upstream_port: int, counters: Any, slot: int) -> None:
        self.upstream_port = upstream_port
        self.counters = counters
        self.slot = slot
        self.transport: asyncio.Transport | None = None
        self.peer: Upstream | None = None
        self.pending: list[bytes] = []  # what arrives before the upstream connection is up
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.counters[self.slot] += 1
        # (uvloop starts reading right after connection_made: pause_reading here is ignored)
        keep(asyncio.get_running_loop().create_task(self._connect()))

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, peer = await loop.create_connection(lambda: Upstream(self), HOST,
                                                   self.upstream_port)
        except OSError:
            if self.transport is not None:
                self.transport.abort()
            return
        if self.closed:
            peer.close()
            return
        self.peer = peer
        if self.pending and peer.transport is not None:
            peer.transport.write(b"".join(self.pending))
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.pending.append(data)
        elif self.peer.transport is not None:
            self.peer.transport.write(data)

    def eof_received(self) -> bool | None:
        if self.peer is not None:
            self.peer.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None:
            self.peer.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Upstream(asyncio.Protocol):
    def __init__(self, down: Downstream) -> None:
        self.down = down
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.down.transport is not None:
            self.down.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.down.close()

    def pause_writing(self) -> None:
        if self.down.transport is not None:
            self.down.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.down.transport is not None:
            self.down.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def worker_main(index: int, strategy: str, port: int, channel: socket.socket | None,
                upstream_port: int, counters: Any, ready: Any) -> None:
    """``reuseport``: bind ``port`` with SO_REUSEPORT; ``handoff``: adopt the fds that arrive
    on ``channel``. Every accepted connection counts in ``counters[index]``."""
    _die_with_parent()

    def factory() -> Downstream:
        return Downstream(upstream_port, counters, index)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        if strategy == "reuseport":
            await loop.create_server(factory, HOST, port, reuse_port=True, backlog=4096)
        else:
            assert channel is not None
            channel.setblocking(False)

            def adopt() -> None:
                while True:
                    try:
                        _, fds, _, _ = socket.recv_fds(channel, 1, MAX_FDS)
                    except BlockingIOError:
                        return
                    if not fds:  # the parent has gone
                        loop.remove_reader(channel.fileno())
                        return
                    for fd in fds:
                        sock = socket.socket(fileno=fd)
                        sock.setblocking(False)
                        keep(loop.create_task(loop.connect_accepted_socket(factory, sock)))
            loop.add_reader(channel.fileno(), adopt)
        ready.send(index)
        await loop.create_future()
    _run(serve)


def acceptor_main(listener: socket.socket, channels: list[socket.socket], counters: Any,
                  slot: int) -> None:
    """The handoff parent: accept, send each fd round robin to a worker, close it here."""
    _die_with_parent()
    listener.setblocking(False)
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    n = len(channels)
    batches: list[list[socket.socket]] = [[] for _ in range(n)]
    rr = 0

    def flush(w: int) -> None:
        batch = batches[w]
        socket.send_fds(channels[w], [b"f"], [c.fileno() for c in batch])
        for c in batch:
            c.close()
        batch.clear()

    while True:
        poller.poll()
        accepted = 0
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            except OSError:  # ECONNABORTED and the like: next one
                continue
            batches[rr].append(conn)
            if len(batches[rr]) == MAX_FDS:
                flush(rr)
            rr = (rr + 1) % n
            accepted += 1
        for w in range(n):
            if batches[w]:
                flush(w)
        counters[slot] += accepted


# ---------------------------------------------------------------------------- load


class ChurnClient(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None], request: bytes) -> None:
        self.done = done
        self.request = request
        self.got = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= len(RESPONSE) and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed before the response"))


class SteadyClient(asyncio.Protocol):
    def __init__(self, request: bytes, start: float, end: float,
                 finished: asyncio.Future[None], tally: dict[str, int]) -> None:
        self.request = request
        self.start, self.end = start, end
        self.finished = finished
        self.tally = tally
        self.transport: asyncio.Transport | None = None
        self.got = 0
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got < len(RESPONSE):
            return
        self.got -= len(RESPONSE)
        now = time.monotonic()
        if now >= self.end:
            assert self.transport is not None
            self.ended = True
            self.transport.close()
            return
        if now >= self.start:
            self.tally["requests"] += 1
        assert self.transport is not None
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended:  # closed by the other side
            self.tally["errors"] += 1
        if not self.finished.done():
            self.finished.set_result(None)


def loadgen_main(mode: str, port: int, concurrency: int, request_size: int, start: float,
                 end: float, out: multiprocessing.connection.Connection) -> None:
    """Work from now until ``end``; count what starts at or after ``start`` and ends before
    ``end``; send the tally on ``out``."""
    _die_with_parent()

    async def churn() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        request = struct.pack(">i", request_size) + b"q" * request_size
        latencies: list[float] = []
        errors = 0

        async def one_loop() -> None:
            nonlocal errors
            while True:
                t0 = time.monotonic()
                if t0 >= end:
                    return
                done: asyncio.Future[None] = loop.create_future()
                transport: asyncio.BaseTransport | None = None
                try:
                    transport, _ = await loop.create_connection(
                        functools.partial(ChurnClient, done, request), HOST, port)
                    await asyncio.wait_for(done, OP_TIMEOUT_S)
                    t1 = time.monotonic()
                    if t0 >= start and t1 <= end:
                        latencies.append(t1 - t0)
                except (OSError, TimeoutError):
                    errors += 1
                finally:
                    if transport is not None:
                        sock = transport.get_extra_info("socket")
                        if sock is not None:
                            with contextlib.suppress(OSError):
                                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
                        transport.close()
        await asyncio.gather(*(one_loop() for _ in range(concurrency)))
        return {"ops": len(latencies), "latencies": latencies, "errors": errors}

    async def steady() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        request = struct.pack(">i", request_size) + b"q" * request_size
        tally = {"requests": 0, "errors": 0}
        finished: list[asyncio.Future[None]] = []
        for _ in range(concurrency):
            fut: asyncio.Future[None] = loop.create_future()
            finished.append(fut)
            await loop.create_connection(
                functools.partial(SteadyClient, request, start, end, fut, tally), HOST, port)
        await asyncio.wait_for(asyncio.gather(*finished), end - time.monotonic() + 10)
        return {"ops": tally["requests"], "errors": tally["errors"],
                "bytes": tally["requests"] * (request_size + 4)}

    try:
        result = _run(churn if mode == "churn" else steady)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    out.send(result)


# ---------------------------------------------------------------------------- orchestration


@dataclass
class Stack:
    """One strategy's processes: N workers (and, for handoff, the accepting parent)."""

    strategy: str
    port: int
    workers: list[BaseProcess] = field(default_factory=list)
    acceptor: BaseProcess | None = None
    counters: Any = None  # [accepted by worker 0..N-1, accepted by the parent]

    def pids(self) -> dict[str, int]:
        out = {f"worker{i}": p.pid for i, p in enumerate(self.workers) if p.pid}
        if self.acceptor is not None and self.acceptor.pid:
            out["parent"] = self.acceptor.pid
        return out

    def check_alive(self) -> None:
        for name, p in [*((f"worker{i}", w) for i, w in enumerate(self.workers)),
                        ("parent", self.acceptor)]:
            if p is not None and not p.is_alive():
                raise RuntimeError(f"{self.strategy} {name} exited with {p.exitcode}")


class Children:
    """Every process the benchmark starts; ``close`` kills whatever is still alive."""

    def __init__(self) -> None:
        self.procs: list[BaseProcess] = []

    def start(self, name: str, target: Callable[..., None], *args: Any) -> BaseProcess:
        p = CTX.Process(target=target, args=args, name=name, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        deadline = time.monotonic() + 3
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(2)
        self.procs.clear()


def listening_socket(reuse_port: bool = False) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((HOST, 0))
    return s


def start_stack(children: Children, strategy: str, n: int, upstream_port: int) -> Stack:
    counters = CTX.RawArray("q", n + 1)
    ready_r, ready_w = CTX.Pipe(duplex=False)
    if strategy == "reuseport":
        # holds the port (bound, never listening: not part of the group) until the workers have it
        with listening_socket(reuse_port=True) as hold:
            port = hold.getsockname()[1]
            stack = Stack(strategy, port, counters=counters)
            for i in range(n):
                stack.workers.append(children.start(f"reuseport-w{i}", worker_main, i, strategy,
                                                    port, None, upstream_port, counters,
                                                    ready_w))
            _wait_ready(ready_r, n)
    else:
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(n)]
        stack = Stack(strategy, 0, counters=counters)
        for i, (_, theirs) in enumerate(pairs):
            stack.workers.append(children.start(f"handoff-w{i}", worker_main, i, strategy, 0,
                                                theirs, upstream_port, counters, ready_w))
        _wait_ready(ready_r, n)
        listener = listening_socket()  # after the workers: they do not hold it
        listener.listen(4096)
        port = stack.port = listener.getsockname()[1]
        stack.acceptor = children.start("handoff-parent", acceptor_main, listener,
                                        [ours for ours, _ in pairs], counters, n)
        listener.close()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
        _wait_listening(port)
    ready_r.close()
    ready_w.close()
    return stack


def _wait_ready(ready: multiprocessing.connection.Connection, n: int) -> None:
    for _ in range(n):
        if not ready.poll(15):
            raise RuntimeError("a worker was not ready within 15 s")
        ready.recv()


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_phase(children: Children, stack: Stack, mode: str, args: argparse.Namespace
              ) -> dict[str, Any]:
    """One load pattern against one stack; its figures."""
    stack.check_alive()
    n_gen = args.loadgens
    total = args.churn_concurrency if mode == "churn" else args.connections
    shares = [total // n_gen + (1 if i < total % n_gen else 0) for i in range(n_gen)]
    size = CHURN_REQUEST_SIZE if mode == "churn" else args.request_size
    lead = WARMUP_S if mode == "churn" else STEADY_SETTLE_S
    now = time.monotonic()
    start, end = now + lead, now + lead + args.seconds
    pipes = []
    gens = []
    at_launch = list(stack.counters)
    for i, share in enumerate(shares):
        if share == 0:
            continue
        r, w = CTX.Pipe(duplex=False)
        gens.append(children.start(f"{mode}-gen{i}", loadgen_main, mode, stack.port, share,
                                   size, start, end, w))
        w.close()
        pipes.append(r)
    pids = stack.pids()
    time.sleep(max(0.0, start - time.monotonic()))
    before_cpu = {k: cpu_seconds(pid) for k, pid in pids.items()}
    before_acc = list(stack.counters)
    time.sleep(max(0.0, end - time.monotonic()))
    after_cpu = {k: cpu_seconds(pid) for k, pid in pids.items()}
    after_acc = list(stack.counters)
    results = []
    for r in pipes:
        if not r.poll(args.seconds + 20):
            raise RuntimeError(f"{mode} load generator sent no result")
        results.append(r.recv())
        r.close()
    for g in gens:
        g.join(5)
    errors = [res["error"] for res in results if "error" in res]
    if errors:
        raise RuntimeError(f"{mode} load generator failed: {errors[0]}")
    stack.check_alive()
    cpu = {k: round(after_cpu[k] - before_cpu[k], 3) for k in pids}
    accepted = [a - b for a, b in zip(after_acc, before_acc, strict=True)]
    n = len(stack.workers)
    out: dict[str, Any] = {
        "strategy": stack.strategy, "mode": mode, "seconds": args.seconds,
        "ops": sum(res["ops"] for res in results),
        "errors": sum(res["errors"] for res in results),
        "accepted_per_worker": accepted[:n],
        "cpu_s": cpu, "cpu_total_s": round(sum(cpu.values()), 3),
    }
    if mode == "churn":
        lat = [x for res in results for x in res["latencies"]]
        out["conn_per_s"] = out["ops"] / args.seconds
        out["p50_ms"] = percentile(lat, 50) * 1000
        out["p99_ms"] = percentile(lat, 99) * 1000
        out["cpu_ms_per_1k_conn"] = (out["cpu_total_s"] * 1e6 / out["ops"]
                                     if out["ops"] else float("nan"))
    else:
        total_bytes = sum(res["bytes"] for res in results)
        out["connections"] = total
        out["req_size"] = size
        out["req_per_s"] = out["ops"] / args.seconds
        out["mb_per_s"] = total_bytes / args.seconds / 1e6
        # the connections were opened before the window
        out["connections_per_worker"] = [a - b for a, b in zip(after_acc[:n], at_launch[:n],
                                                                strict=True)]
        out["cpu_s_per_gb"] = (out["cpu_total_s"] / (total_bytes / 1e9)
                               if total_bytes else float("nan"))
    return out


def spread(counts: list[int]) -> str:
    total = sum(counts)
    if not total:
        return "-"
    return "/".join(str(c) for c in counts) + f" (max/mean {max(counts) * len(counts) / total:.2f})"


def report(phases: list[dict[str, Any]]) -> list[str]:
    lines = []
    def of(mode: str) -> list[dict[str, Any]]:  # reuseport first
        return sorted((p for p in phases if p["mode"] == mode),
                      key=lambda p: p["strategy"] != "reuseport")
    churn, steady = of("churn"), of("steady")
    if churn:
        lines.append("churn (connect, 1 request, close):")
        lines.append(f"  {'strategy':<10} {'conn/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                     f"{'CPU s':>7} {'parent':>6} {'CPU ms/1k conn':>15}  accepted per worker")
        for p in churn:
            lines.append(f"  {p['strategy']:<10} {p['conn_per_s']:>8.0f} {p['p50_ms']:>8.2f} "
                         f"{p['p99_ms']:>8.2f} {p['cpu_total_s']:>7.2f} "
                         f"{p['cpu_s'].get('parent', 0.0):>6.2f} "
                         f"{p['cpu_ms_per_1k_conn']:>15.0f}  {spread(p['accepted_per_worker'])}"
                         + (f"  errors {p['errors']}" if p["errors"] else ""))
    if steady:
        lines.append(f"steady ({steady[0]['connections']} connections, "
                     f"{steady[0]['req_size']}-byte requests):")
        lines.append(f"  {'strategy':<10} {'MB/s':>8} {'req/s':>8} {'CPU s':>7} "
                     f"{'parent':>6} {'CPU s/GB':>9}  connections per worker")
        for p in steady:
            lines.append(f"  {p['strategy']:<10} {p['mb_per_s']:>8.1f} {p['req_per_s']:>8.0f} "
                         f"{p['cpu_total_s']:>7.2f} {p['cpu_s'].get('parent', 0.0):>6.2f} "
                         f"{p['cpu_s_per_gb']:>9.2f}  "
                         f"{spread(p['connections_per_worker'])}"
                         + (f"  errors {p['errors']}" if p["errors"] else ""))
    return lines


def ratios(phases: list[dict[str, Any]]) -> dict[str, float]:
    by = {(p["strategy"], p["mode"]): p for p in phases}
    out: dict[str, float] = {}
    for mode, keys in (("churn", ("conn_per_s", "p50_ms", "p99_ms", "cpu_ms_per_1k_conn")),
                       ("steady", ("mb_per_s", "req_per_s", "cpu_s_per_gb"))):
        h, r = by.get(("handoff", mode)), by.get(("reuseport", mode))
        if h is None or r is None:
            continue
        for k in keys:
            out[f"{mode}.{k}"] = h[k] / r[k] if r[k] else float("nan")
    return out


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase (churn, steady)")
    ap.add_argument("--strategy", choices=("both", "reuseport", "handoff"), default="both")
    ap.add_argument("--loadgens", type=int, default=2, help="load generator processes")
    ap.add_argument("--churn-concurrency", type=int, default=32,
                    help="churn: connections in flight, over all load generators")
    ap.add_argument("--connections", type=int, default=16, help="steady: connections")
    ap.add_argument("--request-size", type=int, default=16384, help="steady: request bytes")
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON to OUT")
    args = ap.parse_args(argv)
    strategies = ["reuseport", "handoff"] if args.strategy == "both" else [args.strategy]

    children = Children()
    phases: list[dict[str, Any]] = []
    with sigterm_as_exit():
        try:
            upstream_listener = listening_socket()
            upstream_listener.listen(4096)
            upstream_port = upstream_listener.getsockname()[1]
            children.start("upstream", upstream_main, upstream_listener)
            upstream_listener.close()
            _wait_listening(upstream_port)
            stacks = [start_stack(children, s, args.workers, upstream_port) for s in strategies]
            print(f"{args.workers} workers; {args.loadgens} load generators; "
                  f"{args.seconds:g} s per phase; "
                  + "; ".join(f"{s.strategy} on :{s.port} {s.pids()}" for s in stacks),
                  flush=True)
            for mode, order in (("churn", stacks), ("steady", stacks[::-1])):
                for stack in order:  # A B, then B A: drift of the machine hits both
                    phases.append(run_phase(children, stack, mode, args))
                    print(f"  {mode:<6} {stack.strategy:<9} done", flush=True)
        finally:
            children.close()
    lines = report(phases)
    rel = ratios(phases)
    if rel:
        lines.append("handoff / reuseport: " + ", ".join(f"{k} {v:.2f}" for k, v in rel.items()))
    try:
        load = os.getloadavg()
        lines.append(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
                     f"on {os.cpu_count()} cores")
    except OSError:
        pass
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "phases": phases, "ratios": rel}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
