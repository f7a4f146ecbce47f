"""Storage THROTTLE holds the scaled rate whatever the batch size: producers with no quota,
librdkafka from a 16 KB batch.size to its 1 MB default and aiokafka with its defaults, run at
full speed, then the cluster passes its soft limit (factor 0.5 of a 400 KB/s base rate): over
14 s each gets 200 KB/s (+-10%), and none is frozen when THROTTLE begins beyond what its own
request costs at the scaled rate."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaError, Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.volumes import BASE, GB, Publisher

pytestmark = pytest.mark.e2e

TARGET = 0.5 * BASE
MEASURE_S = 14.0
VALUE = b"r" * 1000


@pytest.fixture(scope="module")
def throttling(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[ProxyProcess, Publisher]]:
    topic = f"volumes-{uuid.uuid4().hex[:6]}"
    publisher = Publisher(tansu.bootstrap, topic)
    proxy = ProxyProcess(tansu.bootstrap, workdir=tmp_path_factory.mktemp("rate"),
                         extra_yaml=f"""quotas:
  window: {{samples: 3, size_seconds: 1}}
storage:
  topic: "{topic}"
  stale_after_seconds: 3
  soft: {{type: MinFreePercentage, level: 20}}
  hard: {{type: MinFreePercentage, level: 5}}
  unquoted_producer_byte_rate: {BASE}
  evaluate_seconds: 0.2
""").start()
    try:
        proxy.wait_broker_listener(111)
        yield proxy, publisher
    finally:
        proxy.stop()
        publisher.close()


Delivered = list[tuple[float, int]]  # (time, bytes) of each acknowledged message


def _librdkafka(bootstrap: str, topic: str, batch_size: int, idempotent: bool = True
                ) -> Callable[[threading.Event, Delivered], None]:
    def run(stop: threading.Event, delivered: Delivered) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "client.id": f"rate-{batch_size}",
                             "acks": "all", "enable.idempotence": idempotent, "linger.ms": 5,
                             "batch.size": batch_size, "queue.buffering.max.kbytes": 1024})
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, msg: object) -> None:
            if err is None:
                delivered.append((time.monotonic(), len(VALUE)))
            elif err.code() != KafkaError._PURGE_QUEUE:
                errors.append(err)

        while not stop.is_set():
            try:
                producer.produce(topic, value=VALUE, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
        producer.purge(in_queue=True, in_flight=False)
        assert producer.flush(60) == 0 and not errors, errors[:3]

    return run


def _aiokafka(bootstrap: str, topic: str) -> Callable[[threading.Event, Delivered], None]:
    def run(stop: threading.Event, delivered: Delivered) -> None:
        async def main() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="rate-aiokafka")
            await producer.start()
            try:
                pending: set[asyncio.Future[object]] = set()
                while not stop.is_set():
                    future = await producer.send(topic, VALUE)
                    future.add_done_callback(
                        lambda f: f.exception() is None
                        and delivered.append((time.monotonic(), len(VALUE))))
                    pending.add(future)
                    pending = {f for f in pending if not f.done()}
                await asyncio.wait_for(asyncio.gather(*pending), 60)
            finally:
                await producer.stop()

        asyncio.run(main())

    return run


@pytest.mark.parametrize("client", ["librdkafka-16k", "librdkafka-16k-pipelined",
                                    "librdkafka-128k", "librdkafka-default",
                                    "aiokafka-default"])
def test_throttle_holds_the_scaled_rate_whatever_the_batch_size(
        throttling: tuple[ProxyProcess, Publisher], client: str) -> None:
    proxy, publisher = throttling
    topic = new_topic(proxy.bootstrap, "rate")
    batch = {"librdkafka-16k": 16384, "librdkafka-16k-pipelined": 16384,
             "librdkafka-128k": 131072, "librdkafka-default": 1_000_000,
             "aiokafka-default": 16384}[client]
    # Not idempotent: librdkafka keeps up to a whole queue (1 MB) of requests in flight, all
    # read by the proxy before THROTTLE begins and recorded after.
    run = (_aiokafka(proxy.bootstrap, topic) if client.startswith("aiokafka")
           else _librdkafka(proxy.bootstrap, topic, batch,
                            idempotent=not client.endswith("pipelined")))

    def factor() -> float:
        return proxy.metrics().get("kafka_proxy_storage_factor", -1)

    publisher.consumed = 50 * GB
    wait_for(lambda: factor() == 1.0 and proxy.metrics().get("kafka_proxy_storage_state") == 0,
             20, what="OPEN")
    stop = threading.Event()
    delivered: Delivered = []
    worker = threading.Thread(target=run, args=(stop, delivered))
    worker.start()
    try:
        # Running unthrottled, at full speed, well above the base rate.
        wait_for(lambda: sum(n for _, n in delivered) > 6 * BASE, 30,
                 what="the producer at full speed")
        publisher.consumed = int(87.5 * GB)  # between soft (80 GB) and hard (95 GB): 0.5
        wait_for(lambda: factor() == pytest.approx(0.5), 20, what="THROTTLE at 0.5")
        t0 = time.monotonic()

        def measured() -> tuple[float, float] | None:
            """(rate over 14 s or more from the first delivery 3 s (3 windows) after THROTTLE
            began, longest gap between deliveries from THROTTLE on)."""
            after = [(t, n) for t, n in delivered if t >= t0]
            starts = [t for t, _ in after if t >= t0 + 3.0]
            if not starts or starts[-1] < starts[0] + MEASURE_S:
                return None
            first = starts[0]
            end = next(t for t in starts if t >= first + MEASURE_S)
            rate = sum(n for t, n in after if first <= t < end) / (end - first)
            times = [t0] + [t for t, _ in after]
            return rate, max(b - a for a, b in itertools.pairwise(times))

        rate, gap = wait_for(measured, 60, interval=0.5, what="14 s of throttled deliveries")
    finally:
        stop.set()
        worker.join(120)
    # What one request of this producer costs at the scaled rate (the queue holds 1 MB).
    cost = min(batch, 1 << 20) / TARGET
    print(f"\n{client}: {rate:.0f} B/s over {MEASURE_S:.0f} s (target {TARGET:.0f}); "
          f"longest gap {gap:.2f} s")
    assert rate == pytest.approx(TARGET, rel=0.10)
    assert gap <= max(2.0, cost + 1.0)
