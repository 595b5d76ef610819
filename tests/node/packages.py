"""The Debian packages a real node needs: containerd, runc and busybox-static.

Found on PATH, else installed with apt-get (as root, or through `sudo -n`) the way
`tests.cluster.binaries` installs etcd, so a fresh CI machine needs nothing done by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.cluster.binaries import BinariesError, Progress, _file_lock, _stderr, cache_root

#: command -> the Debian package that provides it
NODE_PACKAGES: dict[str, str] = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "busybox": "busybox-static",
}


def _which(command: str) -> str | None:
    return shutil.which(command, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def ensure_node_packages(progress: Progress = _stderr) -> dict[str, Path]:
    """The path of every command in NODE_PACKAGES, installing the missing packages."""
    missing = sorted({NODE_PACKAGES[c] for c in NODE_PACKAGES if _which(c) is None})
    if missing:
        with _file_lock(cache_root() / "apt-node.lock", progress, "installing node packages"):
            missing = sorted({NODE_PACKAGES[c] for c in NODE_PACKAGES if _which(c) is None})
            if missing:
                _apt_install(missing, progress)
    found: dict[str, Path] = {}
    for command in NODE_PACKAGES:
        path = _which(command)
        if path is None:
            raise BinariesError(f"`{command}` is still not on PATH after installing {NODE_PACKAGES[command]}")
        found[command] = Path(path)
    return found


def _apt_install(packages: list[str], progress: Progress) -> None:
    if shutil.which("apt-get") is None:
        raise BinariesError(f"install {', '.join(packages)} (no apt-get here to do it)")
    prefix: list[str] = []
    if os.geteuid() != 0:
        if (
            shutil.which("sudo") is None
            or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode
        ):
            raise BinariesError(
                f"installing {', '.join(packages)} needs root: run `sudo apt-get install ...`"
            )
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *packages]
    progress(f"installing Debian packages {', '.join(packages)}")
    result = subprocess.run(install, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        subprocess.run([*prefix, "apt-get", "update"], env=env, capture_output=True, text=True)
        result = subprocess.run(install, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BinariesError(f"`{' '.join(install)}` failed:\n{(result.stdout + result.stderr)[-2000:]}")
    # Debian's containerd package may start the machine's own containerd where an init system
    # runs; the node harness runs its own, with its own root, state and socket.
