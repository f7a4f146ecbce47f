"""``quotas describe|alter`` and ``acls`` (kafka-configs.sh and kafka-acls.sh in the CLI):
option checks with Kafka's texts, the ``--command-config`` properties, the output formats, and
the wire exchange against a fake broker answering with the proxy's own response encoders."""

from __future__ import annotations

import datetime
import io
import socketserver
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.authorizer.acls import (
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.cli import admin_client, admin_tools
from kafka_quota_proxy.cli.admin_client import (
    CommandConfigError,
    client_settings,
    jaas_credentials,
    parse_properties,
)
from kafka_quota_proxy.cli.admin_tools import (
    UsageError,
    format_adding,
    format_quotas,
    format_resource_acls,
    java_double,
    parse_add_config,
    parse_delete_config,
)
from kafka_quota_proxy.cli.main import build_parser, main
from kafka_quota_proxy.protocol import acl_frames, client_quota_frames, sasl_frames
from kafka_quota_proxy.protocol.headers import encode_response_header, parse_request_header


# ------------------------------------------------------------------ command-config
def test_properties_read_as_java_reads_them() -> None:
    text = ("# a comment\n! another\n\nsecurity.protocol=SASL_SSL\nsasl.mechanism : SCRAM-SHA-512\n"
            "ssl.truststore.location /etc/ca.pem\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \\\n"
            "    required username=\"alice\" \\\n    password=\"p=w\\\\d\";\n"
            "empty=\nesc=a\\tb\\u0041\n")
    props = parse_properties(text)
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["ssl.truststore.location"] == "/etc/ca.pem"
    assert props["empty"] == "" and props["esc"] == "a\tbA"
    assert jaas_credentials(props["sasl.jaas.config"]) == ("alice", "p=w\\d")


def test_jaas_lines() -> None:
    assert jaas_credentials('org.apache.kafka.common.security.plain.PlainLoginModule required '
                            'username="bob"  password="s e;cret";') == ("bob", "s e;cret")
    assert jaas_credentials("org.apache.kafka.common.security.scram.ScramLoginModule required "
                            "username=bob password=x;") == ("bob", "x")
    with pytest.raises(CommandConfigError, match="username and a password"):
        jaas_credentials('org.apache.kafka.common.security.plain.PlainLoginModule required '
                         'username="bob";')
    with pytest.raises(CommandConfigError, match="Krb5LoginModule is not supported"):
        jaas_credentials("com.sun.security.auth.module.Krb5LoginModule required;")


def test_client_settings_from_kafka_properties(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    s = client_settings({
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="admin" password="pw";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca),
        "ssl.endpoint.identification.algorithm": ""})
    assert (s.security_protocol, s.sasl_mechanism, s.username, s.password) == (
        "SASL_SSL", "SCRAM-SHA-256", "admin", "pw")
    assert s.tls and s.sasl and not s.check_hostname and "BEGIN CERTIFICATE" in (s.ca_pem or "")
    # librdkafka's names work too
    s = client_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": "u", "sasl.password": "p"})
    assert (s.username, s.password, s.tls, s.check_hostname) == ("u", "p", False, True)
    assert client_settings({"ssl.ca.location": str(ca), "security.protocol": "SSL"}).ca_pem
    # Kafka's default mechanism is GSSAPI, which this client does not speak
    with pytest.raises(CommandConfigError, match=r"sasl\.mechanism GSSAPI"):
        client_settings({"security.protocol": "SASL_SSL", "sasl.username": "u",
                         "sasl.password": "p"})
    with pytest.raises(CommandConfigError, match=r"security\.protocol TLS"):
        client_settings({"security.protocol": "TLS"})
    with pytest.raises(CommandConfigError, match=r"needs sasl\.jaas\.config"):
        client_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"})
    jks = tmp_path / "store.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed junk")
    with pytest.raises(CommandConfigError, match="JKS"):
        client_settings({"security.protocol": "SSL", "ssl.truststore.location": str(jks)})


def test_pkcs12_truststore(tmp_path: Path) -> None:
    import trustme
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12

    ca = trustme.CA()
    cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    store = tmp_path / "trust.p12"
    store.write_bytes(pkcs12.serialize_key_and_certificates(
        b"ca", None, None, [cert], BestAvailableEncryption(b"changeit")))
    s = client_settings({"security.protocol": "SSL", "ssl.truststore.type": "PKCS12",
                         "ssl.truststore.location": str(store),
                         "ssl.truststore.password": "changeit"})
    assert s.ca_pem is not None and "BEGIN CERTIFICATE" in s.ca_pem
    s.ssl_context()  # loads


# ------------------------------------------------------------------ quota options
def test_java_doubles() -> None:
    assert [java_double(x) for x in (1048576.0, 2e6, 1e7, 12345678.9, 0.5, 1e-3, 1e-4, 100,
                                     0.0, 1.5e20)] == [
        "1048576.0", "2000000.0", "1.0E7", "1.23456789E7", "0.5", "0.001", "1.0E-4", "100.0",
        "0.0", "1.5E20"]


def test_add_and_delete_config() -> None:
    assert parse_add_config("producer_byte_rate=1024, consumer_byte_rate = 2e3") == {
        "producer_byte_rate": "1024", "consumer_byte_rate": "2e3"}
    assert parse_add_config("a=[1,2],b=3") == {"a": "1,2", "b": "3"}
    with pytest.raises(UsageError, match='must be in the format "key=val" or  "key=\\[val1'):
        parse_add_config("producer_byte_rate")
    with pytest.raises(UsageError, match="Invalid character found for config key: a b"):
        parse_add_config("a b=1")
    assert parse_delete_config(["a,b", " c "]) == ["a", "b", "c"]


def _args(*argv: str) -> Any:
    return build_parser().parse_args(argv)


def test_entity_names_pair_with_types_in_order() -> None:
    args = _args("quotas", "alter", "--bootstrap-server", "h:1", "--entity-type", "users",
                 "--entity-default", "--entity-type", "clients", "--entity-name", "app",
                 "--add-config", "producer_byte_rate=1")
    entity = admin_tools.check_quota_args(args, alter=True)
    assert entity.components() == [("user", 1, None), ("client-id", 0, "app")]
    assert entity.alter_entity() == [("user", None), ("client-id", "app")]
    assert entity.completed() == "Completed updating default config for users in the cluster."
    args = _args("quotas", "describe", "--bootstrap-server", "h:1", "--entity-type", "users")
    assert admin_tools.check_quota_args(args, alter=False).components() == [("user", 2, None)]
    args = _args("quotas", "alter", "--bootstrap-server", "h:1", "--entity-type", "users",
                 "--entity-name", "alice", "--add-config", "producer_byte_rate=1")
    assert admin_tools.check_quota_args(args, alter=True).completed() == (
        "Completed updating config for user alice.")


@pytest.mark.parametrize(("argv", "message"), [
    (["--entity-type", "users", "--entity-name", "a"], "--bootstrap-server must be specified."),
    (["-B", "--entity-type", "topics", "--entity-name", "t"],
     "Invalid entity type topics, the entity type must be one of users, clients, ips with a "
     "--bootstrap-server argument"),
    (["-B", "--entity-type", "users", "--entity-type", "users"],
     "Duplicate entity type(s) specified: users"),
    (["-B", "--entity-type", "users", "--entity-type", "ips"],
     "Only 'users' and 'clients' entity types may be specified together"),
    (["-B", "--entity-name", "a"], "At least one entity type must be specified"),
    (["-B", "--entity-type", "users", "--add-config", "producer_byte_rate=1"],
     "An entity-name or default entity must be specified with --alter of users, clients, "
     "brokers or ips"),
    (["-B", "--entity-type", "users", "--entity-name", "a"],
     "At least one of --add-config, --add-config-file, or --delete-config must be specified "
     "with --alter"),
    (["-B", "--entity-type", "users", "--entity-type", "clients", "--entity-name", "a",
      "--add-config", "producer_byte_rate=1"],
     "An entity name must be specified for every entity type"),
    (["-B", "--entity-type", "clients", "--entity-name", "a", "--add-config", "foo=1"],
     "Only quota configs can be added for 'clients' using --bootstrap-server. Unexpected config "
     "names: Set(foo)"),
    (["-B", "--entity-type", "users", "--entity-name", "a", "--delete-config", "foo,bar"],
     "Only quota and SCRAM credential configs can be deleted for 'users' using "
     "--bootstrap-server. Unexpected config names: ArrayBuffer(foo, bar)"),
    (["-B", "--entity-type", "ips", "--entity-name", "10.0.0.1", "--add-config",
      "producer_byte_rate=1"],
     "Only connection quota configs can be added for 'ips' using --bootstrap-server. "
     "Unexpected config names: producer_byte_rate"),
    (["-B", "--entity-type", "users", "--entity-name", "a", "--add-config",
      "producer_byte_rate=fast"],
     "Cannot parse quota configuration value for producer_byte_rate: fast"),
])
def test_alter_refused_with_kafkas_texts(argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = [x for a in argv for x in (["--bootstrap-server", "127.0.0.1:1"] if a == "-B"
                                      else [a])]
    assert main(["quotas", "alter", *argv]) == 1
    out = capsys.readouterr()
    assert out.err.strip() == message and out.out == ""


def test_quota_lines_as_kafka_configs_prints_them() -> None:
    assert format_quotas([("user", "alice")], [("producer_byte_rate", 1048576.0)]) == (
        "Quota configs for user-principal 'alice' are producer_byte_rate=1048576.0")
    assert format_quotas([("client-id", "app"), ("user", None)],
                         [("consumer_byte_rate", 1e7), ("request_percentage", 50.0)]) == (
        "Quota configs for the default user-principal, client-id 'app' are "
        "consumer_byte_rate=1.0E7, request_percentage=50.0")
    assert format_quotas([("ip", "10.0.0.1")], [("connection_creation_rate", 5.0)]) == (
        "Quota configs for ip '10.0.0.1' are connection_creation_rate=5.0")


# ------------------------------------------------------------------ ACL options and output
TOPIC_T = (ResourceType.TOPIC, "t", PatternType.LITERAL)
ALICE_READ = ("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)


def test_acl_output_as_kafka_acls_prints_it() -> None:
    deny = ("User:bob", "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY)
    assert format_resource_acls({TOPIC_T: [ALICE_READ, deny]}) == (
        "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, "
        "patternType=LITERAL)`:\n"
        "\t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:bob, host=10.0.0.1, operation=WRITE, permissionType=DENY)\n\n")
    assert format_adding(TOPIC_T, [ALICE_READ]) == (
        "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, "
        "patternType=LITERAL)`: \n \t(principal=User:alice, host=*, operation=READ, "
        "permissionType=ALLOW)\n\n")
    assert admin_tools.pattern_str((ResourceType.GROUP, None, PatternType.MATCH)) == (
        "ResourcePattern(resourceType=GROUP, name=<any>, patternType=MATCH)")


def test_acl_entries_and_resources() -> None:
    args = _args("acls", "--bootstrap-server", "h:1", "--add", "--allow-principal",
                 "User:alice", "--allow-principal", "User:bob", "--operation", "Read",
                 "--operation", "DescribeConfigs", "--deny-principal", "User:eve",
                 "--deny-host", "10.0.0.9", "--topic", "t", "--cluster", "--group", "g",
                 "--transactional-id", "tx", "--resource-pattern-type", "LITERAL")
    entries = admin_tools.acl_entries(args)
    assert len(entries) == 6
    assert ("User:eve", "10.0.0.9", AclOperation.READ, AclPermissionType.DENY) in entries
    assert ("User:bob", "*", AclOperation.DESCRIBE_CONFIGS, AclPermissionType.ALLOW) in entries
    assert admin_tools.resource_filters(args, required=True) == [
        TOPIC_T, (ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL),
        (ResourceType.GROUP, "g", PatternType.LITERAL),
        (ResourceType.TRANSACTIONAL_ID, "tx", PatternType.LITERAL)]
    assert admin_tools.parse_operation("IDEMPOTENTWRITE") is AclOperation.IDEMPOTENT_WRITE
    assert admin_tools.parse_operation("idempotent_write") is AclOperation.IDEMPOTENT_WRITE


@pytest.mark.parametrize(("argv", "message"), [
    (["--list"], "--bootstrap-server must be specified"),
    (["-B", "--list", "--add"], "Command must include exactly one action: --list, --add, "
     "--remove."),
    (["-B", "--list", "--allow-principal", "User:a"],
     'Option "[list]" can\'t be used with option "[allow-principal]"'),
    (["-B", "--add", "--principal", "User:a"],
     "The --principal option is only available if --list is set"),
    (["-B", "--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type",
      "match"], "A '--resource-pattern-type' value of 'MATCH' is not valid when adding acls."),
    (["-B", "--add", "--topic", "t"],
     "You must specify one of: --allow-principal, --deny-principal when trying to add ACLs."),
    (["-B", "--add", "--allow-principal", "User:a"],
     "You must provide at least one resource: --topic <topic> or --cluster or --group <group> "
     "or --delegation-token <Delegation Token ID>"),
    (["-B", "--add", "--allow-principal", "User:a", "--group", "g", "--operation", "Write"],
     "ResourceType GROUP only supports operations [READ, DESCRIBE, DELETE, ALL]"),
    (["-B", "--list", "--resource-pattern-type", "weird"],
     "Unknown resource-pattern-type: weird"),
])
def test_acl_usage_errors(argv: list[str], message: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = [x for a in argv for x in (["--bootstrap-server", "127.0.0.1:1"] if a == "-B"
                                      else [a])]
    assert main(["acls", *argv]) == 1
    out = capsys.readouterr()
    assert out.err.strip() == message.strip() and out.out == ""


def test_acl_argument_errors_as_acl_command_reports_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--allow-principal",
                 "alice", "--topic", "t"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "Error while executing ACL command: expected a string in format "
        "principalType:principalName but got alice",
        "java.lang.IllegalArgumentException: expected a string in format "
        "principalType:principalName but got alice"]
    assert main(["acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--allow-principal",
                 "User:a", "--topic", "t", "--operation", "Fly"]) == 1
    assert capsys.readouterr().out.startswith(
        "Error while executing ACL command: Unknown operation name Fly\n")


# ------------------------------------------------------------------ the wire, against a fake
class FakeBroker(socketserver.ThreadingTCPServer):
    """Answers ApiVersions (v0), the quota APIs and the ACL APIs with the proxy's own
    encoders, from in-memory state; ``refuse`` makes alters fail with that code."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, apis: dict[int, tuple[int, int]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.apis = apis
        self.quotas: dict[tuple[tuple[str, str | None], ...], dict[str, float]] = {}
        self.acls: list[acl_frames.Acl] = []
        self.refuse = 0
        self.requests: list[tuple[int, int]] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


def _api_versions(apis: dict[int, tuple[int, int]], cid: int) -> bytes:
    cls: Any = load_response_schema(18, 0)
    mod = __import__(cls.__module__, fromlist=["ApiVersion"])
    from kio.schema.errors import ErrorCode

    value = cls(error_code=ErrorCode(0), api_keys=tuple(
        mod.ApiVersion(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in apis.items()))
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    return encode_response_header(cid, 0) + buf.getvalue()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: FakeBroker = self.server  # type: ignore[assignment]
        sock = self.request
        while True:
            head = _recv(sock, 4)
            if head is None:
                return
            frame = _recv(sock, struct.unpack(">i", head)[0])
            assert frame is not None
            header = parse_request_header(frame, 0, len(frame))
            key, v, cid = header.api_key, header.api_version, header.correlation_id
            server.requests.append((key, v))
            answer = self.answer(server, frame, key, v, cid)
            sock.sendall(struct.pack(">i", len(answer)) + answer)

    def answer(self, server: FakeBroker, frame: bytes, key: int, v: int, cid: int) -> bytes:
        if key == 18:
            return _api_versions(server.apis, cid)
        if key == 17:  # SaslHandshake: PLAIN only
            mechanism = sasl_frames.handshake_mechanism(frame, v)
            return sasl_frames.encode_response(17, v, cid, error_code=0 if mechanism == "PLAIN"
                                               else 33, mechanisms=("PLAIN",))[4:]
        if key == 36:
            token = sasl_frames.authenticate_bytes(frame, v)
            ok = token == b"\0alice\0alice-pw"
            return sasl_frames.encode_response(
                36, v, cid, error_code=0 if ok else 58,
                error_message=None if ok else "Authentication failed: Invalid username or "
                "password", auth_bytes=b"", session_lifetime=datetime.timedelta(0))[4:]
        if key == 48:
            asked = client_quota_frames.decode_describe(frame, v)
            entries = [(entity, list(values.items()))
                       for entity, values in server.quotas.items()
                       if len(entity) == len(asked.components) and all(
                           (t, n) in entity for t, _, n in asked.components)]
            return client_quota_frames.describe_response(v, cid, 0, 0, None, entries)
        if key == 49:
            request = client_quota_frames.decode_alter(frame, v)
            results = []
            for entity, ops in request.entries:
                if server.refuse:
                    results.append((entity, server.refuse, None))
                    continue
                values = server.quotas.setdefault(tuple(entity), {})
                for op in ops:
                    if op.remove:
                        values.pop(op.key, None)
                    else:
                        values[op.key] = op.value
                results.append((entity, 0, None))
            return client_quota_frames.alter_response(v, cid, 0, results)
        if key == 29:
            f = acl_frames.decode_describe(frame, v)
            found = [a for a in server.acls if f[0] in (1, a[0]) and f[1] in (None, a[1])]
            return acl_frames.describe_response(v, cid, 0, 0, None, found)
        if key == 30:
            created = acl_frames.decode_create(frame, v)
            if server.refuse:
                return acl_frames.create_response(v, cid, 0, [(server.refuse, None)
                                                              for _ in created])
            server.acls += created
            return acl_frames.create_response(v, cid, 0, [(0, None) for _ in created])
        assert key == 31
        results: list[acl_frames.DeleteResult] = []
        for f in acl_frames.decode_delete(frame, v):
            gone = [a for a in server.acls
                    if a[:3] == (f[0], f[1], f[2]) and f[3] in (None, a[3])
                    and f[5] in (1, a[5])]
            server.acls = [a for a in server.acls if a not in gone]
            results.append((0, None, [(0, None, a) for a in gone]))
        return acl_frames.delete_response(v, cid, 0, results)


def _recv(sock: Any, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    server = FakeBroker({18: (0, 3), 48: (0, 1), 49: (0, 1), 29: (1, 3), 30: (1, 3),
                         31: (1, 3)})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_quotas_alter_then_describe_over_the_wire(broker: FakeBroker,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    b = ["--bootstrap-server", broker.bootstrap]
    assert main(["quotas", "alter", *b, "--entity-type", "users", "--entity-name", "alice",
                 "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2e7"]) == 0
    assert capsys.readouterr().out == "Completed updating config for user alice.\n"
    assert broker.quotas == {(("user", "alice"),): {"producer_byte_rate": 1048576.0,
                                                    "consumer_byte_rate": 2e7}}
    assert (49, 1) in broker.requests  # the highest version both know
    assert main(["quotas", "describe", *b, "--entity-type", "users", "--entity-name",
                 "alice"]) == 0
    assert capsys.readouterr().out == ("Quota configs for user-principal 'alice' are "
                                       "producer_byte_rate=1048576.0, consumer_byte_rate=2.0E7\n")
    assert (48, 1) in broker.requests
    assert main(["quotas", "alter", *b, "--entity-type", "users", "--entity-name", "alice",
                 "--delete-config", "consumer_byte_rate"]) == 0
    assert broker.quotas[(("user", "alice"),)] == {"producer_byte_rate": 1048576.0}
    capsys.readouterr()
    # deleting what is not set: Kafka's tool refuses before any alter
    assert main(["quotas", "alter", *b, "--entity-type", "users", "--entity-name", "alice",
                 "--delete-config", "request_percentage"]) == 1
    assert capsys.readouterr().err == "Invalid config(s): request_percentage\n"
    # refused by the broker: Kafka's exception, as ConfigCommand prints what it did not expect
    broker.refuse = 31
    assert main(["quotas", "alter", *b, "--entity-type", "clients", "--entity-default",
                 "--add-config", "request_percentage=50"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Error while executing config command with args '")
    assert err[1:] == [
        "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
        "ClusterAuthorizationException: Cluster authorization failed.",
        "Caused by: org.apache.kafka.common.errors.ClusterAuthorizationException: Cluster "
        "authorization failed."]


def test_a_broker_without_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeBroker({18: (0, 3)})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["quotas", "describe", "--bootstrap-server", server.bootstrap,
                     "--entity-type", "clients"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert ("java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
            "UnsupportedVersionException: The broker does not support DESCRIBE_CLIENT_QUOTAS"
            ) in capsys.readouterr().err


def test_acls_add_list_remove_over_the_wire(broker: FakeBroker,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    b = ["--bootstrap-server", broker.bootstrap]
    assert main(["acls", *b, "--add", "--allow-principal", "User:alice", "--operation", "Read",
                 "--topic", "t"]) == 0
    assert capsys.readouterr().out == format_adding(TOPIC_T, [ALICE_READ])
    assert broker.acls == [(2, "t", 3, "User:alice", "*", 3, 3)]
    assert (30, 3) in broker.requests
    assert main(["acls", *b, "--list", "--topic", "t"]) == 0
    assert capsys.readouterr().out == format_resource_acls({TOPIC_T: [ALICE_READ]})
    assert main(["acls", *b, "--list", "--principal", "User:bob"]) == 0
    assert capsys.readouterr().out == "ACLs for principal `User:bob`\n"
    # without --force, the question is asked and a "n" keeps the ACLs
    import sys

    stdin = sys.stdin
    sys.stdin = io.StringIO("n\n")
    try:
        assert main(["acls", *b, "--remove", "--topic", "t"]) == 0
    finally:
        sys.stdin = stdin
    assert capsys.readouterr().out == (
        "Are you sure you want to delete all ACLs for resource filter `ResourcePattern("
        "resourceType=TOPIC, name=t, patternType=LITERAL)`? (y/n)\n")
    assert broker.acls
    assert main(["acls", *b, "--remove", "--force", "--topic", "t"]) == 0
    assert broker.acls == []
    broker.refuse = 31
    assert main(["acls", *b, "--add", "--allow-principal", "User:alice", "--topic", "t"]) == 1
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "Error while executing ACL command: org.apache.kafka.common.errors."
        "ClusterAuthorizationException: Cluster authorization failed.",
        "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
        "ClusterAuthorizationException: Cluster authorization failed.",
        "Caused by: org.apache.kafka.common.errors.ClusterAuthorizationException: Cluster "
        "authorization failed."]


def test_unreachable_bootstrap_is_kafkas_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["acls", "--bootstrap-server", f"127.0.0.1:{port}", "--list"]) == 1
    out = capsys.readouterr().out
    assert ("org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node "
            "assignment. Call: describeAcls") in out
    assert "Caused by: java.net.ConnectException" in out
    assert admin_client.error_for(999, None).name == "UnknownServerException"


def test_sasl_plain_from_a_jaas_line(broker: FakeBroker, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    def config(password: str, mechanism: str = "PLAIN") -> str:
        path = tmp_path / f"{password}-{mechanism}.properties"
        path.write_text("security.protocol=SASL_PLAINTEXT\n"
                        f"sasl.mechanism={mechanism}\n"
                        "sasl.jaas.config=org.apache.kafka.common.security.plain."
                        f'PlainLoginModule required username="alice" password="{password}";\n')
        return str(path)

    b = ["--bootstrap-server", broker.bootstrap]
    assert main(["acls", *b, "--command-config", config("alice-pw"), "--list"]) == 0
    assert broker.requests[:3] == [(17, 1), (36, 1), (18, 0)]
    capsys.readouterr()
    assert main(["acls", *b, "--command-config", config("nope"), "--list"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "Error while executing ACL command: org.apache.kafka.common.errors."
        "SaslAuthenticationException: Authentication failed: Invalid username or password")
    assert main(["quotas", "describe", *b, "--command-config", config("x", "SCRAM-SHA-256"),
                 "--entity-type", "users"]) == 1
    assert ("UnsupportedSaslMechanismException: Client SASL mechanism 'SCRAM-SHA-256' not "
            "enabled in the server, enabled mechanisms are [PLAIN]") in capsys.readouterr().err


class TlsBroker(FakeBroker):
    def __init__(self, apis: dict[int, tuple[int, int]], ctx: Any) -> None:
        super().__init__(apis)
        self.ctx = ctx

    def get_request(self) -> Any:
        sock, addr = super().get_request()
        return self.ctx.wrap_socket(sock, server_side=True), addr


def test_tls_with_a_pem_truststore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from testkit.certs import Certs

    certs = Certs(tmp_path, "t")
    server = TlsBroker({18: (0, 3), 29: (1, 3)}, certs.server_context(certs.server()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def config(ca: Path, extra: str = "") -> str:
            path = tmp_path / f"{ca.stem}{len(extra)}.properties"
            path.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\n"
                            f"ssl.truststore.location={ca}\n{extra}")
            return str(path)

        b = ["--bootstrap-server", server.bootstrap]
        assert main(["acls", *b, "--command-config", config(certs.ca_file), "--list"]) == 0
        assert (29, 3) in server.requests
        other = Certs(tmp_path, "other").ca_file
        assert main(["acls", *b, "--command-config", config(other), "--list"]) == 1
        out = capsys.readouterr().out
        assert ("Error while executing ACL command: org.apache.kafka.common.errors."
                "SslAuthenticationException: SSL handshake failed") in out
    finally:
        server.shutdown()
        server.server_close()
