"""Identities and encrypted transport end to end: real clients (librdkafka, aiokafka,
kafka-python) over SSL, mTLS and SASL_SSL through the proxy, which re-originates TLS toward a
broker that speaks TLS and SASL (``testkit.secure_front`` in front of tansu).

Each client produces and consumes its own messages exactly once; per-user quotas hold for two
users at once; a client-id cannot move a user out of its budget; a failed or missing
authentication never reaches a named user's budget."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_quota_proxy.demo.embedded_broker import TansuBroker, free_port, free_port_range
from kafka_quota_proxy.security.credentials import add_user
from testkit.certs import Certs, Pem
from testkit.e2e import ProxyProcess, wait_for
from testkit.rates import cycle_rate
from testkit.secure_front import SecureFront

pytestmark = pytest.mark.e2e

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
MESSAGES = 2000


@dataclass
class Secured:
    proxy: ProxyProcess
    front: SecureFront
    tansu: TansuBroker
    certs: Certs  # the proxy's listeners (and clients)
    broker_certs: Certs  # the broker side

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"), "proxy")


@pytest.fixture(scope="module")
def broker_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("broker-certs"), "broker")


def _listener_yaml(certs: Certs, protocol: str, client_auth: str = "none",
                   rules: str | None = None, extra: str = "") -> str:
    server = certs.server()
    text = f"""  security:
    protocol: {protocol}
"""
    if protocol.endswith("SSL"):
        text += f"""    tls:
      cert_file: "{server.cert}"
      key_file: "{server.key}"
      client_auth: {client_auth}
      client_ca_file: "{certs.ca_file}"
      reload_seconds: 0.5
"""
    if rules is not None:
        text += f"    ssl_principal_mapping_rules: {json.dumps(rules)}\n"
    return text + extra


def _upstream_yaml(broker_certs: Certs, sasl_user: str | None = None,
                   workdir: Path | None = None, own: Pem | None = None) -> str:
    text = f"""  tls:
    ca_file: "{broker_certs.ca_file}"
"""
    if own is not None:  # the proxy's own certificate, for brokers that require mTLS
        text += f"""    cert_file: "{own.cert}"
    key_file: "{own.key}"
"""
    if sasl_user is not None:
        assert workdir is not None
        secret = workdir / "proxy-password"
        secret.write_text(USERS[sasl_user])
        text += f"""  sasl:
    mechanism: SCRAM-SHA-512
    username: {sasl_user}
    password_file: "{secret}"
"""
    return text


def _quota_yaml(alice: int, bob: int) -> str:
    return f"""quotas:
  window: {{samples: 11, size_seconds: 1}}
  entities:
    - {{user: alice, producer_byte_rate: {alice}}}
    - {{user: bob, producer_byte_rate: {bob}}}
    - {{client-id: bob, producer_byte_rate: 100000000}}
"""


@pytest.fixture
def secured(certs: Certs, broker_certs: Certs, request: pytest.FixtureRequest,
            tmp_path: Path) -> Iterator[Any]:
    started: list[Any] = []

    def make(protocol: str, *, sasl: bool, client_auth: str = "none", rules: str | None = None,
             quotas: str = "", session_lifetime_ms: int = 0, listeners_extra: str = "",
             terminate: dict[str, str] | None = None, kinds_yaml: str = "",
             broker_mtls: bool = False) -> Secured:
        front_port = free_port()
        tansu = TansuBroker(advertised_port=front_port,
                            log_path=str(tmp_path / "tansu.log")).start()
        started.append(tansu)
        front = SecureFront(tansu.port, front_port,
                            tls=broker_certs.server_context(broker_certs.server("broker"),
                                                            client_auth=broker_mtls),
                            users=USERS if sasl else None,
                            session_lifetime_ms=session_lifetime_ms).start()
        if terminate is not None:  # the proxy's own users, unknown to the broker
            text = ""
            for user, password in terminate.items():
                text = add_user(text, user, password, 4096)
            credentials = tmp_path / "credentials.yaml"
            credentials.write_text(text)
            listeners_extra += f"""    sasl:
      mode: terminate
      credentials_file: "{credentials}"
      credentials_reload_seconds: 0.2
"""
        started.append(front)
        proxy = ProxyProcess(
            front.bootstrap,
            listeners_yaml=_listener_yaml(certs, protocol, client_auth, rules, listeners_extra)
            + kinds_yaml,
            upstream_yaml=_upstream_yaml(broker_certs, "alice" if sasl else None, tmp_path,
                                         broker_certs.client("kafka-quota-proxy")
                                         if broker_mtls else None),
            extra_yaml=quotas)
        proxy.start()
        started.append(proxy)
        proxy.wait_broker_listener(111)
        return Secured(proxy, front, tansu, certs, broker_certs)

    yield make
    for thing in reversed(started):
        thing.stop()


# ---------------------------------------------------------------------------- clients
def _rdkafka(s: Secured, *, user: str | None = None, mechanism: str = "PLAIN",
             cert: Pem | None = None, password: str | None = None,
             **extra: Any) -> dict[str, Any]:
    """librdkafka's settings for this setup (SASL_SSL when ``user`` is given)."""
    conf: dict[str, Any] = {"bootstrap.servers": s.bootstrap,
                            "ssl.ca.location": str(s.certs.ca_file), **extra}
    if user is not None:
        conf.update({"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                     "sasl.username": user,
                     "sasl.password": password if password is not None else USERS[user]})
    else:
        conf["security.protocol"] = "SSL"
    if cert is not None:
        conf.update({"ssl.certificate.location": str(cert.cert),
                     "ssl.key.location": str(cert.key)})
    return conf


def _rdkafka_roundtrip(conf: dict[str, Any], topic: str, tag: str) -> None:
    producer = Producer({**conf, "client.id": f"rd-{tag}", "linger.ms": 5})
    keys = [f"{tag}-{i:06d}".encode() for i in range(MESSAGES)]
    errors: list[str] = []
    for k in keys:
        while True:
            try:
                producer.produce(topic, key=k, value=b"v" * 200,
                                 on_delivery=lambda e, m: errors.append(str(e)) if e else None)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert not errors
    consumer = Consumer({**conf, "group.id": f"g-{tag}", "enable.auto.commit": False})
    seen: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len([k for k in seen if k.startswith(
                tag.encode() + b"-")]) < MESSAGES:
            seen += [m.key() for m in consumer.consume(5000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    mine = sorted(k for k in seen if k.startswith(tag.encode() + b"-"))
    assert mine == keys  # each exactly once


def _aiokafka_roundtrip(s: Secured, topic: str, tag: str, sasl: tuple[str, str] | None,
                        cert: Pem | None = None, password: str | None = None) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as TP

    ctx = s.certs.client_context(cert)
    kw: dict[str, Any] = {"bootstrap_servers": s.bootstrap, "ssl_context": ctx,
                          "security_protocol": "SSL"}
    if sasl is not None:
        kw.update(security_protocol="SASL_SSL", sasl_mechanism=sasl[0],
                  sasl_plain_username=sasl[1], sasl_plain_password=password or USERS[sasl[1]])
    keys = [f"{tag}-{i:06d}".encode() for i in range(MESSAGES)]

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(client_id=f"aio-{tag}", **kw)
        await producer.start()
        try:
            futures = [await producer.send(topic, b"v" * 200, key=k, partition=0) for k in keys]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(client_id=f"aio-{tag}-c", enable_auto_commit=False, **kw)
        await consumer.start()
        seen: list[bytes] = []
        try:
            consumer.assign([TP(topic, 0)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(
                    [k for k in seen if k.startswith(tag.encode())]) < MESSAGES:
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    seen += [m.key for m in msgs if m.key is not None]
        finally:
            await consumer.stop()
        return seen

    seen = asyncio.run(run())
    assert sorted(k for k in seen if k.startswith(tag.encode() + b"-")) == keys


def _kafka_python_roundtrip(s: Secured, topic: str, tag: str, sasl: tuple[str, str] | None,
                            cert: Pem | None = None, password: str | None = None) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as TP

    kw: dict[str, Any] = {"bootstrap_servers": s.bootstrap, "security_protocol": "SSL",
                          "ssl_cafile": str(s.certs.ca_file)}
    if cert is not None:
        kw.update(ssl_certfile=str(cert.cert), ssl_keyfile=str(cert.key))
    if sasl is not None:
        kw.update(security_protocol="SASL_SSL", sasl_mechanism=sasl[0],
                  sasl_plain_username=sasl[1], sasl_plain_password=password or USERS[sasl[1]])
    keys = [f"{tag}-{i:06d}".encode() for i in range(MESSAGES)]
    producer = KafkaProducer(client_id=f"kp-{tag}", **kw)
    try:
        for k in keys:
            producer.send(topic, b"v" * 200, key=k, partition=0)
        producer.flush(60)
    finally:
        producer.close(10)
    consumer = KafkaConsumer(client_id=f"kp-{tag}-c", enable_auto_commit=False,
                             consumer_timeout_ms=2000, **kw)
    seen: list[bytes] = []
    try:
        consumer.assign([TP(topic, 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(
                [k for k in seen if k.startswith(tag.encode())]) < MESSAGES:
            for msgs in consumer.poll(timeout_ms=500).values():
                seen += [m.key for m in msgs if m.key is not None]
    finally:
        consumer.close()
    assert sorted(k for k in seen if k.startswith(tag.encode() + b"-")) == keys


def _topic(conf: dict[str, Any]) -> str:
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"sec-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


def _authenticated(p: ProxyProcess) -> list[str]:
    return [e["principal"] for e in p.events() if e.get("event") == "client_authenticated"]


def _closed(p: ProxyProcess, reason: str) -> list[dict[str, Any]]:
    return [e for e in p.closed_connections() if e.get("reason") == reason]


# ---------------------------------------------------------------------------- SSL, mTLS
def test_three_clients_over_tls_both_ways_exactly_once(secured: Any) -> None:
    s: Secured = secured("SSL", sasl=False)
    topic = _topic(_rdkafka(s))
    _rdkafka_roundtrip(_rdkafka(s), topic, "rd")
    _aiokafka_roundtrip(s, topic, "aio", None)
    _kafka_python_roundtrip(s, topic, "kp", None)
    assert s.front.connections > 0  # the proxy reached the broker over TLS
    # no client certificate: the principal is ANONYMOUS, as Kafka's SSL listeners say
    metrics = s.proxy.metrics()
    assert metrics.get('kafka_proxy_closed_connections_total{reason="tls_handshake_failed"}',
                       0) == 0


def test_brokers_that_require_mtls_get_the_proxys_certificate(secured: Any) -> None:
    s: Secured = secured("SSL", sasl=False, broker_mtls=True)
    topic = _topic(_rdkafka(s))
    _rdkafka_roundtrip(_rdkafka(s), topic, "rd-broker-mtls")
    assert s.front.connections > 0


def test_mtls_principals_from_mapping_rules_and_bad_certificates(secured: Any,
                                                                 tmp_path: Path) -> None:
    s: Secured = secured("SSL", sasl=False, client_auth="required",
                         rules="RULE:^CN=([^,]+),OU=clients,.*$/$1/L,DEFAULT",
                         quotas=_quota_yaml(10**9, 10**9))
    alice = s.certs.client("Alice")
    topic = _topic(_rdkafka(s, cert=alice))
    _rdkafka_roundtrip(_rdkafka(s, cert=alice), topic, "rd")
    _aiokafka_roundtrip(s, topic, "aio", None, cert=s.certs.client("bob"))
    _kafka_python_roundtrip(s, topic, "kp", None, cert=alice)
    metrics = s.proxy.metrics()
    users = {k.split('user="')[1].split('"')[0] for k in metrics
             if k.startswith("kafka_proxy_quota_entity_bytes_per_second{")}
    assert {"alice", "bob"} <= users, users  # the rule's $1, lower-cased
    # a certificate from another CA: the handshake fails, one connection closes with a reason
    stranger = Certs(tmp_path, "stranger").client("mallory")
    producer = Producer({**_rdkafka(s), "ssl.certificate.location": str(stranger.cert),
                         "ssl.key.location": str(stranger.key), "message.timeout.ms": 3000})
    producer.produce(topic, b"x")
    producer.flush(5)
    wait_for(lambda: _closed(s.proxy, "tls_handshake_failed"), 10, what="handshake failure")


# ---------------------------------------------------------------------------- SASL
def test_sasl_ssl_plain_and_scram_three_clients(secured: Any) -> None:
    s: Secured = secured("SASL_SSL", sasl=True)
    topic = _topic(_rdkafka(s, user="alice"))
    _rdkafka_roundtrip(_rdkafka(s, user="alice", mechanism="PLAIN"), topic, "rdplain")
    _rdkafka_roundtrip(_rdkafka(s, user="bob", mechanism="SCRAM-SHA-512"), topic, "rdscram")
    _aiokafka_roundtrip(s, topic, "aio", ("SCRAM-SHA-512", "bob"))
    _kafka_python_roundtrip(s, topic, "kp", ("PLAIN", "alice"))
    principals = set(_authenticated(s.proxy))
    assert principals == {"alice", "bob"}, principals
    assert set(s.front.authenticated) == {"alice", "bob"}
    # OAUTHBEARER (librdkafka's unsecured token): the principal is the token's sub
    oauth = {**_rdkafka(s, user="alice"), "sasl.mechanism": "OAUTHBEARER",
             "enable.sasl.oauthbearer.unsecure.jwt": True,
             "sasl.oauthbearer.config": "principal=bob"}
    for key in ("sasl.username", "sasl.password"):
        oauth.pop(key)
    _rdkafka_roundtrip(oauth, topic, "rdoauth")
    oauth_logins = [e for e in s.proxy.events() if e.get("event") == "client_authenticated"
                    and e.get("mechanism") == "OAUTHBEARER"]
    assert oauth_logins and {e["principal"] for e in oauth_logins} == {"bob"}


def test_sasl_termination_over_plaintext(secured: Any) -> None:
    """SASL_PLAINTEXT with termination: the connection goes on reading after the proxy has
    authenticated the client (uvloop calls the protocol's data_received as it was when the
    connection was made, not as the connection changes it)."""
    own = {"bob": "bob-proxy-pw"}
    s: Secured = secured("SASL_PLAINTEXT", sasl=True, terminate=own)
    bob = {**_rdkafka(s, user="bob", mechanism="SCRAM-SHA-256", password=own["bob"]),
           "security.protocol": "SASL_PLAINTEXT"}
    topic = _topic(bob)
    _rdkafka_roundtrip(bob, topic, "rdplainterm")
    logins = [e for e in s.proxy.events() if e.get("event") == "client_authenticated"]
    assert logins and {e["principal"] for e in logins} == {"bob"}


def test_sasl_termination_three_clients_and_credentials_reload(secured: Any) -> None:
    """The proxy authenticates bob and carol itself (the broker knows neither) and reaches the
    broker as alice, its own identity; a wrong password never reaches the broker; a user
    added to the credentials file can log in without a restart."""
    own = {"bob": "bob-proxy-pw", "carol": "carol-proxy-pw"}
    s: Secured = secured("SASL_SSL", sasl=True, terminate=own)
    bob = _rdkafka(s, user="bob", mechanism="SCRAM-SHA-512", password=own["bob"])
    topic = _topic(bob)
    _rdkafka_roundtrip(bob, topic, "rdterm")
    _aiokafka_roundtrip(s, topic, "aioterm", ("PLAIN", "carol"), password=own["carol"])
    _kafka_python_roundtrip(s, topic, "kpterm", ("SCRAM-SHA-256", "bob"), password=own["bob"])
    logins = [e for e in s.proxy.events() if e.get("event") == "client_authenticated"]
    assert {e["principal"] for e in logins} == {"bob", "carol"}
    assert all(e.get("terminated") for e in logins)
    assert set(s.front.authenticated) == {"alice"}  # every upstream connection: the proxy's
    # a wrong password: the proxy answers it (error 58) and closes; the broker never sees it
    errors: list[str] = []
    wrong = Producer({**bob, "sasl.password": "nope", "error_cb": lambda e: errors.append(str(e))})
    wait_for(lambda: wrong.poll(0.1) is not None and any("uthentication" in e for e in errors),
             20, what="the authentication error")
    wait_for(lambda: [e for e in s.proxy.closed_connections()
                      if e.get("reason") == "sasl_authentication_failed"], 10, what="the close")
    assert set(s.front.authenticated) == {"alice"} and not s.front.failures
    # dave is added while the proxy runs
    path = next(Path(line.split('"')[1]) for line in s.proxy.config_path.read_text().splitlines()
                if "credentials_file" in line)
    path.write_text(add_user(path.read_text(), "dave", "dave-pw", 4096))
    wait_for(lambda: s.proxy.metrics().get(
        'kafka_proxy_credentials_reloads_total{result="success"}', 0) >= 1, 10,
        what="the credentials reload")
    _rdkafka_roundtrip(_rdkafka(s, user="dave", mechanism="SCRAM-SHA-256", password="dave-pw"),
                       topic, "rddave")


def test_wrong_password_and_unauthenticated_requests_reach_no_budget(secured: Any) -> None:
    from testkit.e2e import KafkaWire

    s: Secured = secured("SASL_PLAINTEXT", sasl=True, quotas=_quota_yaml(10**9, 10**9))
    # a wrong password: the client gets the broker's authentication error
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": s.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
                         "sasl.password": "wrong", "error_cb": lambda e: errors.append(str(e))})
    wait_for(lambda: producer.poll(0.1) is not None and any(
        "uthentication" in e for e in errors), 20, what="the authentication error")
    wait_for(lambda: any(e.get("event") == "sasl_authentication_failed" and e["error_code"] == 58
                         for e in s.proxy.events()), 10, what="the failure logged")
    # a Metadata request before authenticating, a SaslAuthenticate before the handshake
    port = int(s.bootstrap.rsplit(":", 1)[1])
    with KafkaWire("127.0.0.1", port) as wire:
        wire.send_raw(wire.encode(3, 1, topics=None))
        assert wire.is_closed_by_peer()
    with KafkaWire("127.0.0.1", port) as wire:
        wire.send_raw(wire.encode(36, 1, auth_bytes=b"\0bob\0bob-secret"))
        assert wire.is_closed_by_peer()
    wait_for(lambda: _closed(s.proxy, "unauthenticated_request")
             and _closed(s.proxy, "sasl_out_of_order"), 10, what="both closes logged")
    metrics = s.proxy.metrics()
    users = {k.split('user="')[1].split('"')[0] for k in metrics
             if k.startswith("kafka_proxy_quota_entity_bytes_per_second{")}
    assert not users & {"alice", "bob"}, users
    assert not _authenticated(s.proxy)


# ---------------------------------------------------------------------------- quotas
def _produce_as(conf: dict[str, Any], topic: str, client_id: str, seconds: float,
                delivered: list[tuple[float, int]], errors: list[str]) -> None:
    producer = Producer({**conf, "client.id": client_id, "linger.ms": 5, "batch.size": 65536,
                         "queue.buffering.max.kbytes": 4096})
    value = b"q" * 1000

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((time.monotonic(), len(msg.value()) + len(msg.key())))

    deadline = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, key=b"%08d" % seq, value=value, on_delivery=on_delivery)
            seq += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(60)
    errors[:] = [e for e in errors if "Purged" not in e]


@pytest.mark.parametrize("mode", ["SASL_SSL", "mTLS"])
def test_per_user_quotas_hold_for_two_users_whatever_their_client_id(secured: Any,
                                                                     mode: str) -> None:
    """alice (quota 300 KB/s) calls herself client-id "bob", which has a huge client-id
    quota; bob has 600 KB/s: each gets its own user's rate (±5% over whole throttle cycles,
    with SASL over 45 s). With mTLS (the same quota maths, another way to the principal) a
    15 s run shows each user throttled in their own user's budget."""
    alice_q, bob_q = 300_000, 600_000
    if mode == "mTLS":
        s: Secured = secured("SSL", sasl=False, client_auth="required",
                             rules="RULE:^CN=([^,]+),.*$/$1/L", quotas=_quota_yaml(alice_q, bob_q))
        confs = {"alice": _rdkafka(s, cert=s.certs.client("alice")),
                 "bob": _rdkafka(s, cert=s.certs.client("bob"))}
    else:
        s = secured("SASL_SSL", sasl=True, quotas=_quota_yaml(alice_q, bob_q))
        confs = {"alice": _rdkafka(s, user="alice"),
                 "bob": _rdkafka(s, user="bob", mechanism="SCRAM-SHA-512")}
    topic = _topic(confs["alice"])
    runs: dict[str, list[tuple[float, int]]] = {"alice": [], "bob": []}
    errors: list[str] = []
    start = time.monotonic()
    seconds = 45.0 if mode == "SASL_SSL" else 15.0
    threads = [threading.Thread(target=_produce_as, args=(confs[u], topic, "bob", seconds,
                                                          runs[u], errors)) for u in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not errors, errors[:3]
    if mode == "SASL_SSL":
        for user, quota in (("alice", alice_q), ("bob", bob_q)):
            measured = cycle_rate([(t - start, n) for t, n in runs[user]], 12.0, quota)
            print(f"{mode} {user}: {measured:.0f} B/s for a quota of {quota}")
            assert measured == pytest.approx(quota, rel=0.05), (user, measured)
    metrics = s.proxy.metrics()
    for user, quota in (("alice", alice_q), ("bob", bob_q)):
        labels = f'broker="111",client_id="",quota="produce",user="{user}"'
        assert metrics[f"kafka_proxy_quota_entity_bytes_per_second_limit{{{labels}}}"] == quota
        assert metrics[f"kafka_proxy_quota_entity_throttled_requests_total{{{labels}}}"] > 0


def test_kip368_reauthentication_keeps_the_connection(secured: Any) -> None:
    s: Secured = secured("SASL_SSL", sasl=True, session_lifetime_ms=2000)
    conf = _rdkafka(s, user="bob", mechanism="SCRAM-SHA-512")
    topic = _topic(conf)
    producer = Producer({**conf, "linger.ms": 5})
    delivered: list[int] = []
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        producer.produce(topic, b"x" * 100, on_delivery=lambda e, m: delivered.append(
            0 if e is None else 1))
        producer.poll(0.05)
    assert producer.flush(30) == 0
    assert delivered and not any(delivered)
    # the broker asked for re-authentication every 2 s: the same connections re-authenticated
    assert s.front.authenticated.count("bob") >= 3, s.front.authenticated
    reauth = [e for e in s.proxy.events() if e.get("event") == "client_reauthenticated"]
    assert reauth and all(e["principal"] == "bob" for e in reauth)


# ---------------------------------------------------------------------------- listener map
def test_three_listener_kinds_at_once(secured: Any, certs: Certs) -> None:
    """SASL_SSL on the main ports, mTLS (INTERNAL) and plaintext (LEGACY) on their own: each
    client is told about the brokers' ports of its own kind, and gets its own principal."""
    from testkit.e2e import KafkaWire

    internal, legacy = free_port_range(5), free_port_range(5)
    internal_boot, legacy_boot = free_port(), free_port()
    server = certs.server("internal")
    kinds = f"""  extra:
    - name: INTERNAL
      bootstrap: "127.0.0.1:{internal_boot}"
      broker_ports: "{internal[0]}-{internal[1]}"
      security:
        protocol: SSL
        ssl_principal_mapping_rules: "RULE:^CN=([^,]+),.*$/$1/L"
        tls:
          cert_file: "{server.cert}"
          key_file: "{server.key}"
          client_auth: required
          client_ca_file: "{certs.ca_file}"
    - name: LEGACY
      bootstrap: "127.0.0.1:{legacy_boot}"
      broker_ports: "{legacy[0]}-{legacy[1]}"
"""
    s: Secured = secured("SASL_SSL", sasl=True, kinds_yaml=kinds,
                         quotas=_quota_yaml(10**9, 10**9))
    sasl_conf = _rdkafka(s, user="alice")
    mtls_conf = {**_rdkafka(s, cert=s.certs.client("Bob")),
                 "bootstrap.servers": f"127.0.0.1:{internal_boot}"}
    plain_conf = {"bootstrap.servers": f"127.0.0.1:{legacy_boot}"}
    topic = _topic(sasl_conf)
    _rdkafka_roundtrip(sasl_conf, topic, "kind-sasl")
    _rdkafka_roundtrip(mtls_conf, topic, "kind-mtls")
    _rdkafka_roundtrip(plain_conf, topic, "kind-plain")
    # each kind's Metadata names its own broker port
    with KafkaWire("127.0.0.1", legacy_boot) as wire:
        ports = [b.port for b in wire.request(3, 1, topics=None).brokers]
    assert ports and all(legacy[0] <= p <= legacy[1] for p in ports), ports
    closed = [e for e in s.proxy.closed_connections() if "principal" in e]
    by_kind = {(e["listener"].split(":")[0] if ":" in e["listener"] else "main")
               for e in closed}
    assert by_kind == {"main", "INTERNAL", "LEGACY"}, by_kind
    principals = {(e["listener"].split(":")[0] if ":" in e["listener"] else "main",
                   e["principal"]) for e in closed if e["listener"].endswith("broker-111")}
    assert principals == {("main", "alice"), ("INTERNAL", "bob"), ("LEGACY", "ANONYMOUS")}
