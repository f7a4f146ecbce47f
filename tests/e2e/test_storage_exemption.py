"""Storage exemptions are by principal, never by client-id, end to end against tansu: during a
storage PAUSE the client whose mTLS certificate maps to the exempt principal keeps producing,
while a client that merely calls itself ``volume-agent`` (its client.id) is held with
everyone else; and a configuration exempting client-ids does not start."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.certs import Certs
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.volumes import BASE, GB, NODE, Publisher

pytestmark = pytest.mark.e2e


class Producing:
    """A librdkafka producer at full speed in a thread, its delivered bytes counted."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        self.producer = Producer({**conf, "acks": "all", "linger.ms": 5, "log_level": 2,
                                  "queue.buffering.max.kbytes": 1024,
                                  "message.timeout.ms": 120000})
        self.topic = topic
        self.delivered = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered += len(msg.value())

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.producer.produce(self.topic, value=b"x" * 1000,
                                      on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.producer.purge()
        self.producer.flush(0)


def test_only_the_exempt_principal_produces_during_pause(tansu: TansuBroker,
                                                         tmp_path: Path) -> None:
    certs = Certs(tmp_path, "storage")
    server = certs.server()
    volumes = f"volumes-{uuid.uuid4().hex[:6]}"
    publisher = Publisher(tansu.bootstrap, volumes)
    publisher.consumed = 97 * GB  # 3 % free: past the hard limit (5 %), PAUSE
    proxy = ProxyProcess(tansu.bootstrap, log_level="info", listeners_yaml=f"""  security:
    protocol: SSL
    ssl_principal_mapping_rules: ["RULE:^CN=([^,]+),.*$/$1/", "DEFAULT"]
    tls:
      cert_file: "{server.cert}"
      key_file: "{server.key}"
      client_ca_file: "{certs.ca_file}"
      client_auth: requested
""", extra_yaml=f"""storage:
  topic: "{volumes}"
  stale_after_seconds: 30
  soft: {{type: MinFreePercentage, level: 20}}
  hard: {{type: MinFreePercentage, level: 5}}
  unquoted_producer_byte_rate: {BASE}
  exempt_users: ["User:volume-agent"]
  evaluate_seconds: 0.2
""")
    producers: list[Producing] = []
    try:
        proxy.start()
        proxy.wait_broker_listener(NODE)
        wait_for(lambda: proxy.metrics().get("kafka_proxy_storage_state") == 2, 30,
                 what="PAUSE")
        topic = new_topic(tansu.bootstrap, "paused")
        tls = {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL",
               "ssl.ca.location": str(certs.ca_file)}
        agent_cert = certs.client("volume-agent")
        # the principal volume-agent (its certificate), under another client-id
        agent = Producing({**tls, "client.id": "ops-tool",
                           "ssl.certificate.location": str(agent_cert.cert),
                           "ssl.key.location": str(agent_cert.key)}, topic)
        # ANONYMOUS (TLS without a certificate) calling itself volume-agent
        claimer = Producing({**tls, "client.id": "volume-agent"}, topic)
        producers += [agent, claimer]
        # the claimer's produce request waits in the proxy (the only one that can)
        wait_for(lambda: proxy.metrics().get("kafka_proxy_storage_held_connections", 0) >= 1,
                 20, what="the client-id claimer held")
        started, before = time.monotonic(), agent.delivered
        wait_for(lambda: agent.delivered - before >= 60_000_000, 30,
                 what="the exempt principal producing 60 MB more during PAUSE")
        spent = time.monotonic() - started
        assert proxy.metrics().get("kafka_proxy_storage_state") == 2  # still PAUSE
        print(f"\nduring PAUSE over {spent:.1f} s: principal volume-agent "
              f"{(agent.delivered - before) / spent / 1e6:.1f} MB/s, client.id=volume-agent "
              f"(ANONYMOUS) {claimer.delivered / spent / 1e6:.3f} MB/s")
        assert claimer.delivered == 0
        assert not agent.errors and not claimer.errors
    finally:
        for p in producers:
            p.close()
        proxy.stop()
        publisher.close()


def test_a_client_id_exemption_does_not_start(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("""listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "127.0.0.1"
  broker_ports: "9193-9292"
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
storage:
  hard: {type: MinFreePercentage, level: 5}
  exempt_client_ids: ["volume-agent"]
""")
    for command in ("check-config", "run"):
        args = [str(config)] if command == "check-config" else ["--config", str(config)]
        done = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", command, *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, command
        assert (f"{config}:9:3: storage.exempt_client_ids: storage exemptions by client-id "
                "are refused") in done.stdout + done.stderr, command
