"""The container image's build, without Docker: the exact build context deploy/Dockerfile sees
(the repository filtered by deploy/Dockerfile.dockerignore), its COPY lines carried out in a
temporary directory, and what they copied ``pip install``ed as the Dockerfile does, into a
fresh virtual environment of its own (testkit/install.py). From there every module is
imported (but those needing the ``spark`` extra, which the image does not install), the
configuration the image bakes in passes ``check-config``, and that configuration, moved to free
ports in front of a tansu broker, serves a client that produces and consumes through the proxy.
A package or subpackage the image would lack fails here as it would in the image."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.install import (
    DEPLOY,
    ROOT,
    SPARK_EXTRA_IMPORTS,
    SPARK_EXTRA_MODULES,
    build_context,
    carry_out_copies,
    check_main_modules,
    fresh_venv,
    import_each,
    modules_of,
    on_free_ports,
    repository_files,
    round_trip,
    run_proxy,
    shipped_files,
    shipped_top_level,
    tree_files,
)

pytestmark = pytest.mark.e2e

BAKED_CONFIG = "etc/kafka-quota-proxy/config.yaml"


def image_sources(tmp_path: Path, files: list[str]) -> tuple[Path, Path]:
    """The build stage's /src and the runtime image's root after the COPY lines, from the
    repository's ``files``."""
    context = build_context(tmp_path / "context", files)
    src, root = tmp_path / "src", tmp_path / "root"
    carry_out_copies(context, src, root)
    return src, root


def test_the_image_context_holds_every_package(tmp_path: Path) -> None:
    files = repository_files()
    src, root = image_sources(tmp_path, files)
    copied = set(tree_files(src))
    top = shipped_top_level(files)
    assert top, "no package found in the repository"
    lacking = [name for name in top if f"{name}/__init__.py" not in copied]
    assert lacking == [], (
        f"packages the image's build context lacks (deploy/Dockerfile.dockerignore): {lacking}")
    missing = sorted(set(shipped_files(files)) - copied)
    assert missing == [], f"files of the packages the image's build would lack: {missing}"
    assert {"pyproject.toml", "README.md"} <= copied
    assert (root / BAKED_CONFIG).read_bytes() == (DEPLOY / "config.image.yaml").read_bytes()


def test_the_image_context_installs_and_runs(tansu: TansuBroker, tmp_path: Path) -> None:
    files = repository_files()  # one listing for the context and the modules to import
    src, root = image_sources(tmp_path, files)
    work = tmp_path / "work"  # the image's WORKDIR /tmp: outside the repository
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    with fresh_venv(tmp_path / "venv") as venv:
        # RUN pip install . && kafka-quota-proxy --version (in WORKDIR /src)
        seconds = venv.pip_install(".", cwd=src)
        print(f"pip install . (the image's build context): {seconds:.1f} s")
        version = venv.run([venv.script("kafka-quota-proxy"), "--version"], work)
        assert version.returncode == 0 and "kafka-quota-proxy" in version.stdout, version
        site = venv.site_packages(work)
        assert site.is_relative_to(venv.path)

        modules = modules_of(shipped_files(files))
        imported = import_each(venv, modules, work)
        failed = {m: r for m, r in imported.items() if "error" in r}
        # the image installs no extra: exactly the Spark jobs' modules that import one fail,
        # for want of a module of the extra and not of the project
        assert set(failed) == SPARK_EXTRA_MODULES, {m: r["error"] for m, r in failed.items()}
        assert {r["missing"].split(".")[0] for r in failed.values()} <= SPARK_EXTRA_IMPORTS, (
            failed)
        elsewhere = {m: r["file"] for m, r in imported.items()
                     if "file" in r and not Path(r["file"]).is_relative_to(site)}
        assert elsewhere == {}
        check_main_modules(venv, modules, work, site)

        baked = root / BAKED_CONFIG
        check = venv.run([venv.script("kafka-quota-proxy"), "check-config", baked], work)
        assert check.returncode == 0, check.stdout + check.stderr

        config, bootstrap = on_free_ports(yaml.safe_load(baked.read_text()), tansu.bootstrap)
        own = work / "config.yaml"
        own.write_text(yaml.safe_dump(config, sort_keys=False))
        with run_proxy(venv, own, bootstrap, work):
            sent, received = round_trip(f"127.0.0.1:{bootstrap}")
        assert received == sent
