"""``kafka-quota-proxy quotas describe|alter`` and ``kafka-quota-proxy acls`` (kafka-configs.sh
and kafka-acls.sh in the CLI), run as a subprocess against proxies in front of one tansu: over
plaintext, a quota altered then described, for a user and for a client-id of the default user,
then removed; over SASL_SSL (the proxy terminating SASL, a ``--command-config`` with Kafka's
properties), an admin alters and describes, a user the ACLs let describe but not alter is
refused as Kafka's tool reports it, a wrong password fails authentication, and a super user
adds, lists and removes ACLs (which a user without rights on the cluster may not)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.security.credentials import add_user
from testkit.certs import Certs
from testkit.e2e import ProxyProcess, wait_for

pytestmark = pytest.mark.e2e

USERS = {"admin": "admin-pw", "alice": "alice-pw"}
REFUSED = [
    "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
    "ClusterAuthorizationException: Cluster authorization failed.",
    "Caused by: org.apache.kafka.common.errors.ClusterAuthorizationException: Cluster "
    "authorization failed."]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka_quota_proxy", *argv],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def plain(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap, extra_yaml="""quotas:
  admin_principals: [ANONYMOUS]
""").start()
    try:
        p.wait_broker_listener(111)
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def secured(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ProxyProcess, Path]]:
    """A SASL_SSL proxy terminating SASL, with ACLs (admin a super user; alice may describe
    configs, client quotas among them, not alter them); its CA file."""
    work = tmp_path_factory.mktemp("admin-tools")
    certs = Certs(work, "proxy")
    server = certs.server()
    text = ""
    for user, password in USERS.items():
        text = add_user(text, user, password, 4096)
    credentials = work / "credentials.yaml"
    credentials.write_text(text)
    p = ProxyProcess(tansu.bootstrap, listeners_yaml=f"""  security:
    protocol: SASL_SSL
    tls:
      cert_file: "{server.cert}"
      key_file: "{server.key}"
    sasl:
      mode: terminate
      credentials_file: "{credentials}"
""", extra_yaml="""quotas:
  admin_principals: [User:admin]
acls:
  super_users: [User:admin]
  bindings:  # (with ACLs on, they say who may describe and alter quotas)
    - {principal: User:alice, operation: DescribeConfigs, cluster: true}
""").start()
    try:
        p.wait_broker_listener(111)
        yield p, certs.ca_file
    finally:
        p.stop()


def _command_config(directory: Path, ca: Path, user: str, password: str,
                    mechanism: str = "SCRAM-SHA-512") -> str:
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    path = directory / f"{user}-{mechanism}.properties"
    path.write_text(f"""# Kafka's client properties, as kafka-configs.sh reads them
security.protocol=SASL_SSL
sasl.mechanism={mechanism}
sasl.jaas.config={module} required \\
    username="{user}" password="{password}";
ssl.truststore.type=PEM
ssl.truststore.location={ca}
""")
    return str(path)


def test_quotas_alter_then_describe_over_plaintext(plain: ProxyProcess) -> None:
    b = ["--bootstrap-server", plain.bootstrap]
    alice = ["--entity-type", "users", "--entity-name", "alice"]
    done = _cli("quotas", "alter", *b, *alice, "--add-config",
                "producer_byte_rate=1048576,consumer_byte_rate=20000000")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "Completed updating config for user alice.\n", "")
    described = {"Quota configs for user-principal 'alice' are producer_byte_rate=1048576.0, "
                 "consumer_byte_rate=2.0E7\n",  # (in either order, as Kafka's tool prints)
                 "Quota configs for user-principal 'alice' are consumer_byte_rate=2.0E7, "
                 "producer_byte_rate=1048576.0\n"}
    wait_for(lambda: _cli("quotas", "describe", *b, *alice).stdout in described, 20,
             interval=0.2, what="alice's quotas described")

    # a client-id of the default user, then removed
    app = ["--entity-type", "users", "--entity-default", "--entity-type", "clients",
           "--entity-name", "app"]
    done = _cli("quotas", "alter", *b, *app, "--add-config", "request_percentage=50")
    assert (done.returncode, done.stdout) == (
        0, "Completed updating default config for users in the cluster.\n")
    wait_for(lambda: _cli("quotas", "describe", *b, *app).stdout == (
        "Quota configs for the default user-principal, client-id 'app' are "
        "request_percentage=50.0\n"), 20, interval=0.2, what="the <default user, app> quota")
    done = _cli("quotas", "alter", *b, *app, "--delete-config", "request_percentage")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: _cli("quotas", "describe", *b, *app).stdout == "", 20, interval=0.2,
             what="the removal")
    # what is not set cannot be deleted (Kafka's tool asks first)
    done = _cli("quotas", "alter", *b, *app, "--delete-config", "request_percentage")
    assert (done.returncode, done.stderr) == (1, "Invalid config(s): request_percentage\n")


def test_quotas_over_sasl_ssl_and_a_refused_alter(secured: tuple[ProxyProcess, Path],
                                                  tmp_path: Path) -> None:
    proxy, ca = secured
    b = ["--bootstrap-server", proxy.bootstrap]
    admin = ["--command-config", _command_config(tmp_path, ca, "admin", USERS["admin"])]
    alice = ["--command-config", _command_config(tmp_path, ca, "alice", USERS["alice"],
                                                 "PLAIN")]
    bob = ["--entity-type", "clients", "--entity-name", "bob-app"]
    done = _cli("quotas", "alter", *b, *admin, *bob, "--add-config", "producer_byte_rate=2048")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "Completed updating config for client bob-app.\n", "")
    wait_for(lambda: _cli("quotas", "describe", *b, *alice, *bob).stdout == (
        "Quota configs for client-id 'bob-app' are producer_byte_rate=2048.0\n"), 20,
        interval=0.2, what="bob-app's quota, described by alice")

    # alice may describe, not alter: Kafka's ClusterAuthorizationException, exit 1
    done = _cli("quotas", "alter", *b, *alice, *bob, "--add-config", "producer_byte_rate=1")
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and done.stdout == ""
    assert lines[0] == (f"Error while executing config command with args 'quotas alter "
                        f"{' '.join([*b, *alice, *bob])} --add-config producer_byte_rate=1'")
    assert lines[1:] == REFUSED
    assert _cli("quotas", "describe", *b, *admin, *bob).stdout == (
        "Quota configs for client-id 'bob-app' are producer_byte_rate=2048.0\n")

    # a wrong password: the proxy's SASL error, as Kafka's client raises it
    wrong = ["--command-config", _command_config(tmp_path, ca, "admin", "nope",
                                                 "SCRAM-SHA-256")]
    done = _cli("quotas", "describe", *b, *wrong, *bob)
    assert done.returncode == 1
    assert ("java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
            "SaslAuthenticationException: ") in done.stderr
    # a CA that did not sign the proxy's certificate: the handshake fails
    other = Certs(tmp_path, "other").ca_file
    untrusted = ["--command-config", _command_config(tmp_path, other, "admin", USERS["admin"],
                                                     "PLAIN")]
    done = _cli("quotas", "describe", *b, *untrusted, *bob)
    assert done.returncode == 1
    assert ("org.apache.kafka.common.errors.SslAuthenticationException: SSL handshake failed"
            in done.stderr), done.stderr


def test_acls_added_listed_and_removed_by_a_super_user(secured: tuple[ProxyProcess, Path],
                                                       tmp_path: Path) -> None:
    proxy, ca = secured
    b = ["--bootstrap-server", proxy.bootstrap,
         "--command-config", _command_config(tmp_path, ca, "admin", USERS["admin"])]
    alice = ["--bootstrap-server", proxy.bootstrap,
             "--command-config", _command_config(tmp_path, ca, "alice", USERS["alice"])]
    pattern = "ResourcePattern(resourceType=TOPIC, name=orders-, patternType=PREFIXED)"
    read = "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)"
    describe = "(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)"
    done = _cli("acls", *b, "--add", "--allow-principal", "User:alice", "--operation", "Read",
                "--operation", "Describe", "--topic", "orders-", "--resource-pattern-type",
                "prefixed")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"Adding ACLs for resource `{pattern}`: \n \t{read}\n\t{describe}\n\n", "")
    listing = f"Current ACLs for resource `{pattern}`:\n"
    done = _cli("acls", *b, "--list", "--topic", "orders-", "--resource-pattern-type",
                "prefixed")
    assert done.returncode == 0, done.stdout
    assert done.stdout in (f"{listing}\t{read}\n\t{describe}\n\n",
                           f"{listing}\t{describe}\n\t{read}\n\n")
    # every ACL, and those of a principal (match: the patterns that apply to a name)
    assert listing in _cli("acls", *b, "--list").stdout
    assert _cli("acls", *b, "--list", "--topic", "orders-eu", "--resource-pattern-type",
                "match", "--principal", "User:alice").stdout.startswith(
        f"ACLs for principal `User:alice`\n{listing}")

    # alice has no right on the cluster: refused as kafka-acls.sh reports it (on stdout)
    done = _cli("acls", *alice, "--add", "--allow-principal", "User:alice", "--cluster")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-3:] == [
        "Error while executing ACL command: org.apache.kafka.common.errors."
        "ClusterAuthorizationException: Cluster authorization failed.", *REFUSED]

    done = _cli("acls", *b, "--remove", "--force", "--allow-principal", "User:alice",
                "--operation", "Describe", "--topic", "orders-", "--resource-pattern-type",
                "prefixed")
    assert (done.returncode, done.stdout) == (0, "")
    done = _cli("acls", *b, "--list", "--topic", "orders-", "--resource-pattern-type",
                "prefixed")
    assert done.stdout == f"{listing}\t{read}\n\n"
    done = _cli("acls", *b, "--remove", "--force", "--topic", "orders-",
                "--resource-pattern-type", "prefixed")
    assert done.returncode == 0, done.stdout
    assert _cli("acls", *b, "--list", "--topic", "orders-", "--resource-pattern-type",
                "prefixed").stdout == ""
