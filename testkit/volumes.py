"""Volume snapshots published to the storage topic, as the volume agent does."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from kafka_quota_proxy.quota.storage import Snapshot, Volume

BASE = 400_000  # unquoted_producer_byte_rate
GB = 1_000_000_000
NODE = 111  # tansu's node id


class Publisher:
    """Publishes broker 111's snapshot every 0.3 s, with ``consumed`` bytes of 100 GB used."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic = topic
        self.consumed = 50 * GB
        self.publishing = threading.Event()
        self.publishing.set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if self.publishing.is_set():
                snap = Snapshot(NODE, int(time.time() * 1000),
                                (Volume("/var/lib/kafka", 100 * GB, self.consumed),))
                self.producer.produce(self.topic, key=str(NODE).encode(), value=snap.to_json())
                self.producer.poll(0)
            self.done.wait(0.3)
        self.producer.flush(10)

    def close(self) -> None:
        self.done.set()
        self.thread.join(15)
