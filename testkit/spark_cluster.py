"""A Spark standalone cluster on this host, from the pyspark package: one master and N workers,
each a JVM of its own (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``Worker``),
all on 127.0.0.1. Executors are started by the workers, in JVMs of their own, and run their
Python workers with the interpreter the driver names (``PYSPARK_PYTHON``: this one).

``StandaloneCluster.start`` returns once the master's web UI (``/json/``) lists every worker
as alive; ``stop`` ends the master, the workers and everything they started (each runs in a
process group of its own). Used by ``tests/spark/test_cluster.py`` and ``bench/replay_bench.py
--workers N``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HOST = "127.0.0.1"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cluster_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the cluster's processes and of a driver that talks to it: Spark
    from the pyspark package, every address on 127.0.0.1, Python workers on this interpreter
    (executors inherit the worker's environment, the driver's ``PYSPARK_PYTHON`` goes with
    each Python function)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "SPARK_HOME": str(_spark_home()),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_MASTER_HOST": HOST,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    return env


@dataclass
class StandaloneCluster:
    """A running master and its workers (``start``)."""

    url: str  # spark://127.0.0.1:P
    web_url: str  # the master's web UI
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    _files: list[IO[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, directory: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
              timeout: float = 90.0) -> StandaloneCluster:
        directory.mkdir(parents=True, exist_ok=True)
        port, web = _free_port(), _free_port()
        cluster = cls(f"spark://{HOST}:{port}", f"http://{HOST}:{web}", directory)
        try:
            cluster._spawn("master", "org.apache.spark.deploy.master.Master",
                           "--host", HOST, "--port", str(port), "--webui-port", str(web))
            cluster.wait(lambda state: state.get("status") == "ALIVE", "the master", timeout)
            for i in range(workers):
                work = directory / f"worker-{i}"
                work.mkdir(exist_ok=True)
                cluster._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                               cluster.url, "--host", HOST, "--cores", str(cores),
                               "--memory", memory, "--webui-port", str(_free_port()),
                               "--work-dir", str(work))
            cluster.wait(lambda state: state.get("aliveworkers") == workers,
                         f"{workers} workers registered", timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = self.directory / f"{name}.log"
        out = log.open("wb")
        self._files.append(out)
        self.logs.append(log)
        env = cluster_env()
        env["SPARK_LOG_DIR"] = str(self.directory)
        env["SPARK_LOCAL_DIRS"] = str(self.directory / f"{name}-tmp")
        self.processes.append(subprocess.Popen(
            [str(_spark_home() / "bin" / "spark-class"), main_class, *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True))  # its own process group: executors and all end with it

    def state(self) -> dict[str, Any]:
        """The master's view (``/json/``): workers, applications; {} while it cannot answer."""
        try:
            with urllib.request.urlopen(f"{self.web_url}/json/", timeout=2) as r:
                return dict(json.load(r))
        except (OSError, ValueError):
            return {}

    def wait(self, condition: Any, what: str, timeout: float = 90.0) -> dict[str, Any]:
        """Poll the master's state until ``condition(state)``; between polls, wait on the
        master's process (a cluster process that ends is an error, at once)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if state and condition(state):
                return state
            for p, log in zip(self.processes, self.logs, strict=True):
                if p.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited ({p.returncode}) before {what}:\n"
                                       + self.tail(log))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout:.0f} s; master state: {state}\n"
                                   + self.tail(self.logs[0]))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.processes[0].wait(0.2)

    @staticmethod
    def tail(log: Path, lines: int = 30) -> str:
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def executor_logs(self) -> list[Path]:
        """The stderr of every executor the workers started (``work-dir/app-*/N/stderr``)."""
        return sorted(self.directory.glob("worker-*/app-*/*/stderr"))

    def stop(self) -> None:
        """End the workers (and the executors and Python workers they started), then the
        master: each process group, SIGTERM, then SIGKILL what is left after 10 s."""
        for p in reversed(self.processes):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in self.processes:  # the group too: an executor may outlive its worker
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for f in self._files:
            f.close()
        self._files.clear()

    def __enter__(self) -> StandaloneCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
