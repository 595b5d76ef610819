"""GPU memory watchdog: which pod uses how much memory on which GPU, and who is over its share.

Per-process memory comes from NVML; a PID is mapped to its pod through `/proc/<pid>/cgroup`
(the agent needs `hostPID: true`). Both cgroup layouts are understood:
- systemd driver: `.../kubepods-burstable-pod1b2c3d4e_..._.slice/cri-containerd-<id>.scope`
  (the pod UID with underscores for dashes);
- cgroupfs driver: `/kubepods/burstable/pod1b2c3d4e-.../<container id>`;
  guaranteed pods have no QoS level (`kubepods-pod<uid>.slice`, `/kubepods/pod<uid>/`).

A pod's share on a GPU is the memory grant in its `linkpack.io/allocation` annotation, whatever
the record's enforcement level; whole GPUs and MIG instances have no memory share to police.
Each violation carries the record's level, so its event and metric tell an expected overrun (a
`cooperative` share: the framework shim's caps can be lifted) from a bug (an `interposer` or
`hard-mps` share should have been refused the memory). A share the device plugin had to hold
more weakly than its record (`linkpack_agent_enforcement_fallbacks`) is still named by its
record's level. `assess` is pure; `Watchdog` fetches, reports each violation once per episode
and, when configured, kills the offending processes.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.allocation import AllocationError, Enforcement, decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from node_agent.kube.node_api import PodInfo
from node_agent.metrics import PodGpuMemory
from node_agent.sources.nvml_reader import NvmlError, NvmlReader

_MIB = 1024 * 1024
_HEX = "[0-9a-fA-F]"
_POD_UID_RE = re.compile(
    rf"(?:^|[/\-])pod({_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}})(?=\.slice|/|$)"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a `/proc/<pid>/cgroup` file (v1 or v2, systemd or cgroupfs), or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        match = _POD_UID_RE.search(path)
        if match:
            return match.group(1).replace("_", "-").lower()
    return None


def read_pod_uid(pid: int, proc_root: Path) -> str | None:
    """The pod of a host PID, or None when the process is gone, unreadable or not in a pod."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return pod_uid_from_cgroup(text)


@dataclass(frozen=True, slots=True)
class ProcessUse:
    gpu_index: int
    pid: int
    used_bytes: int
    pod_uid: str | None


@dataclass(frozen=True, slots=True)
class Share:
    """A pod's memory share on one GPU; `limit_bytes` None means nothing to police."""

    pod_uid: str
    namespace: str
    pod: str
    gpu_index: int
    limit_bytes: int | None
    enforcement: str = ""  # the level the allocation record says (contract.allocation.Enforcement)


#: what an overrun means at each level of a share's record
_OVERRUN_MEANING = {
    Enforcement.COOPERATIVE.value: "expected at this level: the framework caps can be lifted",
    Enforcement.INTERPOSER.value: "the CUDA interposer should have refused this; it counts allocations "
    "only, so a few hundred MiB over is the driver's own memory (see --watchdog-tolerance-mib), more is a bug",
    Enforcement.HARD_MPS.value: "MPS should have refused this; a few hundred MiB over is the driver's own "
    "memory (see --watchdog-tolerance-mib), more means the MPS limits did not apply",
}


@dataclass(frozen=True, slots=True)
class Violation:
    pod_uid: str
    namespace: str
    pod: str
    gpu_index: int
    used_bytes: int
    limit_bytes: int
    pids: tuple[int, ...]
    enforcement: str = ""  # the level of the pod's allocation record

    @property
    def message(self) -> str:
        text = (
            f"pod {self.namespace}/{self.pod} uses {self.used_bytes // _MIB} MiB on GPU {self.gpu_index}, "
            f"above its share of {self.limit_bytes // _MIB} MiB (processes {', '.join(map(str, self.pids))})"
        )
        if self.enforcement:
            meaning = _OVERRUN_MEANING.get(self.enforcement, "")
            text += f"; its record's enforcement is {self.enforcement}" + (f" ({meaning})" if meaning else "")
        return text


@dataclass(frozen=True)
class WatchdogReport:
    usage: tuple[PodGpuMemory, ...]
    violations: tuple[Violation, ...]
    new_violations: tuple[Violation, ...] = ()
    killed: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()


def shares_from_pods(pods: Sequence[PodInfo], node: str) -> tuple[tuple[Share, ...], tuple[str, ...]]:
    """Memory shares from the allocation annotations of running pods on `node`."""
    shares: list[Share] = []
    warnings: list[str] = []
    for pod in pods:
        raw = pod.annotations.get(ALLOCATION_ANNOTATION)
        if raw is None or pod.finished:
            continue
        try:
            allocation = decode_allocation(raw)
        except AllocationError as exc:
            warnings.append(f"pod {pod.namespace}/{pod.name}: unreadable allocation: {exc}")
            continue
        if allocation.node != node:
            warnings.append(
                f"pod {pod.namespace}/{pod.name}: allocation is for node {allocation.node}, not {node}"
            )
            continue
        for grant in allocation.grants:
            policed = not grant.whole and not grant.mig_uuid and grant.memory_mib > 0
            limit = grant.memory_mib * _MIB if policed else None
            shares.append(
                Share(pod.uid, pod.namespace, pod.name, grant.index, limit, allocation.enforcement.value)
            )
    return tuple(shares), tuple(warnings)


def assess(
    processes: Sequence[ProcessUse], shares: Sequence[Share], tolerance_bytes: int = 0
) -> WatchdogReport:
    """Per-pod usage against shares (pure). Processes outside any known pod are ignored."""
    used: dict[tuple[str, int], int] = {}
    pids: dict[tuple[str, int], list[int]] = {}
    for p in processes:
        if p.pod_uid is None:
            continue
        key = (p.pod_uid, p.gpu_index)
        used[key] = used.get(key, 0) + p.used_bytes
        pids.setdefault(key, []).append(p.pid)
    usage: list[PodGpuMemory] = []
    violations: list[Violation] = []
    for s in sorted(shares, key=lambda s: (s.namespace, s.pod, s.gpu_index)):
        key = (s.pod_uid, s.gpu_index)
        in_use = used.get(key, 0)
        usage.append(PodGpuMemory(s.namespace, s.pod, s.gpu_index, s.limit_bytes or 0, in_use))
        if s.limit_bytes is not None and in_use > s.limit_bytes + tolerance_bytes:
            violations.append(
                Violation(
                    s.pod_uid,
                    s.namespace,
                    s.pod,
                    s.gpu_index,
                    in_use,
                    s.limit_bytes,
                    tuple(sorted(pids[key])),
                    s.enforcement,
                )
            )
    return WatchdogReport(tuple(usage), tuple(violations))


class Watchdog:
    """Fetches process memory, maps it to pods, and acts on pods above their share."""

    def __init__(
        self,
        reader: NvmlReader,
        node: str,
        *,
        proc_root: Path = Path("/proc"),
        tolerance_mib: int = 0,
        kill: bool = False,
        kill_signal: int = signal.SIGKILL,
        kill_process: Callable[[int, int], None] = os.kill,
    ) -> None:
        self._reader = reader
        self._node = node
        self._proc_root = proc_root
        self._tolerance = tolerance_mib * _MIB
        self._kill = kill
        self._signal = kill_signal
        self._kill_process = kill_process
        self._open: set[tuple[str, int]] = set()

    def check(self, pods: Sequence[PodInfo]) -> WatchdogReport:
        warnings: list[str] = []
        shares, share_warnings = shares_from_pods(pods, self._node)
        warnings.extend(share_warnings)
        processes = self._processes(warnings)
        report = assess(processes, shares, self._tolerance)
        current = {(v.pod_uid, v.gpu_index) for v in report.violations}
        new = tuple(v for v in report.violations if (v.pod_uid, v.gpu_index) not in self._open)
        self._open = current
        killed: list[int] = []
        if self._kill:
            for v in report.violations:
                for pid in v.pids:
                    try:
                        self._kill_process(pid, self._signal)
                        killed.append(pid)
                    except OSError as exc:
                        warnings.append(f"could not kill process {pid} of {v.namespace}/{v.pod}: {exc}")
        return WatchdogReport(report.usage, report.violations, new, tuple(killed), tuple(warnings))

    def _processes(self, warnings: list[str]) -> list[ProcessUse]:
        found: list[ProcessUse] = []
        cache: dict[int, str | None] = {}
        try:
            count = self._reader.device_count()
        except NvmlError as exc:
            warnings.append(f"cannot count GPUs: {exc}")
            return found
        for index in range(count):
            try:
                procs = self._reader.processes(index)
            except NvmlError as exc:
                warnings.append(f"GPU {index}: processes unreadable: {exc}")
                continue
            for proc in procs:
                if proc.pid not in cache:
                    cache[proc.pid] = read_pod_uid(proc.pid, self._proc_root)
                found.append(ProcessUse(index, proc.pid, proc.used_memory_bytes or 0, cache[proc.pid]))
        return found
