"""Clients whose offered load is known, run against the project's own quota engine, written as
the proxy writes a capture: the known truth that ``spark_jobs.tune``'s offered-load estimate is
held to.

The proxy side is the quota filter's (``proxy.features.quotas.filter``), on an injected clock:
one ``QuotaManager`` (one broker); a request is read from the connection when the connection is
not muted and, with requests of a limited client in flight, only while its produce budget,
counting those in flight, is below its quota (``produce_headroom``); it is recorded into the
budget when its response starts (``quota.recording.record_request``), and a throttle mutes the
connection from then until it has passed. The client waits it out too (KIP-219).

- ``Producer``: librdkafka-like. The application hands it ``rate`` bytes/s, evenly; a batch
  goes out when it holds ``batch_size`` bytes or its oldest byte has waited ``linger_ms``, with
  at most ``max_in_flight`` requests awaiting their response. While the client is held back
  its queue grows; after, it sends what is queued, ``batch_size`` at a time.
- ``Consumer``: one Fetch at a time (librdkafka, per broker). Data arrives at ``rate`` bytes/s
  (None: a backlog, always more than a fetch takes); the broker answers as soon as there is a
  byte (``fetch.min.bytes`` 1) or after ``fetch_wait_max_ms``, with at most
  ``fetch_max_bytes``.

The truth (``truth``): what the same client sends when nothing holds it back, measured as the
quota measures it (request bytes for a producer, response bytes for a consumer, per second):
the same simulation with no quota.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from kafka_quota_proxy.proxy.features.capture.writer import FIELDS
from kafka_quota_proxy.quota.entities import QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager
from kafka_quota_proxy.quota.recording import record_request
from kafka_quota_proxy.quota.replay import settings_from_section
from testkit.synth_capture import write_capture_file

START_MS = 1_790_000_000_000  # wall clock of the simulation's time 0 (a minute boundary)
QUOTA_CLOCK_MS = 7_000_000  # the quota clock (monotonic) at time 0
RUN = f"5151-{START_MS}"
PRODUCE_RESPONSE_BYTES = 64
FETCH_REQUEST_BYTES = 120


@dataclass(frozen=True)
class Producer:
    rate: float  # bytes/s the application offers
    batch_size: int = 1_000_000  # librdkafka batch.size
    linger_ms: float = 5.0  # librdkafka linger.ms
    max_in_flight: int = 5  # max.in.flight (idempotent: 5)
    overhead: int = 120  # request bytes around the records (headers, batch header)


@dataclass(frozen=True)
class Consumer:
    rate: float | None  # bytes/s arriving in the partitions it reads; None: a backlog
    fetch_max_bytes: int = 1_000_000  # fetch.max.bytes
    fetch_wait_max_ms: float = 500.0  # fetch.wait.max.ms
    overhead: int = 100  # response bytes around the records


@dataclass(frozen=True)
class Client:
    """One client connection: who it is, what it does, and when (seconds from time 0)."""

    role: Producer | Consumer
    user: str = "alice"
    client_id: str = "app"
    connection: int = 1
    start_s: float = 0.0
    stop_s: float | None = None  # the application stops handing it data (None: never)


@dataclass(frozen=True)
class Link:
    latency_ms: float = 2.0  # the broker's round trip (and its work) for a request
    bytes_per_ms: float = 500_000.0  # 500 MB/s each way


@dataclass
class _State:
    client: Client
    index: int
    # the application's data handed over / cut into requests (producer), or taken (consumer)
    taken: float = 0.0
    queue: deque[int] = field(default_factory=deque)  # requests sent, not yet read (sizes)
    in_flight: int = 0  # requests sent, response not yet received (client side)
    proxy_in_flight: int = 0  # requests read by the proxy, response not yet recorded
    held_until: float = -math.inf  # the client waits out its throttle until then
    muted_until: float = -math.inf  # the proxy reads nothing of it until then
    version: int = 0  # of the client's "send" wake-up (older ones are stale)


def _available(c: Client, role: Producer | Consumer, t: float, taken: float) -> float:
    rate = role.rate
    if rate is None:
        return math.inf
    end = t if c.stop_s is None else min(t, c.stop_s * 1000)
    return max(0.0, rate * (end - c.start_s * 1000) / 1000 - taken)


class _Simulation:
    def __init__(self, clients: Sequence[Client], quotas: dict[str, object] | None,
                 seconds: float, link: Link, broker: int) -> None:
        self.clients = [_State(c, i) for i, c in enumerate(clients)]
        self.end_ms = seconds * 1000
        self.link = link
        self.broker = broker
        section = quotas or {"entities": []}
        self.settings = settings_from_section(section)
        self.manager = QuotaManager(self.settings)
        self.produce_on = bool(self.settings.for_type(QuotaType.PRODUCE))
        self.fetch_on = bool(self.settings.for_type(QuotaType.FETCH))
        # (time, order, client, kind, three numbers the kind needs)
        self.events: list[tuple[float, int, int, str, tuple[float, float, float]]] = []
        self.order = 0
        self.rows: list[dict[str, object]] = []

    def push(self, t: float, kind: str, state: _State, a: float = 0.0, b: float = 0.0,
             c: float = 0.0) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, self.order, state.index, kind, (a, b, c)))

    # ------------------------------------------------------------------ the client
    def wake(self, s: _State, t: float) -> None:
        """Schedule the client's next send (a new wake-up makes the older ones stale)."""
        s.version += 1
        at = self.next_send(s, t)
        if at is not None and at < self.end_ms:
            self.push(at, "send", s, s.version)

    def next_send(self, s: _State, t: float) -> float | None:
        c, role = s.client, s.client.role
        t = max(t, c.start_s * 1000, s.held_until)
        if isinstance(role, Consumer):
            return t if s.in_flight == 0 else None
        if s.in_flight >= role.max_in_flight:
            return None
        if _available(c, role, t, s.taken) >= role.batch_size:
            return t
        # the oldest byte not yet cut into a batch arrived when the application had handed
        # over ``taken`` bytes; the batch goes when it has waited linger.ms, or is full
        stop = math.inf if c.stop_s is None else c.stop_s * 1000
        oldest = c.start_s * 1000 + s.taken * 1000 / role.rate
        if oldest >= stop:
            return None  # nothing more to send
        full = c.start_s * 1000 + (s.taken + role.batch_size) * 1000 / role.rate
        return max(t, min(oldest + role.linger_ms, full if full <= stop else math.inf))

    def send(self, s: _State, t: float) -> None:
        role = s.client.role
        if isinstance(role, Producer):
            size = math.floor(min(_available(s.client, role, t, s.taken), role.batch_size))
            if size <= 0:  # (less than a byte yet)
                s.version += 1
                self.push(t + 1, "send", s, s.version)
                return
            s.taken += size
            request = size + role.overhead + 4
        else:
            request = FETCH_REQUEST_BYTES
        s.in_flight += 1
        s.queue.append(request)
        self.try_read(s, t)
        self.wake(s, t)

    # ------------------------------------------------------------------ the proxy
    def try_read(self, s: _State, t: float) -> None:
        if not s.queue:
            return
        if t < s.muted_until:
            self.push(s.muted_until, "read", s)
            return
        c = s.client
        if s.proxy_in_flight and isinstance(c.role, Producer) and self.produce_on and not (
                self.manager.produce_headroom(c.user, c.client_id, int(t))):
            return  # read again when a response comes back
        request = s.queue.popleft()
        s.proxy_in_flight += 1
        if isinstance(c.role, Producer):
            if self.produce_on:
                self.manager.sensor(QuotaType.PRODUCE, c.user, c.client_id,
                                    int(t)).in_flight += request - 4
            at = t + self.link.latency_ms + request / self.link.bytes_per_ms
            self.push(at, "response", s, t, request, PRODUCE_RESPONSE_BYTES)
        else:
            self.push(t + self.link.latency_ms / 2, "broker", s, t, t)
        if s.queue:
            self.push(t, "read", s)

    def broker_fetch(self, s: _State, t: float, read: float, arrived: float) -> None:
        c, role = s.client, s.client.role
        assert isinstance(role, Consumer)
        available = _available(c, role, t, s.taken)
        if available < 1 and t < arrived + role.fetch_wait_max_ms:
            if role.rate:
                need = c.start_s * 1000 + (s.taken + 1) * 1000 / role.rate
                at = need if c.stop_s is None or need <= c.stop_s * 1000 else math.inf
            else:
                at = math.inf
            self.push(min(at, arrived + role.fetch_wait_max_ms), "broker", s, read, arrived)
            return
        size = math.floor(min(available, role.fetch_max_bytes))
        s.taken += size
        response = size + role.overhead + 4
        self.push(t + self.link.latency_ms / 2, "response", s, read, FETCH_REQUEST_BYTES,
                  response)

    def response(self, s: _State, t: float, read: float, request: int, response: int) -> None:
        """The response starts: recorded (the proxy's rule), a throttle mutes the connection;
        the client has it once it has passed (the client then waits out the throttle)."""
        c = s.client
        now = int(t)
        produce = isinstance(c.role, Producer)
        api_key = 0 if produce else 1
        if produce and self.produce_on:
            self.manager.sensor(QuotaType.PRODUCE, c.user, c.client_id,
                                now).in_flight -= request - 4
        p, f, q = record_request(self.manager, c.user, c.client_id, api_key, request, response,
                                 False, 0.0, now, None, self.produce_on, self.fetch_on, False)
        held = max(p, f, q)
        self.rows.append({
            "ts_ms": START_MS + int(read), "quota_ms": QUOTA_CLOCK_MS + now,
            "connection": c.connection, "user": c.user, "client_id": c.client_id,
            "api_key": api_key, "request_bytes": request, "response_bytes": response,
            "duration_us": round((t - read) * 1000), "throttle_produce_ms": p,
            "throttle_fetch_ms": f})
        s.proxy_in_flight -= 1
        received = t + (0 if produce else response / self.link.bytes_per_ms)
        if held:
            s.muted_until = max(s.muted_until, t + held)
            s.held_until = max(s.held_until, received + held)
        self.push(received, "received", s)
        self.try_read(s, t)

    def run(self) -> pd.DataFrame:
        for s in self.clients:
            self.wake(s, 0.0)
        while self.events:
            t, _, i, kind, (a, b, c) = heapq.heappop(self.events)
            if t >= self.end_ms:
                break
            s = self.clients[i]
            if kind == "send":
                if a == s.version:
                    self.send(s, t)
            elif kind == "read":
                self.try_read(s, t)
            elif kind == "broker":
                self.broker_fetch(s, t, a, b)
            elif kind == "response":
                self.response(s, t, a, int(b), int(c))
            elif kind == "received":
                s.in_flight -= 1
                self.wake(s, t)
        return self.capture()

    def capture(self) -> pd.DataFrame:
        rows = pd.DataFrame(self.rows, columns=[
            "ts_ms", "quota_ms", "connection", "user", "client_id", "api_key",
            "request_bytes", "response_bytes", "duration_us", "throttle_produce_ms",
            "throttle_fetch_ms"])
        n = len(rows)
        rows.insert(0, "seq", np.arange(1, n + 1, dtype=np.int64))
        rows.insert(0, "process", f"sim/0/{START_MS}")
        rows.insert(0, "instance", "sim")
        rows.insert(0, "run", RUN)
        rows["broker"] = np.int32(self.broker)
        rows["client_address"] = "10.0.0.1"
        rows["api_version"] = np.where(rows["api_key"] == 0, 9, 15).astype(np.int16)
        rows["request_time_ms"] = 0.05 + rows["duration_us"] / 1000.0
        rows["follower"] = False
        rows["throttle_request_ms"] = np.int32(0)
        rows["client_rack"] = None
        rows["quota_generation"] = np.int32(0)
        rows["storage_scale"] = None
        rows["partitions"] = None
        return rows[[name for name, _ in FIELDS]].astype({
            "ts_ms": "int64", "quota_ms": "int64", "connection": "int64",
            "api_key": "int16", "request_bytes": "int32", "response_bytes": "int32",
            "duration_us": "int64", "throttle_produce_ms": "int32",
            "throttle_fetch_ms": "int32"})


def simulate(clients: Sequence[Client], quotas: dict[str, object] | None, seconds: float,
             link: Link = Link(), broker: int = 1) -> pd.DataFrame:
    """The capture rows (every field of the capture schema, one row per request, in the order
    the quotas recorded them) of ``clients`` through one broker under ``quotas`` (a
    ``quotas`` section; None: no quota) for ``seconds``."""
    return _Simulation(clients, quotas, seconds, link, broker).run()


def recorded_bytes(rows: pd.DataFrame) -> pd.Series:
    """What each row records into its byte-rate quota: request bytes - 4 for a Produce,
    response bytes - 4 for a Fetch."""
    return pd.Series(np.where(rows["api_key"] == 0, rows["request_bytes"] - 4,
                              rows["response_bytes"] - 4), index=rows.index, dtype=float)


def truth(client: Client, seconds: float, link: Link = Link()) -> float:
    """What ``client`` sends (as its byte-rate quota counts it) per second with nothing holding
    it back: the same simulation with no quota, over the time it is active (from its start to
    its stop, or the end; past the first and last second, where the simulation begins and
    ends, for a steady rate)."""
    rows = simulate([client], None, seconds, link)
    start = client.start_s + 1
    stop = (seconds if client.stop_s is None else client.stop_s) - 1
    t = (rows["ts_ms"] - START_MS) / 1000.0
    inside = (t >= start) & (t < stop)
    return float(recorded_bytes(rows)[inside].sum() / (stop - start))


def quota_section(role: Producer | Consumer, quota: float, user: str = "alice"
                  ) -> dict[str, object]:
    """A per-user quota of ``quota`` bytes/s of the role's kind, Kafka's window."""
    key = "producer_byte_rate" if isinstance(role, Producer) else "consumer_byte_rate"
    return {"window": {"samples": 11, "size_seconds": 1},
            "entities": [{"user": user, key: quota}]}


def write_capture(rows: pd.DataFrame, directory: Path, quotas: dict[str, object]) -> Path:
    """``rows`` as a capture directory, written as the proxy writes one (with the live
    ``quotas-<run>-<generation>.json``)."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    n = len(rows)
    columns: dict[str, object] = {}
    for name, kind in FIELDS:
        if name in ("client_rack", "storage_scale", "partitions"):
            columns[name] = pa.nulls(n, kind)
        else:
            columns[name] = rows[name].tolist()
    write_capture_file(directory / f"capture-sim-{RUN}-00000.parquet", columns)
    (directory / f"quotas-{RUN}-00000.json").write_text(json.dumps(
        {"run": RUN, "quota_generation": 0, "since_ms": START_MS, "quotas": quotas}))
    return directory
