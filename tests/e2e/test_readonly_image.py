"""The configuration the container image bakes in runs with a read-only root filesystem, as
deploy/README.md says: the Dockerfile copies deploy/config.image.yaml (carried out here as in
tests/e2e/test_image_context.py), that file enables nothing that writes (capture) or holds
producers back for want of volume data (storage), and the proxy started with it (its ports
moved to free ones on 127.0.0.1, nothing else changed) becomes ready, serves /metrics and stops
cleanly without writing a single file.

"Without writing" is observed, not assumed: the proxy runs under a Python audit hook that
reports every open for writing, directory creation, rename, removal, permission change and
Unix socket bind made through Python, wherever it would happen. The tests may run as root,
for whom a 0555 directory is no obstacle, so the hook is the check; the working directory,
HOME and TMPDIR are a 0555 directory as well, and it must still be empty afterwards. The
checkout's virtualenv has the test dependencies too; hypothesis, which kio imports when present
and which writes a cache to the working directory, is hidden from the proxy: the image does
not have it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_quota_proxy.config.loading import load_config
from kafka_quota_proxy.demo.embedded_broker import free_port, free_port_range, wait_for_port
from testkit.install import DEPLOY, ROOT, build_context, carry_out_copies

pytestmark = pytest.mark.e2e

IMAGE_CONFIG = "etc/kafka-quota-proxy/config.yaml"
WRITE_MARK = "AUDITED-WRITE "

# Runs ``cli.main`` as the image's entrypoint does, under an audit hook that prints
# WRITE_MARK + the event for every attempt to change the filesystem.
AUDITED_MAIN = r"""
import os, sys

MARK = sys.argv.pop(1)
WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGES = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.chmod",
           "os.chown", "os.link", "os.symlink", "os.utime", "os.mkfifo", "os.mknod",
           "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.rmtree"}

def hook(event, args):
    if event == "open":
        path, _mode, flags = args
        if isinstance(path, int) or not flags & WRITING:
            return
    elif event == "socket.bind":
        if not isinstance(args[1], (str, bytes)):
            return
    elif event not in CHANGES:
        return
    sys.__stderr__.write(f"{MARK}{event} {args!r}\n")
    sys.__stderr__.flush()

sys.addaudithook(hook)
# The image installs the runtime dependencies only. kio imports hypothesis when it is
# installed (a test dependency here), and hypothesis keeps a cache in the working directory.
sys.modules["hypothesis"] = None
from kafka_quota_proxy.cli.main import main
sys.exit(main())
"""


def baked_config(tmp_path: Path) -> Path:
    """The file the image holds at /etc/kafka-quota-proxy/config.yaml: the Dockerfile's COPY
    lines carried out from the exact build context."""
    context = build_context(tmp_path / "context")
    root = tmp_path / "root"
    carry_out_copies(context, tmp_path / "src", root)
    return root / IMAGE_CONFIG


def runtime_stage(dockerfile: str) -> str:
    """The Dockerfile from its last FROM on (the image that runs)."""
    return dockerfile[dockerfile.rindex("\nFROM "):]


def test_the_image_bakes_the_read_only_configuration(tmp_path: Path) -> None:
    baked = baked_config(tmp_path)
    assert baked.read_bytes() == (DEPLOY / "config.image.yaml").read_bytes()
    runtime = runtime_stage((DEPLOY / "Dockerfile").read_text())
    assert 'CMD ["run", "--config", "/etc/kafka-quota-proxy/config.yaml"]' in runtime
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime  # no __pycache__ writes at run time
    assert "WORKDIR /tmp" in runtime  # the one writable place (--tmpfs /tmp, an emptyDir)

    config = load_config(baked)
    assert config.capture is None or Path(config.capture.dir).is_relative_to("/tmp"), (
        "capture writes files: off, or under /tmp (a tmpfs/emptyDir in the documented runs)")
    assert config.storage is None or config.storage.on_missing == "OPEN", (
        "storage throttling with on_missing PAUSE holds every producer until volume agents "
        "publish: not for a configuration that must work as it is")
    # EXPOSE and the HEALTHCHECK port are the configuration's
    listeners = config.listeners
    first, last = listeners.broker_ports.first, listeners.broker_ports.last
    assert config.metrics.listen is not None
    expose = re.search(r"^EXPOSE (.+)$", runtime, re.MULTILINE)
    assert expose is not None
    assert expose.group(1).split() == [f"{listeners.bootstrap.port}/tcp",
                                       f"{first}-{last}/tcp",
                                       f"{config.metrics.listen.port}/tcp"]
    assert f"HEALTHCHECK_PORT={listeners.bootstrap.port}" in runtime

    check = subprocess.run([sys.executable, "-m", "kafka_quota_proxy", "check-config", str(baked)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert re.search(r"^capture\s+: off$", check.stdout, re.MULTILINE), check.stdout
    assert re.search(r"^storage throttling\s+: off$", check.stdout, re.MULTILINE), check.stdout


def _on_free_ports(config: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
    """The same configuration with its listening ports moved to free ones on 127.0.0.1 (the
    image's fixed ports may be taken on a shared test machine)."""
    listeners = config["listeners"]
    first, last = map(int, str(listeners["broker_ports"]).split("-"))
    ports = free_port_range(last - first + 1)
    bootstrap = free_port(outside=ports)
    metrics = free_port(outside=ports)
    while metrics == bootstrap:
        metrics = free_port(outside=ports)
    listeners["bootstrap"] = f"127.0.0.1:{bootstrap}"
    listeners["broker_ports"] = f"{ports[0]}-{ports[1]}"
    listeners["broker_listen_host"] = "127.0.0.1"
    config["metrics"]["listen"] = f"127.0.0.1:{metrics}"
    return config, bootstrap, metrics


def test_the_baked_configuration_runs_without_writing(tmp_path: Path) -> None:
    baked = yaml.safe_load(baked_config(tmp_path).read_text())
    moved, bootstrap, metrics = _on_free_ports(baked)
    own = tmp_path / "config.yaml"
    own.write_text(yaml.safe_dump(moved, sort_keys=False))
    load_config(own)  # still valid

    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    env = {**os.environ, "HOME": str(read_only), "TMPDIR": str(read_only),
           "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", AUDITED_MAIN, WRITE_MARK, "run", "--config", str(own)],
        env=env, cwd=read_only, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port("127.0.0.1", bootstrap, 30)
        wait_for_port("127.0.0.1", metrics, 30)  # (opened just after the listeners)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as r:
            assert b"\nkafka_proxy_upstream_brokers " in r.read()
    finally:
        proc.terminate()
        _, err_bytes = proc.communicate(timeout=60)
    err = err_bytes.decode(errors="replace")
    writes = [line for line in err.splitlines() if line.startswith(WRITE_MARK)]
    assert proc.returncode == 0, err[-3000:]
    assert writes == [], "\n".join(writes)
    assert list(read_only.iterdir()) == []
    read_only.chmod(0o755)  # so that pytest can remove it
