"""Delivering the CUDA driver-API interposer (node_agent/sharing/interposer) to this node's share containers.

The agent's image ships `liblinkpack_cuda.so` (built by `make interposer`), by default at
/opt/linkpack/lib/liblinkpack_cuda.so (`--interposer-lib`). At start the agent copies it into
the host directory it already fills with the framework shim (`--shim-host-dir`), in a
subdirectory `interposer/` that the device plugin mounts read-only into share containers whose
record says `interposer`, and loads the installed copy once in a child process (`ctypes.CDLL`,
with the interposer switched off, so nothing but the loader runs: no GPU and no driver needed).
Only when both succeed does the node publish `interposer.available`; the device plugin checks at
every handout that the file is still there.

The GPU state directory (`--gpu-state-dir`), shared read-write by every share container of the
node for the interposer's priority between sharers, is created here too (mode 1777: containers
run as any user; the interposer makes its state files writable by all).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from node_agent.sharing.host_files import install_file

log = logging.getLogger(__name__)

LIBRARY_NAME = "liblinkpack_cuda.so"
#: the subdirectory of the shim's host directory the library is installed in (and mounted from)
INSTALL_SUBDIR = "interposer"
DEFAULT_INTERPOSER_LIB = f"/opt/linkpack/lib/{LIBRARY_NAME}"

_LOAD_CHECK = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"


def install_interposer(source: str | Path, shim_dir: str | Path) -> Path:
    """Copy the library to `<shim_dir>/interposer/` (created if missing) and return that directory.
    The file is replaced atomically and only when it differs, so a container starting meanwhile
    never maps half a library. Raises OSError when the source cannot be read or the directory
    cannot be written."""
    data = Path(source).read_bytes()
    directory = Path(shim_dir) / INSTALL_SUBDIR
    directory.mkdir(parents=True, exist_ok=True)
    install_file(directory / LIBRARY_NAME, data)
    return directory


def load_problem(library: str | Path, timeout_s: float = 20.0) -> str:
    """Why the library does not load ("" when it does): `ctypes.CDLL` in a child Python, so the
    agent's own process never maps it. The interposer is switched off there (a pure pass-through)."""
    env = {**os.environ, "LINKPACK_INTERPOSER": "off"}
    env.pop("LD_PRELOAD", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_CHECK, str(library)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the load check could not run: {exc}"
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"the load check exited with status {done.returncode}"
    return ""


def interposer_installed(directory: str | None) -> bool:
    """The library is in this install directory (None: no interposer on this node)."""
    return directory is not None and (Path(directory) / LIBRARY_NAME).is_file()


def prepare_interposer(source: str | None, shim_dir: str | None) -> str | None:
    """Install the interposer for the kubelet to mount: the directory holding it, or None (logged,
    and shares recorded for the interposer are held cooperatively) when there is no library to
    install, no shim directory to install it in, or the installed copy does not load."""
    if source is None:
        log.info("no CUDA interposer configured (--interposer-lib ''); shares are held without it")
        return None
    if shim_dir is None:
        log.warning("the CUDA interposer needs the shim's host directory (--shim-host-dir); not installed")
        return None
    try:
        directory = install_interposer(source, shim_dir)
    except OSError as exc:
        log.error("cannot install the CUDA interposer from %s in %s: %s", source, shim_dir, exc)
        return None
    problem = load_problem(directory / LIBRARY_NAME)
    if problem:
        log.error(
            "the CUDA interposer in %s does not load, shares are held without it: %s", directory, problem
        )
        return None
    log.info("CUDA interposer installed in %s", directory)
    return str(directory)


def prepare_gpu_state_dir(directory: str | None) -> str | None:
    """Create the GPU state directory shared by the node's share containers: the directory, or None
    (logged; the interposer then applies no priority between sharers) when it cannot be made."""
    if directory is None:
        return None
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)  # every container user creates and updates the per-GPU files
    except OSError as exc:
        log.error("cannot prepare the GPU state directory %s; no priority between sharers: %s", path, exc)
        return None
    return str(path)
