"""`NvmlReader` over the real NVIDIA management library (nvidia-ml-py, `import pynvml`).

The only module of the agent that touches pynvml. Every call goes through `_call` /
`_optional`, so no `NVMLError` (nor a ctypes error from a binding quirk) gets past this
module: unsupported facts become "unsupported" values, anything else `NvmlReadError`.

Binding quirks handled here:
- `NVML_P2P_CAPS_INDEX_READ` is the tuple `(0,)` in nvidia-ml-py 13.615.71; we pass the
  integer caps index ourselves (`P2PCapability` values).
- `NVML_NVLINK_MAX_LINKS` follows the header of the binding, not the GPU; every link number
  up to it is tried and per-link errors mean "no such link".

It is a little over 450 lines on purpose: it is the one adapter class for every `NvmlReader`
method, and keeping them beside `_call` / `_optional` keeps the error rule in one place.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
from pathlib import Path
from typing import Any

from node_agent.sources.nvml_reader import (
    LINK_KIND_BY_NVML_LEVEL,
    P2P_STATUS_BY_CODE,
    Affinity,
    DeviceIdentity,
    EccCounts,
    EventKind,
    GpuProcess,
    MigInfo,
    NvLinkInfo,
    NvmlReadError,
    NvmlUnavailable,
    P2PCapability,
    P2PStatus,
    PowerLimits,
    RemoteDeviceType,
    Utilization,
    XidEvent,
    cpulist_from_mask_words,
    cuda_version_text,
    lowest_set_bit,
)
from topology.model import LinkKind, MigDevice, MigMode

# NVML return codes (nvml.h); stable across driver versions.
_ERROR_NOT_SUPPORTED = 3
_ERROR_INVALID_ARGUMENT = 2
_ERROR_NO_PERMISSION = 4
_ERROR_NOT_FOUND = 6
_ERROR_TIMEOUT = 10
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15
_UNSUPPORTED_CODES = frozenset({_ERROR_NOT_SUPPORTED, _ERROR_FUNCTION_NOT_FOUND})
#: Driver facts and power limits are also "unknown" when the agent may not read them.
_UNKNOWN_FACT_CODES = _UNSUPPORTED_CODES | {_ERROR_NO_PERMISSION}

# Event bits and other values from nvml.h.
_EVENT_SINGLE_BIT_ECC = 0x1
_EVENT_DOUBLE_BIT_ECC = 0x2
_EVENT_XID_CRITICAL = 0x8
_WATCHED_EVENTS = _EVENT_XID_CRITICAL | _EVENT_DOUBLE_BIT_ECC
_NO_INSTANCE = 0xFFFFFFFF
_MIG_ENABLE = 1
_AFFINITY_SCOPE_NODE = 0
_MEMORY_ERROR_CORRECTED = 0
_MEMORY_ERROR_UNCORRECTED = 1
_ECC_VOLATILE = 0
_ECC_AGGREGATE = 1
_REMOTE_TYPES = {0: RemoteDeviceType.GPU, 1: RemoteDeviceType.IBMNPU, 2: RemoteDeviceType.SWITCH}
_MIG_PROFILE_RE = re.compile(r"(\d+g\.\d+gb(?:\+[a-z0-9]+)*)", re.IGNORECASE)
_MIB = 1024 * 1024


class PynvmlReader:
    """NVML through pynvml. Build it with `PynvmlReader.open()`; call `close()` when done."""

    source = "nvml"

    def __init__(
        self, nvml: Any, handles: list[Any], *, cpu_count: int, sysfs_root: Path, watch_events: bool
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._cpu_words = max(1, math.ceil(cpu_count / 64))
        self._sysfs_root = sysfs_root
        self._uuids: dict[str, int] = {}
        self._event_set: Any = None
        self._closed = False
        #: GPUs whose XID events could not be subscribed (health then relies on polling).
        self.unwatched: tuple[int, ...] = ()
        if watch_events:
            self._subscribe_events()

    @classmethod
    def open(
        cls,
        nvml: Any = None,
        *,
        cpu_count: int | None = None,
        sysfs_root: Path = Path("/sys"),
        watch_events: bool = True,
    ) -> PynvmlReader:
        """Initialise NVML and take a handle per GPU; `NvmlUnavailable` when that is impossible."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {_describe(nvml, exc)}") from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            _quiet_shutdown(nvml)
            raise NvmlUnavailable(f"cannot enumerate GPUs: {_describe(nvml, exc)}") from exc
        return cls(
            nvml,
            handles,
            cpu_count=cpu_count or os.cpu_count() or 1,
            sysfs_root=sysfs_root,
            watch_events=watch_events,
        )

    # ------------------------------------------------------------------ protocol

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        # _v2 first (the current name), then the original for bindings and drivers without it.
        for call in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            code = self._known(call)
            if code is not None:
                return cuda_version_text(int(code))
        return ""

    def power_limits(self, index: int) -> PowerLimits:
        h = self._handle(index)
        limit = self._known("nvmlDeviceGetPowerManagementLimit", h, gpu=index)
        if limit is None:
            return PowerLimits()
        bounds = self._known("nvmlDeviceGetPowerManagementLimitConstraints", h, gpu=index)
        default = self._known("nvmlDeviceGetPowerManagementDefaultLimit", h, gpu=index)
        low, high = (int(bounds[0]), int(bounds[1])) if bounds is not None else (0, 0)
        return PowerLimits(
            limit_w=_watts(int(limit)),
            min_w=-(-low // 1000),  # the range rounded inwards, so any whole watt in it is settable
            max_w=high // 1000,
            default_w=_watts(int(default)) if default is not None else 0,
        )

    def set_power_limit(self, index: int, watts: int) -> None:
        h = self._handle(index)
        if watts <= 0:
            raise NvmlReadError("nvmlDeviceSetPowerManagementLimit", f"{watts} W is not a limit", gpu=index)
        self._call("nvmlDeviceSetPowerManagementLimit", h, watts * 1000, gpu=index)

    def device_count(self) -> int:
        return len(self._handles)

    def identity(self, index: int) -> DeviceIdentity:
        h = self._handle(index)
        uuid = _text(self._call("nvmlDeviceGetUUID", h, gpu=index))
        memory = self._call("nvmlDeviceGetMemoryInfo", h, gpu=index)
        pci = self._call("nvmlDeviceGetPciInfo", h, gpu=index)
        self._uuids[uuid] = index
        return DeviceIdentity(
            index=index,
            uuid=uuid,
            name=_text(self._call("nvmlDeviceGetName", h, gpu=index)),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            pci_bus_id=_text(pci.busId),
        )

    def affinity(self, index: int) -> Affinity:
        h = self._handle(index)
        cpu_words = self._optional("nvmlDeviceGetCpuAffinity", h, self._cpu_words, gpu=index)
        node_words = self._optional("nvmlDeviceGetMemoryAffinity", h, 1, _AFFINITY_SCOPE_NODE, gpu=index)
        numa = lowest_set_bit([int(w) for w in node_words]) if node_words is not None else None
        if numa is None:
            numa = self._sysfs_numa_node(index)
        gpu_numa = self._optional("nvmlDeviceGetNumaNodeId", h, gpu=index)
        return Affinity(
            numa_node=numa,
            cpulist=cpulist_from_mask_words([int(w) for w in cpu_words]) if cpu_words is not None else "",
            gpu_numa_id=int(gpu_numa) if gpu_numa is not None and int(gpu_numa) >= 0 else None,
        )

    def topology_level(self, a: int, b: int) -> LinkKind:
        level = self._call("nvmlDeviceGetTopologyCommonAncestor", self._handle(a), self._handle(b), gpu=a)
        return LINK_KIND_BY_NVML_LEVEL.get(int(level), LinkKind.SYS)

    def p2p_status(self, a: int, b: int, capability: P2PCapability) -> P2PStatus:
        # int(capability): never the binding's READ constant, which is a tuple (see module doc).
        code = self._optional(
            "nvmlDeviceGetP2PStatus", self._handle(a), self._handle(b), int(capability), gpu=a
        )
        if code is None:
            return P2PStatus.NOT_SUPPORTED
        code = int(code)
        return P2P_STATUS_BY_CODE[code] if 0 <= code < len(P2P_STATUS_BY_CODE) else P2PStatus.UNKNOWN

    def nvlinks(self, index: int) -> tuple[NvLinkInfo, ...]:
        h = self._handle(index)
        nvml = self._nvml
        links: list[NvLinkInfo] = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = int(nvml.nvmlDeviceGetNvLinkState(h, link))
            except Exception as exc:
                if _code(nvml, exc) == _ERROR_GPU_IS_LOST:
                    raise _read_error(nvml, "nvmlDeviceGetNvLinkState", exc, index) from exc
                continue  # no such link on this GPU
            active = state == 1
            version = self._optional("nvmlDeviceGetNvLinkVersion", h, link)
            remote_bus, remote_type = "", RemoteDeviceType.UNKNOWN
            if active:
                pci = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
                remote_bus = _text(pci.busId) if pci is not None else ""
                kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
                if kind is not None:
                    remote_type = _REMOTE_TYPES.get(int(kind), RemoteDeviceType.UNKNOWN)
            links.append(NvLinkInfo(link, active, int(version or 0), remote_bus, remote_type))
        return tuple(links)

    def mig(self, index: int) -> MigInfo:
        h = self._handle(index)
        nvml = self._nvml
        modes = self._optional("nvmlDeviceGetMigMode", h, gpu=index)
        if modes is None:
            return MigInfo(MigMode.UNSUPPORTED)
        if int(modes[0]) != _MIG_ENABLE:
            return MigInfo(MigMode.DISABLED)
        slots = int(self._call("nvmlDeviceGetMaxMigDeviceCount", h, gpu=index))
        devices: list[MigDevice] = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except Exception as exc:
                if _code(nvml, exc) in (_ERROR_NOT_FOUND, _ERROR_INVALID_ARGUMENT):
                    continue  # empty slot
                raise _read_error(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", exc, index) from exc
            devices.append(self._mig_device(mig, index))
        devices.sort(key=lambda d: (d.gpu_instance_id, d.compute_instance_id))
        return MigInfo(MigMode.ENABLED, tuple(devices))

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        h = self._handle(index)
        found: dict[int, int | None] = {}
        for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
            for proc in self._optional(call, h, gpu=index) or ():
                pid, used = int(proc.pid), proc.usedGpuMemory
                if used is None:
                    found.setdefault(pid, None)
                else:
                    found[pid] = max(int(used), found.get(pid) or 0)
        return tuple(GpuProcess(pid, used) for pid, used in sorted(found.items()))

    def utilization(self, index: int) -> Utilization | None:
        rates = self._optional("nvmlDeviceGetUtilizationRates", self._handle(index), gpu=index)
        return Utilization(int(rates.gpu), int(rates.memory)) if rates is not None else None

    def ecc(self, index: int) -> EccCounts:
        h = self._handle(index)

        def total(error_type: int, counter: int) -> int | None:
            value = self._optional("nvmlDeviceGetTotalEccErrors", h, error_type, counter, gpu=index)
            return int(value) if value is not None else None

        rows = self._optional("nvmlDeviceGetRemappedRows", h, gpu=index)
        return EccCounts(
            volatile_corrected=total(_MEMORY_ERROR_CORRECTED, _ECC_VOLATILE),
            volatile_uncorrected=total(_MEMORY_ERROR_UNCORRECTED, _ECC_VOLATILE),
            aggregate_corrected=total(_MEMORY_ERROR_CORRECTED, _ECC_AGGREGATE),
            aggregate_uncorrected=total(_MEMORY_ERROR_UNCORRECTED, _ECC_AGGREGATE),
            remap_pending=bool(rows[2]) if rows is not None else None,
            remap_failed=bool(rows[3]) if rows is not None else None,
        )

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        if self._event_set is None:
            return None
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except Exception as exc:
            if _code(nvml, exc) == _ERROR_TIMEOUT:
                return None
            raise _read_error(nvml, "nvmlEventSetWait", exc, None) from exc
        index = self._index_of_event_device(data.device)
        kind_bits = int(data.eventType)
        if kind_bits & _EVENT_XID_CRITICAL:
            kind, xid = EventKind.XID, int(data.eventData)
        elif kind_bits & _EVENT_DOUBLE_BIT_ECC:
            kind, xid = EventKind.DOUBLE_BIT_ECC, 0
        else:
            kind, xid = EventKind.SINGLE_BIT_ECC, 0
        return XidEvent(
            gpu_index=index,
            kind=kind,
            xid=xid,
            gpu_instance_id=_instance_id(getattr(data, "gpuInstanceId", _NO_INSTANCE)),
            compute_instance_id=_instance_id(getattr(data, "computeInstanceId", _NO_INSTANCE)),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._event_set is not None:
            with contextlib.suppress(Exception):  # closing: nothing useful to do with a failure
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        _quiet_shutdown(self._nvml)

    # ------------------------------------------------------------------ internals

    def _handle(self, index: int) -> Any:
        if self._closed:
            raise NvmlReadError("nvml", "reader is closed", gpu=index)
        if not 0 <= index < len(self._handles):
            raise NvmlReadError("nvml", f"no GPU with index {index} ({len(self._handles)} GPUs)", gpu=index)
        return self._handles[index]

    def _call(self, call: str, *args: Any, gpu: int | None = None) -> Any:
        """pynvml.<call>(*args); any failure, a binding without the function included, is ours."""
        try:
            return getattr(self._nvml, call)(*args)
        except Exception as exc:
            raise _read_error(self._nvml, call, exc, gpu) from exc

    def _optional(self, call: str, *args: Any, gpu: int | None = None) -> Any:
        """Like `_call`, but None when the GPU, driver or binding does not support the call."""
        try:
            return getattr(self._nvml, call)(*args)
        except Exception as exc:
            if _code(self._nvml, exc) in _UNSUPPORTED_CODES or isinstance(exc, AttributeError):
                return None
            raise _read_error(self._nvml, call, exc, gpu) from exc

    def _known(self, call: str, *args: Any, gpu: int | None = None) -> Any:
        """Like `_optional`, and None too when the agent lacks the permission to ask."""
        try:
            return getattr(self._nvml, call)(*args)
        except Exception as exc:
            if _code(self._nvml, exc) in _UNKNOWN_FACT_CODES or isinstance(exc, AttributeError):
                return None
            raise _read_error(self._nvml, call, exc, gpu) from exc

    def _mig_device(self, mig: Any, parent: int) -> MigDevice:
        name = _text(self._call("nvmlDeviceGetName", mig, gpu=parent))
        memory = self._call("nvmlDeviceGetMemoryInfo", mig, gpu=parent)
        memory_mib = int(memory.total) // _MIB
        match = _MIG_PROFILE_RE.search(name)
        if match:
            profile = match.group(1).lower()
        else:
            attrs = self._optional("nvmlDeviceGetAttributes", mig, gpu=parent)
            slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
            profile = f"{slices}g.{round(memory_mib / 1024)}gb"
        return MigDevice(
            uuid=_text(self._call("nvmlDeviceGetUUID", mig, gpu=parent)),
            profile=profile,
            gpu_instance_id=int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
            compute_instance_id=int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
            memory_mib=memory_mib,
        )

    def _sysfs_numa_node(self, index: int) -> int | None:
        try:
            bus = _text(self._nvml.nvmlDeviceGetPciInfo(self._handles[index]).busId)
        except Exception:
            return None
        # sysfs uses a 4-digit lower-case domain: 00000000:17:00.0 -> 0000:17:00.0
        domain, _, rest = bus.partition(":")
        path = self._sysfs_root / "bus" / "pci" / "devices" / f"{domain[-4:]}:{rest}".lower() / "numa_node"
        try:
            value = int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def _subscribe_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception:
            self._event_set = None
            self.unwatched = tuple(range(len(self._handles)))
            return
        unwatched: list[int] = []
        for index, h in enumerate(self._handles):
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(h))
                wanted = _WATCHED_EVENTS & supported
                if not wanted:
                    unwatched.append(index)
                    continue
                nvml.nvmlDeviceRegisterEvents(h, wanted, self._event_set)
            except Exception:
                unwatched.append(index)
        self.unwatched = tuple(unwatched)

    def _index_of_event_device(self, device: Any) -> int:
        nvml = self._nvml
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(device))
        except Exception as exc:
            raise _read_error(nvml, "nvmlDeviceGetUUID (event device)", exc, None) from exc
        if uuid not in self._uuids:
            for index in range(len(self._handles)):
                try:
                    self._uuids[_text(nvml.nvmlDeviceGetUUID(self._handles[index]))] = index
                except Exception:  # a GPU we cannot name cannot be the one we look for
                    continue
        if uuid not in self._uuids:
            raise NvmlReadError("nvmlEventSetWait", f"event from unknown device {uuid}")
        return self._uuids[uuid]


def _code(nvml: Any, exc: BaseException) -> int | None:
    base = getattr(nvml, "NVMLError", None)
    if isinstance(base, type) and isinstance(exc, base):
        value = getattr(exc, "value", None)
        return int(value) if isinstance(value, int) else None
    return None


def _describe(nvml: Any, exc: BaseException) -> str:
    code = _code(nvml, exc)
    name = type(exc).__name__
    text = str(exc) or name
    return f"{text} (NVML code {code})" if code is not None else f"{name}: {text}"


def _read_error(nvml: Any, call: str, exc: BaseException, gpu: int | None) -> NvmlReadError:
    return NvmlReadError(call, _describe(nvml, exc), gpu=gpu, gpu_lost=_code(nvml, exc) == _ERROR_GPU_IS_LOST)


def _quiet_shutdown(nvml: Any) -> None:
    with contextlib.suppress(Exception):  # a failed shutdown leaves nothing to clean up
        nvml.nvmlShutdown()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _watts(milliwatts: int) -> int:
    """Milliwatts as whole watts, to the nearest."""
    return (milliwatts + 500) // 1000


def _instance_id(value: object) -> int | None:
    number = int(value) if isinstance(value, int) else _NO_INSTANCE
    return None if number == _NO_INSTANCE else number


__all__ = ["PynvmlReader"]
