"""The binaries of a real control plane: kube-apiserver, kube-scheduler (built) and etcd (installed).

kube-apiserver and kube-scheduler are built from `k8s.io/kubernetes` at the release pinned in
`tests/cluster/k8s/go.mod`, into a cache outside the work tree keyed by that version:
`$LINKPACK_CACHE_DIR` or `$XDG_CACHE_HOME/linkpack` or `~/.cache/linkpack`, then `k8s-<version>/`.
A stamp (hash of go.mod and go.sum) decides whether a cached build is current; a lock file keeps
parallel test processes from building twice. etcd comes from `$PATH`, else from Debian's
`etcd-server` package (installed with apt-get as root, or through `sudo -n`).

The kubelet (for the real-node tests, `tests/node/`) is built the same way on its own stamp
(`build_kubelet`). Run `python -m tests.cluster.binaries` to build ahead of a test run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.procs import die_with_parent

Progress = Callable[[str], None]

MODULE_DIR = Path(__file__).resolve().parent / "k8s"
COMMANDS = ("kube-apiserver", "kube-scheduler")
#: Built only for the tests that run a real node (`tests/node/`).
NODE_COMMANDS = ("kubelet",)
# The usual place of an official Go install, tried when `go` is not on PATH.
_GO_FALLBACKS = (Path("/usr/local/go/bin/go"),)
_HEARTBEAT_S = 30.0
# Version stamping as Kubernetes' own build does it (hack/lib/version.sh), so /version and the
# logs name the release instead of "v0.0.0-master".
_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


def _build_flags(version: str) -> list[str]:
    major, minor = version.lstrip("v").split(".")[:2]
    stamps = []
    for package in _VERSION_PACKAGES:
        stamps += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return ["-trimpath", f"-ldflags=-s -w {' '.join(stamps)}"]


def _recipe(version: str) -> str:
    """Everything about the build besides the pin; part of the cache stamp, so a change rebuilds."""
    return "CGO_ENABLED=0 GOFLAGS=-mod=mod go build " + " ".join(_build_flags(version))


class BinariesError(RuntimeError):
    """A binary could not be built or installed; the message says what to do about it."""


@dataclass(frozen=True, slots=True)
class Binaries:
    apiserver: Path
    scheduler: Path
    etcd: Path
    version: str


def _stderr(message: str) -> None:
    print(f"[linkpack cluster] {message}", file=sys.stderr, flush=True)


def required_version(module_dir: Path, module: str) -> str:
    """The version of `module` required by the go.mod in `module_dir`."""
    text = (module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\d+\.\d+\.\d+\S*)", text, re.MULTILINE)
    if match is None:
        raise BinariesError(f"{module_dir / 'go.mod'}: no `require {module} vX.Y.Z` line")
    return match.group(1)


def pinned_version(module_dir: Path = MODULE_DIR) -> str:
    """The `k8s.io/kubernetes` version required by the pinning module's go.mod."""
    return required_version(module_dir, "k8s.io/kubernetes")


def cache_root() -> Path:
    explicit = os.environ.get("LINKPACK_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "linkpack"


def build_dir(version: str) -> Path:
    return cache_root() / f"k8s-{version}"


def _pin_stamp(module_dir: Path, version: str) -> str:
    digest = hashlib.sha256(_recipe(version).encode())
    for name in ("go.mod", "go.sum"):
        path = module_dir / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def find_go() -> Path:
    explicit = os.environ.get("GO")
    if explicit:
        return Path(explicit)
    found = shutil.which("go")
    if found:
        return Path(found)
    for candidate in _GO_FALLBACKS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise BinariesError(
        "no Go toolchain: put `go` on PATH or set GO=/path/to/go "
        f"(the k8s module in {MODULE_DIR} needs the Go version its go.mod names)"
    )


@contextlib.contextmanager
def _file_lock(path: Path, progress: Progress, what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process that is {what} (lock {path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _binaries_current(directory: Path, stamp: str, commands: tuple[str, ...], stamp_name: str) -> bool:
    stamp_file = directory / stamp_name
    if not stamp_file.exists() or stamp_file.read_text().strip() != stamp:
        return False
    return all(os.access(directory / command, os.X_OK) for command in commands)


def _run_with_heartbeat(
    argv: list[str], cwd: Path, env: dict[str, str], progress: Progress, label: str
) -> tuple[int, str]:
    """Run `argv`, reporting every few seconds that it is still running; (exit code, output)."""
    with tempfile.TemporaryFile(mode="w+") as output:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent(),
        )
        started = time.monotonic()
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(_HEARTBEAT_S):
                progress(f"{label}: still running after {time.monotonic() - started:.0f}s")

        ticker = threading.Thread(target=heartbeat, daemon=True)
        ticker.start()
        try:
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            done.set()
            ticker.join()
        output.seek(0)
        return code, output.read()


def build_kubernetes(progress: Progress = _stderr, module_dir: Path = MODULE_DIR) -> tuple[Path, str]:
    """Build (or reuse) kube-apiserver and kube-scheduler; (directory holding them, version)."""
    return _build_commands(COMMANDS, "stamp", progress, module_dir)


def build_kubelet(progress: Progress = _stderr, module_dir: Path = MODULE_DIR) -> Path:
    """Build (or reuse) the kubelet of the pinned release (a real node's agent; `tests/node/`).

    Built on its own, with its own stamp beside the control plane's, so a control-plane-only run
    never pays for it (about 6 minutes on 2 cores after the control plane's build).
    """
    directory, _ = _build_commands(NODE_COMMANDS, "stamp-kubelet", progress, module_dir)
    return directory / "kubelet"


def _build_commands(
    commands: tuple[str, ...], stamp_name: str, progress: Progress, module_dir: Path
) -> tuple[Path, str]:
    version = pinned_version(module_dir)
    stamp = _pin_stamp(module_dir, version)
    directory = build_dir(version)
    if _binaries_current(directory, stamp, commands, stamp_name):
        return directory, version
    with _file_lock(directory / ".lock", progress, f"building Kubernetes {version}"):
        if _binaries_current(directory, stamp, commands, stamp_name):  # built by whoever held the lock
            return directory, version
        go = find_go()
        for stale in directory.glob("build-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
        env = {
            **os.environ,
            "CGO_ENABLED": "0",  # static binaries, as upstream releases them; no C compiler needed
            "GOFLAGS": "-mod=mod",
        }
        argv = [str(go), "build", *_build_flags(version), "-o", f"{staging}{os.sep}"]
        argv += [f"k8s.io/kubernetes/cmd/{command}" for command in commands]
        progress(
            f"building {', '.join(commands)} {version} into {directory} "
            "(first run only: several minutes on 2 cores, plus module download)"
        )
        started = time.monotonic()
        try:
            code, output = _run_with_heartbeat(argv, module_dir, env, progress, "go build")
            if code != 0:
                tail = "\n".join(output.splitlines()[-40:])
                raise BinariesError(f"`{' '.join(argv)}` in {module_dir} failed (exit {code}):\n{tail}")
            for command in commands:
                os.replace(staging / command, directory / command)
            (directory / stamp_name).write_text(stamp + "\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        progress(f"built {', '.join(commands)} {version} in {time.monotonic() - started:.0f}s")
    return directory, version


def ensure_etcd(progress: Progress = _stderr) -> Path:
    """etcd from PATH (or $ETCD), else installed from Debian's `etcd-server` package."""
    explicit = os.environ.get("ETCD")
    if explicit:
        return Path(explicit)
    found = shutil.which("etcd")
    if found:
        return Path(found)
    lock = cache_root() / "apt-etcd.lock"
    with _file_lock(lock, progress, "installing etcd"):
        found = shutil.which("etcd")
        if found:
            return Path(found)
        _apt_install_etcd(progress)
        found = shutil.which("etcd")
        if not found:
            raise BinariesError("package `etcd-server` was installed but `etcd` is still not on PATH")
        return Path(found)


def _apt_install_etcd(progress: Progress) -> None:
    if shutil.which("apt-get") is None:
        raise BinariesError(
            "etcd is not on PATH and there is no apt-get to install it: install etcd "
            "(3.4 or newer) or set ETCD=/path/to/etcd"
        )
    prefix: list[str] = []
    if os.geteuid() != 0:
        if (
            shutil.which("sudo") is None
            or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode
        ):
            raise BinariesError(
                "etcd is not on PATH and installing Debian's `etcd-server` needs root: run "
                "`sudo apt-get install etcd-server`, or set ETCD=/path/to/etcd"
            )
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", "etcd-server"]
    progress("etcd is not on PATH: installing Debian package etcd-server")
    result = subprocess.run(install, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        progress("apt-get install failed; running apt-get update first")
        update = subprocess.run([*prefix, "apt-get", "update"], env=env, capture_output=True, text=True)
        if update.returncode != 0:
            raise BinariesError(
                f"`apt-get update` failed (exit {update.returncode}):\n{update.stderr[-2000:]}"
            )
        result = subprocess.run(install, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BinariesError(
            f"`{' '.join(install)}` failed (exit {result.returncode}); install etcd yourself or set "
            f"ETCD=/path/to/etcd:\n{(result.stdout + result.stderr)[-2000:]}"
        )
    # The package may start a system etcd on 127.0.0.1:2379 where an init system runs; the tests
    # use their own ports and data directories, so it does not get in the way.


def ensure_binaries(progress: Progress = _stderr) -> Binaries:
    """All three binaries, building or installing what is missing (never skips)."""
    etcd = ensure_etcd(progress)
    directory, version = build_kubernetes(progress)
    return Binaries(
        apiserver=directory / "kube-apiserver",
        scheduler=directory / "kube-scheduler",
        etcd=etcd,
        version=version,
    )


def main() -> None:
    binaries = ensure_binaries()
    print(f"kube-apiserver {binaries.apiserver}")
    print(f"kube-scheduler {binaries.scheduler}")
    print(f"etcd           {binaries.etcd}")
    if os.geteuid() == 0:  # the real-node tests (tests/node) run only as root
        print(f"kubelet        {build_kubelet()}")


if __name__ == "__main__":
    main()
