"""The command line: ``kafka-quota-proxy run|check-config|demo|volume-agent|--version``."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from kafka_quota_proxy import __version__
from kafka_quota_proxy.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 60


def cli(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_quota_proxy", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------ --version / --help


def test_version_matches_pyproject() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert __version__ == pyproject["project"]["version"]


def test_version_flag() -> None:
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kafka-quota-proxy {__version__}\n"


def test_version_flag_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kafka-quota-proxy {__version__}"


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "kafka-quota-proxy"
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"kafka-quota-proxy {__version__}"


def test_help_lists_commands() -> None:
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kafka-quota-proxy")
    for command in ("run", "check-config", "demo", "volume-agent", "replay"):
        assert f"    {command}" in proc.stdout, proc.stdout
    assert "--version" in proc.stdout


@pytest.mark.parametrize(
    ("command", "fragment"),
    [("run", "--config FILE"), ("check-config", "FILE"), ("demo", "--seconds"),
     ("volume-agent", "--config FILE")],
)
def test_subcommand_help(command: str, fragment: str) -> None:
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"usage: kafka-quota-proxy {command}" in proc.stdout
    assert fragment in proc.stdout


def test_parser_knows_the_commands() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--config", "x.yaml"]).config == "x.yaml"
    assert parser.parse_args(["check-config", "x.yaml"]).file == "x.yaml"
    args = parser.parse_args(["demo", "--seconds", "1.5", "--out", "d", "--no-replay"])
    assert (args.seconds, args.out, args.replay) == (1.5, "d", False)
    assert parser.parse_args(["demo"]).replay is True
    assert parser.parse_args(["volume-agent", "--config", "a.yaml"]).config == "a.yaml"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("run",), "the following arguments are required: --config"),
        (("check-config",), "the following arguments are required: FILE"),
        (("serve",), "invalid choice: 'serve'"),
    ],
)
def test_usage_errors(args: tuple[str, ...], fragment: str) -> None:
    proc = cli(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "usage: kafka-quota-proxy" in proc.stderr
    assert fragment in proc.stderr, proc.stderr


# ------------------------------------------------------------------ run


def test_run_missing_config_fails_fast(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    started = time.monotonic()
    proc = cli("run", "--config", str(missing), timeout=30)  # TimeoutExpired if it hangs
    assert time.monotonic() - started < 30
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "invalid configuration" in proc.stderr
    assert f"{missing}: cannot read: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_missing_config_relative_name() -> None:
    proc = cli("run", "--config", "missing.yaml", timeout=30)
    assert proc.returncode != 0
    assert "missing.yaml: cannot read: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_invalid_config_lists_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "listeners:\n"
        '  bootstrap: "127.0.0.1:9192"\n'
        '  advertised_host: "127.0.0.1"\n'
        '  broker_ports: "9100-9200"\n'
        "upstream:\n"
        '  bootstrap_servers: ["127.0.0.1:9092"]\n'
        "  colour: blue\n"
    )
    proc = cli("run", "--config", str(path), timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("invalid configuration:\n")
    assert f"{path}:7:3: upstream.colour: unknown key" in proc.stderr
    # Checks across fields run once every field is valid on its own.
    path.write_text(path.read_text().replace("  colour: blue\n", ""))
    proc = cli("run", "--config", str(path), timeout=30)
    assert proc.returncode == 2
    assert (f"{path}:4:3: listeners.broker_ports: broker_ports 9100-9200 collides with bootstrap "
            "port 9192" in proc.stderr)


def test_run_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    """A valid configuration: the proxy listens (bootstrap and /metrics) even while the
    upstream cluster is unreachable, and SIGTERM (the container stop signal) makes it drain
    and exit 0."""
    bootstrap, metrics, upstream = free_port(), free_port(), free_port()  # upstream: closed
    path = tmp_path / "config.yaml"
    path.write_text(
        "listeners:\n"
        f'  bootstrap: "127.0.0.1:{bootstrap}"\n'
        '  advertised_host: "127.0.0.1"\n'
        '  broker_ports: "65500-65509"\n'
        "upstream:\n"
        f'  bootstrap_servers: ["127.0.0.1:{upstream}"]\n'
        "  metadata_refresh_seconds: 1\n"
        "metrics:\n"
        f'  listen: "127.0.0.1:{metrics}"\n'
        "logging:\n"
        "  format: json\n"
        "network:\n"
        "  shutdown_timeout_seconds: 2\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafka_quota_proxy", "run", "--config", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as r:
                    assert r.status == 200
                    body = r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert "kafka_proxy_upstream_brokers" in body
        with socket.create_connection(("127.0.0.1", bootstrap), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "proxy_started" in err
    assert "proxy_stopped" in err


def test_replay_pacing_overrides_the_configs_for_the_job(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # ``replay --pacing kafka|strict``: the same capture under either pacing, to compare
    config = tmp_path / "config.yaml"
    config.write_text(
        'listeners: {bootstrap: "127.0.0.1:9192", advertised_host: "127.0.0.1", '
        'broker_ports: "9193-9292"}\n'
        'upstream: {bootstrap_servers: ["127.0.0.1:9092"]}\n'
        "quotas:\n  cap_byte_rate_throttle: false\n"
        '  entities: [{client-id: "<default>", producer_byte_rate: 1000}]\n')
    handed: list[str] = []

    def job(capture: str, out: str, candidate: dict, **_: object) -> dict:
        handed.append(candidate.get("pacing"))
        return {}

    monkeypatch.setattr("kafka_quota_proxy.spark_jobs.main.run", job)
    args = ["replay", "--capture", str(tmp_path), "--config", str(config), "--out",
            str(tmp_path / "out")]
    for pacing in ([], ["--pacing", "strict"], ["--pacing", "kafka"]):
        assert main([*args, *pacing]) == 0
    assert handed == ["kafka", "strict", "kafka"]
    # strict cannot hold a throttle bounded at one window: refused, nothing run
    config.write_text(config.read_text().replace("cap_byte_rate_throttle: false",
                                                 "cap_byte_rate_throttle: true"))
    assert main([*args, "--pacing", "strict"]) == 1
    assert handed == ["kafka", "strict", "kafka"]
