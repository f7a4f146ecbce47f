"""Request quotas (``request_percentage``) charge work, never waiting (README "Quotas"): under
the README's 50% quota, consumers idling in long polls, consumers joining and leaving a group
and ``acks=all`` producers at librdkafka's defaults are never throttled, though their requests
wait on the broker for hundreds of milliseconds; a client flooding cheap requests (ApiVersions,
Metadata, ListOffsets in a loop) is held to its quota, within 10%, in the terms the replay
uses (the ``request_time_ms`` of the capture), and the replay gives every throttle the proxy
gave."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, new_topic, reproduce_capture, wait_for
from testkit.rates import cycle_rate

pytestmark = pytest.mark.e2e

RUN_S = 16.0
FLOOD_QUOTA = 2.0  # % of one thread: 20 ms of work per second
WARMUP_S = 6.0  # the first window's burst paid back before measuring
CYCLES_S = 20.0  # measured from one burst to the first burst this much later


def _rows(capture_dir: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(capture_dir.glob("capture-*.parquet"))
            for r in pq.read_table(f).to_pylist()]


def _proxy(tansu: TansuBroker, capture_dir: Path, entities: str) -> ProxyProcess:
    return ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  entities:
{entities}capture:
  dir: "{capture_dir}"
  rotate_seconds: 5
""").start()


def _idle_consumer(bootstrap: str, topic: str, client_id: str, group: str, subscribe: bool,
                   stop: threading.Event, errors: list[str]) -> None:
    """librdkafka defaults on an empty topic: subscribed (a JoinGroup that waits for the
    group to settle), or assigned its partition (long-poll fetches, fetch.wait.max.ms 500)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                  "auto.offset.reset": "earliest"})
    if subscribe:
        c.subscribe([topic])
    else:
        c.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            m = c.poll(0.2)
            if m is not None and m.error() and m.error().code() != KafkaError._PARTITION_EOF:
                errors.append(str(m.error()))
    finally:
        c.close()


def _joining_consumers(bootstrap: str, topic: str, stop: threading.Event,
                       errors: list[str]) -> None:
    """aiokafka consumers of one group joining one after the other and leaving: every arrival
    and departure makes the others rejoin, and a JoinGroup waits for the whole group."""

    async def member(n: int, stay_s: float) -> None:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="joiners",
                             client_id=f"joiner-{n}", auto_offset_reset="earliest",
                             session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
        await c.start()
        try:
            deadline = time.monotonic() + stay_s
            while time.monotonic() < deadline and not stop.is_set():
                await c.getmany(timeout_ms=300)
        finally:
            await c.stop()

    async def main() -> None:
        tasks = []
        for n in range(3):
            tasks.append(asyncio.create_task(member(n, RUN_S - 3 * n)))
            await asyncio.sleep(2.0)
        for t in tasks:
            try:
                await t
            except Exception as exc:  # reported, and failing the test
                errors.append(repr(exc))

    asyncio.run(main())


def _acks_all_producer(bootstrap: str, topic: str, stop: threading.Event,
                       errors: list[str], sent: list[int]) -> None:
    """librdkafka's defaults (acks=all, batch.size 1 MB, linger.ms 5), paced at 2 MB/s."""
    p = Producer({"bootstrap.servers": bootstrap, "client.id": "acks-all"})
    rate = 2_000_000
    start = time.monotonic()
    n = 0
    while not stop.is_set():
        if n * 1000 > rate * (time.monotonic() - start):
            p.poll(0.005)
            continue
        try:
            p.produce(topic, value=b"a" * 1000,
                      on_delivery=lambda e, m: e is not None and errors.append(str(e)))
            n += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    assert p.flush(30) == 0
    sent.append(n)


def test_waiting_is_never_charged_to_a_request_quota(tansu: TansuBroker, tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    proxy = _proxy(tansu, capture_dir,
                   '    - {client-id: "<default>", request_percentage: 50}\n')
    stop = threading.Event()
    errors: list[str] = []
    sent: list[int] = []
    try:
        proxy.wait_broker_listener(111)
        empty = new_topic(proxy.bootstrap, "idle")
        joined = new_topic(proxy.bootstrap, "join", partitions=3)
        produced = new_topic(proxy.bootstrap, "acks-all")
        threads = [
            threading.Thread(target=_idle_consumer, args=(
                proxy.bootstrap, empty, f"idle-{n}", f"idle-group-{n}", n == 0, stop, errors))
            for n in range(3)]
        threads.append(threading.Thread(target=_joining_consumers, args=(
            proxy.bootstrap, joined, stop, errors)))
        threads.append(threading.Thread(target=_acks_all_producer, args=(
            proxy.bootstrap, produced, stop, errors, sent)))
        start = time.monotonic()
        for t in threads:
            t.start()
        # librdkafka's first JoinGroup with tansu waits about 23 s for the group to settle
        wait_for(lambda: any(r["client_id"] == "idle-0" and r["api_key"] == 14
                             for r in _rows(capture_dir)), 60, interval=0.5,
                 what="the subscribed consumer's group to form")
        time.sleep(max(0.0, start + RUN_S - time.monotonic()))  # the run's length
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]
        metrics = proxy.metrics()
    finally:
        stop.set()
        proxy.stop()
    rows = _rows(capture_dir)
    by_client: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_client.setdefault(r["client_id"], []).append(r)
    # The run was what it claims: long polls that waited, group joins, acks=all produces.
    idle_fetches = [r for n in (1, 2) for r in by_client.get(f"idle-{n}", [])
                    if r["api_key"] == 1]
    waited = [r for r in idle_fetches if r["duration_us"] >= 300_000]
    joins = [r for n in range(3) for r in by_client.get(f"joiner-{n}", []) if r["api_key"] == 11]
    joins += [r for r in by_client.get("idle-0", []) if r["api_key"] == 11]
    produces = [r for r in by_client.get("acks-all", []) if r["api_key"] == 0]
    assert len(waited) >= 10, f"{len(waited)} of {len(idle_fetches)} idle fetches waited"
    assert len(joins) >= 4 and max(r["duration_us"] for r in joins) >= 5_000_000, joins
    assert len(produces) >= 20 and sent and sent[0] * 1000 > 2_000_000 * RUN_S * 0.8
    # ... and a request quota was applied to every request but none was throttled.
    throttled = [r for r in rows if r["throttle_request_ms"] > 0]
    assert not throttled, throttled[:3]
    assert metrics.get('kafka_proxy_quota_throttled_requests_total{quota="request"}', 0) == 0
    # What was charged: the proxy's work on a long poll (tens of microseconds), not its wait
    # (300 ms and more). Bounds far under the wait and loose enough for a loaded machine, where
    # a pause of the event loop lands in a request's time (5.06 ms was seen under CI's load).
    charged = sorted(r["request_time_ms"] for r in waited)
    assert charged[len(charged) // 2] < 5.0, charged
    assert charged[-1] < 50.0, charged
    wait_s = sum(r["duration_us"] for r in rows) / 1e6
    work_s = sum(r["request_time_ms"] for r in rows) / 1e3
    slowest_join = max(joins, key=lambda r: r["duration_us"])
    print(f"\nwaiting never charged: {len(rows)} requests waited {wait_s:.1f} s and were "
          f"charged {work_s * 1000:.0f} ms; {len(waited)} long polls (max charge "
          f"{max(r['request_time_ms'] for r in waited):.3f} ms), {len(joins)} JoinGroups "
          f"(longest waited {slowest_join['duration_us'] / 1e6:.2f} s, charged "
          f"{slowest_join['request_time_ms']:.3f} ms), {len(produces)} acks=all produces")
    assert work_s < wait_s / 20


def _flood(bootstrap: str, topic: str, stop: threading.Event, counts: list[int]) -> None:
    """ApiVersions, Metadata and ListOffsets in a loop, one at a time, as fast as answered."""
    from kio.schema.list_offsets.v7 import request as list_offsets
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i8, i32, i64

    latest = (list_offsets.ListOffsetsTopic(
        name=TopicName(topic), partitions=(list_offsets.ListOffsetsPartition(
            partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)),)),)
    host, port = bootstrap.rsplit(":", 1)
    n = 0
    with KafkaWire(host, int(port), client_id="flooder", timeout=30) as wire:
        while not stop.is_set():
            wire.request(18, 3, client_software_name="flood", client_software_version="1")
            wire.request(3, 12, topics=None, allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False)
            answer = wire.request(2, 7, replica_id=BrokerId(-1), isolation_level=i8(0),
                                  topics=latest)
            assert answer.topics[0].partitions[0].error_code == 0
            n += 3
    counts.append(n)


def test_a_flood_of_cheap_requests_is_held_to_its_request_quota(
        tansu: TansuBroker, tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    proxy = _proxy(tansu, capture_dir,
                   f'    - {{client-id: "flooder", request_percentage: {FLOOD_QUOTA}}}\n'
                   '    - {client-id: "<default>", request_percentage: 50}\n')
    stop = threading.Event()
    counts: list[int] = []
    try:
        proxy.wait_broker_listener(111)
        topic = new_topic(proxy.bootstrap, "flood")
        t = threading.Thread(target=_flood, args=(proxy.bootstrap, topic, stop, counts))
        start = time.monotonic()
        t.start()
        wait_for(lambda: proxy.metrics().get(
            'kafka_proxy_quota_throttled_requests_total{quota="request"}', 0) > 0, 20,
            what="the flood throttled")
        # the run's length: two whole cycles (about 12 s each: a burst, then one request per
        # second, throttled, until the burst's samples leave the 11 s window) after the warm-up
        time.sleep(max(0.0, start + WARMUP_S + CYCLES_S + 14 - time.monotonic()))
        stop.set()
        t.join(60)
    finally:
        stop.set()
        proxy.stop()
    rows = _rows(capture_dir)
    flood = sorted((r for r in rows if r["client_id"] == "flooder"), key=lambda r: r["quota_ms"])
    assert flood and counts
    throttled = [r for r in flood if r["throttle_request_ms"] > 0]
    first = flood[0]["quota_ms"]
    # Measured as the replay counts it: the charged request time (capture's request_time_ms)
    # over whole throttle cycles after the warm-up, as a percentage of one thread (10 ms of
    # work per second = 1%).
    charges = [((r["quota_ms"] - first) / 1000.0, r["request_time_ms"]) for r in flood]
    share = cycle_rate(charges, WARMUP_S, FLOOD_QUOTA * 10.0, CYCLES_S, whole=True) / 10.0
    free_share = sum(ms for t, ms in charges if t < 0.5) / 0.5 / 10.0
    matched, total = reproduce_capture(capture_dir, rows)
    mean_ms = sum(ms for _, ms in charges) / len(charges)
    print(f"\nflood: {len(flood)} requests, {len(throttled)} throttled; {share:.2f}% of a "
          f"thread over whole cycles for a quota of {FLOOD_QUOTA}% (unthrottled at first: "
          f"{free_share:.1f}%); mean charge {mean_ms:.3f} ms; replay {matched}/{total}")
    # the flood would take more than its quota (twice it at least: a loaded CI run's flooder
    # reached 5.6 % of a thread in its first half second, 2.8 times its quota of 2 %)
    assert free_share > 2 * FLOOD_QUOTA
    assert abs(share - FLOOD_QUOTA) <= 0.1 * FLOOD_QUOTA, share
    assert matched == total
