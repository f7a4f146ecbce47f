"""deploy/helm/kafka-quota-proxy: ``helm lint`` passes, and what ``helm template`` renders is
what the proxy needs. The broker port range is a value: the configuration's ``broker_ports``,
every containerPort and every Service port (port == targetPort) come from it, exactly. The
configuration in the ConfigMap passes the project's own validation (``check-config``). With
default values, the chart renders what deploy/kubernetes.yaml holds (the same configuration,
ports, probes, security contexts and resources), so the two cannot drift apart. The helm binary
is the one on PATH, else a pinned one (testkit/helm.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_quota_proxy.config.loading import load_config, parse_config
from testkit.helm import helm_binary

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kafka-quota-proxy"
MANIFEST = ROOT / "deploy" / "kubernetes.yaml"
WIDE = ["--set", "listeners.brokerPorts.first=20000,listeners.brokerPorts.count=25"]


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def render(helm: Path, *args: str) -> dict[str, dict[str, Any]]:
    """``helm template`` of the chart: its documents by kind (one of each)."""
    done = run_helm(helm, "template", "kqp", str(CHART), *args)
    assert done.returncode == 0, done.stderr
    docs: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(done.stdout):
        if doc:
            assert doc["kind"] not in docs, f"two {doc['kind']}s"
            docs[doc["kind"]] = doc
    assert set(docs) == {"ConfigMap", "Deployment", "Service"}
    return docs


def refusal(helm: Path, *args: str) -> str:
    done = run_helm(helm, "template", "kqp", str(CHART), *args)
    assert done.returncode != 0, f"rendered with {args}"
    return done.stderr


def container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def config_text(docs: dict[str, dict[str, Any]]) -> str:
    text: str = docs["ConfigMap"]["data"]["config.yaml"]
    return text


def check_ports(docs: dict[str, dict[str, Any]], bootstrap: int, metrics: int, first: int,
                count: int) -> None:
    """config.yaml, the containerPorts and the Service's ports agree, port for port."""
    config = parse_config(config_text(docs))
    brokers = list(range(first, first + count))
    assert str(config.listeners.broker_ports) == f"{first}-{first + count - 1}"
    assert config.listeners.bootstrap.port == bootstrap
    assert config.metrics.listen is not None and config.metrics.listen.port == metrics
    expected = sorted([bootstrap, metrics, *brokers])

    ports = container(docs)["ports"]
    assert sorted(p["containerPort"] for p in ports) == expected
    assert all(p["protocol"] == "TCP" for p in ports)
    names = [p["name"] for p in ports]
    assert len(set(names)) == len(names)
    assert all(len(name) <= 15 for name in names), names  # IANA service names
    assert {p["name"]: p["containerPort"] for p in ports}.items() >= {
        "bootstrap": bootstrap, "metrics": metrics}.items()

    service = docs["Service"]["spec"]["ports"]
    assert sorted(p["port"] for p in service) == expected
    assert all(p["port"] == p["targetPort"] for p in service), "clients use the port numbers"
    assert len({p["name"] for p in service}) == len(service)


def check_pod(docs: dict[str, dict[str, Any]]) -> None:
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    c = container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsGroup"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    config_volume = volumes[mounts["/etc/kafka-quota-proxy"]]
    assert config_volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert c["args"] == ["run", "--config", "/etc/kafka-quota-proxy/config.yaml"]
    # the probes name ports that exist
    port_names = {p["name"] for p in c["ports"]}
    assert c["readinessProbe"]["tcpSocket"]["port"] in port_names
    assert c["livenessProbe"]["httpGet"]["port"] in port_names
    assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"
    # SIGKILL only after the preStop delay and the proxy's drain
    config = parse_config(config_text(docs))
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + config.network.shutdown_timeout_seconds
    selector = docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert docs["Service"]["spec"]["selector"] == selector


def test_the_chart_lints(helm: Path) -> None:
    for args in ([], WIDE):
        done = run_helm(helm, "lint", "--strict", str(CHART), *args)
        assert done.returncode == 0, done.stdout + done.stderr


def test_default_values(helm: Path) -> None:
    docs = render(helm)
    check_ports(docs, bootstrap=9192, metrics=9102, first=9193, count=10)
    check_pod(docs)
    assert docs["Service"]["spec"]["type"] == "LoadBalancer"


def test_the_broker_port_range_is_a_value(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, *WIDE, "--set", "listeners.bootstrapPort=19092,metrics.port=19102")
    check_ports(docs, bootstrap=19092, metrics=19102, first=20000, count=25)
    check_pod(docs)
    config = tmp_path / "config.yaml"
    config.write_text(config_text(docs))
    check = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "check-config", str(config)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "20000-20024 (25 brokers max)" in check.stdout, check.stdout
    annotations = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "19102"


def test_extra_configuration_is_merged_and_valid(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("""
advertisedHost: proxy.kafka.svc.cluster.local
upstream:
  bootstrapServers: ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]
service:
  type: ClusterIP
  annotations: {example.com/internal: "true"}
replicas: 2
restartOnConfigChange: true
config:
  logging: {level: debug}
  network: {max_frame_bytes: 104857600, shutdown_timeout_seconds: 20}
  quotas:
    entities:
      - {user: "<default>", client-id: "<default>", producer_byte_rate: 52428800}
      - {client-id: batch, consumer_byte_rate: 2147483648, request_percentage: 12.5}
  capture: {dir: /var/lib/kafka-quota-proxy/capture}
extraVolumes:
  - {name: capture, persistentVolumeClaim: {claimName: kqp-capture}}
extraVolumeMounts:
  - {name: capture, mountPath: /var/lib/kafka-quota-proxy/capture}
""")
    docs = render(helm, "-f", str(values))
    path = tmp_path / "config.yaml"
    path.write_text(config_text(docs))
    config = load_config(path)
    assert config.listeners.advertised_host == "proxy.kafka.svc.cluster.local"
    assert [str(s) for s in config.upstream.bootstrap_servers] == [
        "kafka-0.kafka:9092", "kafka-1.kafka:9092"]
    assert config.logging.level == "debug" and config.logging.format == "json"  # merged
    assert config.network.max_frame_bytes == 104857600
    assert config.network.shutdown_timeout_seconds == 20
    raw = yaml.safe_load(config_text(docs))
    # large integers stay integers (no 2.147483648e+09)
    assert raw["quotas"]["entities"][1]["consumer_byte_rate"] == 2147483648
    assert config.capture is not None
    assert config.capture.dir == "/var/lib/kafka-quota-proxy/capture"
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    assert mounts[config.capture.dir] == "capture"
    pod = docs["Deployment"]["spec"]["template"]
    assert "checksum/config" in pod["metadata"]["annotations"]
    assert docs["Deployment"]["spec"]["replicas"] == 2
    service = docs["Service"]
    assert service["spec"]["type"] == "ClusterIP"
    assert "externalTrafficPolicy" not in service["spec"]  # LoadBalancer/NodePort only
    assert service["metadata"]["annotations"] == {"example.com/internal": "true"}
    check_pod(docs)


def test_inconsistent_values_are_refused(helm: Path) -> None:
    assert "lies in the broker ports" in refusal(helm, "--set", "listeners.bootstrapPort=9195")
    assert "lies in the broker ports" in refusal(helm, "--set", "metrics.port=9202")
    assert "must be a port" in refusal(
        helm, "--set", "listeners.brokerPorts.first=65530,listeners.brokerPorts.count=10")
    assert "count" in refusal(helm, "--set", "listeners.brokerPorts.count=0")
    assert "set those instead" in refusal(helm, "--set", "config.listeners.broker_ports=1-2")
    assert "set upstream.bootstrapServers" in refusal(
        helm, "--set", "config.upstream.bootstrap_servers[0]=x:9092")
    assert "not supported" in refusal(helm, "--set", "config.listeners.extra[0].name=X")
    assert "terminationGracePeriodSeconds" in refusal(
        helm, "--set", "config.network.shutdown_timeout_seconds=60")
    assert "advertisedHost" in refusal(helm, "--set", "advertisedHost=")


def _manifest() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def test_default_values_render_what_the_plain_manifest_holds(helm: Path) -> None:
    chart, plain = render(helm), _manifest()
    assert parse_config(config_text(chart)) == parse_config(config_text(plain))
    c, p = container(chart), container(plain)
    for key in ("args", "readinessProbe", "livenessProbe", "lifecycle", "resources",
                "securityContext", "imagePullPolicy"):
        assert c[key] == p[key], key
    assert sorted(c["ports"], key=lambda x: x["containerPort"]) == sorted(
        p["ports"], key=lambda x: x["containerPort"])
    pod_c = chart["Deployment"]["spec"]["template"]["spec"]
    pod_p = plain["Deployment"]["spec"]["template"]["spec"]
    for key in ("terminationGracePeriodSeconds", "automountServiceAccountToken",
                "enableServiceLinks"):
        assert pod_c[key] == pod_p[key], key
    assert pod_c["securityContext"] == pod_p["securityContext"]
    volumes_c = {v["name"]: v for v in pod_c["volumes"]}
    for volume in pod_p["volumes"]:
        if "emptyDir" in volume:
            assert volumes_c[volume["name"]]["emptyDir"] == volume["emptyDir"]
    assert chart["Deployment"]["spec"]["strategy"] == plain["Deployment"]["spec"]["strategy"]
    assert chart["Deployment"]["spec"]["replicas"] == plain["Deployment"]["spec"]["replicas"]
    sc, sp = chart["Service"]["spec"], plain["Service"]["spec"]
    assert sorted(sc["ports"], key=lambda x: x["port"]) == sorted(
        sp["ports"], key=lambda x: x["port"])
    for key in ("type", "externalTrafficPolicy"):
        assert sc[key] == sp[key], key
