"""The YAML configuration loader: values and defaults, the shipped example configurations, and
the positioned error messages (``FILE:LINE:COL: dotted.path: message``)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_config, parse_config
from kafka_quota_proxy.config.schema import HostPort, PortRange, ProxyConfig
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from testkit import config_errors
from testkit.certs import Certs
from testkit.hostile import alias_bomb

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
SOURCE = "test.yaml"
ERROR_LINE = config_errors.ERROR_LINE

MINIMAL = """\
listeners:
  bootstrap: "127.0.0.1:9192"     # where clients bootstrap
  advertised_host: "127.0.0.1"    # host written into rewritten broker addresses
  broker_ports: "9193-9292"       # one port per upstream broker
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
metrics:
  listen: "127.0.0.1:9102"        # optional; GET /metrics
"""

BASE = config_errors.BASE  # (its line numbers are there)


def errors_of(text: str, source: str = SOURCE) -> list[str]:
    return config_errors.errors_of(text, source)


def single_error(text: str) -> dict[str, Any]:
    return config_errors.single_error(text, SOURCE)


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )


def k8s_configmap_config() -> str:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    text: str = cm["data"]["config.yaml"]
    return text


# ------------------------------------------------------------------ values and defaults


def test_minimal_form_values_and_defaults() -> None:
    cfg = parse_config(MINIMAL, SOURCE)
    assert isinstance(cfg, ProxyConfig)
    assert cfg.listeners.bootstrap == HostPort("127.0.0.1", 9192)
    assert cfg.listeners.advertised_host == "127.0.0.1"
    assert cfg.listeners.broker_ports == PortRange(9193, 9292)
    assert len(cfg.listeners.broker_ports) == 100
    assert 9193 in cfg.listeners.broker_ports and 9292 in cfg.listeners.broker_ports
    assert 9192 not in cfg.listeners.broker_ports and 9293 not in cfg.listeners.broker_ports
    assert cfg.listeners.broker_listen_host is None
    assert cfg.listeners.broker_host == "127.0.0.1"  # defaults to the bootstrap host
    assert cfg.upstream.bootstrap_servers == [HostPort("127.0.0.1", 9092)]
    assert cfg.metrics.listen == HostPort("127.0.0.1", 9102)
    # defaults
    assert cfg.upstream.connect_timeout_seconds == 10.0
    assert cfg.upstream.metadata_refresh_seconds == 30.0
    assert cfg.logging.format == "json"
    assert cfg.logging.level == "info"
    assert cfg.network.max_frame_bytes == DEFAULT_MAX_FRAME_BYTES == 100 * 1024 * 1024
    assert cfg.network.write_buffer_high_bytes == 4 * 1024 * 1024
    assert cfg.network.write_buffer_low_bytes == 1024 * 1024
    assert cfg.network.shutdown_timeout_seconds == 30.0


def test_metrics_is_optional() -> None:
    cfg = parse_config(BASE, SOURCE)
    assert cfg.metrics.listen is None
    cfg = parse_config(BASE + "metrics:\n  listen: null\n", SOURCE)
    assert cfg.metrics.listen is None


def test_config_is_frozen() -> None:
    cfg = parse_config(MINIMAL, SOURCE)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.listeners.advertised_host = "elsewhere"


def test_alternative_spellings() -> None:
    text = BASE.replace('"9193-9292"', "9300").replace(
        '["127.0.0.1:9092"]', '"kafka-1:9092, kafka-2:9092,"'
    ).replace('"127.0.0.1:9192"', '"[::1]:9192"')
    cfg = parse_config(text, SOURCE)
    assert cfg.listeners.bootstrap == HostPort("::1", 9192)
    assert str(cfg.listeners.bootstrap) == "[::1]:9192"
    assert cfg.listeners.broker_ports == PortRange(9300, 9300)
    assert [str(s) for s in cfg.upstream.bootstrap_servers] == ["kafka-1:9092", "kafka-2:9092"]


def test_every_key_overridable() -> None:
    text = textwrap.dedent("""\
        listeners:
          bootstrap: "127.0.0.1:9192"
          advertised_host: "127.0.0.1"
          broker_ports: "9193-9292"
          broker_listen_host: "0.0.0.0"
        upstream:
          bootstrap_servers: ["127.0.0.1:9092"]
          connect_timeout_seconds: 2.5
          metadata_refresh_seconds: 5
        logging:
          format: console
          level: debug
        network:
          max_frame_bytes: 1048576
          write_buffer_high_bytes: 65536
          write_buffer_low_bytes: 65536
          shutdown_timeout_seconds: 0
        """)
    cfg = parse_config(text, SOURCE)
    assert cfg.listeners.broker_host == "0.0.0.0"
    assert cfg.upstream.connect_timeout_seconds == 2.5
    assert cfg.upstream.metadata_refresh_seconds == 5.0
    assert (cfg.logging.format, cfg.logging.level) == ("console", "debug")
    assert cfg.network.max_frame_bytes == 1048576
    assert cfg.network.write_buffer_high_bytes == cfg.network.write_buffer_low_bytes == 65536
    assert cfg.network.shutdown_timeout_seconds == 0


# ------------------------------------------------------------------ shipped configurations


def test_minimal_yaml_file_is_exactly_the_documented_form() -> None:
    assert (DEPLOY / "config.minimal.yaml").read_text() == MINIMAL


def test_example_config_values() -> None:
    cfg = load_config(DEPLOY / "config.example.yaml")
    assert cfg.listeners.bootstrap == HostPort("0.0.0.0", 9192)
    assert cfg.listeners.advertised_host == "kafka-proxy.example.internal"
    assert cfg.listeners.broker_ports == PortRange(9193, 9292)
    assert cfg.listeners.broker_listen_host == "0.0.0.0"
    assert len(cfg.upstream.bootstrap_servers) == 3
    assert cfg.metrics.listen == HostPort("0.0.0.0", 9102)


def test_example_config_sets_every_key() -> None:
    """The example documents every section and every key: it sets each model field."""
    data = yaml.safe_load((DEPLOY / "config.example.yaml").read_text())
    assert set(data) == set(ProxyConfig.model_fields)
    for section, value in data.items():
        if not isinstance(value, dict):  # a top-level value (workers)
            continue
        model = ProxyConfig.model_fields[section].annotation
        model = next((a for a in typing.get_args(model) if a is not type(None)), model)
        assert set(value) == set(model.model_fields), section  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["config.example.yaml", "config.minimal.yaml", "kubernetes.yaml"])
def test_shipped_config_parses(name: str) -> None:
    text = k8s_configmap_config() if name == "kubernetes.yaml" else (DEPLOY / name).read_text()
    cfg = parse_config(text, name)
    assert cfg.upstream.bootstrap_servers


# The files deploy/config.example.yaml names (under /etc/kafka-quota-proxy/), by their keys.
EXAMPLE_FILES = {
    "listeners.security.tls.cert_file": "tls/proxy.pem",
    "listeners.security.tls.key_file": "tls/proxy.key",
    "listeners.security.tls.client_ca_file": "tls/clients-ca.pem",
    "upstream.tls.ca_file": "tls/kafka-ca.pem",
    "upstream.sasl.password_file": "secrets/kafka-password",
}
EXAMPLE_FILES_DIR = "/etc/kafka-quota-proxy/"


def example_in(directory: Path, *, with_files: bool) -> Path:
    """deploy/config.example.yaml with its files under ``directory`` (made, ``with_files``:
    check-config reads them as the proxy will, so a test machine has to provide them)."""
    text = (DEPLOY / "config.example.yaml").read_text()
    named = {m for m in re.findall(r'"(/[^"]+)"', text) if m.startswith(EXAMPLE_FILES_DIR)}
    assert named == {EXAMPLE_FILES_DIR + f for f in EXAMPLE_FILES.values()}, named
    if with_files:
        certs = Certs(directory, "clients")
        (directory / "tls").mkdir(exist_ok=True)
        (directory / "secrets").mkdir(exist_ok=True)
        server = certs.server()
        server.cert.rename(directory / "tls/proxy.pem")
        server.key.rename(directory / "tls/proxy.key")
        certs.ca_file.rename(directory / "tls/clients-ca.pem")
        Certs(directory, "kafka").ca_file.rename(directory / "tls/kafka-ca.pem")
        (directory / "secrets/kafka-password").write_text("proxy-password\n")
    path = directory / "config.example.yaml"
    path.write_text(text.replace(EXAMPLE_FILES_DIR, f"{directory}/"))
    return path


@pytest.mark.parametrize("name", ["config.example.yaml", "config.minimal.yaml", "kubernetes.yaml"])
def test_shipped_config_passes_check_config(name: str, tmp_path: Path) -> None:
    """The example passes where the files it names exist (here, under a test directory)."""
    if name == "kubernetes.yaml":
        path = tmp_path / "k8s-config.yaml"
        path.write_text(k8s_configmap_config())
    elif name == "config.example.yaml":
        path = example_in(tmp_path, with_files=True)
    else:
        path = DEPLOY / name
    proc = check_config(path)
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout
    assert f"{path}: configuration is valid" in proc.stdout
    assert "bootstrap listener" in proc.stdout  # the summary follows


def test_example_config_without_its_files_fails_check_config(tmp_path: Path) -> None:
    """Without the files it names, check-config refuses the example (as run would), each
    missing file at the line and column of its key."""
    path = example_in(tmp_path, with_files=False)
    proc = check_config(path)
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout == ""
    lines = path.read_text().splitlines()
    expected = []
    for field, name in EXAMPLE_FILES.items():
        file = f"{tmp_path}/{name}"
        (number,) = [i for i, line in enumerate(lines, 1) if f'"{file}"' in line]
        key = field.rsplit(".", 1)[1]
        column = lines[number - 1].index(f"{key}:") + 1
        expected.append(f"  {path}:{number}:{column}: {field}: cannot read {file}: No such file "
                        "or directory")
    assert f"{path}: invalid configuration (5 error(s)):" in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[1:] == expected, proc.stderr


def test_kubernetes_manifest_matches_its_config() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    cfg = parse_config(k8s_configmap_config(), "kubernetes.yaml")
    assert cfg.listeners.broker_ports == PortRange(9193, 9202)
    assert cfg.metrics.listen is not None
    wanted = {
        cfg.listeners.bootstrap.port,
        cfg.metrics.listen.port,
        *range(cfg.listeners.broker_ports.first, cfg.listeners.broker_ports.last + 1),
    }
    assert len(wanted) == 12

    deployment, service = kinds["Deployment"], kinds["Service"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {p["containerPort"] for p in container["ports"]} == wanted
    assert {p["port"] for p in service["spec"]["ports"]} == wanted
    assert all(p["port"] == p["targetPort"] for p in service["spec"]["ports"])
    names = [p["name"] for p in service["spec"]["ports"]]
    assert len(set(names)) == len(names) and all(len(n) <= 15 for n in names)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]

    assert deployment["spec"]["replicas"] == 1
    assert pod["terminationGracePeriodSeconds"] > cfg.network.shutdown_timeout_seconds
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["tcpSocket"]["port"] == "bootstrap"
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/kafka-quota-proxy"] == "config"
    assert container["args"] == ["run", "--config", "/etc/kafka-quota-proxy/config.yaml"]


def test_dockerfile_matches_example_config() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cfg = load_config(DEPLOY / "config.example.yaml")
    assert cfg.metrics.listen is not None
    expose = next(line for line in dockerfile.splitlines() if line.startswith("EXPOSE "))
    assert expose.split()[1:] == [
        f"{cfg.listeners.bootstrap.port}/tcp",
        f"{cfg.listeners.broker_ports}/tcp",
        f"{cfg.metrics.listen.port}/tcp",
    ]
    assert 'ENTRYPOINT ["kafka-quota-proxy"]' in dockerfile
    assert 'CMD ["run", "--config", "/etc/kafka-quota-proxy/config.yaml"]' in dockerfile
    assert "STOPSIGNAL SIGTERM" in dockerfile
    assert re.search(r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim$",
                     dockerfile, re.M)
    assert re.search(r"^USER (?!0|root)\S+", dockerfile, re.M)


# ------------------------------------------------------------------ errors


def test_unknown_key_nested() -> None:
    text = BASE.replace('  broker_ports: "9193-9292"\n',
                        '  broker_ports: "9193-9292"\n  advertized_host: "typo"\n')
    e = single_error(text)
    assert (e["line"], e["col"]) == (5, 3)
    assert e["path"] == "listeners.advertized_host"
    assert e["msg"] == "unknown key (did you mean 'advertised_host'?)"


def test_an_unknown_key_gets_the_closest_known_one_at_any_depth() -> None:
    text = BASE + ("quotas:\n  windw: {samples: 11}\n  entities:\n"
                   "    - {user: a, producer_byte_rat: 5}\n"
                   "acls:\n  bindings:\n    - {principal: 'User:a', operation: Read, topik: x}\n")
    assert [e.split(": ", 1)[1] for e in errors_of(text)] == [
        "quotas.windw: unknown key (did you mean 'window'?)",
        "quotas.entities.0.producer_byte_rat: unknown key (did you mean 'producer_byte_rate'?)",
        "acls.bindings.0.topik: unknown key (did you mean 'topic'?)"]


def test_unknown_key_top_level_and_deep() -> None:
    text = BASE + "throttles:\n  default: 1\nnetwork:\n  shutdown_timeout_seconds: 1\n  bogus: 2\n"
    errors = errors_of(text)
    assert sorted(errors) == sorted([
        f"{SOURCE}:7:1: throttles: unknown key",
        f"{SOURCE}:11:3: network.bogus: unknown key",
    ])


def test_missing_required_field() -> None:
    text = BASE.replace('  advertised_host: "127.0.0.1"\n', "")
    e = single_error(text)
    # reported at the enclosing mapping's key: the missing key has no position of its own
    assert (e["line"], e["col"]) == (1, 1)
    assert e["path"] == "listeners.advertised_host"
    assert e["msg"] == "required field is missing"


def test_missing_required_section() -> None:
    text = "# header comment\n" + BASE.split("upstream:")[0]
    e = single_error(text)
    # reported at the top-level mapping, which starts at its first key (line 2)
    assert (e["line"], e["col"]) == (2, 1)
    assert e["path"] == "upstream"
    assert e["msg"] == "required field is missing"


@pytest.mark.parametrize(
    ("extra", "line", "path", "fragment"),
    [
        ("network:\n  max_frame_bytes: 1.5\n", 8, "network.max_frame_bytes", "valid integer"),
        ("network:\n  write_buffer_high_bytes: [1]\n", 8, "network.write_buffer_high_bytes",
         "valid integer"),
        ("network:\n  shutdown_timeout_seconds: soon\n", 8,
         "network.shutdown_timeout_seconds", "valid number"),
        ("logging:\n  level: verbose\n", 8, "logging.level", "'debug', 'info'"),
        ("logging:\n  format: xml\n", 8, "logging.format", "'json' or 'console'"),
        ("network:\n  max_frame_bytes: 0\n", 8, "network.max_frame_bytes", "greater than 0"),
        ("network:\n  max_frame_bytes: 2147483648\n", 8, "network.max_frame_bytes",
         "less than or equal to 2147483647"),
        ("network:\n  shutdown_timeout_seconds: -1\n", 8, "network.shutdown_timeout_seconds",
         "greater than or equal to 0"),
        ("logging: verbose\n", 7, "logging", "valid dictionary"),
        ("metrics:\n", 7, "metrics", "valid dictionary"),
    ],
)
def test_wrong_type_or_value(extra: str, line: int, path: str, fragment: str) -> None:
    e = single_error(BASE + extra)
    assert e["line"] == line
    assert e["path"] == path
    assert fragment in e["msg"], e["msg"]


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("connect_timeout_seconds: soon", "valid number"),
        ("connect_timeout_seconds: 0", "greater than 0"),
        ("metadata_refresh_seconds: -5", "greater than 0"),
    ],
)
def test_wrong_upstream_value(setting: str, fragment: str) -> None:
    e = single_error(BASE + f"  {setting}\n")
    assert (e["line"], e["col"]) == (7, 3)
    assert e["path"] == "upstream." + setting.split(":")[0]
    assert fragment in e["msg"], e["msg"]


def test_wrong_type_advertised_host() -> None:
    e = single_error(BASE.replace('advertised_host: "127.0.0.1"', "advertised_host: 12"))
    assert (e["line"], e["col"], e["path"]) == (3, 3, "listeners.advertised_host")
    assert "valid string" in e["msg"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('"localhost"', "expected \"host:port\", got 'localhost'"),
        ('"localhost:"', "expected \"host:port\""),
        ('":9192"', "expected \"host:port\""),
        ('"localhost:http"', "expected \"host:port\""),
        ('"localhost:70000"', "port 70000 is outside 1-65535"),
        ('"localhost:0"', "port 0 is outside 1-65535"),
        ("9192", 'expected a "host:port" string'),
        ("null", 'expected a "host:port" string'),
    ],
)
def test_bad_host_port_bootstrap(value: str, fragment: str) -> None:
    e = single_error(BASE.replace('bootstrap: "127.0.0.1:9192"', f"bootstrap: {value}"))
    assert (e["line"], e["col"], e["path"]) == (2, 3, "listeners.bootstrap")
    assert fragment in e["msg"], e["msg"]


def test_bad_host_port_in_upstream_list() -> None:
    e = single_error(BASE.replace('["127.0.0.1:9092"]', '["kafka-1:9092", "kafka-2"]'))
    assert (e["line"], e["col"], e["path"]) == (6, 3, "upstream.bootstrap_servers")
    assert "expected \"host:port\", got 'kafka-2'" in e["msg"]


def test_upstream_list_must_not_be_empty() -> None:
    e = single_error(BASE.replace('["127.0.0.1:9092"]', "[]"))
    assert (e["line"], e["path"]) == (6, "upstream.bootstrap_servers")
    assert "at least 1 item" in e["msg"]


def test_bad_host_port_metrics() -> None:
    e = single_error(BASE + "metrics:\n  listen: 9102\n")
    assert (e["line"], e["col"], e["path"]) == (8, 3, "metrics.listen")
    assert 'expected a "host:port" string' in e["msg"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('"9292-9193"', "port range 9292-9193 must satisfy 1 <= first <= last <= 65535"),
        ('"0-100"', "port range 0-100 must satisfy"),
        ('"65000-65536"', "port range 65000-65536 must satisfy"),
        ('"abc"', 'expected a port range like "9193-9292", got \'abc\''),
        ('"9193-"', "expected a port range"),
        ('"-9193"', "expected a port range"),
        ('"9193..9292"', "expected a port range"),
    ],
)
def test_bad_port_range(value: str, fragment: str) -> None:
    e = single_error(BASE.replace('broker_ports: "9193-9292"', f"broker_ports: {value}"))
    assert (e["line"], e["col"], e["path"]) == (4, 3, "listeners.broker_ports")
    assert fragment in e["msg"], e["msg"]


@pytest.mark.parametrize("ports", ['"9100-9200"', '"9192-9192"', '"9192"', '"9150-9192"'])
def test_bootstrap_port_inside_broker_ports(ports: str) -> None:
    e = single_error(BASE.replace('broker_ports: "9193-9292"', f"broker_ports: {ports}"))
    # a check across fields: reported at the field to change
    assert (e["line"], e["col"], e["path"]) == (4, 3, "listeners.broker_ports")
    assert e["msg"] == (f"broker_ports {PortRange.parse(ports.strip(chr(34)))} collides with "
                        "bootstrap port 9192")


@pytest.mark.parametrize(
    "listen", ['"127.0.0.1:9192"', '"127.0.0.1:9193"', '"0.0.0.0:9250"', '"127.0.0.1:9292"']
)
def test_metrics_port_colliding(listen: str) -> None:
    e = single_error(BASE + f"metrics:\n  listen: {listen}\n")
    # A check across sections, reported at metrics.listen
    assert e["path"] == "metrics.listen"
    assert e["line"] == BASE.count("\n") + 2
    port = listen.strip('"').rsplit(":", 1)[1]
    assert e["msg"].startswith(f"metrics.listen port {port} collides with ")
    assert e["msg"].endswith(("bootstrap port 9192", "broker_ports 9193-9292")), e["msg"]


def test_metrics_same_port_other_host_is_allowed() -> None:
    cfg = parse_config(BASE + 'metrics:\n  listen: "127.0.0.2:9192"\n', SOURCE)
    assert cfg.metrics.listen == HostPort("127.0.0.2", 9192)


def test_write_buffer_low_above_high() -> None:
    text = BASE + "network:\n  write_buffer_high_bytes: 1000\n  write_buffer_low_bytes: 1001\n"
    e = single_error(text)
    assert (e["line"], e["col"], e["path"]) == (7, 1, "network")
    assert e["msg"] == "write_buffer_low_bytes must not exceed write_buffer_high_bytes"
    # low above the default high (4 MiB) is caught too
    e = single_error(BASE + "network:\n  write_buffer_low_bytes: 4194305\n")
    assert (e["line"], e["path"]) == (7, "network")


def test_duplicate_keys() -> None:
    text = BASE.replace('  broker_ports: "9193-9292"\n',
                        '  broker_ports: "9193-9292"\n  bootstrap: "127.0.0.1:9000"\n')
    e = single_error(text)
    assert (e["line"], e["col"], e["path"], e["msg"]) == (
        5, 3, "listeners.bootstrap", "duplicate key")


def test_duplicate_sections() -> None:
    text = BASE + "upstream:\n  bootstrap_servers: [\"10.0.0.1:9092\"]\n"
    e = single_error(text)
    assert (e["line"], e["col"], e["path"], e["msg"]) == (7, 1, "upstream", "duplicate key")


def test_a_duplicate_key_hides_no_other_error() -> None:
    text = BASE + "logging:\n  level: info\n  level: debug\nmetrics: {listen: 12}\n"
    assert [e.split(": ", 1)[1] for e in errors_of(text)] == [
        "logging.level: duplicate key", 'metrics.listen: expected a "host:port" string']


def test_every_duplicate_is_reported() -> None:
    text = BASE + "logging:\n  level: info\n  level: debug\n  level: error\nlogging: {}\n"
    assert errors_of(text) == [
        f"{SOURCE}:9:3: logging.level: duplicate key",
        f"{SOURCE}:10:3: logging.level: duplicate key",
        f"{SOURCE}:11:1: logging: duplicate key",
    ]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (BASE + "metrics: [\n", 8),  # unclosed flow sequence: reported at end of input
        (BASE.replace('  advertised_host: "127.0.0.1"', ' advertised_host: "127.0.0.1"'), 3),
        (BASE + "logging:\n  level: \"info\n", 9),  # unterminated quoted scalar
        (BASE + "network:\n\tmax_frame_bytes: 1\n", 8),  # tab indentation
        (BASE + "---\nlisteners: {}\n", 7),  # a second document
    ],
)
def test_yaml_syntax_error_reports_line(text: str, line: int) -> None:
    errors = errors_of(text)
    assert len(errors) == 1, errors
    m = re.match(rf"^{re.escape(SOURCE)}:(\d+):(\d+): YAML syntax error: .+", errors[0])
    assert m, errors[0]
    assert int(m.group(1)) == line


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n", "[listeners]\n"])
def test_non_mapping_document(text: str) -> None:
    assert errors_of(text) == [f"{SOURCE}:1:1: the configuration must be a YAML mapping"]


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "null\n"])
def test_empty_document(text: str) -> None:
    assert errors_of(text) == [f"{SOURCE}:1:1: the configuration must be a YAML mapping"]


def test_several_errors_are_all_reported_with_their_lines() -> None:
    text = textwrap.dedent("""\
        listeners:
          bootstrap: "localhost"
          advertised_host: "127.0.0.1"
          broker_ports: "9300-9200"
          colour: blue
        upstream:
          bootstrap_servers: ["127.0.0.1:9092"]
          connect_timeout_seconds: -1
        """)
    errors = errors_of(text)
    assert errors == [  # in the order of the file
        f"{SOURCE}:2:3: listeners.bootstrap: expected \"host:port\", got 'localhost'",
        f"{SOURCE}:4:3: listeners.broker_ports: port range 9300-9200 must satisfy "
        "1 <= first <= last <= 65535",
        f"{SOURCE}:5:3: listeners.colour: unknown key",
        f"{SOURCE}:8:3: upstream.connect_timeout_seconds: Input should be greater than 0",
    ]


def test_errors_come_in_the_order_of_the_file() -> None:
    """Sections written in another order than the schema's: the errors follow the file."""
    text = textwrap.dedent("""\
        upstream:
          bootstrap_servers: ["127.0.0.1:9092"]
          connect_timeout_seconds: -1
        listeners:
          bootstrap: "localhost"
          advertised_host: "127.0.0.1"
          broker_ports: "9193-9292"
        """)
    assert [line.split(":")[1] for line in errors_of(text)] == ["3", "5"]


def test_summary_names_every_section() -> None:
    from kafka_quota_proxy.config.summary import summarize

    summary = summarize(load_config(DEPLOY / "config.example.yaml"))
    for fragment in ("capture            : /var/lib/kafka-quota-proxy/capture",
                     "storage throttling : topic __kafka_quota_proxy_volumes",
                     "listeners          : SASL_SSL, client certificates requested, SASL inspect",
                     "listener INTERNAL  : PLAINTEXT (bootstrap 0.0.0.0:9392",
                     "upstream security  : TLS, SASL SCRAM-SHA-512 as kafka-quota-proxy"):
        assert fragment in summary, summary
    minimal = summarize(parse_config(BASE, SOURCE))
    assert "capture            : off" in minimal and "storage throttling : off" in minimal
    assert ("ACLs               : on, 5 bindings in the config, super users User:admin, closed "
            "where no ACL is found, dynamic ACLs in topic __kafka_quota_proxy_acls") in summary
    assert "ACLs               : off (every client may do what the proxy's own principal may)" \
        in minimal


def test_summary_says_what_a_broker_sees_of_each_listener_kind() -> None:
    """Under SASL inspection a broker sees each client's own principal; on every other kind
    it sees the proxy's connection for every client, and check-config says so."""
    from kafka_quota_proxy.config.summary import summarize

    lines = summarize(load_config(DEPLOY / "config.example.yaml")).splitlines()
    seen = [lines[i + 1] for i, line in enumerate(lines) if line.startswith("listener")]
    assert seen == [
        "  broker sees      : each client's own SASL principal (the exchange goes to the broker)",
        "  broker sees      : every client as the proxy's SASL login 'kafka-quota-proxy': broker "
        "ACLs and quotas cannot tell clients apart"]
    minimal = summarize(parse_config(BASE, SOURCE))
    assert ("  broker sees      : every client as ANONYMOUS (the proxy's unauthenticated "
            "connection): broker ACLs and quotas cannot tell clients apart") in minimal


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (line,) = info.value.errors
    assert line.startswith(f"{path}: cannot read: ")
    assert "No such file" in line


def test_load_config_uses_path_as_source(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + "extra: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}:7:1: extra: unknown key"]


# ------------------------------------------------------------------ check-config on bad files


def test_check_config_bad_file_reports_every_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent("""\
        listeners:
          bootstrap: "127.0.0.1:9192"
          advertised_host: "127.0.0.1"
          broker_ports: "9292-9193"
        upstream:
          bootstrap_servers: ["127.0.0.1:9092"]
          retries: 3
        network:
          max_frame_bytes: big
        """))
    proc = check_config(path)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "configuration is valid" not in proc.stdout + proc.stderr
    assert f"{path}: invalid configuration (3 error(s)):" in proc.stderr
    for expected in (
        f"{path}:4:3: listeners.broker_ports: port range 9292-9193 must satisfy",
        f"{path}:7:3: upstream.retries: unknown key",
        f"{path}:9:3: network.max_frame_bytes: Input should be a valid integer",
    ):
        assert expected in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", ":1:1: the configuration must be a YAML mapping"),
        ("listeners: [\n", ":2:1: YAML syntax error"),
        ("listeners: {}\nlisteners: {}\n", ":2:1: listeners: duplicate key"),
    ],
)
def test_check_config_other_bad_files(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    proc = check_config(path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert f"{path}{expected}" in proc.stderr, proc.stderr
    assert "configuration is valid" not in proc.stderr


def test_check_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    proc = check_config(path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert f"{path}: cannot read: No such file or directory" in proc.stderr


# ------------------------------------------------------------------ former bugs (regressions)


def test_check_config_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(BASE.replace("127.0.0.1", "caf\xe9", 1).encode("latin-1"))
    proc = check_config(path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{path}:" in proc.stderr


@pytest.mark.parametrize("listen", ['"0.0.0.0:9192"', '"localhost:9192"'])
def test_metrics_port_colliding_via_wildcard_or_name(listen: str) -> None:
    e = single_error(BASE + f"metrics:\n  listen: {listen}\n")
    assert e["msg"] == "metrics.listen port 9192 collides with bootstrap port 9192"


# --------------------------------------------------------------------------- racks
RACKS_DOC = """\
racks:
  proxy_rack: "us-east-1a"
  selector: rack-aware
  brokers: {1: "us-east-1a", 2: "us-east-1b"}
  clients:
    - {client_id: "^billing-.*", rack: "us-east-1b"}
    - {network: "10.1.0.0/16", rack: "us-east-1a"}
"""


def test_racks_form_from_the_issue() -> None:
    cfg = parse_config(BASE + RACKS_DOC, SOURCE)
    assert cfg.racks is not None
    racks = cfg.racks.client_racks()
    assert racks.rack_for("", "billing-9", "10.1.0.1") == ("us-east-1b", "rule")
    assert racks.rack_for("", "x", "10.1.0.1") == ("us-east-1a", "rule")
    assert racks.rack_for("", "x", "192.168.0.1") == ("us-east-1a", "proxy")
    assert cfg.racks.brokers == {1: "us-east-1a", 2: "us-east-1b"}
    assert type(cfg.racks.make_selector()).__name__ == "RackAwareSelector"
    assert parse_config(BASE, SOURCE).racks is None  # no section: routing off


def test_custom_selector_by_module_and_class() -> None:
    cfg = parse_config(
        BASE + "racks:\n  selector: kafka_quota_proxy.routing.selector:LeaderSelector\n", SOURCE)
    assert cfg.racks is not None
    assert type(cfg.racks.make_selector()).__name__ == "LeaderSelector"


@pytest.mark.parametrize(
    ("extra", "line", "path", "fragment"),
    [
        ("racks:\n  selector: nearest\n", 8, "racks.selector", '"module:Class"'),
        ("racks:\n  selector: 'no_such_module:X'\n", 8, "racks.selector", "cannot import"),
        ("racks:\n  selector: 'kafka_quota_proxy.routing.selector:Nope'\n", 8, "racks.selector",
         "has no 'Nope'"),
        ("racks:\n  decide: maybe\n", 8, "racks.decide", "'broker' or 'proxy'"),
        ("racks:\n  brokers: {one: a}\n", 8, "racks.brokers.one.[key]", "valid integer"),
        ("racks:\n  clients:\n    - {rack: a}\n", 9, "racks.clients.0", "client_id pattern"),
        ("racks:\n  clients:\n    - {network: 10.0.0.0/40, rack: a}\n", 9,
         "racks.clients.0.network", "not a network"),
        ("racks:\n  clients:\n    - {client_id: '(', rack: a}\n", 9,
         "racks.clients.0.client_id", "not a regular expression"),
        ("racks:\n  clients:\n    - {client_id: x, rack: ''}\n", 9, "racks.clients.0.rack",
         "at least 1 character"),
    ],
)
def test_bad_racks_config(extra: str, line: int, path: str, fragment: str) -> None:
    e = single_error(BASE + extra)
    assert (e["line"], e["path"]) == (line, path), e
    assert fragment in e["msg"], e["msg"]


# ---------------------------------------------------------------- hostile or broken files
def test_alias_bomb_is_refused_before_it_expands() -> None:
    """Seven chained anchors (a few hundred bytes) expand to 9^7 values: refused from the node
    tree, counting each shared node once, with nothing expanded (the validation used to
    expand it: seconds of CPU and gigabytes)."""
    import tracemalloc

    tracemalloc.start()
    try:
        errors = errors_of(BASE + alias_bomb())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert errors == [f"{SOURCE}:1:1: refused: more than 200000 values once its aliases are "
                      "expanded"]
    assert peak < 5 << 20
    # Aliases as such are fine, and a modest expansion is still validated as usual.
    assert any("extra: unknown key" in e for e in errors_of(BASE + alias_bomb(3)))


def test_deep_nesting_is_refused_with_its_position() -> None:
    text = BASE + "extra: " + "[" * 5000 + "]" * 5000 + "\n"
    line = BASE.count("\n") + 1
    # found by the linear pre-check, at the 65th bracket (column 72), before PyYAML scans it
    assert errors_of(text) == [f"{SOURCE}:{line}:72: refused: collections nested deeper than "
                               "64 levels"]
    assert any("unknown key" in e for e in errors_of(BASE + "extra: " + "[" * 60 + "]" * 60))
    # Brackets in quoted strings and comments are not nesting.
    quoted = BASE + 'extra: "' + "[" * 100 + '"  # ' + "{" * 100 + "\n"
    assert any("extra: unknown key" in e for e in errors_of(quoted))
    # Nesting by indentation (no brackets) is refused as PyYAML composes it: the root
    # mapping is level 1, so the 64th nested key is level 65.
    block = BASE + "".join(f"{'  ' * i}k{i}:\n" for i in range(70)) + "  " * 70 + "v\n"
    nested_line = BASE.count("\n") + 64
    assert errors_of(block) == [f"{SOURCE}:{nested_line}:{2 * 63 + 1}: refused: collections "
                                "nested deeper than 64 levels"]


def test_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(BASE + "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [f"{path}: larger than 1048576 bytes"]
    assert errors_of(BASE + "# " + "x" * (1 << 20)) == [
        f"{SOURCE}: refused: larger than 1048576 bytes"]
