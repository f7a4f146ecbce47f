"""The container image's build, without Docker: the exact build context deploy/Dockerfile
sees (the repository filtered by deploy/Dockerfile.dockerignore), its COPY lines carried out in
a temporary directory, ``pip install`` of what they copied, and the proxy started from that
installation alone (a package the image would lack fails here as it would in the image)."""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from demo.embedded_broker import free_port, free_port_range, wait_for_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _matches(pattern: str, path: str) -> bool:
    """Whether a .dockerignore pattern matches ``path`` or one of its parent directories."""
    pattern = pattern.rstrip("/")
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        if fnmatch.fnmatchcase("/".join(parts[:i]), pattern):
            return True
        if pattern.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], pattern[3:]):
            return True
    return False


def _ignored(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last pattern that matches decides (``!`` re-includes)."""
    ignored = False
    for include, pattern in patterns:
        if _matches(pattern, path):
            ignored = not include
    return ignored


def build_context(into: Path) -> Path:
    """The files of the repository the Dockerfile's build may see, copied to ``into``."""
    patterns: list[tuple[bool, str]] = []
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.startswith("!"), line.lstrip("!")))
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in tracked.splitlines():
        if (ROOT / rel).is_file() and not _ignored(rel, patterns):
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, into / rel)
    return into


def carry_out_copies(context: Path, src: Path, root: Path) -> None:
    """The Dockerfile's COPY lines from the context: into ``src`` (its WORKDIR /src) or, for
    absolute destinations, under ``root``."""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        *sources, dest = line.split()[1:]
        target = root / dest.lstrip("/") if dest.startswith("/") else src / dest
        for source in sources:
            matches = glob.glob(str(context / source.rstrip("/")))
            if not matches:
                assert "*" in source, f"{line!r}: {source} is not in the build context"
                continue
            for match in map(Path, matches):
                if match.is_dir():
                    shutil.copytree(match, target, dirs_exist_ok=True)
                elif dest.endswith("/"):
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(match, target / match.name)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(match, target)


def test_the_image_context_installs_and_runs(tmp_path: Path) -> None:
    context = build_context(tmp_path / "context")
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]
    missing = [p for p in packages if not (context / p / "__init__.py").exists()]
    assert not missing, f"packages pyproject.toml lists but the build context lacks: {missing}"
    src, root = tmp_path / "src", tmp_path / "root"
    src.mkdir()
    carry_out_copies(context, src, root)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(src)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    # every package comes from the installation, none from this checkout
    where = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; print('\\n'.join("
         "importlib.import_module(p).__file__ for p in sys.argv[1:]))", *packages],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where
    config = root / "etc/kafka-quota-proxy/config.yaml"
    check = subprocess.run([sys.executable, "-m", "cli.main", "check-config", str(config)],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    # and the proxy starts from it
    ports = free_port_range(4)
    bootstrap = free_port(outside=ports)
    own = tmp_path / "config.yaml"
    own.write_text(f"""listeners:
  bootstrap: "127.0.0.1:{bootstrap}"
  advertised_host: "127.0.0.1"
  broker_ports: "{ports[0]}-{ports[1]}"
upstream:
  bootstrap_servers: ["127.0.0.1:{free_port()}"]
""")
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "--config", str(own)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_for_port("127.0.0.1", bootstrap, 20)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
