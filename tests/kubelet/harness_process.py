"""Build and drive tests/kubelet/harness: the kubelet's own device manager as a child process.

The binary is built with `go build` once per harness source and Kubernetes version, into a
cache directory (LINKPACK_CACHE_DIR, else ~/.cache/linkpack) so that later runs start at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HARNESS_SOURCE = Path(__file__).resolve().parent / "harness"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"
CHECKPOINT = DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"
BUILD_TIMEOUT_S = 1800


class HarnessUnavailable(RuntimeError):
    """The harness cannot be built or run here; the message says why (tests skip on it)."""


def kubernetes_version() -> str:
    found = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)", (HARNESS_SOURCE / "go.mod").read_text(), re.MULTILINE
    )
    if not found:
        raise HarnessUnavailable("tests/kubelet/harness/go.mod does not require k8s.io/kubernetes")
    return found.group(1)


def go_binary() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if found is None:
        raise HarnessUnavailable("no Go toolchain (go) on PATH")
    return found


def harness_binary() -> Path:
    """The built harness, building it first when this source and version have not been built."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((HARNESS_SOURCE / name).read_bytes())
    cache = Path(os.environ.get("LINKPACK_CACHE_DIR", Path.home() / ".cache" / "linkpack"))
    target = cache / "kubelet-harness" / f"{kubernetes_version()}-{digest.hexdigest()[:12]}" / "harness"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=target.parent)) / "harness"
    try:
        built = subprocess.run(
            [go_binary(), "build", "-o", str(partial), "."],
            cwd=HARNESS_SOURCE,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if built.returncode != 0:
            raise HarnessUnavailable(f"go build of the kubelet harness failed:\n{built.stderr[-4000:]}")
        partial.replace(target)
    finally:
        shutil.rmtree(partial.parent, ignore_errors=True)
    return target


class KubeletHarness:
    """One running harness; `send` one command, get its answer."""

    def __init__(self, binary: Path, log_path: Path) -> None:
        self._log = log_path.open("w")
        self._proc = subprocess.Popen(
            [str(binary), "-v=4"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )

    def send(self, cmd: str, timeout_s: float = 30.0, **fields: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"harness did not answer {cmd!r} within {timeout_s}s")
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"harness exited (rc={self._proc.poll()}) while answering {cmd!r}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                self.send("quit", timeout_s=10)
                self._proc.wait(timeout=10)
        except (OSError, TimeoutError, RuntimeError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait(timeout=10)
        finally:
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._log.close()
