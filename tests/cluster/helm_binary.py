"""The `helm` command the chart tests use, built from `helm.sh/helm/v3` at the release pinned in
`tests/cluster/helm/go.mod`, into the same cache as the Kubernetes binaries (`helm-<version>/`
beside `k8s-<version>/`, see `tests.cluster.binaries`), with the same stamp and lock rules.

Run `python -m tests.cluster.helm_binary` to build ahead of a test run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from tests.cluster.binaries import (
    BinariesError,
    Progress,
    _file_lock,
    _run_with_heartbeat,
    _stderr,
    cache_root,
    find_go,
    required_version,
)

MODULE_DIR = Path(__file__).resolve().parent / "helm"
_MODULE = "helm.sh/helm/v3"
_PACKAGE = f"{_MODULE}/cmd/helm"
_VERSION_VARIABLE = f"{_MODULE}/internal/version.version"


def pinned_version(module_dir: Path = MODULE_DIR) -> str:
    """The `helm.sh/helm/v3` version required by the pinning module's go.mod."""
    return required_version(module_dir, _MODULE)


def _kubernetes_minor(module_dir: Path) -> str:
    """The Kubernetes minor release of the client libraries Helm is built with (k8s.io/client-go
    v0.<minor>.<patch>): Helm's default Kubernetes version when no cluster is asked."""
    text = (module_dir / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.", text, re.MULTILINE)
    if match is None:
        raise BinariesError(f"{module_dir / 'go.mod'}: no k8s.io/client-go requirement")
    return match.group(1)


def _build_flags(version: str, module_dir: Path = MODULE_DIR) -> list[str]:
    # what Helm's own Makefile stamps: the version `helm version` reports, and the Kubernetes
    # version `helm template` and `helm lint` assume (else v1.20, older than the chart allows)
    minor = _kubernetes_minor(module_dir)
    stamps = [f"-X {_VERSION_VARIABLE}={version}"]
    for package in (f"{_MODULE}/pkg/lint/rules", f"{_MODULE}/pkg/chartutil"):
        stamps += [f"-X {package}.k8sVersionMajor=1", f"-X {package}.k8sVersionMinor={minor}"]
    return ["-trimpath", f"-ldflags=-s -w {' '.join(stamps)}"]


def _stamp(module_dir: Path, version: str) -> str:
    recipe = "CGO_ENABLED=0 GOFLAGS=-mod=mod go build " + " ".join(_build_flags(version, module_dir))
    digest = hashlib.sha256(recipe.encode())
    for name in ("go.mod", "go.sum"):
        path = module_dir / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def _current(binary: Path, stamp_file: Path, stamp: str) -> bool:
    return stamp_file.exists() and stamp_file.read_text().strip() == stamp and os.access(binary, os.X_OK)


def ensure_helm(progress: Progress = _stderr, module_dir: Path = MODULE_DIR) -> Path:
    """The path of a `helm` built at the pinned version (building it on first use, never skipping)."""
    version = pinned_version(module_dir)
    stamp = _stamp(module_dir, version)
    directory = cache_root() / f"helm-{version}"
    binary, stamp_file = directory / "helm", directory / "stamp"
    if _current(binary, stamp_file, stamp):
        return binary
    with _file_lock(directory / ".lock", progress, f"building Helm {version}"):
        if _current(binary, stamp_file, stamp):  # built by whoever held the lock
            return binary
        go = find_go()
        for stale in directory.glob("build-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        argv = [str(go), "build", *_build_flags(version, module_dir), "-o", str(staging / "helm"), _PACKAGE]
        progress(f"building helm {version} into {directory} (first run only: a few minutes on 2 cores)")
        started = time.monotonic()
        try:
            code, output = _run_with_heartbeat(argv, module_dir, env, progress, "go build")
            if code != 0:
                tail = "\n".join(output.splitlines()[-40:])
                raise BinariesError(f"`{' '.join(argv)}` in {module_dir} failed (exit {code}):\n{tail}")
            os.replace(staging / "helm", binary)
            stamp_file.write_text(stamp + "\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        progress(f"built helm {version} in {time.monotonic() - started:.0f}s")
    return binary


def main() -> None:
    print(f"helm {ensure_helm()}")


if __name__ == "__main__":
    main()
