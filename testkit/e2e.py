"""Helpers shared by the end-to-end tests: the proxy as a real subprocess, condition waits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kafka_quota_proxy.demo.embedded_broker import free_port, free_port_range, wait_for_port

T = TypeVar("T")


def new_topic(bootstrap: str, prefix: str = "t", partitions: int = 1) -> str:
    """Create a topic with a fresh name through ``bootstrap``; return its name."""
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)
    return name


def wait_for(
    cond: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class ProxyProcess:
    upstream: str
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kqp-")))
    extra_yaml: str = ""
    listeners_yaml: str = ""  # more keys of ``listeners`` (indented two spaces)
    upstream_yaml: str = ""  # more keys of ``upstream`` (indented two spaces)
    bootstrap_port: int = 0
    metrics_port: int = 0
    ports: tuple[int, int] = (0, 0)
    process: subprocess.Popen[bytes] | None = None
    nofile: tuple[int, int] | None = None  # RLIMIT_NOFILE (soft, hard) to start the proxy with
    log_level: str = "debug"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.bootstrap_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "proxy.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.yaml"

    def broker_port(self, node_id: int) -> int:
        first, last = self.ports
        return first + node_id % (last - first + 1)

    def write_config(self) -> None:
        if not self.bootstrap_port:
            self.ports = free_port_range(20)
            self.bootstrap_port = free_port(outside=self.ports)
            self.metrics_port = free_port(outside=self.ports)
        self.config_path.write_text(
            f"""listeners:
  bootstrap: "127.0.0.1:{self.bootstrap_port}"
  advertised_host: "127.0.0.1"
  broker_ports: "{self.ports[0]}-{self.ports[1]}"
{self.listeners_yaml}upstream:
  bootstrap_servers: ["{self.upstream}"]
  connect_timeout_seconds: 5
  metadata_refresh_seconds: 2
{self.upstream_yaml}metrics:
  listen: "127.0.0.1:{self.metrics_port}"
logging:
  level: {self.log_level}
{self.extra_yaml}"""
        )

    def start(self) -> ProxyProcess:
        self.write_config()
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kafka_quota_proxy", "run", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=self._limits if self.nofile else None,
        )
        log.close()
        wait_for_port("127.0.0.1", self.bootstrap_port, 20)
        # (the metrics endpoint opens just after the listeners: a test may read it at once)
        wait_for_port("127.0.0.1", self.metrics_port, 20)
        return self

    def _limits(self) -> None:
        import resource

        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def wait_broker_listener(self, node_id: int, timeout: float = 20) -> int:
        port = self.broker_port(node_id)
        try:
            wait_for_port("127.0.0.1", port, timeout)
        except TimeoutError:  # (stopped here: a test failing on it must not leave it running)
            self.stop()
            raise
        return port

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        proc = self.process
        if proc is None:
            return None
        self.process = None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def edit_config(self, old: str, new: str, timeout: float = 20) -> None:
        """Replace ``old`` by ``new`` in the config file and wait until the proxy has reloaded
        it successfully once more."""
        def reloads() -> float:
            return self.metrics().get('kafka_proxy_config_reloads_total{result="success"}', 0)

        before = reloads()
        text = self.config_path.read_text()
        assert old in text, old
        self.config_path.write_text(text.replace(old, new))
        wait_for(lambda: reloads() > before, timeout, what="the config reload")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def events(self) -> list[dict[str, Any]]:
        out = []
        if not self.log_path.exists():
            return out
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out

    def closed_connections(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == "connection_closed"]

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        values: dict[str, float] = {}
        # (lines end at "\n" alone: a label value may hold any other character, a client-id's
        # \x1c or \u2028 too, which ``splitlines`` would split on)
        for line in text.split("\n"):
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


class KafkaWire:
    """A tiny blocking Kafka client speaking raw frames, for probing the proxy."""

    def __init__(
        self, host: str, port: int, client_id: str = "wire-probe", timeout: float = 10.0,
        ssl_context: Any = None, preamble: bytes = b"", source: str | None = None,
    ) -> None:
        """``preamble``: bytes sent first (a PROXY protocol header); ``ssl_context``: the
        connection is TLS after it; ``source``: the local address to connect from (another
        loopback address, 127.0.0.2, is another client address)."""
        self.sock = socket.create_connection(
            (host, port), timeout=timeout,
            source_address=(source, 0) if source is not None else None)
        try:
            if preamble:
                self.sock.sendall(preamble)
            if ssl_context is not None:
                self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
        except BaseException:
            self.sock.close()  # (left open, it would warn in whichever test collects it)
            raise
        self.client_id = client_id
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the proxy")
            buf += chunk
        return bytes(buf)

    def is_closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True when the peer closes the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def encode(self, api_key: int, version: int, **fields: Any) -> bytes:
        import dataclasses
        import io

        from kio.index import load_request_schema
        from kio.serial import entity_writer

        from kafka_quota_proxy.protocol.headers import encode_request_header

        self._correlation += 1
        cls = load_request_schema(api_key, version)
        names = {f.name for f in dataclasses.fields(cls)}
        body = io.BytesIO()
        entity_writer(cls)(body, cls(**{k: v for k, v in fields.items() if k in names}))
        frame = encode_request_header(api_key, version, self._correlation, self.client_id)
        frame += body.getvalue()
        return len(frame).to_bytes(4, "big") + frame

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        from kafka_quota_proxy.protocol import apis
        from kafka_quota_proxy.protocol.headers import parse_response_header
        from kafka_quota_proxy.protocol.rewrite import decode_response

        self.send_raw(self.encode(api_key, version, **fields))
        size = int.from_bytes(self.recv_exactly(4), "big")
        frame = self.recv_exactly(size)
        hv = apis.response_header_version(api_key, version)
        if api_key == 18:
            hv = 0
        header = parse_response_header(frame, 0, size, hv)
        assert header.correlation_id == self._correlation
        body = frame[header.size :]
        if api_key == 18 and int.from_bytes(body[:2], "big", signed=True) == 35:
            return decode_response(api_key, 0, body)
        return decode_response(api_key, version, body)


def reproduce_capture(capture_dir: Path, rows: list[dict[str, Any]]) -> tuple[int, int]:
    """Replay captured ``rows`` through the quota engine under the configs (and storage
    settings) written next to them, per broker in the proxy's order: (requests whose three
    throttles equal the recorded ones, requests)."""
    from kafka_quota_proxy.quota.replay import (
        Recorded,
        StorageSettings,
        replay,
        settings_from_section,
    )

    docs = [json.loads(f.read_text()) for f in capture_dir.glob("quotas-*.json")]
    configs = {d["quota_generation"]: settings_from_section(d["quotas"]) for d in docs}
    storage = next((StorageSettings.from_section(d["storage"]) for d in docs
                    if d.get("storage")), None)
    matched = total = 0
    for broker in {r["broker"] for r in rows}:
        mine = sorted((r for r in rows if r["broker"] == broker),
                      key=lambda r: (r["quota_ms"], r["seq"]))
        recorded = [Recorded(r["seq"], r["quota_ms"], r["user"], r["client_id"], r["api_key"],
                             r["request_bytes"], r["response_bytes"], r["duration_us"],
                             r["request_time_ms"], r["follower"], r["quota_generation"],
                             r.get("storage_scale")) for r in mine]
        for r, t in zip(mine, replay(recorded, configs.__getitem__, storage=storage),
                        strict=True):
            total += 1
            matched += (t.produce_ms, t.fetch_ms, t.request_ms) == (
                r["throttle_produce_ms"], r["throttle_fetch_ms"], r["throttle_request_ms"])
    return matched, total
