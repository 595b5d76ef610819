"""MPS supervision against a fake `nvidia-cuda-mps-control` written by these tests.

The fake behaves as the real control program does where the supervisor looks: `-d` forks a
daemon and returns; the daemon writes `nvidia-cuda-mps-control.pid` in CUDA_MPS_PIPE_DIRECTORY,
logs to CUDA_MPS_LOG_DIRECTORY and serves commands on a socket in the pipe directory; without
`-d` the program is a client that sends each stdin line to the daemon and prints the answer,
exiting 1 when no daemon answers. `get_server_list` answers (no servers), `quit` ends the daemon.
A test crashes it with SIGKILL; while the file named by FAKE_MPS_REFUSE exists, `-d` fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.allocation import Enforcement
from node_agent.config import AgentConfig, parse_args
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import SharingConfig
from node_agent.deviceplugin.inventory import share_unit_id
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sharing.mps import PID_FILE, ExternalMps, MpsSettings, MpsSupervisor
from node_agent.sources.nvml_simulated import SimulatedNvml
from node_agent.wiring import start_mps
from tests.node_agent.fakes import FakeClock, FakeNodeApi
from tests.support.device_plugin import bound_pod, inventory, share, uuid
from tests.support.machines import catalog_machine, topo_text
from tests.support.resources import SHARED

FAKE_CONTROL = r"""
import os, socket, sys, time

pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
sock_path = os.path.join(pipe, "control.sock")
pid_path = os.path.join(pipe, "nvidia-cuda-mps-control.pid")


def log(line):
    with open(os.path.join(logs, "control.log"), "a") as f:
        f.write(f"[{time.time():.3f}] {line}\n")


def ask(line):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(sock_path)
    s.sendall(line.encode() + b"\n")
    s.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out.decode()


def client():
    for line in sys.stdin:
        try:
            sys.stdout.write(ask(line.strip()))
        except OSError:
            sys.stderr.write("Cannot find MPS control daemon process\n")
            sys.exit(1)


def daemon():
    refuse = os.environ.get("FAKE_MPS_REFUSE")
    if refuse and os.path.exists(refuse):
        sys.stderr.write("fake: refusing to start\n")
        sys.exit(1)
    try:
        ask("get_server_list")
        sys.stderr.write("An instance of this daemon is already running\n")
        sys.exit(1)
    except OSError:
        pass
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    server.listen(8)
    with open(pid_path, "w") as f:
        f.write(f"{os.getpid()}\n")
    log("control daemon started")
    while True:
        conn, _ = server.accept()
        with conn:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            command = data.decode().strip()
            log(f"command {command}")
            if command == "quit":
                os.unlink(pid_path)
                os.unlink(sock_path)
                log("quitting")
                conn.sendall(b"")
                os._exit(0)
            conn.sendall(b"" if command == "get_server_list" else b"unknown command\n")


if "-d" in sys.argv[1:]:
    daemon()
else:
    client()
"""


def fake_control(directory: Path) -> Path:
    """The fake control program, executable, with this interpreter."""
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(f"#!{sys.executable}\n{FAKE_CONTROL}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def short_dir(prefix: str) -> Path:
    """A directory under /tmp: unix socket paths must stay short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def _kill(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            text = Path(f"/proc/{pid}/stat").read_text()
            if text.rsplit(")", 1)[-1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} is still running")


class Mps:
    """A supervisor of the fake daemon, with a hand-moved clock for its back-off."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = root
        self.control = fake_control(tmp)
        self.refuse = tmp / "refuse"
        self.clock = FakeClock()
        self.settings = MpsSettings(
            control=str(self.control),
            pipe_dir=str(root / "pipe"),
            log_dir=str(root / "log"),
            backoff_initial_s=1.0,
            backoff_max_s=8.0,
        )
        self.pids: list[int] = []
        os.environ["FAKE_MPS_REFUSE"] = str(self.refuse)
        self.supervisor = MpsSupervisor(self.settings, clock=self.clock)

    def pid(self) -> int | None:
        pid = self.supervisor.pid()
        if pid is not None and pid not in self.pids:
            self.pids.append(pid)
        return pid

    def crash(self) -> int:
        pid = self.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        return pid


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Mps]:
    root = short_dir("lp-mps-")
    m = Mps(root, tmp_path)
    try:
        yield m
    finally:
        os.environ.pop("FAKE_MPS_REFUSE", None)
        m.pid()
        for pid in m.pids:
            _kill(pid)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(30)
def test_the_supervisor_starts_the_daemon_in_its_own_directories(mps: Mps) -> None:
    """The supervisor runs `-d` with the pipe and log directories it chose and reports MPS active once the daemon answers."""
    assert not mps.supervisor.active
    assert mps.supervisor.start() is True
    assert mps.supervisor.active and mps.supervisor.starts == 1
    assert (Path(mps.settings.pipe_dir) / PID_FILE).is_file() and mps.pid() is not None
    assert "control daemon started" in (Path(mps.settings.log_dir) / "control.log").read_text()
    assert mps.supervisor.check() is True and mps.supervisor.starts == 1  # a healthy daemon is left alone


@pytest.mark.timeout(30)
def test_a_crashed_daemon_is_reported_inactive_then_restarted_after_its_back_off(mps: Mps) -> None:
    """A daemon that crashed makes the next check report MPS inactive, and the check after the back-off restarts it."""
    mps.supervisor.start()
    first = mps.crash()
    assert mps.supervisor.check() is False and not mps.supervisor.active
    assert mps.supervisor.starts == 1  # not restarted on the poll that found it dead
    mps.clock.advance(0.5)
    assert mps.supervisor.check() is False and mps.supervisor.starts == 1  # back-off not over
    mps.clock.advance(0.5)
    assert mps.supervisor.check() is True and mps.supervisor.active
    assert mps.supervisor.starts == 2 and mps.pid() not in (None, first)


@pytest.mark.timeout(60)
def test_restarts_that_keep_failing_back_off_longer_each_time(mps: Mps) -> None:
    """Failing restarts are retried after 1, 2, 4 ... seconds (up to the maximum), and a success resets the back-off."""
    mps.supervisor.start()
    mps.refuse.touch()
    mps.crash()
    assert mps.supervisor.check() is False  # found dead: next try in 1 s
    attempts = []
    for _ in range(14):
        mps.clock.advance(1.0)
        before = mps.supervisor.starts
        assert mps.supervisor.check() is False
        attempts.append(mps.supervisor.starts - before)
    # tries at t=1, 3 (1+2), 7 (3+4), then every 8 s (the maximum): t=15
    assert [i + 1 for i, tried in enumerate(attempts) if tried] == [1, 3, 7]
    mps.refuse.unlink()
    mps.clock.advance(1.0)  # t=15
    assert mps.supervisor.check() is True
    mps.crash()
    assert mps.supervisor.check() is False
    mps.clock.advance(1.0)
    assert mps.supervisor.check() is True  # back to the first delay after a healthy spell


@pytest.mark.timeout(30)
def test_stop_asks_the_daemon_to_quit(mps: Mps) -> None:
    """Stopping the supervisor sends quit: the daemon exits, removes its pid file, and MPS is reported inactive."""
    mps.supervisor.start()
    pid = mps.pid()
    assert pid is not None
    mps.supervisor.stop()
    wait_gone(pid)
    assert not (Path(mps.settings.pipe_dir) / PID_FILE).exists()
    assert not mps.supervisor.active
    assert "command quit" in (Path(mps.settings.log_dir) / "control.log").read_text()


@pytest.mark.timeout(30)
def test_a_missing_control_binary_is_not_active_and_is_retried(tmp_path: Path) -> None:
    """Without the control binary the supervisor reports MPS inactive and keeps retrying with back-off."""
    root = short_dir("lp-mps-")
    clock = FakeClock()
    supervisor = MpsSupervisor(
        MpsSettings(control=str(tmp_path / "absent"), pipe_dir=str(root / "p"), log_dir=str(root / "l")),
        clock,
    )
    try:
        assert supervisor.start() is False and not supervisor.active
        clock.advance(1.0)
        assert supervisor.check() is False and supervisor.starts == 2
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(60)
def test_the_agent_publishes_mps_active_only_while_the_supervised_daemon_is_healthy(
    mps: Mps, tmp_path: Path
) -> None:
    """The agent's status says mps.active while the supervised daemon answers, false on the poll that finds it dead, true after the restart."""
    config = AgentConfig(node_name="n1", proc_root=tmp_path, mps_pipe_dir=mps.settings.pipe_dir)
    cluster = FakeNodeApi()
    text = topo_text("hgx-h100")
    agent = Agent(
        config,
        SimulatedNvml(catalog_machine("hgx-h100"), node_name="n1"),
        cluster,
        AgentMetrics(),
        lambda: text,
        mps.clock,
    )
    agent.mps = mps.supervisor
    mps.supervisor.start()
    agent.poll()
    assert cluster.status["mps"] == {"active": True}
    mps.crash()
    mps.clock.advance(5)
    agent.poll()
    assert cluster.status["mps"] == {"active": False}
    mps.clock.advance(5)
    agent.poll()
    assert cluster.status["mps"] == {"active": True}


@pytest.mark.timeout(30)
def test_an_mps_share_handed_out_while_the_daemon_is_down_is_held_cooperatively(mps: Mps) -> None:
    """A share recorded as hard MPS handed out while the supervised daemon is down is held cooperatively, and with MPS limits once it is back."""
    store = InMemoryPodRecords(
        [
            bound_pod("first", share(0, 1024, 1), bound_at=1, enforcement=Enforcement.HARD_MPS),
            bound_pod("second", share(1, 1024, 1), bound_at=2, enforcement=Enforcement.HARD_MPS),
        ]
    )
    sharing = SharingConfig(mps_pipe_dir=mps.settings.pipe_dir)
    broker = AllocationBroker(
        inventory(2, units_per_gpu=4), store, sharing, mps_ready=lambda: mps.supervisor.active
    )
    mps.supervisor.start()
    mps.crash()
    mps.supervisor.check()
    assert Path(mps.settings.pipe_dir).is_dir()  # the directory stays: only the daemon tells
    down = broker.allocate(SHARED, [share_unit_id(uuid(0), 0)])
    assert down.enforcement is Enforcement.COOPERATIVE and "MPS does not serve" in down.fallback
    mps.clock.advance(1)
    mps.supervisor.check()
    up = broker.allocate(SHARED, [share_unit_id(uuid(1), 0)])
    assert (
        up.enforcement is Enforcement.HARD_MPS and up.env("CUDA_MPS_PIPE_DIRECTORY") == mps.settings.pipe_dir
    )
    assert broker.counters.fallbacks == {"hard-mps": 1}


@pytest.mark.timeout(30)
def test_dash_dash_mps_starts_the_supervised_daemon_from_the_command_line(mps: Mps) -> None:
    """`--mps` with `--mps-control` and the MPS directories starts a supervised daemon; without `--mps` none is started."""
    config = parse_args(
        [
            "--no-kube",
            "--mps",
            "--mps-control",
            str(mps.control),
            "--mps-pipe-dir",
            mps.settings.pipe_dir,
            "--mps-log-dir",
            mps.settings.log_dir,
        ],
        env={},
    )
    assert config.mps_supervise and config.mps_pipe_dir == mps.settings.pipe_dir
    supervisor = start_mps(config)
    assert supervisor is not None and supervisor.active
    mps.pid()
    supervisor.stop()
    assert start_mps(parse_args(["--no-kube"], env={})) is None
    defaults = parse_args(["--no-kube", "--mps"], env={})
    assert (
        defaults.mps_pipe_dir == "/var/lib/linkpack/mps/pipe"
        and defaults.mps_log_dir == "/var/lib/linkpack/mps/log"
    )


@pytest.mark.timeout(10)
def test_an_external_daemon_counts_while_its_pipe_directory_exists(tmp_path: Path) -> None:
    """With `--mps-pipe-dir` alone, MPS is active while the external daemon's pipe directory exists, as before."""
    external = ExternalMps(str(tmp_path / "pipe"))
    assert external.check() is False
    (tmp_path / "pipe").mkdir()
    assert external.check() is True and external.active
    assert ExternalMps(None).active is False
