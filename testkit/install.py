"""The project installed the way its users install it, for the packaging tests
(tests/e2e/test_install.py, tests/e2e/test_image_context.py).

* What ships: the packages of the checkout are the top-level directories holding an
  ``__init__.py`` that pyproject.toml's ``[tool.setuptools.packages.find] exclude`` does not
  leave out, and every directory with an ``__init__.py`` beneath them. This is worked out from
  the files of the repository, not asked of setuptools, so that the archives the build makes
  are checked against the checkout rather than against the build's own idea of it.
* Where it runs: a :class:`FreshVenv`, a new virtual environment made with ``python -m venv``
  from the base interpreter, with nothing of the checkout on ``sys.path`` (no editable finder,
  no ``PYTHONPATH``, its working directory outside the repository), into which pip installs the
  wheel or the source tree with its dependencies from the package index.
* What it must do there: import every module of every package from its own site-packages and
  carry real traffic: :func:`run_proxy` starts its ``kafka-quota-proxy run`` and
  :func:`round_trip` produces and consumes a few messages through it with confluent-kafka.
* The container image: :func:`build_context` copies what deploy/Dockerfile's build context
  holds (the repository filtered by deploy/Dockerfile.dockerignore) and
  :func:`carry_out_copies` carries out its COPY lines.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kafka_quota_proxy.demo.embedded_broker import free_port, free_port_range, wait_for_port
from testkit.e2e import new_topic, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

# Modules that import the ``spark`` extra (pyspark, pandas, matplotlib and numpy, which pandas
# brings) at their top: they import where the extra is installed (tests/e2e/test_install.py
# installs ``kafka-quota-proxy[spark]``) and nowhere else, e.g. in the container image, which
# installs the project without extras. ``kafka-quota-proxy replay`` imports them when it runs.
SPARK_EXTRA_MODULES = frozenset({
    f"kafka_quota_proxy.spark_jobs.{name}"
    for name in ("bounds", "capture", "engine", "entity_pass", "held", "main", "profile",
                 "replay", "report", "session", "tune")
})
SPARK_EXTRA_IMPORTS = frozenset({"pyspark", "pandas", "numpy", "matplotlib"})


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def repository_files() -> list[str]:
    """The repository's files as a fresh clone has them once everything is committed: the
    tracked ones and the new ones git does not ignore (no .venv, build output or caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted({rel for rel in listed.splitlines() if (ROOT / rel).is_file()})


def copy_files(files: Iterable[str], into: Path) -> Path:
    for rel in files:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, into / rel)
    return into


def in_distribution(package: str) -> bool:
    """Whether the build's package finder takes ``package`` (its ``include`` patterns)."""
    patterns = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return any(fnmatch.fnmatchcase(package, pattern) for pattern in patterns)


def shipped_top_level(files: Iterable[str]) -> list[str]:
    """The top-level packages the distribution must hold."""
    return sorted({PurePosixPath(rel).parts[0] for rel in files
                   if len(PurePosixPath(rel).parts) == 2 and rel.endswith("/__init__.py")
                   and in_distribution(PurePosixPath(rel).parts[0])})


def shipped_files(files: Iterable[str]) -> list[str]:
    """The files of the repository under the shipped top-level packages."""
    top = set(shipped_top_level(files := list(files)))
    return [rel for rel in files if PurePosixPath(rel).parts[0] in top
            and "__pycache__" not in PurePosixPath(rel).parts]


def packages_of(names: Iterable[str]) -> set[str]:
    """The dotted names of the directories holding an ``__init__.py`` among ``names`` (paths
    relative to the root of a tree or an archive)."""
    return {".".join(PurePosixPath(name).parent.parts) for name in names
            if PurePosixPath(name).name == "__init__.py"}


def modules_of(files: Iterable[str]) -> list[str]:
    """The dotted names of the modules among ``files`` (``pkg/__init__.py`` is ``pkg``)."""
    out = []
    for rel in files:
        path = PurePosixPath(rel)
        if path.suffix == ".py":
            parts = path.with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(out)


def directories_without_init(files: Iterable[str]) -> list[str]:
    """Directories holding Python files but no ``__init__.py``: the build would leave them
    out (``namespaces = false``), so none may exist under a shipped package."""
    files = list(files)
    present = {str(PurePosixPath(rel).parent) for rel in files if rel.endswith("/__init__.py")}
    return sorted({str(PurePosixPath(rel).parent) for rel in files if rel.endswith(".py")}
                  - present)


def archive_names(archive: Path) -> list[str]:
    """The files of a wheel or an sdist, relative to the root of the project (an sdist's
    ``<name>-<version>/`` prefix removed)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as whl:
            return [n for n in whl.namelist() if not n.endswith("/")]
    with tarfile.open(archive) as sdist:
        return ["/".join(m.name.split("/")[1:]) for m in sdist.getmembers() if m.isfile()]


def build_sdist_and_wheel(source: Path, out: Path) -> tuple[Path, Path, str]:
    """``python -m build``: the sdist from ``source``, then the wheel from that sdist (so the
    wheel holds only what the sdist carried), each in an isolated environment holding the
    build requirements of pyproject.toml; (sdist, wheel, what the build printed)."""
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                          cwd=source.parent, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel, output


@dataclass
class FreshVenv:
    """A virtual environment of its own, made by ``python -m venv`` from the base interpreter
    (not the checkout's .venv: no editable finder), run with an environment that puts nothing
    of the checkout on ``sys.path``."""

    path: Path

    @classmethod
    def create(cls, path: Path) -> FreshVenv:
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True,
                       capture_output=True, timeout=300)
        return cls(path)

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def script(self, name: str) -> Path:
        return self.bin / name

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
                if p and not Path(p).resolve().is_relative_to(ROOT)]
        env.update(PATH=os.pathsep.join([str(self.bin), *path]), VIRTUAL_ENV=str(self.path),
                   PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1",
                   MPLCONFIGDIR=str(self.path / "mplconfig"))
        return env

    def run(self, args: list[str | Path], cwd: Path, timeout: float = 120,
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], cwd=cwd, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def pip_install(self, *args: str | Path, cwd: Path) -> float:
        """``pip install ARGS`` with the dependencies from the package index; the seconds it
        took."""
        start = time.monotonic()
        done = self.run([self.python, "-m", "pip", "install", "--quiet", *args], cwd=cwd,
                        timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return time.monotonic() - start

    def site_packages(self, cwd: Path) -> Path:
        done = self.run([self.python, "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=cwd)
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())

    def sys_path(self, cwd: Path) -> list[str]:
        done = self.run([self.python, "-c", "import json, sys; print(json.dumps(sys.path))"],
                        cwd=cwd)
        assert done.returncode == 0, done.stderr
        paths: list[str] = json.loads(done.stdout)
        return paths


@contextmanager
def fresh_venv(path: Path) -> Iterator[FreshVenv]:
    """A :class:`FreshVenv` at ``path``, removed afterwards (with the ``spark`` extra it takes
    about a gigabyte)."""
    venv = FreshVenv.create(path)
    try:
        yield venv
    finally:
        shutil.rmtree(path, ignore_errors=True)


IMPORT_EACH = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = {"file": importlib.import_module(name).__file__}
    except ImportError as e:
        out[name] = {"error": f"{type(e).__name__}: {e}", "missing": e.name}
print(json.dumps(out))
"""


def import_each(venv: FreshVenv, modules: Iterable[str], cwd: Path) -> dict[str, dict[str, Any]]:
    """Import every module in the fresh environment: ``{"file": its __file__}`` or, when it
    cannot be imported, ``{"error": ..., "missing": the module not found}``. ``__main__``
    modules run the CLI when imported: :func:`check_main_modules` runs them instead."""
    names = [m for m in modules if not m.endswith(".__main__")]
    done = venv.run([venv.python, "-c", IMPORT_EACH, *names], cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return result


def check_main_modules(venv: FreshVenv, modules: Iterable[str], cwd: Path,
                       site: Path) -> None:
    """``python -m PKG --version`` for each ``PKG.__main__``, from the fresh environment."""
    for module in modules:
        if not module.endswith(".__main__"):
            continue
        package = module.removesuffix(".__main__")
        where = venv.run([venv.python, "-c", "import importlib.util, sys; "
                          "print(importlib.util.find_spec(sys.argv[1]).origin)", module], cwd)
        assert Path(where.stdout.strip()).is_relative_to(site), (module, where)
        done = venv.run([venv.python, "-m", package, "--version"], cwd)
        assert done.returncode == 0 and "kafka-quota-proxy" in done.stdout, (module, done)


def on_free_ports(config: dict[str, Any], upstream: str) -> tuple[dict[str, Any], int]:
    """``config`` listening on free ports of 127.0.0.1 (as many broker ports as it has, 20 if
    it names none), advertising 127.0.0.1, in front of ``upstream``; and its bootstrap port."""
    listeners = config.setdefault("listeners", {})
    first, last = map(int, str(listeners.get("broker_ports", "1-20")).split("-"))
    ports = free_port_range(last - first + 1)
    bootstrap = free_port(outside=ports)
    metrics = free_port(outside=ports)
    while metrics == bootstrap:
        metrics = free_port(outside=ports)
    listeners.update(bootstrap=f"127.0.0.1:{bootstrap}", advertised_host="127.0.0.1",
                     broker_ports=f"{ports[0]}-{ports[1]}", broker_listen_host="127.0.0.1")
    config.setdefault("upstream", {})["bootstrap_servers"] = [upstream]
    config.setdefault("metrics", {})["listen"] = f"127.0.0.1:{metrics}"
    return config, bootstrap


@contextmanager
def run_proxy(venv: FreshVenv, config: Path, bootstrap: int, cwd: Path,
              ) -> Iterator[subprocess.Popen[bytes]]:
    """``kafka-quota-proxy run --config CONFIG`` from the fresh environment until the block
    ends; it must then stop cleanly on SIGTERM (exit status 0). Its log is ``cwd/proxy.log``."""
    log_path = cwd / "proxy.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(venv.script("kafka-quota-proxy")), "run", "--config",
                                 str(config)], cwd=cwd, env=venv.env(), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-3000:]

    try:
        try:
            wait_for_port("127.0.0.1", bootstrap, 30)
        except TimeoutError:
            raise AssertionError(f"the proxy did not listen: {log_tail()}") from None
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log_tail()


def round_trip(bootstrap: str, count: int = 5) -> tuple[list[bytes], list[bytes]]:
    """One real client through ``bootstrap``: a new topic, ``count`` messages produced with
    acks=all, then read back from the start of the partition. (sent, received)."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        Message,
        Producer,
        TopicPartition,
    )

    topic = new_topic(bootstrap, "install")
    sent = [f"message-{i}-{uuid.uuid4().hex[:8]}".encode() for i in range(count)]
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in sent:
        producer.produce(topic, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0, "messages still unacknowledged after 30 s"
    assert errors == [], errors
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"install-{topic}",
                         "enable.auto.commit": False})
    received: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

        def all_received() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert isinstance(value, bytes)
                received.append(value)
            return len(received) >= count

        wait_for(all_received, 60, interval=0, what=f"{count} messages back from {topic}")
    finally:
        consumer.close()
    return sent, received


# ---------------------------------------------------------------- the container image


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


def context_files(files: Iterable[str] | None = None) -> list[str]:
    """The files of the repository (``files``, by default :func:`repository_files`) the
    Dockerfile's build may see (its build context filtered by deploy/Dockerfile.dockerignore)."""
    patterns: list[tuple[bool, str]] = []
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            patterns.append((line.startswith("!"), line.lstrip("!")))
    return [rel for rel in (repository_files() if files is None else files)
            if not _ignored(rel, patterns)]


def build_context(into: Path, files: Iterable[str] | None = None) -> Path:
    """The files of the repository the Dockerfile's build may see, copied to ``into``."""
    return copy_files(context_files(files), into)


def carry_out_copies(context: Path, src: Path, root: Path) -> None:
    """The Dockerfile's COPY lines from the context: into ``src`` (its WORKDIR /src) or, for
    absolute destinations, under ``root``."""
    src.mkdir(parents=True, exist_ok=True)
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


def tree_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file())
