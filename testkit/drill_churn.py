"""Churn drill: a million client-ids and a hundred thousand users through one proxy, then
quiet: every structure keyed by client-chosen names stays bounded while they come, and the
proxy's state goes back to where it started once they expire.

The proxy (SASL_PLAINTEXT listeners, ``sasl.mode: inspect``) sits before a SASL front
(``testkit.secure_front``, in a process of its own) on a tansu broker; the front accepts
any PLAIN user whose password is its name. Two quotas make every new name a budget, neither
throttling anyone: ``{client-id: drill-nobody, request_percentage: 1}`` has the proxy record
every request's time, into a budget per client-id (as Kafka does for the client-ids no quota
names), and ``{user: <default>, consumer_byte_rate: 1e12}`` gives every user a fetch budget.

- client-ids: ``--connections`` connections authenticate once (user ``churn-clients``) and
  send pipelined ApiVersions v0 requests, each with a client-id of its own (the header
  carries it), ``--client-ids`` in all;
- users: ``--users`` connections, one per user: SaslHandshake, SaslAuthenticate (PLAIN) and one
  Fetch of no partitions once authenticated, closed; ``--user-connections`` at a time.

Quota budgets idle for ``quotas.sensor_idle_expiry_seconds`` (``--expiry``; Kafka: an hour)
are dropped, checked every half of it. The drill samples the proxy's RSS and
``kafka_proxy_client_state_entries{structure}`` as it goes, waits for the entries to come back
to their baseline once traffic stops, and reports the RSS at the baseline, the peak and after
expiry, and the entries per structure.

    python bench/drill_churn.py                      # 1,000,000 client-ids, 100,000 users
    python bench/drill_churn.py --client-ids 20000 --users 1000 --expiry 4    # the suite's
"""

from __future__ import annotations

import argparse
import contextlib
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port, wait_for_port
from kafka_quota_proxy.protocol.primitives import INT32
from testkit.drill_common import (
    ProcessWatch,
    ProxyProcess,
    print_figures,
    traceback_lines,
    wait_for,
)
from testkit.frames import request_frame

FETCH, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 1, 18, 17, 36
STATE = 'kafka_proxy_client_state_entries{structure="'
CLIENTS_USER = "churn-clients"
PIPELINE = 200  # requests in flight per client-id connection


# ---------------------------------------------------------------------------- the front
class AnyUser(dict[str, str]):
    """The front's users: anyone, whose password is their name."""

    def __bool__(self) -> bool:
        return True

    def get(self, user: str, default: Any = None) -> str:  # type: ignore[override]
        return user

    def __contains__(self, user: object) -> bool:
        return True


def serve_front(tansu_port: int, port: int) -> None:
    """The SASL front, in its own process (``--front``), until killed."""
    from testkit.secure_front import SecureFront

    front = SecureFront(tansu_port, port, users=AnyUser(), mechanisms=("PLAIN",))
    front.authenticated = _Forgetful()
    front.start()
    while True:
        time.sleep(3600)


class _Forgetful(list[str]):
    """The front's list of who authenticated, kept empty (a hundred thousand names)."""

    def append(self, _user: str) -> None:
        pass


@contextlib.contextmanager
def broker_behind_front(log_path: str) -> Iterator[int]:
    """tansu, advertising the front's port (every connection to "the broker" goes through
    the front, the proxy's included), and the front; yields the front's port."""
    port = free_port()
    tansu = TansuBroker(advertised_port=port, log_path=log_path).start()
    try:
        with front_process(tansu.port, port):
            yield port
    finally:
        tansu.stop()


@contextlib.contextmanager
def front_process(tansu_port: int, port: int) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--front", str(tansu_port), str(port)],
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, 20)
        yield port
    finally:
        process.kill()
        process.wait(10)


# ---------------------------------------------------------------------------- frames
def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def sasl_frames(user: str, correlation: int = 0) -> bytes:
    """SaslHandshake v1 (PLAIN) and SaslAuthenticate v1 as ``user`` (password: the name)."""
    auth = b"\0" + user.encode() + b"\0" + user.encode()
    return (request_frame(SASL_HANDSHAKE, 1, correlation, user, _string("PLAIN"))
            + request_frame(SASL_AUTHENTICATE, 1, correlation + 1, user,
                            INT32.pack(len(auth)) + auth))


def api_versions(client_id: str, correlation: int) -> bytes:
    return request_frame(API_VERSIONS, 0, correlation, client_id)


def empty_fetch(client_id: str, correlation: int) -> bytes:
    """Fetch v4 of no partitions, answered at once (max_wait_ms 0)."""
    body = (INT32.pack(-1) + INT32.pack(0) + INT32.pack(0) + INT32.pack(1 << 20) + b"\0"
            + INT32.pack(0))
    return request_frame(FETCH, 4, correlation, client_id, body)


# ---------------------------------------------------------------------------- clients
@dataclass
class _Conn:
    sock: socket.socket
    expect: int = 0  # responses still to read
    user: str = ""  # (users: authenticated once its first responses are in)
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)


def _responses(conn: _Conn) -> int:
    """Complete response frames in ``conn.inbox`` (consumed)."""
    n, buf, at = 0, conn.inbox, 0
    while len(buf) - at >= 4:
        size = INT32.unpack_from(buf, at)[0]
        if len(buf) - at - 4 < size:
            break
        at += 4 + size
        n += 1
    del buf[:at]
    return n


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _pump(sel: selectors.BaseSelector, timeout: float = 30.0) -> list[_Conn]:
    """One round of the selector: write what is pending, read what came; the connections
    whose every expected response has arrived."""
    done = []
    events = sel.select(timeout)
    if not events:
        raise TimeoutError("no progress for 30 s")
    for key, mask in events:
        conn: _Conn = key.data
        if mask & selectors.EVENT_WRITE and conn.outbox:
            sent = conn.sock.send(conn.outbox)
            del conn.outbox[:sent]
            if not conn.outbox:
                sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if mask & selectors.EVENT_READ:
            data = conn.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the proxy closed a drill connection")
            conn.inbox += data
            conn.expect -= _responses(conn)
            if conn.expect == 0:
                done.append(conn)
    return done


def _send(sel: selectors.BaseSelector, conn: _Conn, data: bytes, responses: int) -> None:
    conn.outbox += data
    conn.expect += responses
    sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)


def churn_client_ids(port: int, total: int, connections: int, first: int = 0) -> float:
    """``total`` ApiVersions requests, each with a client-id of its own, over ``connections``
    authenticated connections; returns the seconds taken."""
    start = time.monotonic()
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(connections):
        conn = _Conn(_connect(port))
        conn.sock.setblocking(False)
        sel.register(conn.sock, selectors.EVENT_READ, conn)
        _send(sel, conn, sasl_frames(CLIENTS_USER), 2)
        conns.append(conn)
    ready = []
    while len(ready) < connections:
        ready += _pump(sel)
    next_id = first
    last = first + total

    def batch(conn: _Conn) -> None:
        nonlocal next_id
        n = min(PIPELINE, last - next_id)
        if n > 0:
            _send(sel, conn, b"".join(api_versions(f"churn-{i}", i & 0x7FFFFFFF)
                                      for i in range(next_id, next_id + n)), n)
            next_id += n

    for conn in conns:
        batch(conn)
    busy = sum(1 for c in conns if c.expect)
    while busy:
        for conn in _pump(sel):
            batch(conn)
            if not conn.expect:
                busy -= 1
    for conn in conns:
        sel.unregister(conn.sock)
        conn.sock.close()
    sel.close()
    return time.monotonic() - start


def churn_users(port: int, total: int, parallel: int, first: int = 0) -> float:
    """``total`` connections, one per user: authenticate, one Fetch, close; returns the
    seconds taken."""
    start = time.monotonic()
    sel = selectors.DefaultSelector()
    next_user = first
    last = first + total
    live = 0

    def open_one() -> None:
        nonlocal next_user, live
        user = f"user-{next_user}"
        next_user += 1
        conn = _Conn(_connect(port), user=user)
        conn.sock.setblocking(False)
        sel.register(conn.sock, selectors.EVENT_READ, conn)
        _send(sel, conn, sasl_frames(user), 2)
        live += 1

    while next_user < last and live < parallel:
        open_one()
    while live:
        for conn in _pump(sel):
            if conn.user:  # authenticated (as a client, it waits for that): one request
                _send(sel, conn, empty_fetch(conn.user, 2), 1)
                conn.user = ""
                continue
            sel.unregister(conn.sock)
            conn.sock.close()
            live -= 1
            if next_user < last:
                open_one()
    sel.close()
    return time.monotonic() - start


# ---------------------------------------------------------------------------- the run
def state_entries(metrics: dict[str, float]) -> dict[str, int]:
    return {k[len(STATE):-2]: int(v) for k, v in metrics.items() if k.startswith(STATE)}


def _yaml(expiry: float, workdir: Path) -> tuple[str, str, str]:
    password = workdir / "proxy-password"
    password.write_text("kafka-quota-proxy")
    listeners = """  security:
    protocol: SASL_PLAINTEXT
"""
    upstream = f"""  sasl:
    mechanism: PLAIN
    username: kafka-quota-proxy
    password_file: "{password}"
"""
    quotas = f"""quotas:
  sensor_idle_expiry_seconds: {expiry}
  entities:
    - {{client-id: drill-nobody, request_percentage: 1}}
    - {{user: "<default>", consumer_byte_rate: 1000000000000}}
"""
    return listeners, upstream, quotas


def run(client_ids: int = 1_000_000, users: int = 100_000, connections: int = 16,
        user_connections: int = 32, expiry: float = 60.0, rounds: int = 2,
        workdir: Path | None = None, sample_seconds: float = 1.0) -> dict[str, Any]:
    """``rounds`` times: ``client_ids`` new client-ids and ``users`` new users, then quiet
    until every structure is back at its baseline. Figures per round (``r1_...``) and in
    all."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="drill-churn-"))
    figures: dict[str, Any] = {"client_ids_per_round": client_ids, "users_per_round": users,
                               "rounds": rounds, "expiry_seconds": expiry}
    listeners, upstream, quotas = _yaml(expiry, workdir)
    mb = 1 << 20
    with broker_behind_front(str(workdir / "tansu.log")) as front_port:
        proxy = ProxyProcess(f"127.0.0.1:{front_port}", workdir=workdir / "proxy",
                             listeners_yaml=listeners, upstream_yaml=upstream,
                             extra_yaml=quotas, log_level="warning")
        proxy.workdir.mkdir(parents=True, exist_ok=True)
        proxy.start()
        try:
            port = proxy.bootstrap_port
            # warm-up: a few of each, so the baseline holds the code paths' own allocations
            churn_client_ids(port, 2_000, 2, first=10**9)
            churn_users(port, 200, 4, first=10**9)
            wait_for(lambda: not any(state_entries(proxy.metrics()).values()),
                     expiry * 3 + 30, interval=0.5, what="the warm-up's state expired")
            assert proxy.process is not None
            watch = ProcessWatch(proxy.process.pid, every=sample_seconds).start()
            baseline = state_entries(proxy.metrics())
            figures["rss_baseline_mb"] = watch.rss[-1] / mb
            peak: dict[str, int] = dict(baseline)
            stop = threading.Event()

            def sample() -> dict[str, int]:
                now = state_entries(proxy.metrics())
                for k, v in now.items():
                    peak[k] = max(peak.get(k, 0), v)
                return now

            def sampler() -> None:
                while not stop.is_set():
                    with contextlib.suppress(OSError):
                        sample()
                    stop.wait(sample_seconds)

            thread = threading.Thread(target=sampler, daemon=True)
            thread.start()
            for r in range(1, rounds + 1):
                begin = len(watch.rss)
                took = churn_client_ids(port, client_ids, connections, first=r * 10**8)
                figures[f"r{r}_client_ids_per_second"] = client_ids / took
                took = churn_users(port, users, user_connections, first=r * 10**8)
                figures[f"r{r}_users_per_second"] = users / took
                quiet = time.monotonic()
                try:
                    wait_for(lambda: all(v <= baseline.get(k, 0)
                                         for k, v in sample().items()),
                             expiry * 3 + 60, interval=0.5,
                             what="every structure back at its baseline")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}: {sample()} (baseline {baseline})") from None
                figures[f"r{r}_seconds_to_baseline"] = time.monotonic() - quiet
                stop.wait(sample_seconds * 2)  # (an RSS sample or two after the expiry)
                figures[f"r{r}_rss_peak_mb"] = max(watch.rss[begin:]) / mb
                figures[f"r{r}_rss_after_expiry_mb"] = watch.rss[-1] / mb
            stop.set()
            thread.join(10)
            after = sample()
            watch_figures = watch.stop()
            figures.update({
                "rss_peak_mb": watch_figures["rss_peak_mb"],
                "rss_end_mb": watch_figures["rss_end_mb"],
                "fds_start": watch_figures["fds_start"], "fds_end": watch_figures["fds_end"],
            })
            for k in sorted(peak):
                figures[f"entries_{k}_baseline"] = baseline.get(k, 0)
                figures[f"entries_{k}_peak"] = peak[k]
                figures[f"entries_{k}_after"] = after.get(k, 0)
            figures["proxy_alive"] = proxy.alive
            figures["tracebacks"] = traceback_lines(proxy)
        finally:
            proxy.stop()
    return figures


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--front":
        serve_front(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client-ids", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--user-connections", type=int, default=32)
    parser.add_argument("--expiry", type=float, default=60.0,
                        help="quotas.sensor_idle_expiry_seconds (default 60)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    figures = run(args.client_ids, args.users, args.connections, args.user_connections,
                  args.expiry, args.rounds)
    print_figures("churn drill", figures)
    return 0 if figures["proxy_alive"] and not figures["tracebacks"] else 1


if __name__ == "__main__":
    sys.exit(main())
