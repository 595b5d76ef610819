"""The Debian packages the image tests run (mmdebstrap, containerd, a C compiler), installed with
apt-get on first use when a command is missing. Root only: without root no image is built at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

#: command -> the Debian package that has it
PACKAGES = {
    "mmdebstrap": "mmdebstrap",
    "containerd": "containerd",
    "ctr": "containerd",
    "cc": "gcc",
    "make": "make",
}
_TIMEOUT_S = 900
_LOCK = threading.Lock()


class PackagesUnavailable(RuntimeError):
    """A command is missing and apt-get could not install its package; the message says why."""


def ensure_commands(*commands: str) -> None:
    """Install the packages of whichever `commands` are not on PATH (apt-get update, install)."""
    with _LOCK:
        missing = sorted({PACKAGES[command] for command in commands if shutil.which(command) is None})
        if not missing:
            return
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise PackagesUnavailable(f"missing {', '.join(missing)}, and no apt-get as root to install them")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in (["update", "-q"], ["install", "-y", "-q", "--no-install-recommends", *missing]):
            try:
                done = subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True,
                                      timeout=_TIMEOUT_S, check=False)  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise PackagesUnavailable(f"apt-get {' '.join(args)} failed: {exc}") from exc
            if done.returncode != 0:
                tail = (done.stdout + done.stderr)[-2000:]
                raise PackagesUnavailable(f"apt-get {' '.join(args)} exited {done.returncode}:\n{tail}")
        still = [command for command in commands if shutil.which(command) is None]
        if still:
            raise PackagesUnavailable(
                f"apt-get installed {', '.join(missing)} but {', '.join(still)} is not on PATH"
            )
