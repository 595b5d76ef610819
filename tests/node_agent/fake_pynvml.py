"""A stand-in for the `pynvml` module: the same call names, errors with NVML codes, scripted faults.

`FakePynvml.fail[name] = code` makes that call raise `NVMLError(code)`; an exception instance
is raised as is. Only what `node_agent.sources.nvml_pynvml` calls is implemented.
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15
UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


@dataclass
class FakeMig:
    uuid: str
    name: str
    total: int
    gi: int
    ci: int
    slices: int = 1


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * 1024**3
    used: int = 1024**3
    bus: str = "00000000:07:00.0"
    cpu_words: tuple[int, ...] = (0xFF, 0)  # CPUs 0-7
    node_words: tuple[int, ...] | None = (0b100,)  # NUMA node 2
    numa_id: int | None = None  # None: not supported
    links: dict[int, tuple[int, int, str, int]] = field(
        default_factory=dict
    )  # link -> state, version, bus, type
    mig_mode: tuple[int, int] | None = (0, 0)
    migs: list[FakeMig | None] = field(default_factory=list)
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    util: tuple[int, int] = (37, 12)
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    power_limit_mw: int | None = 400_000  # None: power management not supported
    power_range_mw: tuple[int, int] = (100_000, 400_000)
    power_default_mw: int = 400_000


class Handle:
    def __init__(self, gpu: FakeGpu, mig: FakeMig | None = None) -> None:
        self.gpu = gpu
        self.mig = mig


class FakePynvml:
    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 36
    NVML_P2P_CAPS_INDEX_READ = (0,)  # the binding bug: a tuple, not an int

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.fail: dict[str, Any] = {}
        self.calls: list[str] = []
        self.p2p: dict[tuple[int, int, int], int] = {}
        self.levels: dict[tuple[int, int], int] = {}
        self.events: deque[SimpleNamespace] = deque()
        self.registered: list[tuple[int, int]] = []
        self.shutdowns = 0
        self.freed = 0
        self.cuda_version = 12040  # what nvmlSystemGetCudaDriverVersion(_v2) answers
        self.power_sets: list[tuple[int, int]] = []  # (GPU index, milliwatts) of every accepted set

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            exc = self.fail[name]
            raise exc if isinstance(exc, BaseException) else NVMLError(exc)

    def _index(self, h: Handle) -> int:
        return self.gpus.index(h.gpu)

    # ------------------------------------------------------------------ library
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        return Handle(self.gpus[i])

    # ------------------------------------------------------------------ identity
    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        self._enter("nvmlDeviceGetUUID")
        return h.mig.uuid if h.mig else h.gpu.uuid

    def nvmlDeviceGetName(self, h: Handle) -> str:
        self._enter("nvmlDeviceGetName")
        return h.mig.name if h.mig else h.gpu.name

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo")
        if h.mig:
            return SimpleNamespace(total=h.mig.total, used=0, free=h.mig.total)
        return SimpleNamespace(total=h.gpu.total, used=h.gpu.used, free=h.gpu.total - h.gpu.used)

    def nvmlDeviceGetPciInfo(self, h: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=h.gpu.bus)

    def nvmlDeviceGetCpuAffinity(self, h: Handle, size: int) -> list[int]:
        self._enter("nvmlDeviceGetCpuAffinity")
        return list(h.gpu.cpu_words[:size]) + [0] * max(0, size - len(h.gpu.cpu_words))

    def nvmlDeviceGetMemoryAffinity(self, h: Handle, size: int, scope: int) -> list[int]:
        self._enter("nvmlDeviceGetMemoryAffinity")
        if h.gpu.node_words is None:
            raise NVMLError(NOT_SUPPORTED)
        return list(h.gpu.node_words[:size])

    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetNumaNodeId")
        if h.gpu.numa_id is None:
            raise NVMLError(NOT_SUPPORTED)
        return h.gpu.numa_id

    # ------------------------------------------------------------------ topology
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor")
        key = tuple(sorted((self._index(a), self._index(b))))
        return self.levels.get(key, 40)  # type: ignore[arg-type]

    def nvmlDeviceGetP2PStatus(self, a: Handle, b: Handle, index: Any) -> int:
        self._enter("nvmlDeviceGetP2PStatus")
        if isinstance(index, bool) or not isinstance(index, int):
            raise ctypes.ArgumentError(f"argument 3: wrong type {type(index).__name__}")
        return self.p2p.get((self._index(a), self._index(b), index), 0)

    def _link(self, h: Handle, link: int) -> tuple[int, int, str, int]:
        if link not in h.gpu.links:
            raise NVMLError(2 if h.gpu.links else NOT_SUPPORTED)
        return h.gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState")
        return self._link(h, link)[0]

    def nvmlDeviceGetNvLinkVersion(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkVersion")
        return self._link(h, link)[1]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo")
        return SimpleNamespace(busId=self._link(h, link)[2])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType")
        return self._link(h, link)[3]

    # ------------------------------------------------------------------ MIG
    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        if h.gpu.mig_mode is None:
            raise NVMLError(NOT_SUPPORTED)
        return list(h.gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return len(h.gpu.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, i: int) -> Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        mig = h.gpu.migs[i]
        if mig is None:
            raise NVMLError(NOT_FOUND)
        return Handle(h.gpu, mig)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        assert h.mig is not None
        return h.mig.gi

    def nvmlDeviceGetComputeInstanceId(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        assert h.mig is not None
        return h.mig.ci

    def nvmlDeviceGetAttributes(self, h: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes")
        assert h.mig is not None
        return SimpleNamespace(gpuInstanceSliceCount=h.mig.slices)

    # ------------------------------------------------------------------ load and errors
    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.gpu.procs]

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=h.gpu.util[0], memory=h.gpu.util[1])

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors")
        return h.gpu.ecc.get((error_type, counter), 0)

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows")
        return h.gpu.remapped

    # ------------------------------------------------------------------ power
    def _power(self, h: Handle) -> int:
        if h.gpu.power_limit_mw is None:
            raise NVMLError(NOT_SUPPORTED)
        return h.gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetPowerManagementLimit")
        return self._power(h)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Handle) -> list[int]:
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints")
        self._power(h)
        return list(h.gpu.power_range_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit")
        self._power(h)
        return h.gpu.power_default_mw

    def nvmlDeviceSetPowerManagementLimit(self, h: Handle, limit_mw: int) -> None:
        self._enter("nvmlDeviceSetPowerManagementLimit")
        self._power(h)
        low, high = h.gpu.power_range_mw
        if not isinstance(limit_mw, int) or not low <= limit_mw <= high:
            raise NVMLError(INVALID_ARGUMENT)
        h.gpu.power_limit_mw = limit_mw
        self.power_sets.append((self._index(h), limit_mw))

    # ------------------------------------------------------------------ events
    def nvmlEventSetCreate(self) -> str:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes")
        return 0x1 | 0x2 | 0x8

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        self.registered.append((self._index(h), types))

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait")
        if not self.events:
            raise NVMLError(TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:
        self._enter("nvmlEventSetFree")
        self.freed += 1

    def queue_event(self, gpu: int, event_type: int, data: int = 0) -> None:
        self.events.append(
            SimpleNamespace(
                device=Handle(self.gpus[gpu]),
                eventType=event_type,
                eventData=data,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        )
