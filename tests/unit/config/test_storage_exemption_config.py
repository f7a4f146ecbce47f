"""Storage exemptions are by principal only (``storage.exempt_users``, Kafka's ``User:`` prefix
optional): client-ids, which any client may send, are refused, and so are principals anyone
can be (ANONYMOUS, a SASL listener's fallback principal); each refusal positioned
``FILE:LINE:COLUMN``, and ``check-config`` says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.config.loading import parse_config
from testkit import config_errors

SOURCE = "limits.yaml"
BASE = config_errors.BASE

STORAGE = """\
storage:
  hard: {type: MinFreePercentage, level: 5}
"""


def single_error(text: str) -> dict[str, object]:
    return config_errors.single_error(text, SOURCE)


def with_security(block: str) -> str:
    """BASE with ``listeners.security`` (``security:`` on line 5, the block from line 6)."""
    lines = "".join(f"    {line}\n" for line in block.splitlines())
    return BASE.replace('  broker_ports: "9193-9292"\n',
                        f'  broker_ports: "9193-9292"\n  security:\n{lines}')


def test_exempt_client_ids_are_refused_at_their_key() -> None:
    e = single_error(BASE + STORAGE + '  exempt_client_ids: ["volume-agent"]\n')
    assert (e["line"], e["col"], e["path"]) == (9, 3, "storage.exempt_client_ids"), e
    assert "any client can send any client-id" in str(e["msg"])
    assert "exempt_users" in str(e["msg"])


def test_exempt_users_are_principals_with_an_optional_user_prefix() -> None:
    cfg = parse_config(BASE + STORAGE + '  exempt_users: ["User:volume-agent", "ops"]\n'
                       "  exempt_client_ids: []\n", SOURCE)
    assert cfg.storage is not None
    assert cfg.storage.exempt_users == ["volume-agent", "ops"]


@pytest.mark.parametrize("user", ["ANONYMOUS", "User:ANONYMOUS"])
def test_exempting_anonymous_is_refused(user: str) -> None:
    e = single_error(BASE + STORAGE + f'  exempt_users: ["ops", "{user}"]\n')
    assert (e["line"], e["path"]) == (9, "storage.exempt_users.1"), e
    assert "every client without an authenticated principal" in str(e["msg"])


def test_exempting_a_sasl_fallback_principal_is_refused() -> None:
    text = with_security("protocol: SASL_PLAINTEXT\nsasl: {fallback_principal: kerberos}\n")
    e = single_error(text + STORAGE + '  exempt_users: ["kerberos"]\n')
    assert e["path"] == "storage.exempt_users.0", e
    assert "fallback_principal" in str(e["msg"])


def test_check_config_names_the_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(BASE + STORAGE + '  exempt_client_ids: ["volume-agent"]\n')
    assert main(["check-config", str(path)]) != 0
    err = capsys.readouterr().err
    assert f"{path}:9:3: storage.exempt_client_ids: storage exemptions by client-id are " \
           "refused" in err
