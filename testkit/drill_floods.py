"""Floods drill: connections past the file-descriptor limit, and abusive config files, while
good clients move keyed messages through the proxy.

1. **Connection flood** (``--rounds`` times). The proxy runs under an fd limit (``--fd-limit``,
   so ``max_connections`` = (limit - 64) / 2) with a short ``connections_max_idle_seconds``.
   ``--connections`` sockets are opened to a broker port from ``--threads`` threads and held:
   most idle, every ``--active-every``-th sending an ApiVersions request every second. A
   thread scrapes ``/metrics`` all along. The proxy must admit up to ``max_connections`` and
   refuse the rest at once (the client sees EOF or RST at once, the refusal is counted and
   logged at most once a second), keep its open fds below the limit, keep answering
   ``/metrics``, close the admitted idle sockets after the idle timeout and never the busy
   ones. Then the flood is released: the proxy's fds return to where they were and new
   connections are admitted and answered.
2. **Config abuse** (``--cycles`` times). The config file (whose ``quotas`` section limits the
   good producer's client-id) goes through invalid YAML, a wrong type, a negative rate, a file
   cut in the middle of a value, renamed away (and back), empty, deleted, nested 5,000 deep
   and an alias bomb, each followed by a valid file with a changed quota; the file watcher
   and SIGHUP both trigger reloads. Every bad file must be counted as a failed reload and
   change nothing, every valid one must be applied
   (``kafka_proxy_quota_entity_bytes_per_second_limit`` shows the new quota), the watcher
   must still apply the last edit, and the alias bomb must not move the proxy's memory.

Throughout: every acknowledged message of the good clients consumed exactly once, no
traceback in the proxy's log, no "Too many open files".

    python bench/drill_floods.py                       # 1024 fds, 3 x 5,000 connections, 10 cycles
    python bench/drill_floods.py --fd-limit 256 --connections 600 --rounds 1 --cycles 1
                                                       # the suite's version (test_drill_floods.py)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import queue
import resource
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import parse_config
from testkit.drill_common import (
    GoodTraffic,
    ProcessWatch,
    ProxyProcess,
    loop_lag,
    print_figures,
    tansu_broker,
    traceback_lines,
    wait_for,
)
from testkit.e2e import KafkaWire

GOOD = "floods-good"  # the good producer's client-id, which the quota section limits
BASE_RATE = 2_000_000  # its producer_byte_rate at start (far above its ~0.15 MB/s)
MB = 1 << 20
LAG_COUNT = "kafka_proxy_event_loop_lag_seconds_count"


class _GoodTraffic(GoodTraffic):
    """``GoodTraffic`` that also records when each acknowledged message was sent, so the
    produce latency can be told per phase (the harness keeps the latencies only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timed: list[tuple[float, float]] = []  # (sent at, produce-to-ack seconds)

    def p99_ms(self, start: float, end: float) -> float:
        """p99 produce-to-ack latency (ms) of the messages sent between ``start`` and
        ``end`` (``time.monotonic``)."""
        values = sorted(lat for at, lat in list(self.timed) if start <= at < end)
        return round(values[int(len(values) * 0.99)] * 1000, 1) if values else 0.0

    def delivered(self, sent_at: float, err: Any, msg: Any) -> None:
        super().delivered(sent_at, err, msg)
        if err is None:
            self.timed.append((sent_at, self.latencies[-1]))


def _api_versions_v0(correlation: int) -> bytes:
    return struct.pack(">ihhih", 10, 18, 0, correlation, 0)


def _wait(cond: Callable[[], Any], timeout: float, what: str, timeouts: list[str],
          interval: float = 0.1) -> bool:
    """``wait_for`` that records a timeout instead of raising: the drill always reports its
    figures, and the figures show what did not happen."""
    try:
        wait_for(cond, timeout, interval=interval, what=what)
        return True
    except AssertionError:
        timeouts.append(what)
        return False


class Metrics:
    """Scrapes of the proxy's ``/metrics``: counts answers and failures, the slowest answer,
    and the peaks of open connections and fds. ``every`` > 0 also scrapes from a thread."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.ok = 0
        self.failed = 0
        self.slowest = 0.0
        self.peak_connections = 0.0
        self.peak_open_fds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self) -> dict[str, float]:
        start = time.monotonic()
        try:
            m = self.proxy.metrics()
        except Exception:
            with self._lock:
                self.failed += 1
            return {}
        took = time.monotonic() - start
        connections = sum(v for k, v in m.items() if k.startswith("kafka_proxy_connections{"))
        with self._lock:
            self.ok += 1
            self.slowest = max(self.slowest, took)
            self.peak_connections = max(self.peak_connections, connections)
            self.peak_open_fds = max(self.peak_open_fds, m.get("kafka_proxy_open_fds", 0))
        return m

    def reset_peaks(self) -> None:
        with self._lock:
            self.peak_connections = self.peak_open_fds = 0.0

    def start(self, every: float) -> Metrics:
        def scrape() -> None:
            while not self._stop.is_set():
                self.get()
                self._stop.wait(every)

        self._stop.clear()
        self._thread = threading.Thread(target=scrape, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


# ---------------------------------------------------------------------- connection flood
@dataclass
class _Conn:
    sock: socket.socket
    active: bool  # sends a request every ``active_period`` seconds
    opened_at: float
    state: str = "open"  # open | eof | rst
    closed_at: float = 0.0
    responses: int = 0
    last_response: float = 0.0
    awaiting: bool = False
    next_send: float = 0.0
    correlation: int = 0
    buf: bytearray = field(default_factory=bytearray)


class Flood:
    """``count`` connections to ``port``, opened from ``threads`` threads and held: a pump
    thread (epoll) reads every socket, notes when and how the proxy closes it, and keeps
    the active ones sending one ApiVersions v0 request at a time, every ``active_period``."""

    def __init__(self, port: int, count: int, *, threads: int = 4, active_every: int = 10,
                 active_period: float = 1.0, connect_timeout: float = 15.0) -> None:
        self.port = port
        self.count = count
        self.threads = threads
        self.active_every = active_every
        self.active_period = active_period
        self.connect_timeout = connect_timeout
        self.conns: list[_Conn] = []
        self.connect_errors: Counter[str] = Counter()
        self.open_seconds = 0.0
        self._ordinal = itertools.count()
        self._new: queue.SimpleQueue[_Conn] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)

    @property
    def connect_failed(self) -> int:
        return sum(self.connect_errors.values())

    def open(self) -> Flood:
        self._pump_thread.start()
        start = time.monotonic()
        shares = [self.count // self.threads + (i < self.count % self.threads)
                  for i in range(self.threads)]
        openers = [threading.Thread(target=self._opener, args=(n,), daemon=True)
                   for n in shares]
        for t in openers:
            t.start()
        for t in openers:
            t.join()
        self.open_seconds = time.monotonic() - start
        return self

    def _opener(self, n: int) -> None:
        for _ in range(n):
            active = next(self._ordinal) % self.active_every == 0
            try:
                sock = socket.create_connection(("127.0.0.1", self.port),
                                                timeout=self.connect_timeout)
            except OSError as exc:
                self.connect_errors[type(exc).__name__] += 1
                continue
            sock.setblocking(False)
            self._new.put(_Conn(sock, active, time.monotonic()))

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        active: list[_Conn] = []
        try:
            while not self._stop.is_set():
                while True:
                    try:
                        c = self._new.get_nowait()
                    except queue.Empty:
                        break
                    self.conns.append(c)
                    sel.register(c.sock, selectors.EVENT_READ, c)
                    if c.active:
                        active.append(c)
                        self._send(c, sel)
                for key, _ in sel.select(0.05):
                    self._read(key.data, sel)
                now = time.monotonic()
                for c in active:
                    if c.state == "open" and not c.awaiting and now >= c.next_send:
                        self._send(c, sel)
                if len(active) > 64 and any(c.state != "open" for c in active[:64]):
                    active = [c for c in active if c.state == "open"]
        finally:
            sel.close()

    def _closed(self, c: _Conn, how: str, sel: selectors.BaseSelector) -> None:
        c.state = how
        c.closed_at = time.monotonic()
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(c.sock)
        c.sock.close()

    def _send(self, c: _Conn, sel: selectors.BaseSelector) -> None:
        c.correlation += 1
        try:
            c.sock.send(_api_versions_v0(c.correlation))
        except BlockingIOError:
            return
        except OSError:
            self._closed(c, "rst", sel)
            return
        c.awaiting = True

    def _read(self, c: _Conn, sel: selectors.BaseSelector) -> None:
        if c.state != "open":
            return
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._closed(c, "rst", sel)
            return
        if not data:
            self._closed(c, "eof", sel)
            return
        c.buf += data
        while len(c.buf) >= 4:
            size = int.from_bytes(c.buf[:4], "big")
            if len(c.buf) < 4 + size:
                break
            del c.buf[:4 + size]
            now = time.monotonic()
            c.responses += 1
            c.last_response = now
            c.awaiting = False
            c.next_send = now + self.active_period

    def settled(self) -> bool:
        """Every idle socket closed by the proxy (refused, or idle too long) and every active
        one either refused or answered."""
        conns = list(self.conns)
        return len(conns) == self.count - self.connect_failed and all(
            c.state != "open" or (c.active and c.responses) for c in conns)

    def classify(self, idle_timeout: float) -> dict[str, int]:
        """How each socket ended, from the client's side. Refused: closed with no answer
        within ``idle_timeout / 2`` of connecting (the proxy refuses at accept)."""
        now = time.monotonic()
        refused_window = idle_timeout / 2
        out: Counter[str] = Counter()
        for c in list(self.conns):
            lived = (c.closed_at or now) - c.opened_at
            if c.state != "open" and not c.responses and lived < refused_window:
                out["refused_seen"] += 1
                out[f"refused_{c.state}"] += 1
            elif c.active and c.responses:
                out["active_answered"] += 1
                out["active_responses"] += c.responses
                if c.state != "open":
                    out["active_closed"] += 1
                elif now - c.last_response > 3 * self.active_period + 1:
                    out["active_stalled"] += 1
            elif c.state == "eof" and lived >= 0.9 * idle_timeout and not c.active:
                out["idle_closed"] += 1
            elif c.state == "open":
                out["left_open"] += 1  # idle past its timeout, or active and never answered
            else:
                out["closed_unexpectedly"] += 1
        return dict(out)

    def release(self) -> None:
        self._stop.set()
        self._pump_thread.join(30)
        for c in self.conns:
            if c.state == "open":
                c.sock.close()
                c.state = "released"
        while True:
            try:
                self._new.get_nowait().sock.close()
            except queue.Empty:
                break


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def _flood_round(proxy: ProxyProcess, metrics: Metrics, port: int, *, connections: int,
                 threads: int, active_every: int, idle_timeout: float, recover: int,
                 timeouts: list[str]) -> dict[str, Any]:
    accepted_key = 'kafka_proxy_connections_accepted_total{listener="broker"}'
    refused_key = 'kafka_proxy_connections_refused_total{reason="max_connections"}'
    before = metrics.get()
    metrics.reset_peaks()
    flood = Flood(port, connections, threads=threads, active_every=active_every)
    start = time.monotonic()
    flood.open()
    opened = connections - flood.connect_failed

    def accounted() -> bool:
        m = metrics.get()
        return bool(m) and (_delta(m, before, accepted_key) + _delta(m, before, refused_key)
                            >= opened)

    _wait(accounted, 30, "every flood connection accepted or refused", timeouts)
    _wait(flood.settled, idle_timeout + 30,
          "idle flood connections closed and active ones answered", timeouts)
    shown = flood.classify(idle_timeout)
    held_seconds = time.monotonic() - start
    during = metrics.get()
    peak_connections, peak_open_fds = metrics.peak_connections, metrics.peak_open_fds
    flood.release()
    fds_before = before.get("kafka_proxy_open_fds", 0)
    broker_before = before.get('kafka_proxy_connections{listener="broker"}', 0)

    def recovered() -> bool:
        m = metrics.get()
        return bool(m) and m.get("kafka_proxy_open_fds", 1e9) <= fds_before + 6 and m.get(
            'kafka_proxy_connections{listener="broker"}', 1e9) <= broker_before + 2

    _wait(recovered, 30, "fds and connections back after the flood", timeouts)
    after_release = metrics.get()
    # New connections are admitted and answered, all held at once.
    wires: list[KafkaWire] = []
    ok = 0
    try:
        for _ in range(recover):
            try:
                wire = KafkaWire("127.0.0.1", port, client_id="floods-recover", timeout=10)
                wires.append(wire)
                wire.request(18, 3, client_software_name="recover", client_software_version="1")
                ok += 1
            except (OSError, AssertionError):
                pass
    finally:
        for wire in wires:
            wire.close()
    end = metrics.get()
    closed = {k.split('"')[1]: _delta(during, before, k) for k in during
              if k.startswith("kafka_proxy_connections_closed_total{")}
    return {
        "opened": opened,
        "connect_failed": flood.connect_failed,
        "open_seconds": flood.open_seconds,
        "held_seconds": held_seconds,
        "accepted": _delta(during, before, accepted_key),
        "refused": _delta(during, before, refused_key),
        "peak_connections": peak_connections,
        "peak_open_fds": peak_open_fds,
        "fds_before": fds_before,
        "fds_after_release": after_release.get("kafka_proxy_open_fds", -1),
        "idle_closed_metric": closed.get("idle_timeout", 0),
        "closed_other": {k: v for k, v in closed.items()
                         if v and k not in ("idle_timeout", "client_closed")},
        "recovered_ok": ok,
        "recovered_refused": _delta(end, after_release, refused_key),
        "lag": loop_lag(during, before),
        **shown,
    }


# ---------------------------------------------------------------------- config abuse
def _alias_bomb(levels: int = 7) -> str:
    """Seven chained anchors, nine aliases each: a few hundred bytes, 9^7 values expanded."""
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]")
    return "extra:\n" + "\n".join(lines) + "\n"


def _replace(path: Path, text: str) -> None:
    """Write ``text`` elsewhere and rename it into place, so the watcher never sees a file
    half-written by the drill (the half-written case is written whole, cut)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _bad_files(valid: str) -> list[tuple[str, str | None, str]]:
    """(name, text or None for rename/delete, trigger). ``sighup``: SIGHUP as well as the
    watcher (two reloads); ``sighup-missing``: only SIGHUP sees it (the file is gone)."""
    value_at = valid.index("producer_byte_rate: ") + len("producer_byte_rate: ")
    rate = valid[value_at:].split("}", 1)[0]
    return [
        ("invalid_yaml", valid + "  bogus: [\n", "watch"),
        ("wrong_type", valid.replace(f"producer_byte_rate: {rate}", 'producer_byte_rate: "fast"'),
         "watch"),
        ("negative_rate", valid.replace(f"producer_byte_rate: {rate}", "producer_byte_rate: -5"),
         "sighup"),
        ("half_written", valid[: value_at + 3], "watch"),  # cut inside the value
        ("renamed_away", None, "sighup-missing"),
        ("empty", "", "watch"),
        ("deleted", None, "sighup-missing"),
        ("nested", valid + "extra: " + "[" * 5000 + "]" * 5000 + "\n", "watch"),
        ("alias_bomb", valid + _alias_bomb(), "sighup"),
    ]


def _good_limits(m: dict[str, float]) -> list[float]:
    limit = "kafka_proxy_quota_entity_bytes_per_second_limit{"
    return [v for k, v in m.items() if k.startswith(limit)
            and f'client_id="{GOOD}"' in k and 'quota="produce"' in k]


def _config_abuse(proxy: ProxyProcess, metrics: Metrics, watch: ProcessWatch, *, cycles: int,
                  timeouts: list[str]) -> dict[str, Any]:
    assert proxy.process is not None
    path = proxy.config_path
    template = path.read_text()
    base = f"producer_byte_rate: {BASE_RATE}"
    assert template.count(base) == 1

    def valid_text(rate: int) -> str:
        return template.replace(base, f"producer_byte_rate: {rate}")

    def reloads(m: dict[str, float]) -> tuple[float, float]:
        return (m.get('kafka_proxy_config_reloads_total{result="failure"}', 0.0),
                m.get('kafka_proxy_config_reloads_total{result="success"}', 0.0))

    # The drill checks itself first (not while timing: parsing the nested file takes ~0.2 s
    # of CPU, GIL held): each bad file is invalid, each valid one valid.
    for _name, text, _trigger in _bad_files(valid_text(BASE_RATE)):
        if text is not None:
            with contextlib.suppress(ConfigError):
                parse_config(text)
                raise RuntimeError(f"the drill's {_name} file is a valid config")
    parse_config(valid_text(BASE_RATE + 1000))
    started_at = time.monotonic()
    rss_peak = rss_before = watch.process.memory_info().rss

    def sampled(cond: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            nonlocal rss_peak
            with contextlib.suppress(Exception):
                rss_peak = max(rss_peak, watch.process.memory_info().rss)
            return cond()
        return check

    start = metrics.get()
    rate = BASE_RATE
    out: Counter[str] = Counter()
    wrong: list[str] = []  # steps whose reloads or quota were not as expected
    lag_ms: dict[str, float] = {}  # per kind of file: the worst loop lag p99 of its steps

    def step(name: str, action: Callable[[], None], trigger: str, fail: int, ok: int,
             limit: int) -> None:
        scraped = metrics.get()
        before = reloads(scraped)
        action()
        if trigger.startswith("sighup"):
            assert proxy.process is not None
            proxy.process.send_signal(signal.SIGHUP)

        def counted() -> bool:
            f, s = reloads(metrics.get())
            return f - before[0] >= fail and s - before[1] >= ok

        _wait(sampled(counted), 20, f"reload of {name} counted", timeouts, interval=0.02)
        # The lag timer records a stall when it next fires: two samples more and the step's
        # stall (if any) is in the histogram.
        samples = metrics.get().get(LAG_COUNT, 0.0)
        _wait(lambda: metrics.get().get(LAG_COUNT, 0.0) >= samples + 2, 10,
              f"loop lag sampled after {name}", timeouts)
        m = metrics.get()
        kind = name.removeprefix("valid after ") if ok else name
        lag_ms[kind if not ok else "valid"] = max(
            lag_ms.get(kind if not ok else "valid", 0.0),
            loop_lag(m, scraped)["loop_lag_p99_ms"])
        f, s = reloads(m)
        limits = _good_limits(m)
        if (f - before[0], s - before[1]) != (fail, ok) or not limits or any(
                v != limit for v in limits):
            wrong.append(f"{name}: failures +{f - before[0]:g} (expected {fail}), successes "
                         f"+{s - before[1]:g} (expected {ok}), limits {limits} (expected {limit})")
            return
        out["bad_counted" if fail else "valid_applied"] += 1

    away = path.with_name("config.away")
    for _ in range(cycles):
        for name, text, trigger in _bad_files(valid_text(rate)):
            out["bad_files"] += 1
            def abuse(name: str = name, text: str | None = text) -> None:
                if name == "renamed_away":
                    os.replace(path, away)
                elif name == "deleted":
                    path.unlink()
                else:
                    assert text is not None
                    _replace(path, text)

            step(name, abuse, trigger, 2 if trigger == "sighup" else 1, 0, rate)
            if name == "renamed_away":
                os.replace(away, path)  # back, unchanged: the watcher sees nothing new
            # Then a valid file with a changed quota, picked up by the watcher alone.
            rate += 1000
            text = valid_text(rate)
            out["valid_files"] += 1
            step(f"valid after {name}", functools.partial(_replace, path, text), "watch", 0, 1,
                 rate)
    end = metrics.get()
    final = _good_limits(end)
    events = proxy.events()
    return {
        "config_cycles": cycles,
        "config_bad_files": out["bad_files"],
        "config_bad_counted": out["bad_counted"],
        "config_valid_files": out["valid_files"],
        "config_valid_applied": out["valid_applied"],
        "config_wrong_steps": wrong,
        "reloads_failure": _delta(end, start, 'kafka_proxy_config_reloads_total{result="failure"}'),
        "reloads_success": _delta(end, start, 'kafka_proxy_config_reloads_total{result="success"}'),
        "reload_failed_log_lines": sum(1 for e in events
                                       if e.get("event") == "config_reload_failed"),
        # The last edit was picked up by the watcher alone (no SIGHUP).
        "watcher_alive": bool(final) and all(v == rate for v in final),
        "config_lag_by_file": ", ".join(f"{k} {v:g}" for k, v in sorted(
            lag_ms.items(), key=lambda kv: -kv[1])),
        "config_rss_before_mb": rss_before / MB,
        "config_rss_peak_mb": rss_peak / MB,
        "lag": loop_lag(end, start),
        "started_at": started_at,
    }


# ---------------------------------------------------------------------- the drill
def _raise_own_fd_limit(need: int) -> int:
    """This process holds the flood's sockets: raise its soft fd limit where allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run(fd_limit: int = 1024, connections: int = 5000, rounds: int = 3, threads: int = 4,
        active_every: int = 10, idle_timeout: float = 10.0, recover: int = 50,
        cycles: int = 10, good_rate: float = 500.0,
        workdir: Path | None = None) -> dict[str, Any]:
    """Both phases; returns the figures."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="drill-floods-"))
    _raise_own_fd_limit(connections + 1024)
    timeouts: list[str] = []
    rounds_out: list[dict[str, Any]] = []
    with tansu_broker(str(workdir / "tansu.log")) as broker:
        proxy = ProxyProcess(broker.bootstrap, workdir=workdir, nofile=(fd_limit, fd_limit),
                             extra_yaml=f"""network:
  connections_max_idle_seconds: {idle_timeout:g}
quotas:
  watch_seconds: 0.2
  entities:
    - {{client-id: "{GOOD}", producer_byte_rate: {BASE_RATE}}}
""")
        proxy.start()
        metrics = Metrics(proxy)
        good = _GoodTraffic(proxy.bootstrap, rate=good_rate, name=GOOD)
        started = stopped = False
        try:
            port = proxy.wait_broker_listener(111)
            assert proxy.process is not None
            watch = ProcessWatch(proxy.process.pid, every=0.2).start()
            good.start()
            started = True
            wait_for(lambda: len(good.acked) >= 200 and len(good.consumed) >= 200, 60,
                     what="good traffic flowing")
            wait_for(lambda: _good_limits(metrics.get()), 30, what="the good producer's budget")
            first = metrics.get()
            max_connections = int(first["kafka_proxy_max_connections"])
            # 1. Connection floods.
            t_flood = time.monotonic()
            metrics.start(every=0.25)
            flood_start = metrics.get()
            for _ in range(rounds):
                rounds_out.append(_flood_round(
                    proxy, metrics, port, connections=connections, threads=threads,
                    active_every=active_every, idle_timeout=idle_timeout, recover=recover,
                    timeouts=timeouts))
            metrics.stop()
            flood_end = metrics.get()
            flood_rss_peak = max(watch.rss) / MB
            flood_fds_peak = max(watch.fds)
            # 2. Config abuse.
            config = _config_abuse(proxy, metrics, watch, cycles=cycles, timeouts=timeouts)
            t_config, t_end = config.pop("started_at"), time.monotonic()
            good_p99 = {"good_produce_p99_ms_before": good.p99_ms(0, t_flood),
                        "good_produce_p99_ms_floods": good.p99_ms(t_flood, t_config),
                        "good_produce_p99_ms_config": good.p99_ms(t_config, t_end)}
            tally = good.stop()
            stopped = True
            proc = watch.stop()
            alive = proxy.alive
        finally:
            metrics.stop()
            if started and not stopped:
                good.stop(drain_seconds=5)
            proxy.stop()
    events = proxy.events()
    refusal_logs = [e for e in events if e.get("event") == "connections_refused"]
    log_text = proxy.log_path.read_text(errors="replace")

    def total(key: str) -> Any:
        return sum(r.get(key, 0) for r in rounds_out)

    flood_lag = loop_lag(flood_end, flood_start)
    config_lag = config.pop("lag")
    figures: dict[str, Any] = {
        "fd_limit": fd_limit,
        "max_connections": max_connections,
        "flood_rounds": rounds,
        "flood_connections": total("opened"),
        "flood_connect_failed": total("connect_failed"),
        "flood_open_seconds_max": round(max(r["open_seconds"] for r in rounds_out), 2),
        "flood_held_seconds_max": round(max(r["held_seconds"] for r in rounds_out), 1),
        "flood_accepted": int(total("accepted")),
        "flood_refused": int(total("refused")),
        "flood_admitted_max": max(r["opened"] - r.get("refused_seen", 0) for r in rounds_out),
        "flood_clients_refused_seen": total("refused_seen"),
        "flood_clients_refused_eof": total("refused_eof"),
        "flood_clients_refused_rst": total("refused_rst"),
        "flood_closed_unexpectedly": total("closed_unexpectedly"),
        "refusal_log_lines": len(refusal_logs),
        "refusal_logged_count": sum(e.get("refused", 0) for e in refusal_logs),
        "flood_seconds": round(sum(r["held_seconds"] for r in rounds_out), 1),
        "peak_connections": int(max(r["peak_connections"] for r in rounds_out)),
        "peak_connections_min": int(min(r["peak_connections"] for r in rounds_out)),
        "fds_before": int(rounds_out[0]["fds_before"]),
        "fds_peak": max(int(max(r["peak_open_fds"] for r in rounds_out)), flood_fds_peak),
        "fds_after_release_max": int(max(r["fds_after_release"] for r in rounds_out)),
        "metrics_scrapes": metrics.ok,
        "metrics_failed": metrics.failed,
        "metrics_slowest_ms": round(metrics.slowest * 1000, 1),
        "idle_timeout_s": idle_timeout,
        "idle_closed_seen": total("idle_closed"),
        "idle_closed_metric": int(total("idle_closed_metric")),
        "idle_left_open": total("left_open"),
        "active_answered": total("active_answered"),
        "active_responses": total("active_responses"),
        "active_closed": total("active_closed"),
        "active_stalled": total("active_stalled"),
        "closed_other_reasons": str(sum((Counter(r["closed_other"]) for r in rounds_out),
                                        Counter()) or "{}"),
        "recovered_ok": total("recovered_ok"),
        "recovered_of": recover * rounds,
        "recovered_refused": int(total("recovered_refused")),
        "flood_loop_lag_p99_ms": flood_lag["loop_lag_p99_ms"],
        "flood_loop_lag_p99_ms_worst_round": max(r["lag"]["loop_lag_p99_ms"]
                                                 for r in rounds_out),
        "flood_rss_peak_mb": round(flood_rss_peak, 1),
        "too_many_open_files": log_text.count("Too many open files"),
        **{k: round(v, 1) if isinstance(v, float) else v for k, v in config.items()},
        "config_loop_lag_p99_ms": config_lag["loop_lag_p99_ms"],
        "good_acked": tally.acked,
        "good_lost": tally.lost,
        "good_duplicated": tally.duplicated,
        "good_produce_p99_ms": round(tally.produce_latency_p99_ms, 1),
        **good_p99,
        "good_errors": len(tally.errors),
        "rss_start_mb": round(proc["rss_start_mb"], 1),
        "rss_peak_mb": round(proc["rss_peak_mb"], 1),
        "rss_end_mb": round(proc["rss_end_mb"], 1),
        "proxy_alive": alive,
        "tracebacks": traceback_lines(proxy),
        "timeouts": timeouts,
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd-limit", type=int, default=1024, help="the proxy's RLIMIT_NOFILE")
    parser.add_argument("--connections", type=int, default=5000, help="per flood round")
    parser.add_argument("--rounds", type=int, default=3, help="flood rounds")
    parser.add_argument("--threads", type=int, default=4, help="threads opening the flood")
    parser.add_argument("--active-every", type=int, default=10,
                        help="every N-th flood connection sends requests")
    parser.add_argument("--idle-timeout", type=float, default=10.0,
                        help="the proxy's connections_max_idle_seconds")
    parser.add_argument("--recover", type=int, default=50,
                        help="new connections opened after each flood")
    parser.add_argument("--cycles", type=int, default=10, help="passes over the abusive files")
    args = parser.parse_args()
    start = time.monotonic()
    figures = run(args.fd_limit, args.connections, args.rounds, args.threads, args.active_every,
                  args.idle_timeout, args.recover, args.cycles)
    figures["drill_seconds"] = round(time.monotonic() - start, 1)
    print_figures(f"floods ({args.rounds} x {args.connections:,} connections under "
                  f"{args.fd_limit} fds, {args.cycles} config cycles)", figures)


if __name__ == "__main__":
    main()
