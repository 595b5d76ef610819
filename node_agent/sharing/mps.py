"""Whether CUDA MPS serves this node's GPU shares, and the control daemon the agent can supervise.

Two ways a node gets MPS:

- **external** (`--mps-pipe-dir` alone): someone else runs the control daemon; the node says
  `mps.active` while that pipe directory exists (`ExternalMps`). It does not talk to the daemon,
  so a daemon that died but left its directory behind still counts as active.
- **supervised** (`--mps`): the agent runs `nvidia-cuda-mps-control -d` itself (`MpsSupervisor`)
  with `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` set to host directories it chose,
  checks at every poll that the daemon of its pid file (`nvidia-cuda-mps-control.pid` in the pipe
  directory) is alive and answers `get_server_list`, restarts it with a growing back-off when it
  does not, and stops it (`quit`) when the agent stops. `mps.active` is true only while it answers.
  It never changes the GPUs' compute mode (an operator's decision, `nvidia-smi -c`).

The extender decides each share's enforcement from the published status at bind time and records
it in the allocation; the device plugin applies the record, and asks `active` again when it
hands a share out (a share recorded as MPS on a node where MPS stopped is held cooperatively).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_MPS_ROOT = "/var/lib/linkpack/mps"
DEFAULT_MPS_PIPE_DIR = f"{DEFAULT_MPS_ROOT}/pipe"
DEFAULT_MPS_LOG_DIR = f"{DEFAULT_MPS_ROOT}/log"
#: the control daemon writes its pid here, in its pipe directory
PID_FILE = "nvidia-cuda-mps-control.pid"


def mps_active(pipe_dir: str | None) -> bool:
    """A pipe directory is configured and exists."""
    return pipe_dir is not None and Path(pipe_dir).is_dir()


class MpsService(Protocol):
    """What the agent asks about MPS: `check` once per poll, `active` whenever (cheap)."""

    @property
    def active(self) -> bool: ...

    def check(self) -> bool: ...


class ExternalMps:
    """An MPS control daemon run by someone else: active while its pipe directory exists."""

    def __init__(self, pipe_dir: str | None) -> None:
        self.pipe_dir = pipe_dir

    @property
    def active(self) -> bool:
        return mps_active(self.pipe_dir)

    def check(self) -> bool:
        return self.active


@dataclass(frozen=True, slots=True)
class MpsSettings:
    """How the agent runs the control daemon."""

    control: str = DEFAULT_MPS_CONTROL  # path of nvidia-cuda-mps-control (or its name on PATH)
    pipe_dir: str = DEFAULT_MPS_PIPE_DIR
    log_dir: str = DEFAULT_MPS_LOG_DIR
    command_timeout_s: float = 5.0  # one control command (get_server_list, quit)
    start_timeout_s: float = 10.0  # from `-d` until the daemon answers
    backoff_initial_s: float = 1.0  # first restart this long after the daemon was found dead
    backoff_max_s: float = 300.0


class MpsSupervisor:
    """Runs and watches one MPS control daemon. `start`, then `check` at every poll, `stop` at the
    end. `active` is true only while the daemon answered the last check. Not thread-safe except
    `active`, which any thread may read. `clock` times the back-off between restarts (the waits
    for the daemon to answer or to go are real time)."""

    def __init__(self, settings: MpsSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._active = False
        self._failures = 0  # restarts in a row that did not give a healthy daemon
        self._next_start = 0.0
        self.starts = 0  # how often the daemon was launched (for tests and logs)

    @property
    def active(self) -> bool:
        return self._active

    @property
    def env(self) -> Mapping[str, str]:
        """The environment of the daemon and of every control command."""
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": self.settings.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": self.settings.log_dir,
        }

    def start(self) -> bool:
        """Launch the daemon unless one already answers in the pipe directory; whether it answers."""
        if self._answers():
            log.info("an MPS control daemon already answers in %s; supervising it", self.settings.pipe_dir)
            return self._healthy()
        try:
            Path(self.settings.pipe_dir).mkdir(parents=True, exist_ok=True)
            Path(self.settings.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.error("cannot create the MPS directories: %s", exc)
            return self._unhealthy()
        self._clear_stale_pid_file()
        self.starts += 1
        problem = self._launch()
        if problem:
            log.error("MPS control daemon did not start: %s", problem)
            return self._unhealthy()
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not self._answers():
            if time.monotonic() >= deadline:
                log.error(
                    "MPS control daemon started but does not answer in %s after %.0f s (see %s)",
                    self.settings.pipe_dir,
                    self.settings.start_timeout_s,
                    self.settings.log_dir,
                )
                return self._unhealthy()
            time.sleep(0.05)
        log.info("MPS control daemon serving in %s (pid %s)", self.settings.pipe_dir, self.pid() or "?")
        return self._healthy()

    def check(self) -> bool:
        """Once per poll: is the daemon answering? When not, restart it once its back-off is over
        (the poll that finds it dead reports inactive; the restart comes at a later one)."""
        if self._answers():
            if not self._active:
                log.info("MPS control daemon answers again")
            return self._healthy()
        if self._active:
            log.error("MPS control daemon in %s stopped answering", self.settings.pipe_dir)
            self._unhealthy()
            return False
        if self._clock() < self._next_start:
            return False
        log.warning("restarting the MPS control daemon (attempt %d)", self._failures + 1)
        return self.start()

    def stop(self) -> None:
        """Ask the daemon to quit. It stops taking clients and exits once its running clients are
        done (it is never killed: that would break them); this waits a little for it to go."""
        self._active = False
        pid = self.pid()
        if self._command("quit") is None:
            log.warning("MPS control daemon in %s did not answer quit", self.settings.pipe_dir)
            return
        deadline = time.monotonic() + self.settings.command_timeout_s
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid is not None and _alive(pid):
            log.info("MPS control daemon %d is quitting; it exits when its clients are done", pid)
        else:
            log.info("MPS control daemon stopped")

    def pid(self) -> int | None:
        """The daemon's pid from its pid file, or None."""
        try:
            return int((Path(self.settings.pipe_dir) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------------ inside

    def _healthy(self) -> bool:
        self._active = True
        self._failures = 0
        return True

    def _unhealthy(self) -> bool:
        self._active = False
        doubling = 2 ** min(self._failures, 30)  # bounded: a daemon may stay broken for days
        delay = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * doubling)
        self._failures += 1
        self._next_start = self._clock() + delay
        return False

    def _answers(self) -> bool:
        """The daemon of the pid file is alive (not a zombie) and answers `get_server_list`."""
        pid = self.pid()
        if pid is None or not _alive(pid):
            return False
        return self._command("get_server_list") is not None

    def _command(self, line: str) -> str | None:
        """A control command's output, or None when the daemon does not answer."""
        try:
            done = subprocess.run(
                [self.settings.control],
                input=line + "\n",
                env=dict(self.env),
                capture_output=True,
                text=True,
                timeout=self.settings.command_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def _launch(self) -> str:
        """Run `control -d` (it forks the daemon and returns); why it failed, or ""."""
        log_path = Path(self.settings.log_dir) / "linkpack-supervisor.log"
        try:
            with log_path.open("ab") as out:
                done = subprocess.run(
                    [self.settings.control, "-d"],
                    env=dict(self.env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,  # never a pipe: the daemon inherits it and would keep it open
                    stderr=out,
                    timeout=self.settings.start_timeout_s,
                    start_new_session=True,
                    check=False,
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return (
            ""
            if done.returncode == 0
            else f"`{self.settings.control} -d` exited {done.returncode} (see {log_path})"
        )

    def _clear_stale_pid_file(self) -> None:
        pid = self.pid()
        if pid is not None and not _alive(pid):
            (Path(self.settings.pipe_dir) / PID_FILE).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc to ask: it exists
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]
