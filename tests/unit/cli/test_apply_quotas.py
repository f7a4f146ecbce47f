"""``replay --tune --apply`` and ``quotas apply``: a recommendation's entities as Kafka's client
quota entities, the diff against what is live (add, change, unchanged, kept), and the wire
exchange (DescribeClientQuotas of every entity, AlterClientQuotas with validate_only, then for
real with --yes) against a fake broker answering with Kafka's semantics
(``quota.client_quotas``, as the proxy answers)."""

from __future__ import annotations

import io
import socketserver
import struct
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_writer

from kafka_quota_proxy.cli.apply_quotas import (
    ADD,
    CHANGE,
    KEPT,
    UNCHANGED,
    diff,
    format_diff,
    recommended_quotas,
)
from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.protocol import client_quota_frames
from kafka_quota_proxy.protocol.headers import encode_response_header, parse_request_header
from kafka_quota_proxy.quota import client_quotas as cq

ALICE: cq.Entity = (("user", "alice"),)
APP: cq.Entity = (("client-id", "app"),)
DEFAULT_USER: cq.Entity = (("user", None),)
DEFAULT_USER_APP: cq.Entity = (("client-id", "app"), ("user", None))

RECOMMENDATION = """quotas:
  window: {samples: 11, size_seconds: 1}
  entities:
    - {user: alice, producer_byte_rate: 1500000}
    - {client-id: app, producer_byte_rate: 700000, consumer_byte_rate: 800000}
    - {user: <default>, client-id: app, consumer_byte_rate: 300000, request_percentage: 7.3}
"""
LIVE: dict[cq.Entity, dict[str, float]] = {ALICE: {"producer_byte_rate": 2_000_000.0},
        APP: {"producer_byte_rate": 500_000.0, "consumer_byte_rate": 800_000.0,
              "controller_mutation_rate": 5.0},
        DEFAULT_USER: {"request_percentage": 50.0},
        (("ip", None),): {"connection_creation_rate": 10.0}}


def _report(tmp_path: Path, text: str = RECOMMENDATION) -> Path:
    out = tmp_path / "report"
    out.mkdir(exist_ok=True)
    (out / "recommended-quotas.yaml").write_text(text)
    return out


# ------------------------------------------------------------------ mapping and diff
def test_entities_map_to_kafkas_with_default_as_a_null_name(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("""quotas:
  entities:
    - {user: <default>, producer_byte_rate: 1000}
    - {client-id: <default>, consumer_byte_rate: 2000}
    - {user: alice, client_id: <default>, request_percentage: 12.5}
    - {user: bob, client-id: app, controller_mutation_rate: 2.5, producer_byte_rate: 3000}
  ip_entities:
    - {ip: <default>, connection_creation_rate: 10}
""")
    assert recommended_quotas(path) == {
        (("user", None),): {"producer_byte_rate": 1000.0},
        (("client-id", None),): {"consumer_byte_rate": 2000.0},
        (("client-id", None), ("user", "alice")): {"request_percentage": 12.5},
        (("client-id", "app"), ("user", "bob")): {"controller_mutation_rate": 2.5,
                                                 "producer_byte_rate": 3000.0},
    }  # (ip entities are not part of a recommendation)
    # a report directory: its recommended-quotas.yaml
    assert recommended_quotas(_report(tmp_path))[DEFAULT_USER_APP] == {
        "consumer_byte_rate": 300_000.0, "request_percentage": 7.3}


def test_diff_per_entity_and_key() -> None:
    recommended: dict[cq.Entity, dict[str, float]] = {ALICE: {"producer_byte_rate": 1_500_000.0},
                   APP: {"producer_byte_rate": 700_000.0, "consumer_byte_rate": 800_000.0},
                   DEFAULT_USER_APP: {"consumer_byte_rate": 300_000.0}}
    # (components in any order)
    live: dict[cq.Entity, dict[str, float]] = {tuple(reversed(e)): v for e, v in LIVE.items()}
    diffs = diff(live, recommended)
    assert [(d.entity, [(k.key, k.current, k.recommended, k.kind) for k in d.keys])
            for d in diffs] == [
        (DEFAULT_USER, [("request_percentage", 50.0, None, KEPT)]),
        (ALICE, [("producer_byte_rate", 2e6, 1.5e6, CHANGE)]),
        (DEFAULT_USER_APP, [("consumer_byte_rate", None, 3e5, ADD)]),
        (APP, [("producer_byte_rate", 5e5, 7e5, CHANGE),
               ("consumer_byte_rate", 8e5, 8e5, UNCHANGED),
               ("controller_mutation_rate", 5.0, None, KEPT)]),
    ]  # users first, defaults first; the ip entity left out
    assert [d.ops() for d in diffs] == [
        [], [("producer_byte_rate", 1.5e6, False)], [("consumer_byte_rate", 3e5, False)],
        [("producer_byte_rate", 7e5, False)]]  # nothing removed
    assert format_diff(diffs) == [
        "the default user-principal:",
        "  request_percentage        50  kept (not in the recommendation)",
        "user-principal 'alice':",
        "  producer_byte_rate        2000000 -> 1500000  change",
        "the default user-principal, client-id 'app':",
        "  consumer_byte_rate        (unset) -> 300000  add",
        "client-id 'app':",
        "  producer_byte_rate        500000 -> 700000  change",
        "  consumer_byte_rate        800000  unchanged",
        "  controller_mutation_rate  5  kept (not in the recommendation)",
    ]


# ------------------------------------------------------------------ the wire
class QuotaBroker(socketserver.ThreadingTCPServer):
    """ApiVersions and the two quota APIs, answered as Kafka (and the proxy) answer them;
    ``refuse``: every alter entity gets that error code."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, quotas: dict[cq.Entity, dict[str, float]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.quotas = {e: dict(v) for e, v in quotas.items()}
        self.refuse = 0
        self.alters: list[bool] = []  # validate_only of each AlterClientQuotas

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


def _recv(sock: Any, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _api_versions(apis: dict[int, tuple[int, int]], cid: int) -> bytes:
    from kio.schema.errors import ErrorCode

    cls: Any = load_response_schema(18, 0)
    mod = __import__(cls.__module__, fromlist=["ApiVersion"])
    value = cls(error_code=ErrorCode(0), api_keys=tuple(
        mod.ApiVersion(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in apis.items()))
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    return encode_response_header(cid, 0) + buf.getvalue()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: QuotaBroker = self.server  # type: ignore[assignment]
        while (head := _recv(self.request, 4)) is not None:
            frame = _recv(self.request, struct.unpack(">i", head)[0])
            assert frame is not None
            h = parse_request_header(frame, 0, len(frame))
            if h.api_key == 18:
                answer = _api_versions({18: (0, 3), 48: (0, 1), 49: (0, 1)}, h.correlation_id)
            elif h.api_key == 48:
                asked = client_quota_frames.decode_describe(frame, h.api_version)
                found = cq.describe(server.quotas, [cq.FilterComponent(*c)
                                                    for c in asked.components], asked.strict)
                answer = client_quota_frames.describe_response(
                    h.api_version, h.correlation_id, 0, 0, None,
                    [(e, list(v.items())) for e, v in found])
            else:
                request = client_quota_frames.decode_alter(frame, h.api_version)
                server.alters.append(request.validate_only)
                results, changes = cq.alter(server.quotas, [
                    cq.AlterEntry(entity, tuple(cq.Op(o.key, o.value, o.remove) for o in ops))
                    for entity, ops in request.entries])
                if server.refuse:
                    results = [cq.AlterResult(r.components, server.refuse, None)
                               for r in results]
                elif not request.validate_only:
                    server.quotas = cq.apply(server.quotas, changes)
                answer = client_quota_frames.alter_response(
                    h.api_version, h.correlation_id, 0,
                    [(r.components, r.error_code, r.error_message) for r in results])
            self.request.sendall(struct.pack(">i", len(answer)) + answer)


@pytest.fixture
def broker() -> Iterator[QuotaBroker]:
    server = QuotaBroker(LIVE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_dry_run_validates_and_changes_nothing_then_yes_applies(
        broker: QuotaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(tmp_path)
    apply = ["quotas", "apply", "--file", str(report), "--bootstrap-server", broker.bootstrap]
    assert main(apply) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"client quotas: live at {broker.bootstrap} -> recommended in "
                      f"{report / 'recommended-quotas.yaml'}")
    assert "  producer_byte_rate        2000000 -> 1500000  change" in out
    assert "  request_percentage        (unset) -> 7.3  add" in out
    assert out[-2:] == [
        "2 to add, 2 to change, 1 unchanged, 2 kept (set live, not in the recommendation: "
        "left as they are)",
        "dry run: validate_only accepted the changes to 3 entities; nothing altered (--yes "
        "applies them)"]
    assert broker.alters == [True]
    assert broker.quotas == LIVE

    assert main([*apply, "--yes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [
        "applied to user-principal 'alice': producer_byte_rate=1500000",
        "applied to the default user-principal, client-id 'app': consumer_byte_rate=300000, "
        "request_percentage=7.3",
        "applied to client-id 'app': producer_byte_rate=700000",
        "applied: 3 entities altered"]
    assert broker.alters == [True, True, False]  # validated first, every time
    assert broker.quotas == {
        ALICE: {"producer_byte_rate": 1_500_000.0},
        APP: {"producer_byte_rate": 700_000.0, "consumer_byte_rate": 800_000.0,
              "controller_mutation_rate": 5.0},  # kept
        DEFAULT_USER: {"request_percentage": 50.0},  # kept
        DEFAULT_USER_APP: {"consumer_byte_rate": 300_000.0, "request_percentage": 7.3},
        (("ip", None),): {"connection_creation_rate": 10.0}}

    # again: nothing left to apply, nothing sent
    assert main([*apply, "--yes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "nothing to apply: every recommended quota is already in force")
    assert broker.alters == [True, True, False]


def test_refused_by_validate_only_nothing_altered(
        broker: QuotaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker.refuse = 31
    assert main(["quotas", "apply", "--file", str(_report(tmp_path)), "--bootstrap-server",
                 broker.bootstrap, "--yes"]) == 1
    captured = capsys.readouterr()
    assert "  producer_byte_rate        2000000 -> 1500000  change" in captured.out
    refused = ("org.apache.kafka.common.errors.ClusterAuthorizationException: Cluster "
               "authorization failed.")
    assert captured.err.splitlines() == [
        f"Error while validating the quotas of user-principal 'alice': {refused}",
        "Error while validating the quotas of the default user-principal, client-id 'app': "
        f"{refused}",
        f"Error while validating the quotas of client-id 'app': {refused}",
        "3 of 3 entities refused: nothing altered"]
    assert broker.alters == [True]  # never for real
    assert broker.quotas == LIVE


def test_a_recommendation_that_does_not_load(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(tmp_path, "quotas:\n  entities:\n    - {user: alice}\n")
    assert main(["quotas", "apply", "--file", str(report), "--bootstrap-server",
                 "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{report / 'recommended-quotas.yaml'}: the recommendation does not "
                          "load:\n")
    assert "set at least one of producer_byte_rate" in err


def test_unreachable_cluster_is_an_error(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cc.properties").write_text("request.timeout.ms=500\n")
    assert main(["quotas", "apply", "--file", str(_report(tmp_path)), "--bootstrap-server",
                 "127.0.0.1:1", "--command-config", str(tmp_path / "cc.properties")]) == 1
    assert ("org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node "
            "assignment. Call: alterClientQuotas") in capsys.readouterr().err


# ------------------------------------------------------------------ replay --tune --apply
@pytest.mark.parametrize(("extra", "message"), [
    (["--apply", "--bootstrap", "h:1"], "--apply needs --tune (it applies the recommendation)"),
    (["--tune", "--apply"], "--apply needs --bootstrap HOST:PORT"),
    (["--tune", "--yes"], "--yes only go with --apply"),
    (["--tune", "--bootstrap", "h:1", "--command-config", "f"],
     "--bootstrap, --command-config only go with --apply"),
])
def test_replay_apply_usage(extra: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--capture", "c", "--config", "nowhere.yaml", "--out", "o",
                 *extra]) == 2
    assert capsys.readouterr().err == f"kafka-quota-proxy replay: error: {message}\n"


def test_replay_tune_apply_applies_what_the_run_recommends(
        broker: QuotaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """After the run (here a stand-in writing the report), the recommendation it wrote."""
    out = tmp_path / "out"

    def run(capture: str, out_dir: str, quotas: dict[str, Any], **kw: Any) -> dict[str, Any]:
        Path(out_dir).mkdir(exist_ok=True)
        (Path(out_dir) / "recommended-quotas.yaml").write_text(RECOMMENDATION)
        return {"requests": 1}

    spark_main = types.ModuleType("kafka_quota_proxy.spark_jobs.main")
    spark_main.run = run  # type: ignore[attr-defined]
    tune = types.ModuleType("kafka_quota_proxy.spark_jobs.tune")
    tune.TuneOptions = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kafka_quota_proxy.spark_jobs.main", spark_main)
    monkeypatch.setitem(sys.modules, "kafka_quota_proxy.spark_jobs.tune", tune)
    config = tmp_path / "config.yaml"
    config.write_text('listeners:\n  bootstrap: "127.0.0.1:9192"\n  advertised_host: '
                      '"127.0.0.1"\n  broker_ports: "9300-9310"\nupstream:\n  '
                      'bootstrap_servers: ["127.0.0.1:9092"]\n')
    replay = ["replay", "--capture", str(tmp_path), "--config", str(config), "--out", str(out),
              "--tune", "--apply", "--bootstrap", broker.bootstrap]
    assert main(replay) == 0
    printed = capsys.readouterr().out
    assert "requests: 1\n" in printed
    assert printed.endswith("nothing altered (--yes applies them)\n")
    assert (broker.alters, broker.quotas) == ([True], LIVE)
    assert main([*replay, "--yes"]) == 0
    assert capsys.readouterr().out.endswith("applied: 3 entities altered\n")
    assert broker.quotas[ALICE] == {"producer_byte_rate": 1_500_000.0}
