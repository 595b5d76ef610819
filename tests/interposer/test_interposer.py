"""The CUDA driver-API interposer (node_agent/sharing/interposer) on a fake libcuda, without a GPU.

Memory: caps on every allocation path, one budget per container across processes, usage of killed
processes reclaimed. Symbols: wrappers reached through linking, dlsym and cuGetProcAddress. Compute:
the time-slice quota measured on the fake's GPU timeline, throughput under the quota, priority.
Also the kill switch and the one-line reports when a limit cannot be held.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.interposer.conftest import Build, hooked_entry_points

MIB = 1 << 20
CAP_MIB = 1024
OOM = "err 2"
PREFIX = "linkpack-interposer:"

# The quota tests compare the GPU time a program got with its share: within QUOTA_TOLERANCE (absolute).
QUOTA_TOLERANCE = 0.05


class Probe:
    """A running memprobe: one command line in, one answer line out."""

    def __init__(self, build: Build, env: dict[str, str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self._err = stderr_path.open("w")
        self.proc = subprocess.Popen(
            [str(build.memprobe)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            env=env,
            bufsize=1,
        )

    def cmd(self, line: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise AssertionError(f"memprobe ended at {line!r}; stderr: {self.stderr()}")
        return answer.strip()

    def alloc(self, kind: str, mib: int, via: str = "direct") -> str:
        return self.cmd(f"alloc {kind} {mib * MIB} {via}")

    def info(self, via: str = "direct") -> tuple[int, int]:
        word, free, total = self.cmd(f"info {via}").split()
        assert word == "info"
        return int(free), int(total)

    def calls(self) -> int:
        return int(self.cmd("calls").split()[1])

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, OSError):
                self.cmd("quit")
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe:
                pipe.close()
        if not self._err.closed:
            self._err.close()


@pytest.fixture
def probes(build: Build, tmp_path: Path) -> Iterator:
    """A factory of memprobes (initialised), all closed at the end of the test."""
    started: list[Probe] = []

    def start(init: bool = True, **env: object) -> Probe:
        env.setdefault("LINKPACK_MEMORY_LIMIT_MIB", CAP_MIB)
        probe = Probe(build, build.env(tmp_path, **env), tmp_path / f"memprobe-{len(started)}.err")
        started.append(probe)
        if init:
            assert probe.cmd("init") == "ok"
        return probe

    yield start
    for probe in started:
        probe.close()


@dataclass
class LaunchRun:
    t0: int
    t1: int
    launches: int
    kernel_us: int
    samples: list[tuple[int, int]]
    stderr: str

    @property
    def busy(self) -> float:
        """The share of wall time the program's kernels kept the (fake) GPU busy."""
        return self.launches * self.kernel_us * 1000 / (self.t1 - self.t0)

    def completed_at(self, t: int) -> int:
        done = 0
        for when, count in self.samples:
            if when <= t:
                done = count
        return done

    def busy_between(self, a: int, b: int) -> float:
        return (self.completed_at(b) - self.completed_at(a)) * self.kernel_us * 1000 / (b - a)


def start_launches(
    build: Build,
    env: dict[str, str],
    seconds: float,
    kernel_us: int,
    api: str = "launch",
    via: str = "direct",
    sync_every: int = 0,
    gap_us: int = 0,
) -> tuple[subprocess.Popen, int]:
    args = [str(build.launchprobe), str(seconds), str(kernel_us), api, via, str(sync_every), str(gap_us)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, kernel_us


def finish(started: tuple[subprocess.Popen, int]) -> LaunchRun:
    proc, kernel_us = started
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"launchprobe failed: {out}\n{err}"
    lines = [line.split() for line in out.splitlines()]
    assert lines[0][0] == "start" and lines[-1][0] == "end", out
    samples = [(int(x[1]), int(x[2])) for x in lines if x[0] == "s"]
    return LaunchRun(int(lines[0][1]), int(lines[-1][1]), int(lines[-1][2]), kernel_us, samples, err)


# ------------------------------------------------------------------------------------------------
# memory


@pytest.mark.timeout(30)
def test_allocation_past_the_cap_is_refused_without_reaching_the_driver(probes) -> None:
    """Allocations succeed up to the cap, the next one gets CUDA_ERROR_OUT_OF_MEMORY from the interposer
    alone, and cuMemGetInfo / cuDeviceTotalMem report the cap."""
    p = probes()
    assert p.info() == (CAP_MIB * MIB, CAP_MIB * MIB)
    assert p.cmd("total") == f"total {CAP_MIB * MIB}"
    assert p.alloc("mem", 512) == "ok 0"
    assert p.alloc("mem", 512) == "ok 1"
    calls = p.calls()
    assert p.alloc("mem", 1) == OOM
    assert p.calls() == calls, "the refused allocation reached the driver"
    assert p.info() == (0, CAP_MIB * MIB)
    assert p.cmd("free 0") == "ok"
    assert p.info() == (512 * MIB, CAP_MIB * MIB)
    assert p.alloc("mem", 512).startswith("ok")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "kind", ["mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"]
)
def test_every_allocation_path_counts_against_the_cap(probes, kind: str) -> None:
    """Each allocation entry point, reached directly, through dlsym and through cuGetProcAddress, is
    counted against the cap, refused past it, and credited back by its free."""
    p = probes()
    assert p.alloc(kind, 512, "direct") == "ok 0"
    assert p.alloc(kind, 256, "dlsym") == "ok 1"
    assert p.alloc(kind, 256, "proc") == "ok 2"
    assert p.info() == (0, CAP_MIB * MIB)
    for via in ("direct", "dlsym", "proc"):
        assert p.alloc(kind, 1, via) == OOM, via
    assert p.cmd("free 1") == "ok"
    assert p.info("proc") == (256 * MIB, CAP_MIB * MIB)
    assert p.cmd("free 0") == "ok"
    assert p.cmd("free 2") == "ok"
    assert p.info("dlsym") == (CAP_MIB * MIB, CAP_MIB * MIB)


@pytest.mark.timeout(30)
def test_symbols_resolve_to_the_wrappers(probes) -> None:
    """dlsym on libcuda and cuGetProcAddress(_v2) hand back the wrappers for hooked entry points, by
    version and per-thread flag as the driver maps them, and the real driver for everything else."""
    p = probes()
    for name in ("cuMemAlloc_v2", "cuMemGetInfo_v2", "cuLaunchKernel", "cuGetProcAddress", "cuMemCreate"):
        assert p.cmd(f"sym {name}") == "sym wrapper", name
    assert p.cmd("sym cuDriverGetVersion") == "sym real"
    assert p.cmd("sym cuStreamSynchronize") == "sym real"
    expectations = [
        ("cuMemAlloc 3020 0 cuMemAlloc_v2", "wrapper"),
        ("cuMemAlloc 12000 0 cuMemAlloc_v2", "wrapper"),
        ("cuMemGetInfo 12000 0 cuMemGetInfo_v2", "wrapper"),
        ("cuMemFree 12000 0 cuMemFree_v2", "wrapper"),
        ("cuLaunchKernel 12000 0 cuLaunchKernel", "wrapper"),
        ("cuLaunchKernel 12000 2 cuLaunchKernel_ptsz", "wrapper"),
        ("cuMemAllocAsync 12000 2 cuMemAllocAsync_ptsz", "wrapper"),
        ("cuGraphLaunch 12000 2 cuGraphLaunch_ptsz", "wrapper"),
        ("cuGetProcAddress 12000 0 cuGetProcAddress_v2", "wrapper"),
        ("cuGetProcAddress 11030 0 cuGetProcAddress", "wrapper"),
        ("cuMemAlloc 12000 0 cuMemAlloc_v2 v1", "wrapper"),
        ("cuDriverGetVersion 12000 0 cuDriverGetVersion", "real"),
        ("cuStreamSynchronize 12000 2 cuStreamSynchronize_ptsz", "real"),
    ]
    for query, kind in expectations:
        assert p.cmd(f"proc {query}") == f"proc 0 {kind}", query
    assert p.stderr() == ""


@pytest.mark.timeout(30)
def test_every_hooked_entry_point_resolves_to_its_wrapper(probes) -> None:
    """Every entry point in the interposer's list (lp_hooks.h) is exported and handed out for the driver's
    own: by dlsym on libcuda, and by cuGetProcAddress for its family, version and per-thread flag."""
    hooks = hooked_entry_points()
    assert len({h.name for h in hooks}) == len(hooks), hooks
    p = probes()
    for hook in hooks:
        flags = 2 if hook.per_thread else 0  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        assert p.cmd(f"sym {hook.name}") == "sym wrapper", hook
        assert p.cmd(f"proc {hook.family} {hook.since} {flags} {hook.name}") == "proc 0 wrapper", hook
    assert p.stderr() == ""


@pytest.mark.timeout(30)
def test_unwrapped_symbol_version_is_reported(probes) -> None:
    """Asking cuGetProcAddress for a hooked family at a version with no wrapper (the 32-bit legacy
    cuMemAlloc) returns the driver's entry point and says on stderr that it is not held to the limits."""
    p = probes()
    assert p.cmd("proc cuMemAlloc 2000 0 cuMemAlloc") == "proc 0 real"
    p.close()
    assert f"{PREFIX} no wrapper for cuMemAlloc at CUDA version 2000" in p.stderr()


@pytest.mark.timeout(30)
def test_processes_of_a_container_share_one_budget(probes) -> None:
    """Processes with one accounting file draw on one budget: what one holds, the others cannot get,
    until it is freed."""
    a, b, c = probes(), probes(), probes()
    assert a.alloc("mem", 512).startswith("ok")
    assert b.alloc("vmm", 256).startswith("ok")
    assert c.info() == (256 * MIB, CAP_MIB * MIB)
    assert c.alloc("mem", 512) == OOM
    assert c.alloc("array", 256) == "ok 0"
    assert a.info() == (0, CAP_MIB * MIB)
    assert b.alloc("mem", 1) == OOM
    assert a.cmd("free 0") == "ok"
    assert c.alloc("managed", 512) == "ok 1"


@pytest.mark.timeout(30)
def test_usage_of_a_killed_process_is_reclaimed(probes) -> None:
    """A process SIGKILLed while it allocates and frees leaves nothing behind: the next process to touch
    the table reclaims its usage, also while it is an unreaped zombie."""
    victim = probes()
    assert victim.cmd("churn 67108864") == "churning"
    time.sleep(0.3)
    other = probes()
    free, _ = other.info()
    assert free <= CAP_MIB * MIB // 2 + 64 * MIB, "the churning process holds at least half of the cap"
    victim.proc.send_signal(signal.SIGKILL)
    stat = Path(f"/proc/{victim.proc.pid}/stat")
    deadline = time.monotonic() + 5
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert other.info() == (CAP_MIB * MIB, CAP_MIB * MIB), "a zombie's usage is reclaimed"
    victim.proc.wait()
    assert other.alloc("mem", CAP_MIB) == "ok 0"

    again = probes()  # and with the process reaped, a newcomer sees the same
    assert again.alloc("mem", 1) == OOM
    assert other.cmd("free 0") == "ok"
    assert again.alloc("mem", CAP_MIB) == "ok 0"


@pytest.mark.timeout(30)
def test_python_ctypes_program_is_held_to_the_cap(build: Build, tmp_path: Path) -> None:
    """A Python program using libcuda through ctypes gets the wrappers both from ctypes' dlsym and from
    cuGetProcAddress_v2, is refused past the cap both ways, and sees the cap in cuMemGetInfo."""
    env = build.env(tmp_path, LINKPACK_MEMORY_LIMIT_MIB=CAP_MIB)
    done = subprocess.run(
        [sys.executable, str(build.ctypes_probe), str(CAP_MIB)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    cap = CAP_MIB * MIB
    assert out["init"] == [0, 0, 0]
    assert out["direct_is_wrapper"] and out["proc_is_wrapper"]
    assert out["alloc_half_direct"] == 0 and out["alloc_half_proc"] == 0
    assert out["past_cap_direct"] == 2 and out["past_cap_proc"] == 2
    assert out["info_full_direct"] == [0, 0, cap] and out["info_full_proc"] == [0, 0, cap]
    assert out["free_proc"] == 0 and out["info_after_free"] == [0, cap // 2, cap]
    assert out["free_direct"] == 0 and out["info_empty"] == [0, cap, cap]
    assert PREFIX not in done.stderr


@pytest.mark.timeout(30)
def test_rtld_next_still_means_after_the_caller(build: Build, tmp_path: Path) -> None:
    """With the interposer's dlsym in front, dlsym(RTLD_NEXT, ...) from a library still finds the next
    definition after that library, not after the interposer."""
    done = subprocess.run(
        [str(build.nextprobe)],
        env=build.env(tmp_path),
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert done.stdout.strip() == "3"


# ------------------------------------------------------------------------------------------------
# compute


def compute_env(build: Build, tmp: Path, name: str, **env: object) -> dict[str, str]:
    """An environment with its own accounting file (so its own token bucket) unless one is given."""
    env.setdefault("LINKPACK_ACCOUNTING_FILE", tmp / f"accounting-{name}")
    return build.env(tmp, **env)


@pytest.mark.timeout(40)
def test_time_slice_quota_holds_the_share(build: Build, tmp_path: Path) -> None:
    """Programs launching 2 ms kernels flat out for 3 s get 0.3 and 0.7 of the GPU's time at 30 and 70
    units (within QUOTA_TOLERANCE), and all of it without a quota."""
    runs = {
        units: start_launches(
            build, compute_env(build, tmp_path, str(units), LINKPACK_COMPUTE_UNITS=units), 3, 2000
        )
        for units in (30, 70, 100)
    }
    busy = {units: finish(run).busy for units, run in runs.items()}
    assert busy[30] == pytest.approx(0.30, abs=QUOTA_TOLERANCE), busy
    assert busy[70] == pytest.approx(0.70, abs=QUOTA_TOLERANCE), busy
    assert busy[100] > 0.95, busy


@pytest.mark.timeout(40)
@pytest.mark.parametrize(
    "api_via", [("ex", "direct"), ("coop", "direct"), ("graph", "proc"), ("ptsz", "proc")]
)
def test_every_launch_path_is_paced(build: Build, tmp_path: Path, api_via: tuple[str, str]) -> None:
    """cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and the per-thread-stream launch from
    cuGetProcAddress are held to the quota like cuLaunchKernel."""
    api, via = api_via
    run = finish(
        start_launches(
            build, compute_env(build, tmp_path, api, LINKPACK_COMPUTE_UNITS=50), 1.5, 2000, api, via
        )
    )
    assert run.busy == pytest.approx(0.5, abs=QUOTA_TOLERANCE)


@pytest.mark.timeout(40)
def test_a_program_under_its_quota_keeps_its_throughput(build: Build, tmp_path: Path) -> None:
    """A program using about 20% of the GPU (2 ms kernels, 8 ms idle) runs as fast under a 50-unit quota
    as without one: pacing only delays launches over the share."""
    paced = start_launches(
        build, compute_env(build, tmp_path, "50", LINKPACK_COMPUTE_UNITS=50), 1.5, 2000, gap_us=8000
    )
    free = start_launches(build, compute_env(build, tmp_path, "free"), 1.5, 2000, gap_us=8000)
    paced_run, free_run = finish(paced), finish(free)
    assert 0.1 < free_run.busy < 0.25, free_run.busy  # well under the 50-unit share
    assert paced_run.launches >= 0.9 * free_run.launches, (paced_run.launches, free_run.launches)


@pytest.mark.timeout(40)
def test_a_containers_processes_share_one_compute_budget(build: Build, tmp_path: Path) -> None:
    """Two processes of one container (one accounting file) at 40 units get 0.4 of the GPU's time
    together, not each."""
    env = compute_env(build, tmp_path, "shared", LINKPACK_COMPUTE_UNITS=40)
    runs = [finish(r) for r in [start_launches(build, env, 2, 2000) for _ in range(2)]]
    assert sum(r.busy for r in runs) == pytest.approx(0.4, abs=QUOTA_TOLERANCE), [r.busy for r in runs]


@pytest.mark.timeout(40)
def test_low_priority_yields_while_high_priority_is_busy(build: Build, tmp_path: Path) -> None:
    """On one (fake, shared) GPU, a low-priority process's launches wait while a high-priority one
    launches, so the high one keeps its solo throughput; with both at normal priority they split it."""

    def scenario(name: str, low: str, high: str):
        where = tmp_path / name
        where.mkdir()
        common = {
            "LINKPACK_GPU_STATE_DIR": where,
            "NVIDIA_VISIBLE_DEVICES": f"GPU-fake-{name}",
            "FAKE_CUDA_SHARED_DEVICE": where / "device",
        }
        low_env = compute_env(build, where, "low", LINKPACK_COMPUTE_PRIORITY=low, **common)
        high_env = compute_env(build, where, "high", LINKPACK_COMPUTE_PRIORITY=high, **common)
        return low_env, high_env

    scenarios = {
        "priority": scenario("priority", "low", "high"),
        "control": scenario("control", "normal", "normal"),
    }
    lows = {
        name: start_launches(build, envs[0], 2.5, 1000, sync_every=10) for name, envs in scenarios.items()
    }
    time.sleep(0.5)
    highs = {
        name: start_launches(build, envs[1], 1.0, 1000, sync_every=10) for name, envs in scenarios.items()
    }
    high = {name: finish(run) for name, run in highs.items()}
    low = {name: finish(run) for name, run in lows.items()}

    assert high["priority"].busy > 0.85, high["priority"].busy
    assert low["priority"].busy_between(high["priority"].t0, high["priority"].t1) < 0.1
    assert low["priority"].busy_between(high["priority"].t1 + 100_000_000, low["priority"].t1) > 0.8
    assert high["control"].busy < 0.7, high["control"].busy  # without priority the GPU is split
    assert PREFIX not in low["priority"].stderr + high["priority"].stderr


# ------------------------------------------------------------------------------------------------
# kill switch and reports


@pytest.mark.timeout(30)
def test_kill_switch_makes_every_wrapper_a_pass_through(build: Build, probes, tmp_path: Path) -> None:
    """LINKPACK_INTERPOSER=off: no cap, the driver's own memory figures and entry points, no pacing."""
    p = probes(LINKPACK_INTERPOSER="off")
    assert p.alloc("mem", 2 * CAP_MIB) == "ok 0"
    free, total = p.info()
    assert total == 80 * 1024 * MIB and free == total - 2 * CAP_MIB * MIB
    assert p.cmd("sym cuMemAlloc_v2") == "sym real"
    assert p.cmd("proc cuMemAlloc 12000 0 cuMemAlloc_v2") == "proc 0 real"
    assert p.stderr() == ""
    env = compute_env(build, tmp_path, "off", LINKPACK_INTERPOSER="off", LINKPACK_COMPUTE_UNITS=30)
    assert finish(start_launches(build, env, 0.5, 2000)).busy > 0.95


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"LINKPACK_ACCOUNTING_FILE": "/nonexistent-dir/accounting"},
            "accounting file /nonexistent-dir/accounting",
        ),
        (
            {"LINKPACK_REAL_LIBCUDA": "/nonexistent-dir/libcuda.so.1"},
            "real CUDA driver /nonexistent-dir/libcuda.so.1",
        ),
        ({"LINKPACK_COMPUTE_PRIORITY": "high"}, "needs LINKPACK_GPU_STATE_DIR"),
        (
            {"LINKPACK_COMPUTE_PRIORITY": "low", "LINKPACK_GPU_STATE_DIR": "/nonexistent-dir"},
            "GPU state file",
        ),
    ],
    ids=["accounting-file", "real-driver", "priority-without-dir", "priority-bad-dir"],
)
def test_a_limit_that_cannot_be_held_is_reported(
    build: Build, probes, tmp_path: Path, env: dict, expected: str
) -> None:
    """When a limit cannot be held (unusable accounting file, driver not found, priority without its
    state file) the interposer says so in one line on stderr, and holds what it still can."""
    p = probes(**env)
    answer = p.alloc("mem", CAP_MIB + 1)
    if "LINKPACK_REAL_LIBCUDA" in env:
        assert answer == "err 500"  # CUDA_ERROR_NOT_FOUND: nothing to pass the call to
    else:
        assert answer == OOM  # the cap still holds, per process if need be
    launched = subprocess.run(
        [str(build.launchprobe), "0.2", "1000"],
        env=build.env(tmp_path, LINKPACK_COMPUTE_UNITS=50, **env),
        capture_output=True,
        text=True,
        timeout=20,
    )
    p.close()
    lines = [line for line in (p.stderr() + launched.stderr).splitlines() if line.startswith(PREFIX)]
    assert any(expected in line for line in lines), lines
