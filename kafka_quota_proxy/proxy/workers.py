"""``workers: N``: one parent process and N worker processes sharing the listeners.

One asyncio process uses one core. With ``workers`` > 1 the process the operator starts becomes
a supervisor: it starts N workers (``kafka-quota-proxy run`` again, told its index through the
environment), each a whole proxy that binds every listener with SO_REUSEPORT, so the kernel
spreads new connections over them. The supervisor

- serves the one metrics endpoint of the host (``metrics.listen``): it scrapes each worker's
  own endpoint (127.0.0.1, a port the worker reports when it is ready) and serves every sample
  with a ``worker`` label, plus its own ``kafka_proxy_workers`` and
  ``kafka_proxy_worker_restarts_total``;
- passes SIGHUP on to every worker (each reloads the file), and on SIGTERM/SIGINT stops them
  (each drains as a single proxy does) and waits for them;
- restarts a worker that dies (logged ``worker_exited`` then ``worker_started``), after a delay
  that doubles from 1 s up to 30 s while restarts keep failing.

Each worker writes its own capture files (the run id holds its pid). The broker-port map is the
same in every worker as long as no two node ids share a slot of ``broker_ports`` (port =
first + node_id mod size), the condition ``deploy/README.md`` already sets for replicas.
Until budgets are coordinated across processes, each worker enforces its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from kafka_quota_proxy.config.schema import ProxyConfig
from kafka_quota_proxy.proxy.listeners import StartupError
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import serve_metrics

log = get_logger("kafka_quota_proxy.workers")

WORKER_ENV = "KAFKA_QUOTA_PROXY_WORKER"  # "<index>:<fd of the pipe to report readiness on>"
READY_TIMEOUT_S = 60.0
RESTART_DELAY_S = (1.0, 30.0)  # first delay, the most it doubles to
STABLE_S = 60.0  # a worker up this long resets the restart delay
SCRAPE_TIMEOUT_S = 5.0


def worker_count(config: ProxyConfig) -> int:
    """How many processes serve: ``workers``, ``auto`` being the cores available."""
    if config.workers == "auto":
        try:
            return max(len(os.sched_getaffinity(0)), 1)
        except AttributeError:  # not Linux
            return os.cpu_count() or 1
    return int(config.workers)


def worker_identity() -> tuple[int, int] | None:
    """(index, readiness fd) when this process is a worker started by a supervisor."""
    value = os.environ.get(WORKER_ENV)
    if not value:
        return None
    index, fd = value.split(":")
    return int(index), int(fd)


def report_ready(fd: int, metrics_port: int | None) -> None:
    """A worker tells its supervisor it is serving, and where its metrics are."""
    with os.fdopen(fd, "w") as pipe:
        pipe.write(json.dumps({"metrics_port": metrics_port}) + "\n")


@dataclass
class Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    metrics_port: int | None = None
    started_at: float = 0.0
    restarts: int = 0
    delay: float = RESTART_DELAY_S[0]
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    def __init__(self, config: ProxyConfig, config_path: str, count: int) -> None:
        self.config = config
        self.config_path = config_path
        self.workers = [Worker(i) for i in range(count)]
        self.stopping = False
        self._metrics_server: asyncio.AbstractServer | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ processes
    async def _start(self, w: Worker) -> None:
        """Start worker ``w``; returns when it is serving. Raises ``StartupError`` if it exits
        first or is not ready within READY_TIMEOUT_S."""
        read_fd, write_fd = os.pipe()
        env = {**os.environ, WORKER_ENV: f"{w.index}:{write_fd}"}
        w.ready.clear()
        w.metrics_port = None
        try:
            w.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kafka_quota_proxy", "run", "--config", self.config_path,
                env=env, pass_fds=(write_fd,), stdin=asyncio.subprocess.DEVNULL)
        finally:
            os.close(write_fd)
        w.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, _read_line, read_fd),
                                          READY_TIMEOUT_S)
        except TimeoutError:
            line = ""
        if not line:
            code = w.process.returncode
            if code is None:
                w.process.kill()
                code = await w.process.wait()
                raise StartupError(f"worker {w.index} was not ready in {READY_TIMEOUT_S:.0f} s")
            raise StartupError(f"worker {w.index} exited with {code} while starting")
        w.metrics_port = json.loads(line).get("metrics_port")
        w.ready.set()
        log.info("worker_started", worker=w.index, pid=w.process.pid, restarts=w.restarts)
        self._watch(w)

    def _watch(self, w: Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._watch_worker(w))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch_worker(self, w: Worker) -> None:
        process = w.process
        assert process is not None
        code = await process.wait()
        w.ready.clear()
        if self.stopping:
            return
        up = time.monotonic() - w.started_at
        if up >= STABLE_S:
            w.delay = RESTART_DELAY_S[0]
        log.warning("worker_exited", worker=w.index, pid=process.pid, code=code,
                    up_seconds=round(up, 1), restart_in_seconds=w.delay)
        while not self.stopping:
            await asyncio.sleep(w.delay)
            if self.stopping:
                return
            w.restarts += 1
            try:
                await self._start(w)
                return
            except StartupError as exc:
                w.delay = min(w.delay * 2, RESTART_DELAY_S[1])
                log.error("worker_restart_failed", worker=w.index, error=str(exc),
                          restart_in_seconds=w.delay)

    def signal_all(self, sig: int) -> None:
        for w in self.workers:
            if w.process is not None and w.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.process.send_signal(sig)

    async def stop(self) -> None:
        self.stopping = True
        self.signal_all(signal.SIGTERM)
        grace = self.config.network.shutdown_timeout_seconds + 10
        for w in self.workers:
            if w.process is None:
                continue
            try:
                await asyncio.wait_for(w.process.wait(), grace)
            except TimeoutError:
                log.error("worker_killed", worker=w.index, after_seconds=grace)
                w.process.kill()
                await w.process.wait()
        for task in list(self._watchers):
            task.cancel()
        if self._metrics_server is not None:
            self._metrics_server.close()

    # ------------------------------------------------------------------ metrics
    def collect(self) -> Iterable[Metric]:
        """Only the supervisor's own families: the workers' are merged in ``scrape``."""
        g = GaugeMetricFamily("kafka_proxy_workers", "Worker processes, by state",
                              labels=["state"])
        ready = sum(1 for w in self.workers if w.ready.is_set())
        g.add_metric(["ready"], ready)
        g.add_metric(["not_ready"], len(self.workers) - ready)
        yield g
        c = CounterMetricFamily("kafka_proxy_worker_restarts",
                                "Worker processes restarted after they exited",
                                labels=["worker"])
        for w in self.workers:
            c.add_metric([str(w.index)], w.restarts)
        yield c

    async def scrape(self) -> list[Metric]:
        """Every worker's families, each sample labelled with its worker."""
        texts = await asyncio.gather(*(self._scrape_one(w) for w in self.workers))
        return merge_worker_metrics((w.index, t) for w, t in zip(self.workers, texts,
                                                                  strict=True) if t)

    async def _scrape_one(self, w: Worker) -> str:
        if not w.ready.is_set() or w.metrics_port is None:
            return ""
        try:
            return await asyncio.wait_for(_http_get("127.0.0.1", w.metrics_port, "/metrics"),
                                          SCRAPE_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("worker_scrape_failed", worker=w.index, error=str(exc))
            return ""

    # ------------------------------------------------------------------ run
    async def run(self, stop: asyncio.Event) -> int:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.signal_all, signal.SIGHUP)
        try:
            for w in self.workers:
                await self._start(w)
            if self.config.metrics.listen is not None:
                m = self.config.metrics.listen
                registry = _SupervisorRegistry(self)
                try:
                    self._metrics_server = await serve_metrics(registry, m.host, m.port,
                                                               refresh=registry.refresh)
                except OSError as exc:
                    raise StartupError(f"cannot listen on metrics.listen {m}: "
                                       f"{exc.strerror or exc}") from None
        except StartupError:
            await self.stop()
            raise
        log.info("workers_started", workers=len(self.workers),
                 pids=[w.process.pid for w in self.workers if w.process])
        await stop.wait()
        await self.stop()
        log.info("workers_stopped")
        return 0


class _SupervisorRegistry(CollectorRegistry):
    """The supervisor's endpoint: its own families and, refreshed before each scrape, the
    workers'."""

    def __init__(self, supervisor: Supervisor) -> None:
        super().__init__(auto_describe=False)
        self.supervisor = supervisor
        self.workers: list[Metric] = []
        self.register(self)

    async def refresh(self) -> None:
        self.workers = await self.supervisor.scrape()

    def collect(self) -> Iterable[Metric]:
        yield from self.supervisor.collect()
        yield from self.workers


def merge_worker_metrics(texts: Iterable[tuple[int, str]]) -> list[Metric]:
    """The families of several workers' exposition texts as one set of families, every
    sample with a ``worker`` label (a family's HELP and type from the first worker that has
    it)."""
    merged: dict[str, Metric] = {}
    for index, text in texts:
        for family in text_string_to_metric_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)
            for sample in family.samples:
                into.samples.append(sample._replace(
                    labels={**sample.labels, "worker": str(index)}))
    return list(merged.values())


def _read_line(fd: int) -> str:
    with os.fdopen(fd, "r") as pipe:
        return pipe.readline()


async def _http_get(host: str, port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ValueError(f"status {head.split(b' ', 2)[1:2]}")
    return body.decode()
