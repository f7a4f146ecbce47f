"""``kafka-quota-proxy credentials add``, run in-process: the password from standard input's
first line, the file written whole with mode 0600, users kept, and refusals that leave the
file as it was."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest
import yaml

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.security.credentials import Credentials

FAST = "4096"  # the least SCRAM allows: quick PBKDF2


def run(monkeypatch: pytest.MonkeyPatch, path: Path, user: str, stdin: str,
        *extra: str) -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["credentials", "add", "--file", str(path), "--user", user, *extra])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_add_creates_the_file_0600_with_both_mechanisms(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "alice-pw\n", "--iterations", FAST) == 0
    assert mode(path) == 0o600
    text = path.read_text()
    creds = Credentials.parse(text)
    assert set(creds.users) == {"alice"}
    assert set(creds.users["alice"]) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert {c.iterations for c in creds.users["alice"].values()} == {4096}
    assert creds.check_plain("alice", "alice-pw")
    assert "alice-pw" not in text
    out, err = capsys.readouterr()
    assert "alice set" in out and "4096 iterations" in out
    assert "alice-pw" not in out + err
    assert [p.name for p in tmp_path.iterdir()] == ["users.yaml"]  # no .tmp left behind


def test_default_iterations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "pw\n") == 0
    held = Credentials.parse(path.read_text()).users["alice"]
    assert {c.iterations for c in held.values()} == {8192}


def test_only_the_first_line_is_the_password(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "first line\r\nsecond line\n", "--iterations",
               FAST) == 0
    creds = Credentials.parse(path.read_text())
    assert creds.check_plain("alice", "first line")
    assert not creds.check_plain("alice", "first line\r")
    assert not creds.check_plain("alice", "first line\r\nsecond line")


def test_password_without_newline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "no-newline", "--iterations", FAST) == 0
    assert Credentials.parse(path.read_text()).check_plain("alice", "no-newline")


def test_second_user_keeps_the_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "a-pw\n", "--iterations", FAST) == 0
    alice = yaml.safe_load(path.read_text())["users"]["alice"]
    assert run(monkeypatch, path, "bob", "b-pw\n", "--iterations", FAST) == 0
    assert mode(path) == 0o600
    doc = yaml.safe_load(path.read_text())
    assert set(doc["users"]) == {"alice", "bob"}
    assert doc["users"]["alice"] == alice
    creds = Credentials.parse(path.read_text())
    assert creds.check_plain("alice", "a-pw") and creds.check_plain("bob", "b-pw")


def test_same_user_again_replaces_the_password(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "old\n", "--iterations", FAST) == 0
    assert run(monkeypatch, path, "alice", "new\n", "--iterations", FAST) == 0
    creds = Credentials.parse(path.read_text())
    assert set(creds.users) == {"alice"}
    assert creds.check_plain("alice", "new") and not creds.check_plain("alice", "old")


def test_an_existing_readable_file_becomes_0600(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("users: {}\n")
    path.chmod(0o644)
    assert run(monkeypatch, path, "alice", "pw\n", "--iterations", FAST) == 0
    assert mode(path) == 0o600


@pytest.mark.parametrize("stdin", ["", "\n", "\r\n", "\nsecond-line-is-not-read\n"])
def test_empty_password_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str], stdin: str) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", stdin, "--iterations", FAST) == 2
    assert not path.exists()
    assert "no password" in capsys.readouterr().err


def test_empty_password_leaves_an_existing_file(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "pw\n", "--iterations", FAST) == 0
    before = path.read_bytes()
    assert run(monkeypatch, path, "alice", "\n", "--iterations", FAST) == 2
    assert path.read_bytes() == before


@pytest.mark.parametrize("broken", [
    "users: {alice: {SCRAM-SHA-256: nonsense}}\n",
    "users: {alice: {SCRAM-SHA-1: 'salt=c2FsdA==,stored_key=AA==,server_key=AA==,"
    "iterations=4096'}}\n",
    "people: {}\n",
    "users: [alice]\n",
])
def test_broken_existing_file_exits_1_unchanged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], broken: str) -> None:
    path = tmp_path / "users.yaml"
    path.write_text(broken)
    path.chmod(0o640)
    assert run(monkeypatch, path, "bob", "b-pw\n", "--iterations", FAST) == 1
    assert path.read_text() == broken
    assert mode(path) == 0o640
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: ")
    assert "b-pw" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["users.yaml"]


def test_existing_file_that_is_not_yaml_exits_1_unchanged(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("users: [unclosed\n")
    assert run(monkeypatch, path, "bob", "b-pw\n", "--iterations", FAST) == 1
    assert path.read_text() == "users: [unclosed\n"


def test_too_few_iterations_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "alice", "pw\n", "--iterations", "1000") == 1
    assert not path.exists()
    assert "4096" in capsys.readouterr().err


def test_a_terminal_is_asked_with_getpass(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts: list[str] = []

    def fake_getpass(prompt: str = "") -> str:
        prompts.append(prompt)
        return "typed-pw"

    monkeypatch.setattr("sys.stdin", Tty("not-the-password\n"))
    monkeypatch.setattr("getpass.getpass", fake_getpass)
    path = tmp_path / "users.yaml"
    assert main(["credentials", "add", "--file", str(path), "--user", "alice",
                 "--iterations", FAST]) == 0
    assert prompts == ["password for alice: "]
    creds = Credentials.parse(path.read_text())
    assert creds.check_plain("alice", "typed-pw")
    assert not creds.check_plain("alice", "not-the-password")


def test_user_and_file_are_required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("pw\n"))
    with pytest.raises(SystemExit) as info:
        main(["credentials", "add", "--file", str(tmp_path / "f.yaml")])
    assert info.value.code == 2
    assert "--user" in capsys.readouterr().err
    assert not (tmp_path / "f.yaml").exists()


def test_list_shows_users_and_mechanisms_never_a_secret(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "bob", "bob-pw\n", "--iterations", FAST) == 0
    assert run(monkeypatch, path, "alice", "alice-pw\n", "--iterations", "5000") == 0
    capsys.readouterr()
    assert main(["credentials", "list", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "alice\tSCRAM-SHA-512 (5000 iterations), SCRAM-SHA-256 (5000 iterations)",
        "bob\tSCRAM-SHA-512 (4096 iterations), SCRAM-SHA-256 (4096 iterations)"]
    assert "2 users" in err
    held = Credentials.parse(path.read_text()).users["alice"]["SCRAM-SHA-256"]
    assert held.salt.hex() not in out and "salt" not in out and "key" not in out


def test_remove_drops_the_user_and_keeps_the_others(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "users.yaml"
    assert run(monkeypatch, path, "bob", "bob-pw\n", "--iterations", FAST) == 0
    assert run(monkeypatch, path, "alice", "alice-pw\n", "--iterations", FAST) == 0
    assert main(["credentials", "remove", "--file", str(path), "--user", "bob"]) == 0
    creds = Credentials.parse(path.read_text())
    assert set(creds.users) == {"alice"} and creds.check_plain("alice", "alice-pw")
    assert mode(path) == 0o600
    before = path.read_text()
    capsys.readouterr()
    assert main(["credentials", "remove", "--file", str(path), "--user", "bob"]) == 1
    assert "no user 'bob'" in capsys.readouterr().err
    assert path.read_text() == before
