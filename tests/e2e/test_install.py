"""The project as its users install it: the wheel ``pip install``ed into a virtual environment
of its own, with nothing of the checkout in sight.

``python -m build`` makes the sdist from a clean copy of the repository (its files only: no
.venv, egg-info or build output), then the wheel from that sdist. Both must hold every package
and subpackage of the checkout, every module and the PEP 561 markers, and the build must not
warn of deprecated settings. The wheel is then installed with its dependencies, from the
package index, into a fresh virtual environment, with the ``spark`` extra so that every module
can be imported: each is imported from that environment's site-packages, ``python -m cli`` and
``python -m proxy`` answer, and its ``kafka-quota-proxy run`` serves a tansu broker while a
confluent-kafka client produces and consumes through it. A package the build leaves out
(``proxy.filters`` once was) fails here as it fails for a user, with ``ModuleNotFoundError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import yaml

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.install import (
    ROOT,
    archive_names,
    build_sdist_and_wheel,
    check_main_modules,
    copy_files,
    directories_without_init,
    fresh_venv,
    import_each,
    modules_of,
    on_free_ports,
    packages_of,
    pyproject,
    repository_files,
    round_trip,
    run_proxy,
    shipped_files,
    shipped_top_level,
)

pytestmark = pytest.mark.e2e


@dataclass
class Built:
    files: list[str]  # the repository's files, as copied
    sdist: Path
    wheel: Path
    output: str  # what the build printed


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    files = repository_files()
    base = tmp_path_factory.mktemp("install")
    copy = copy_files(files, base / "kafka-quota-proxy")
    sdist, wheel, output = build_sdist_and_wheel(copy, base / "dist")
    return Built(files, sdist, wheel, output)


def test_the_type_checker_and_the_import_contracts_cover_every_shipped_package() -> None:
    top = shipped_top_level(repository_files())
    tool = pyproject()["tool"]
    assert sorted(tool["mypy"]["files"]) == top
    # (and the test kit, bench and the tests, whose contracts keep them apart)
    assert sorted(set(tool["importlinter"]["root_packages"]) - {"tests", "testkit", "bench"}) == top


def test_the_sdist_and_the_wheel_hold_every_package(built: Built) -> None:
    shipped = shipped_files(built.files)
    top = shipped_top_level(built.files)
    assert top == ["kafka_quota_proxy"], top  # one import root (docs/architecture.md)
    # what the checkout holds: packages found by their __init__.py (a directory of modules
    # without one would be left out by the build, so there is none), a marker in each
    # top-level package
    assert directories_without_init(shipped) == []
    packages = packages_of(shipped)
    assert set(top) < packages and "kafka_quota_proxy.proxy.filters" in packages, packages
    markers = [rel for rel in shipped if PurePosixPath(rel).name == "py.typed"]
    assert sorted(markers) == [f"{name}/py.typed" for name in top]

    for archive in (built.sdist, built.wheel):
        names = set(archive_names(archive))
        assert packages_of(names) == packages, (archive.name, packages_of(names) ^ packages)
        missing = sorted(set(shipped) - names)
        assert missing == [], f"{archive.name} lacks {missing}"
    assert any(n.endswith(".dist-info/entry_points.txt") for n in archive_names(built.wheel))
    # nothing at the top of site-packages but the package and the distribution's metadata
    roots = {PurePosixPath(n).parts[0] for n in archive_names(built.wheel)}
    assert {r for r in roots if not r.endswith(".dist-info")} == {"kafka_quota_proxy"}, roots

    warnings = [line for line in built.output.splitlines()
                if "DeprecationWarning" in line or "BuildBackendWarning" in line]
    assert warnings == [], "\n".join(warnings)


def test_the_wheel_installs_and_runs_in_a_fresh_virtualenv(
    built: Built, tansu: TansuBroker, tmp_path: Path
) -> None:
    work = tmp_path / "work"  # the working directory: outside the repository
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    with fresh_venv(tmp_path / "venv") as venv:
        seconds = venv.pip_install(f"{built.wheel}[spark]", cwd=work)
        print(f"pip install {built.wheel.name}[spark]: {seconds:.1f} s")
        site = venv.site_packages(work)
        assert site.is_relative_to(venv.path)
        assert [p for p in venv.sys_path(work) if p and Path(p).resolve().is_relative_to(ROOT)
                ] == []
        assert [p.name for p in site.iterdir() if "__editable__" in p.name] == []

        modules = modules_of(shipped_files(built.files))
        imported = import_each(venv, modules, work)
        failed = {m: r["error"] for m, r in imported.items() if "error" in r}
        assert failed == {}
        elsewhere = {m: r["file"] for m, r in imported.items()
                     if not Path(r["file"]).is_relative_to(site)}
        assert elsewhere == {}
        check_main_modules(venv, modules, work, site)

        config, bootstrap = on_free_ports({}, tansu.bootstrap)
        path = work / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        check = venv.run([venv.script("kafka-quota-proxy"), "check-config", path], work)
        assert check.returncode == 0, check.stdout + check.stderr
        with run_proxy(venv, path, bootstrap, work):
            sent, received = round_trip(f"127.0.0.1:{bootstrap}")
        assert received == sent
