"""Prometheus metrics. The hot path only bumps plain Python counters; a custom collector turns
them into Prometheus families at scrape time, so forwarding pays no lock or label lookup."""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kafka_quota_proxy.protocol.apis import api_name

EntityRow = tuple[str, str, str, str, float, float | None, int, int]

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class ProxyStats:
    """Counters updated by the connections; read by the collector, the demo and tests."""

    def __init__(self) -> None:
        self.connections_open: dict[str, int] = defaultdict(int)  # listener kind -> open
        self.connections_total: dict[str, int] = defaultdict(int)
        self.closed: dict[str, int] = defaultdict(int)  # reason -> count
        self.requests: dict[int, int] = defaultdict(int)  # api key -> count
        self.request_bytes: dict[int, int] = defaultdict(int)
        self.response_bytes: dict[int, int] = defaultdict(int)
        # client id -> [request bytes, response bytes, requests]: the demo's per-client rates,
        # kept only once asked for (``track_clients``) and for at most ``per_client_limit`` ids
        # (client-ids are the client's to choose: an unbounded map would grow with their churn)
        self.per_client: dict[str, list[int]] = {}
        self.per_client_limit = 0
        self._untracked = [0, 0, 0]  # what the client-ids not kept add up to (never read)
        self.latency_buckets: dict[int, list[int]] = {}  # api key -> counts per bucket (+Inf last)
        self.latency_sum: dict[int, float] = defaultdict(float)
        self.rewritten: dict[int, int] = {}
        # which side was slow -> times reading from the other side was paused
        self.backpressure: dict[str, int] = defaultdict(int)
        # bytes moved socket to socket in the kernel (``proxy.splice``), by direction
        self.spliced: dict[str, int] = defaultdict(int)
        self.splice_waits = 0  # spliced bytes that waited in a pipe for the broker's socket
        self.node_endpoints_dropped: Callable[[], int] = lambda: 0
        self.client_write_buffered: Callable[[], int] = lambda: 0
        self.client_unread: Callable[[], int] = lambda: 0
        self.throttled: dict[str, int] = defaultdict(int)  # quota type -> throttled requests
        self.throttle_ms: dict[str, int] = defaultdict(int)  # quota type -> ms imposed
        self.reloads: dict[str, int] = defaultdict(int)  # "success" | "failure"
        self.tls_reloads: dict[str, int] = defaultdict(int)  # "success" | "failure"
        self.credentials_reloads: dict[str, int] = defaultdict(int)  # "success" | "failure"
        self.refused: dict[str, int] = defaultdict(int)  # reason -> connections refused
        # a connection's first request of a budget over its quota, held until it is back
        self.held_first_requests = 0
        # Produce requests recorded at close: forwarded whole, never answered (client gone)
        self.unanswered_produce_recorded = 0
        self.max_connections = 0
        self.fd_limit = 0
        self.in_flight: Callable[[], int] = lambda: 0  # requests awaiting their response
        # event-loop lag: how late a timer fired, per bucket of LATENCY_BUCKETS (+Inf last)
        self.loop_lag_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.loop_lag_sum = 0.0
        # the busiest budgets: (broker, quota, user, client_id, rate, limit, throttled, ms)
        self.quota_entities: Callable[[], list[EntityRow]] = list
        self.brokers_known: Callable[[], int] = lambda: 0
        # structure -> entries, of those keyed by client-chosen names (client-id, user, address)
        self.state_entries: Callable[[], dict[str, int]] = dict
        # Each configured feature's own metric families (fetch routing, capture, storage),
        # collected at scrape time after the runtime's.
        self.feature_families: list[Callable[[], Iterable[Any]]] = []

    def observe_latency(self, api_key: int, seconds: float) -> None:
        buckets = self.latency_buckets.get(api_key)
        if buckets is None:
            buckets = self.latency_buckets[api_key] = [0] * (len(LATENCY_BUCKETS) + 1)
        buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum[api_key] += seconds

    def observe_loop_lag(self, seconds: float) -> None:
        self.loop_lag_buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.loop_lag_sum += seconds

    def track_clients(self, limit: int = 1000) -> None:
        """Keep per-client figures (``per_client``) for the first ``limit`` client-ids seen."""
        self.per_client_limit = limit

    def client(self, client_id: str | None) -> list[int]:
        """The figures of one client-id: its own while tracked, else a shared scratch list."""
        key = client_id or ""
        c = self.per_client.get(key)
        if c is None:
            if len(self.per_client) >= self.per_client_limit:
                return self._untracked
            c = self.per_client[key] = [0, 0, 0]
        return c


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    acc = 0
    for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), counts, strict=True):
        acc += n
        out.append((bound, acc))
    return out


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def family(kind: Any, name: str, doc: str, label: str, values: dict[str, Any]) -> Any:
    family = kind(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def entity_families(rows: list[EntityRow], prefix: str = "kafka_proxy_quota_entity",
                    of: str = "") -> Iterator[Any]:
    """Per busiest budget; one unit per metric (Prometheus conventions): byte rates and
    request-time percentages are different metrics, times are in seconds. ``prefix`` and
    ``of`` (what the budgets are, at the head of each help text): the shadow quotas' too."""
    labels = ["broker", "quota", "user", "client_id"]
    byte_rate = GaugeMetricFamily(
        f"{prefix}_bytes_per_second",
        f"{of}Measured byte rate of the busiest produce and fetch quota budgets",
        labels=labels)
    byte_limit = GaugeMetricFamily(
        f"{prefix}_bytes_per_second_limit",
        f"{of}Byte-rate quota of the busiest produce and fetch budgets (absent: unlimited)",
        labels=labels)
    percent = GaugeMetricFamily(
        f"{prefix}_request_percentage",
        f"{of}Measured request time of the busiest request-quota budgets, in % of one thread",
        labels=labels)
    percent_limit = GaugeMetricFamily(
        f"{prefix}_request_percentage_limit",
        f"{of}Request quota of the busiest budgets, in % of one thread (absent: unlimited)",
        labels=labels)
    throttled = CounterMetricFamily(f"{prefix}_throttled_requests",
                                    f"{of}Throttled requests of the busiest budgets",
                                    labels=labels)
    throttle_s = CounterMetricFamily(f"{prefix}_throttle_seconds",
                                     f"{of}Throttle time of the busiest budgets", labels=labels)
    for broker, quota, user, client, r, bound, n, ms in rows:
        values = [broker, quota, user, client]
        request = quota == "request"
        (percent if request else byte_rate).add_metric(values, r)
        if bound is not None:
            (percent_limit if request else byte_limit).add_metric(values, bound)
        throttled.add_metric(values, n)
        throttle_s.add_metric(values, ms / 1000.0)
    yield from (byte_rate, byte_limit, percent, percent_limit, throttled, throttle_s)


class _Collector(Collector):
    def __init__(self, stats: ProxyStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        s = self.stats
        yield family(GaugeMetricFamily, "kafka_proxy_connections", "Open client connections",
                      "listener", s.connections_open)
        yield family(CounterMetricFamily, "kafka_proxy_connections_accepted",
                      "Client connections accepted", "listener", s.connections_total)
        yield family(CounterMetricFamily, "kafka_proxy_connections_closed",
                      "Client connections closed, by reason", "reason", s.closed)
        yield family(CounterMetricFamily, "kafka_proxy_connections_refused",
                      "Client connections refused at accept, by reason", "reason", s.refused)
        for name, doc, value in (
            ("kafka_proxy_max_connections", "Client connections allowed at once",
             s.max_connections),
            ("kafka_proxy_fd_limit", "The process's soft limit on open file descriptors",
             s.fd_limit),
            ("kafka_proxy_open_fds", "File descriptors the process has open", _open_fds()),
            ("kafka_proxy_requests_in_flight", "Requests forwarded and awaiting their response",
             s.in_flight()),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        counters: tuple[tuple[str, str, dict[int, int]], ...] = (
            ("kafka_proxy_requests", "Requests forwarded, by API", s.requests),
            ("kafka_proxy_request_bytes", "Request bytes forwarded, by API", s.request_bytes),
            ("kafka_proxy_response_bytes", "Response bytes forwarded, by API", s.response_bytes),
            ("kafka_proxy_responses_rewritten", "Responses rewritten, by API", s.rewritten),
        )
        for name, doc, data in counters:
            by_name = {api_name(key): v for key, v in sorted(data.items())}
            yield family(CounterMetricFamily, name, doc, "api", by_name)
        h = HistogramMetricFamily(
            "kafka_proxy_upstream_latency_seconds",
            "Time from forwarding a request to its response arriving",
            labels=["api"],
        )
        for key, counts in sorted(s.latency_buckets.items()):
            h.add_metric([api_name(key)], _cumulative(counts), s.latency_sum[key])
        yield h
        lag = HistogramMetricFamily(
            "kafka_proxy_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 0.1 s (time every connection waits)")
        lag.add_metric([], _cumulative(s.loop_lag_buckets), s.loop_lag_sum)
        yield lag
        g = GaugeMetricFamily(
            "kafka_proxy_client_write_buffer_bytes",
            "Bytes waiting in the proxy's write buffers towards clients",
        )
        g.add_metric([], s.client_write_buffered())
        yield g
        g = GaugeMetricFamily(
            "kafka_proxy_client_unread_bytes",
            "Bytes read from clients and held back, not forwarded yet (past the bound on "
            "requests in flight, throttled, or before the broker connection is made)",
        )
        g.add_metric([], s.client_unread())
        yield g
        yield family(CounterMetricFamily, "kafka_proxy_backpressure_pauses",
                      "Times reading one side paused because the other side's write buffer "
                      "was full", "slow_side", s.backpressure)
        yield family(CounterMetricFamily, "kafka_proxy_spliced_bytes",
                      "Bytes of record batches moved from one socket to the other in the "
                      "kernel (splice), without passing through the proxy's memory",
                      "direction", s.spliced)
        c = CounterMetricFamily(
            "kafka_proxy_splice_waits",
            "Times spliced bytes waited in a pipe for room in the broker's socket (the client "
            "not read meanwhile)")
        c.add_metric([], s.splice_waits)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_node_endpoints_dropped",
            "KIP-951 node_endpoints dropped because the proxy address did not fit in place",
        )
        c.add_metric([], self.stats.node_endpoints_dropped())
        yield c
        yield family(CounterMetricFamily, "kafka_proxy_quota_throttled_requests",
                      "Requests throttled, by the quota that throttled them", "quota",
                      s.throttled)
        yield family(CounterMetricFamily, "kafka_proxy_quota_throttle_seconds",
                      "Throttle time imposed, by quota", "quota",
                      {k: v / 1000.0 for k, v in s.throttle_ms.items()})
        c = CounterMetricFamily(
            "kafka_proxy_quota_held_first_requests",
            "Connections whose first request of a budget over its quota waited, unread, until "
            "the budget was back within it (a client reconnecting instead of waiting out its "
            "throttle)")
        c.add_metric([], s.held_first_requests)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_quota_unanswered_produce_recorded",
            "Produce requests recorded into their quotas when their connection closed: sent to "
            "the broker whole, never answered (a client that closes without reading its "
            "responses is charged for what the broker wrote)")
        c.add_metric([], s.unanswered_produce_recorded)
        yield c
        yield family(CounterMetricFamily, "kafka_proxy_config_reloads",
                      "Configuration reloads, by result", "result", s.reloads)
        yield family(CounterMetricFamily, "kafka_proxy_tls_reloads",
                      "Reloads of the listeners' TLS files, by result", "result", s.tls_reloads)
        yield family(CounterMetricFamily, "kafka_proxy_credentials_reloads",
                     "Reloads of the SASL credentials file, by result", "result",
                     s.credentials_reloads)
        yield from entity_families(s.quota_entities())
        yield family(GaugeMetricFamily, "kafka_proxy_client_state_entries",
                     "Entries held per structure keyed by client-chosen names (client-id, "
                     "user, address): each bounded or expiring", "structure",
                     {"per_client": len(s.per_client), **s.state_entries()})
        g = GaugeMetricFamily("kafka_proxy_upstream_brokers", "Upstream brokers known")
        g.add_metric([], s.brokers_known())
        yield g
        for families in s.feature_families:
            yield from families()


def make_registry(stats: ProxyStats) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats))
    return registry


async def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                        refresh: Callable[[], Awaitable[None]] | None = None) -> asyncio.Server:
    """A minimal HTTP/1.1 server on the event loop: GET /metrics; anything else 404.
    ``refresh``: awaited before each scrape (the supervisor gathers its workers' metrics)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                if refresh is not None:
                    await refresh()
                body = generate_latest(registry)
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                )
            else:
                body, head = (
                    b"not found\n",
                    b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n",
                )
            writer.write(
                head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
