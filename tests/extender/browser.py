"""A headless Chromium for page tests, and an app served on loopback for it to load.

`ensure_chromium()` installs Debian's `chromium` package when no browser is on PATH (apt-get as
root, else through `sudo -n`); it raises `BrowserUnavailable` with the reason when that fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

_CANDIDATES = ("chromium", "chromium-browser")
_INSTALL_TIMEOUT_S = 900
_INSTALL_LOCK = threading.Lock()


class BrowserUnavailable(RuntimeError):
    """No Chromium, and it could not be installed; the message has the installer's output tail."""


def find_chromium() -> str | None:
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _apt(args: Sequence[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["apt-get", *args]
    if shutil.which("sudo"):
        return ["sudo", "-n", "apt-get", *args]
    raise BrowserUnavailable("chromium is not installed and this user can neither run apt-get nor sudo")


def ensure_chromium() -> str:
    """The path of a Chromium binary, installing Debian's package first when there is none."""
    with _INSTALL_LOCK:
        found = find_chromium()
        if found:
            return found
        if not shutil.which("apt-get"):
            raise BrowserUnavailable("chromium is not installed and there is no apt-get to install it")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in (["update", "-q"], ["install", "-y", "-q", "chromium"]):
            try:
                done = subprocess.run(
                    _apt(args),
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=_INSTALL_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BrowserUnavailable(f"apt-get {' '.join(args)} failed: {exc}") from exc
            if done.returncode != 0:
                tail = (done.stdout + done.stderr)[-2000:]
                raise BrowserUnavailable(f"apt-get {' '.join(args)} exited {done.returncode}:\n{tail}")
        found = find_chromium()
        if not found:
            raise BrowserUnavailable("apt-get installed chromium but no chromium binary is on PATH")
        return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(app: FastAPI, timeout_s: float = 20.0) -> Iterator[str]:
    """Run `app` with uvicorn on a free loopback port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="page-test-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {base}")
            time.sleep(0.05)
        httpx.get(f"{base}/healthz", timeout=5).raise_for_status()
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def run_chromium(
    binary: str, url: str, extra: Sequence[str], profile: Path, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run against `url` (a throwaway profile, no sandbox: tests run as root)."""
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *extra,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
