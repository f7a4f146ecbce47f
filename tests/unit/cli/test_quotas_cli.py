"""``quotas`` configuration and the ``quotas resolve`` / ``quotas simulate`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import parse_config, parse_quotas
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType

BASE = """listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "127.0.0.1"
  broker_ports: "9193-9292"
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
"""
QUOTAS = """quotas:
  window: {samples: 11, size_seconds: 1}
  entities:
    - {user: alice, client-id: clientA, producer_byte_rate: 10485760}
    - {user: "<default>", consumer_byte_rate: 5242880, controller_mutation_rate: 2.5}
    - {client-id: "<default>", producer_byte_rate: 1048576, request_percentage: 50}
"""


def test_issue_form_parses_as_written() -> None:
    settings = parse_config(BASE + QUOTAS).quotas.settings()
    assert (settings.samples, settings.window_ms) == (11, 1000)
    assert settings.entities == {
        EntityKey("alice", "clientA"): {QuotaType.PRODUCE: 10485760.0},
        EntityKey(DEFAULT, None): {QuotaType.FETCH: 5242880.0},
        EntityKey(None, DEFAULT): {QuotaType.PRODUCE: 1048576.0, QuotaType.REQUEST: 50.0},
    }


@pytest.mark.parametrize(
    ("entity", "line_msg"),
    [
        ("{producer_byte_rate: 5}", "an entity names a user, a client-id, or both"),
        ("{user: bob}", "set at least one of producer_byte_rate"),
        ("{user: bob, producer_byte_rate: 0}", "greater than 0"),
        ("{user: bob, request_percentage: -1}", "greater than 0"),
        ("{user: bob, producer_byte_rate: 1.5}", "valid integer"),
        ("{user: bob, colour: 1, producer_byte_rate: 1}", "unknown key"),
    ],
)
def test_bad_entities_are_reported_at_their_line(entity: str, line_msg: str) -> None:
    text = BASE + f"quotas:\n  entities:\n    - {entity}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "q.yaml")
    (error,) = info.value.errors
    assert error.startswith("q.yaml:9:"), error
    assert "quotas.entities.0" in error and line_msg in error


def test_duplicate_entity_is_an_error() -> None:
    text = BASE + ("quotas:\n  entities:\n    - {user: bob, producer_byte_rate: 1}\n"
                   "    - {user: bob, consumer_byte_rate: 1}\n")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "q.yaml")
    assert info.value.errors == [
        "q.yaml:10:7: quotas.entities.1: entity users/bob is already configured at "
        "quotas.entities.0"]


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka_quota_proxy", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(BASE + QUOTAS)
    return path


@pytest.mark.parametrize("text", [BASE + QUOTAS, QUOTAS], ids=["full", "quotas-only"])
def test_resolve_prints_entity_sharing_and_limits(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text)
    proc = _cli("quotas", "resolve", "--config", str(config_file), "--user", "bob",
                "--client-id", "app")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["limits"] == {"producer_byte_rate": 1048576, "consumer_byte_rate": 5242880,
                             "request_percentage": 50, "controller_mutation_rate": 2.5}
    assert out["controller_mutation_rate"] == {"limit": 2.5, "entity": "users/<default>",
                                               "level": 6, "shared_by": "user"}
    assert out["producer_byte_rate"]["entity"] == "clients/<default>"
    assert out["producer_byte_rate"]["shared_by"] == "client-id"
    assert out["consumer_byte_rate"]["entity"] == "users/<default>"
    assert out["consumer_byte_rate"]["shared_by"] == "user"
    proc = _cli("quotas", "resolve", "--config", str(config_file), "--user", "alice",
                "--client-id", "clientA")
    out = json.loads(proc.stdout)
    assert out["producer_byte_rate"] == {"limit": 10485760, "entity": "users/alice/clients/clientA",
                                         "level": 1, "shared_by": "user+client-id"}


def test_simulate_throttles_over_quota_and_applies_alters(config_file: Path) -> None:
    events = [
        {"t_ms": 0, "client_id": "c1", "quota": "produce", "value": 5_000_000},
        {"t_ms": 0, "client_id": "c1", "quota": "produce", "value": 10_000_000},
        {"t_ms": 10, "client_id": "c2", "quota": "produce", "value": 100},
        {"t_ms": 20, "alter": {"entity": {"client-id": "<default>"},
                               "set": {"producer_byte_rate": 100_000_000},
                               "remove": ["request_percentage"]}},
        {"t_ms": 30, "client_id": "c1", "quota": "produce", "value": 1},
        {"t_ms": 40, "client_id": "c3", "quota": "request", "value": 100_000},
    ]
    proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                stdin="\n".join(json.dumps(e) for e in events) + "\n")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["t_ms"] for x in lines] == [0, 0, 10, 30, 40]  # one line per record event
    assert lines[0]["throttle_ms"] == 0  # 5 MB over W = 10 s: 0.5 MB/s < 1 MiB/s
    # 15 MB over 10 s = 1.5 MB/s: round((1.5e6 - 1048576) / 1048576 * 10000)
    assert lines[1]["throttle_ms"] == round((1_500_000 - 1048576) / 1048576 * 10_000)
    assert lines[2]["throttle_ms"] == 0  # c2 has its own budget
    assert lines[3]["throttle_ms"] == 0 and lines[3]["limit"] == 100_000_000
    assert lines[4]["throttle_ms"] == 0 and lines[4]["limit"] is None  # request quota removed


def test_simulate_compares_kafka_and_strict_pacing_on_the_same_events(
        config_file: Path) -> None:
    # Two requests of 20 s of quota each (c1's <default> budget, 1 MiB/s), 13 s apart: the
    # first throttle is the same either way (10 s: the padded window's burst); Kafka's maths
    # has forgotten the first request by the second (10 s again), strict pacing has not
    # (paid up to 40 s: 40 - 13 - 10 = 17 s).
    q = 1048576
    events = "".join(json.dumps({"t_ms": t, "client_id": "c1", "quota": "produce",
                                 "value": 20 * q}) + "\n" for t in (0, 13_000))
    throttles = {}
    for pacing in (None, "kafka", "strict"):
        flags = ["--pacing", pacing] if pacing else []
        proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                    *flags, stdin=events)
        assert proc.returncode == 0, proc.stderr
        throttles[pacing] = [json.loads(x)["throttle_ms"] for x in proc.stdout.splitlines()]
    assert throttles[None] == throttles["kafka"] == [10_000, 10_000]
    assert throttles["strict"] == [10_000, 17_000]


def test_simulate_reports_bad_events_with_their_line(config_file: Path) -> None:
    proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                stdin='{"t_ms": 5, "quota": "produce", "value": 1}\n{"t_ms": 1, "quota": "x"}\n')
    assert proc.returncode == 1
    assert "line 2" in proc.stderr
    proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                stdin='{"t_ms": 0, "quota": "bogus", "value": 1}\n')
    assert proc.returncode == 1 and "unknown quota 'bogus'" in proc.stderr
    # a missing field is named as such (it once read "line 1: 'value'")
    proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                stdin='{"t_ms": 0, "quota": "produce"}\n')
    assert proc.returncode == 1
    assert "line 1: a record event needs 'value' (or 'alter' for a quota change)" in proc.stderr
    proc = _cli("quotas", "simulate", "--config", str(config_file), "--events", "-",
                stdin='{"t_ms": 0, "quota": "produce", "value": "lots"}\n')
    assert proc.returncode == 1 and "'value' must be a number, not 'lots'" in proc.stderr


# ------------------------------------------------- a file with only a quotas: section


@pytest.fixture
def quota_file(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(QUOTAS)
    return path


def test_resolve_accepts_a_file_with_only_quotas(quota_file: Path) -> None:
    proc = _cli("quotas", "resolve", "--config", str(quota_file), "--user", "alice",
                "--client-id", "clientA")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["limits"] == {
        "producer_byte_rate": 10485760, "consumer_byte_rate": 5242880, "request_percentage": 50,
        "controller_mutation_rate": 2.5}


def test_simulate_accepts_a_file_with_only_quotas(quota_file: Path) -> None:
    events = [{"t_ms": 0, "client_id": "c1", "quota": "produce", "value": 15_000_000},
              {"t_ms": 0, "user": "alice", "client_id": "clientA", "quota": "produce",
               "value": 1}]
    proc = _cli("quotas", "simulate", "--config", str(quota_file), "--events", "-",
                stdin="\n".join(json.dumps(e) for e in events) + "\n")
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(x) for x in proc.stdout.splitlines())
    assert first["limit"] == 1048576 and first["entity"] == "clients/<default>"
    assert first["throttle_ms"] == round((1_500_000 - 1048576) / 1048576 * 10_000)
    assert second["limit"] == 10485760 and second["throttle_ms"] == 0


def test_quota_only_file_settings_match_the_full_config() -> None:
    assert parse_quotas(QUOTAS) == parse_config(BASE + QUOTAS).quotas
    assert parse_quotas(BASE + QUOTAS) == parse_config(BASE + QUOTAS).quotas
    assert parse_quotas("quotas: {}\n").entities == []


def test_quota_only_file_reports_a_bad_value_at_its_line(tmp_path: Path) -> None:
    text = ("# what if bob had no quota\nquotas:\n  entities:\n"
            "    - {user: bob, producer_byte_rate: 0}\n")
    with pytest.raises(ConfigError) as info:
        parse_quotas(text, "q.yaml")
    assert info.value.errors == [
        "q.yaml:4:19: quotas.entities.0.producer_byte_rate: Input should be greater than 0"]
    with pytest.raises(ConfigError) as info:  # as the full-config loader reports it
        parse_config(BASE + text, "q.yaml")
    assert info.value.errors == [
        "q.yaml:10:19: quotas.entities.0.producer_byte_rate: Input should be greater than 0"]
    path = tmp_path / "q.yaml"
    path.write_text(text)
    for command in (["resolve"], ["simulate", "--events", "-"]):
        proc = _cli("quotas", *command, "--config", str(path), stdin="")
        assert proc.returncode == 1
        assert f"{path}:4:19: quotas.entities.0.producer_byte_rate: Input should be greater " \
            "than 0" in proc.stderr, proc.stderr
        assert "listeners" not in proc.stderr


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("quotas:\n  window: {samples: 0}\n",
         "q.yaml:2:12: quotas.window.samples: Input should be greater than or equal to 1"),
        ("quotas:\n  colour: red\n", "q.yaml:2:3: quotas.colour: unknown key"),
        ("quotas:\n  entities:\n    - {user: bob, producer_byte_rate: 1}\n"
         "    - {user: bob, consumer_byte_rate: 1}\n",
         "q.yaml:4:7: quotas.entities.1: entity users/bob is already configured at "
         "quotas.entities.0"),
        ("quotas: {}\nquotas: {}\n", "q.yaml:2:1: quotas: duplicate key"),
        ("quotas:\n  entities: [\n", "q.yaml:3:1: YAML syntax error"),
    ],
)
def test_quota_only_file_errors(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_quotas(text, "q.yaml")
    (got,) = info.value.errors
    assert got.startswith(error), got


def test_a_file_with_other_sections_is_validated_as_a_full_config() -> None:
    with pytest.raises(ConfigError) as info:
        parse_quotas("logging: {level: debug}\n" + QUOTAS, "q.yaml")
    assert "q.yaml:1:1: listeners: required field is missing" in info.value.errors
    bad_listener = BASE.replace('"9193-9292"', '"9192-9292"')
    with pytest.raises(ConfigError) as info:
        parse_quotas(bad_listener + QUOTAS, "q.yaml")
    assert info.value.errors == [
        "q.yaml:4:3: listeners.broker_ports: broker_ports 9192-9292 collides with bootstrap "
        "port 9192"]


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "{}\n"])
def test_an_empty_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_quotas(text, "q.yaml")
    assert info.value.errors == [
        "q.yaml: the file is empty: expected a quotas: section, alone or in a full proxy "
        "configuration"]
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    proc = _cli("quotas", "resolve", "--config", str(path))
    assert proc.returncode == 1 and "the file is empty" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["resolve", "simulate"])
def test_help_says_a_quota_only_file_is_enough(command: str) -> None:
    proc = _cli("quotas", command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "only quotas:" in " ".join(proc.stdout.split())


@pytest.mark.parametrize(("command", "fragment"), [
    ("resolve", "8-level precedence"),
    ("simulate", '"quota": "produce"|"fetch"|"request"'),
])
def test_subcommand_help_says_what_it_does(command: str, fragment: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from kafka_quota_proxy.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["quotas", command, "--help"])
    assert exit_info.value.code == 0
    assert fragment in " ".join(capsys.readouterr().out.split())
