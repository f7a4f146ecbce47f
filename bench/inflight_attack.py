"""A client that pipelines requests and never reads an answer: how much of it the proxy takes.

One tansu broker (memory storage); for each run a fresh proxy (``python -m proxy run``) in
front of it, and one client on a broker port that sends ApiVersions v0 frames in batches of
``--batch`` (default 1,000) with non-blocking sends (whole batches, or ``--random-sizes``) for
``--seconds`` (default 8), never calling ``recv``. The first two batches are made before the
client connects, so that its first bytes follow the connection at once, as a client
pipelining from its first byte sends them: the proxy reads them while it connects to the
broker.

``--long-polls N`` puts N Fetch requests first (an empty partition, ``--hold-ms``, default
10,000), which the broker holds that long: with N at the proxy's bound
(``--max-in-flight``, default the proxy's own, 1,000) nothing comes back during the run, and
whatever the proxy reads past the bound stays with it. This makes the window in which the
bound did not stop reading (the pause at the bound falling on the pause while connecting, which
uvloop does not honour) last the whole run instead of until the first answer.

Reported per run: the proxy's RSS growth (psutil, end of the run minus just before it), the
bytes the client managed to send, and the most requests in flight, bytes in the write buffers
toward clients and bytes read from clients and held unforwarded seen at /metrics (sampled every
0.2 s). At the end: min / median / max of the RSS growth and of the bytes sent.

    .venv/bin/python bench/inflight_attack.py                  # 20 runs of 8 s
    .venv/bin/python bench/inflight_attack.py --long-polls 1000
    .venv/bin/python bench/inflight_attack.py --runs 5 --seconds 2 --random-sizes

See docs/reliability.md for what the proxy may hold of such a client.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import select
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic
from testkit.frames import kio_encode, request_frame


def api_versions_v0(correlation: int) -> bytes:
    return struct.pack(">ihhih", 10, 18, 0, correlation & 0x7FFFFFFF, 0)


def batch_of(first: int, batch: int) -> bytes:
    return b"".join([api_versions_v0(first + i) for i in range(batch)])


def long_polls(topic: str, n: int, hold_ms: int) -> bytes:
    """``n`` Fetch v12 requests (correlation ids from 1 << 30) on partition 0 of the empty
    ``topic``, min_bytes 1: the broker answers each after ``hold_ms``."""
    from kio.index import load_request_schema
    from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
    from kio.static.primitive import i32Timedelta

    body = kio_encode(load_request_schema(1, 12)(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=hold_ms)), min_bytes=1,
        topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=()))
    return b"".join(request_frame(1, 12, (1 << 30) + i, "attack", body) for i in range(n))


def attack(port: int, seconds: float, batch: int, rng: random.Random | None,
           first: bytes = b"", sample: Callable[[], None] | None = None) -> int:
    """Send ``first`` then batches for ``seconds``; return the bytes sent. Whole batches, or
    (``rng``) random sizes. ``sample()`` is called between sends."""
    batches = [first + batch_of(0, batch), batch_of(batch, batch)]
    correlation = 2 * batch
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    sent = 0
    pending = memoryview(b"")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not pending:
                if batches:
                    pending = memoryview(batches.pop(0))
                else:
                    pending = memoryview(batch_of(correlation, batch))
                    correlation += batch
            size = len(pending) if rng is None or not sent else rng.randint(1, len(pending))
            try:
                n = sock.send(pending[:size])
                sent += n
                pending = pending[n:]
            except BlockingIOError:
                select.select([], [sock], [], 0.01)
            if sample is not None:
                sample()
    finally:
        sock.close()
    return sent


def summary(values: list[float]) -> str:
    return (f"min {min(values):.1f} / median {statistics.median(values):.1f} / "
            f"max {max(values):.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--random-sizes", action="store_true",
                    help="send random sizes (default: whole batches)")
    ap.add_argument("--long-polls", type=int, default=0,
                    help="this many long-poll Fetch requests first")
    ap.add_argument("--hold-ms", type=int, default=10_000)
    ap.add_argument("--max-in-flight", type=int, default=None,
                    help="the proxy's network.max_in_flight_requests")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    extra = "quotas: {overrides: {enabled: false}}\n"
    if args.max_in_flight is not None:
        extra += f"network: {{max_in_flight_requests: {args.max_in_flight}}}\n"
    broker = TansuBroker().start()
    growth: list[float] = []
    sent_all: list[float] = []
    try:
        first = b""
        if args.long_polls:
            first = long_polls(new_topic(broker.bootstrap, "attack"), args.long_polls,
                               args.hold_ms)
        for run in range(args.runs):
            proxy = ProxyProcess(broker.bootstrap, log_level="warning", extra_yaml=extra).start()
            try:
                port = proxy.wait_broker_listener(111)
                assert proxy.process is not None
                process = psutil.Process(proxy.process.pid)
                seen = dict.fromkeys(("in_flight", "write_buffer", "unread"), 0.0)
                last = [0.0]

                def sample(proxy: ProxyProcess = proxy, seen: dict[str, float] = seen,
                           last: list[float] = last) -> None:
                    now = time.monotonic()
                    if now - last[0] < 0.2:
                        return
                    last[0] = now
                    m = proxy.metrics()
                    for key, name in (("in_flight", "kafka_proxy_requests_in_flight"),
                                      ("write_buffer", "kafka_proxy_client_write_buffer_bytes"),
                                      ("unread", "kafka_proxy_client_unread_bytes")):
                        seen[key] = max(seen[key], m.get(name, 0))

                before = process.memory_info().rss
                sent = attack(port, args.seconds, args.batch,
                              rng if args.random_sizes else None, first, sample)
                after = process.memory_info().rss
            finally:
                proxy.stop()
            mb = (after - before) / 2**20
            growth.append(mb)
            sent_all.append(sent / 2**20)
            print(f"run {run + 1:2d}: RSS +{mb:6.1f} MB, sent {sent / 2**20:7.1f} MB, "
                  f"in flight <= {seen['in_flight']:.0f}, client write buffer <= "
                  f"{seen['write_buffer'] / 2**20:.1f} MB, unread <= "
                  f"{seen['unread'] / 2**20:.2f} MB", flush=True)
    finally:
        broker.stop()
    print(f"\n{len(growth)} runs of {args.seconds:g} s: RSS growth {summary(growth)}; "
          f"sent {summary(sent_all)}")


if __name__ == "__main__":
    main()
