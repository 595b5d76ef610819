"""A simulated NVML: answers `NvmlReader` from a recorded `NodeTopology`, with fault injection.

What a real machine of that shape would say:
- NVLink per link: on NVSwitch machines every link of a GPU ends at a switch (remote type
  SWITCH, a switch bus id); otherwise `NV<k>` between two GPUs becomes k links whose remote
  bus id is the peer's. Link versions follow the GPU model's NVLink generation.
- Topology levels come from the link kinds; for NVLink pairs (NVML reports the PCIe path
  only) the level is NODE when both GPUs share a NUMA node and SYS otherwise.
- Everything is deterministic: UUIDs derive from the node name and index, bus ids from the
  index, and nothing depends on wall time.

- The driver is "550.54.15" running CUDA "12.4" unless told otherwise (`driver`,
  `cuda_version`; the agent's `--simulate-driver` / `--simulate-cuda`). Power limits follow the
  GPU model (`SIMULATED_POWER`: e.g. A100 SXM 400 W settable within 100-400 W, H100 SXM 700 W);
  `set_power_limit` changes the limit within that range and records every call in
  `power_limit_calls`; with `power_settable` off it is refused as without root.

- MIG: `mig_layout` ({GPU index: profile names}) starts those GPUs in MIG mode with those
  instances, cut with the model's real profiles (`simulated_mig`; the agent's `--simulate-mig`);
  a layout the GPU cannot host raises MigLayoutError. `set_mig` replaces a GPU's MIG state.

Faults for the health and watchdog paths: `inject_xid`, `inject_ecc_event`, `set_ecc`,
`set_nvlink_active`, `set_gpu_lost`, processes with memory, `clear_faults`. `apply_fault`
takes the same commands as JSON (the agent's POST /debug/inject in simulate mode).

It is over 450 lines on purpose: one class answers every `NvmlReader` method from one machine
and its fault state, mirroring `nvml_pynvml` method by method so the two can be read side by side.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from node_agent.sources.nvml_reader import (
    NVLINK_VERSION_BY_GENERATION,
    Affinity,
    DeviceIdentity,
    EccCounts,
    EventKind,
    GpuProcess,
    MigInfo,
    NvLinkInfo,
    NvmlReadError,
    P2PCapability,
    P2PStatus,
    PowerLimits,
    RemoteDeviceType,
    Utilization,
    XidEvent,
)
from node_agent.sources.simulated_mig import carve_layout
from topology.bandwidth import generation_of
from topology.catalog import load_machine
from topology.model import Gpu, LinkKind, MigMode, NodeTopology
from topology.smi_parser import looks_like_nvswitch

_MIB = 1024 * 1024
_UUID_NAMESPACE = uuidlib.UUID("6c1e2d4a-5b7f-4c3e-9a1d-2f8b0e6c7d5a")
_XID_GPU_LOST = 79
_PCIE_P2P_LEVELS = frozenset({LinkKind.INTERNAL, LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE})
DEFAULT_SIMULATED_DRIVER = "550.54.15"
DEFAULT_SIMULATED_CUDA = "12.4"

#: (model name fragment, default = maximum limit W, minimum limit W), first match wins; the
#: figures are the parts' board power and the range `nvidia-smi -q -d POWER` shows for them.
SIMULATED_POWER: tuple[tuple[str, int, int], ...] = (
    ("A100-SXM", 400, 100),
    ("A100", 250, 150),  # PCIe
    ("H100 PCIE", 350, 200),
    ("H100", 700, 200),  # SXM5 ("H100 80GB HBM3")
    ("H800", 700, 200),
    ("H200", 700, 200),
    ("H20", 400, 200),
    ("B300", 1100, 200),
    ("V100-SXM3", 350, 100),
    ("V100-SXM2", 300, 100),
    ("V100-PCIE", 250, 100),
    ("V100", 300, 100),
    ("P100-SXM2", 300, 150),
    ("K40", 235, 180),
    ("A30", 165, 100),
    ("RTX A6000", 300, 100),
    ("RTX 3090", 350, 100),
    ("RTX 4090", 450, 150),
    ("RTX 5090", 575, 400),
    ("RTX PRO 6000", 600, 150),
)
#: A GPU of a model not in the table.
SIMULATED_POWER_OTHER = (300, 100)


def simulated_power(model: str) -> PowerLimits:
    """The power limits a simulated GPU of `model` starts with (at its default)."""
    upper = model.upper()
    default, low = next(
        ((w, lo) for fragment, w, lo in SIMULATED_POWER if fragment in upper), SIMULATED_POWER_OTHER
    )
    return PowerLimits(limit_w=default, min_w=low, max_w=default, default_w=default)


class FaultCommandError(ValueError):
    """A fault command is malformed; the message says which field and why."""


def looks_switched(topology: NodeTopology) -> bool:
    """NVSwitch machine: flagged as such, or an all-to-all NVLink mesh too wide for direct links."""
    return topology.nvswitch or looks_like_nvswitch(topology.gpu_links, topology.gpu_count)


def simulated_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def simulated_bus_id(index: int) -> str:
    return f"{index // 16:08X}:{0x10 + (index % 16) * 0x0E:02X}:00.0"


def switch_bus_id(switch: int) -> str:
    return f"0000FFFF:{0x10 + switch:02X}:00.0"


class SimulatedNvml:
    """`NvmlReader` over a recorded topology. Thread-safe: faults may arrive from another thread.

    With `node_name`, GPU UUIDs are derived from it (distinct simulated nodes never share a
    UUID); without, the topology's own UUIDs are kept.
    """

    source = "nvml (simulated)"

    def __init__(
        self,
        topology: NodeTopology,
        *,
        node_name: str = "",
        default_memory_mib: int = 81920,
        driver: str = DEFAULT_SIMULATED_DRIVER,
        cuda_version: str = DEFAULT_SIMULATED_CUDA,
        mig_layout: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        self.topology = topology
        self._driver = driver
        self._cuda_version = cuda_version
        #: Every `set_power_limit` call that was accepted, (GPU index, watts), in order.
        self.power_limit_calls: list[tuple[int, int]] = []
        #: Off: setting a power limit is refused as NVML refuses an agent without root.
        self.power_settable = True
        self._switched = looks_switched(topology)
        self._gpus = tuple(
            replace(
                g,
                uuid=simulated_uuid(node_name, g.index)
                if node_name
                else g.uuid or simulated_uuid("", g.index),
                pci_bus_id=g.pci_bus_id or simulated_bus_id(g.index),
                memory_mib=g.memory_mib or default_memory_mib,
                model=g.model or "Simulated GPU",
            )
            for g in topology.gpus
        )
        self._lock = threading.Condition()
        self._events: deque[XidEvent] = deque()
        self._lost: set[int] = set()
        self._down_links: dict[int, set[int]] = {}
        self._ecc: dict[int, EccCounts] = {}
        self._processes: dict[int, dict[int, int | None]] = {}
        self._utilization: dict[int, Utilization] = {}
        self._mig: dict[int, MigInfo] = {
            index: MigInfo(MigMode.ENABLED, devices)
            for index, devices in carve_layout(self._gpus, mig_layout or {}).items()
        }
        self._power = {g.index: simulated_power(g.model) for g in self._gpus}

    @classmethod
    def from_machine(cls, name_or_path: str, **kwargs: Any) -> SimulatedNvml:
        """Simulate a catalog machine ("dgx-a100", "hgx-h100", ...) or a `topo -m` file."""
        return cls(load_machine(name_or_path), **kwargs)

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        """The GPUs as this simulation presents them (UUIDs and bus ids filled in)."""
        return self._gpus

    # ------------------------------------------------------------------ protocol

    def driver_version(self) -> str:
        return self._driver

    def cuda_driver_version(self) -> str:
        return self._cuda_version

    def power_limits(self, index: int) -> PowerLimits:
        self._gpu(index, "nvmlDeviceGetPowerManagementLimit")
        with self._lock:
            return self._power[index]

    def set_power_limit(self, index: int, watts: int) -> None:
        call = "nvmlDeviceSetPowerManagementLimit"
        self._gpu(index, call)
        with self._lock:
            current = self._power[index]
            if not self.power_settable:
                raise NvmlReadError(call, "Insufficient Permissions (NVML code 4)", gpu=index)
            if not current.min_w <= watts <= current.max_w:
                raise NvmlReadError(
                    call,
                    f"{watts} W is outside {current.min_w}-{current.max_w} W (NVML code 2)",
                    gpu=index,
                )
            self._power[index] = replace(current, limit_w=watts)
            self.power_limit_calls.append((index, watts))

    def device_count(self) -> int:
        return len(self._gpus)

    def identity(self, index: int) -> DeviceIdentity:
        g = self._gpu(index, "nvmlDeviceGetUUID")
        with self._lock:
            used = sum(b or 0 for b in self._processes.get(index, {}).values())
        return DeviceIdentity(
            index=index,
            uuid=g.uuid,
            name=g.model,
            memory_total_bytes=g.memory_mib * _MIB,
            memory_used_bytes=min(used, g.memory_mib * _MIB),
            pci_bus_id=g.pci_bus_id,
        )

    def affinity(self, index: int) -> Affinity:
        g = self._gpu(index, "nvmlDeviceGetCpuAffinity")
        return Affinity(numa_node=g.numa_node, cpulist=g.cpu_affinity, gpu_numa_id=g.gpu_numa_id)

    def topology_level(self, a: int, b: int) -> LinkKind:
        ga, gb = (
            self._gpu(a, "nvmlDeviceGetTopologyCommonAncestor"),
            self._gpu(b, "nvmlDeviceGetTopologyCommonAncestor"),
        )
        kind = self._link_kind(a, b)
        if kind is not LinkKind.NV:
            return kind
        if ga.numa_node is not None and gb.numa_node is not None:
            return LinkKind.NODE if ga.numa_node == gb.numa_node else LinkKind.SYS
        return LinkKind.NODE if ga.cpu_affinity and ga.cpu_affinity == gb.cpu_affinity else LinkKind.SYS

    def p2p_status(self, a: int, b: int, capability: P2PCapability) -> P2PStatus:
        self._gpu(a, "nvmlDeviceGetP2PStatus")
        self._gpu(b, "nvmlDeviceGetP2PStatus")
        nvlinked = self._active_nvlink_between(a, b)
        if capability in (P2PCapability.NVLINK, P2PCapability.ATOMICS):
            return P2PStatus.OK if nvlinked else P2PStatus.NOT_SUPPORTED
        if nvlinked or self.topology_level(a, b) in _PCIE_P2P_LEVELS:
            return P2PStatus.OK
        return P2PStatus.TOPOLOGY_NOT_SUPPORTED

    def nvlinks(self, index: int) -> tuple[NvLinkInfo, ...]:
        g = self._gpu(index, "nvmlDeviceGetNvLinkState")
        version = NVLINK_VERSION_BY_GENERATION.get(generation_of(g.model).nvlink_gen, 0)
        with self._lock:
            down = set(self._down_links.get(index, ()))
        ends: list[tuple[str, RemoteDeviceType]] = []
        if self._switched:
            width = max((lk.nvlinks for lk in self.topology.gpu_links if index in (lk.a, lk.b)), default=0)
            switches = 6 if width <= 12 else 4
            ends = [(switch_bus_id(link % switches), RemoteDeviceType.SWITCH) for link in range(width)]
        else:
            for peer in range(len(self._gpus)):
                if peer != index and self._link_kind(index, peer) is LinkKind.NV:
                    count = self.topology.link(index, peer).nvlinks
                    ends.extend([(self._gpus[peer].pci_bus_id, RemoteDeviceType.GPU)] * count)
        return tuple(
            NvLinkInfo(link, link not in down, version, bus if link not in down else "", kind)
            for link, (bus, kind) in enumerate(ends)
        )

    def mig(self, index: int) -> MigInfo:
        g = self._gpu(index, "nvmlDeviceGetMigMode")
        with self._lock:
            override = self._mig.get(index)
        return override if override is not None else MigInfo(g.mig_mode, g.mig_devices)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        self._gpu(index, "nvmlDeviceGetComputeRunningProcesses")
        with self._lock:
            return tuple(
                GpuProcess(pid, used) for pid, used in sorted(self._processes.get(index, {}).items())
            )

    def utilization(self, index: int) -> Utilization | None:
        self._gpu(index, "nvmlDeviceGetUtilizationRates")
        with self._lock:
            return self._utilization.get(index, Utilization(0, 0))

    def ecc(self, index: int) -> EccCounts:
        self._gpu(index, "nvmlDeviceGetTotalEccErrors")
        with self._lock:
            return self._ecc.get(index, _CLEAN_ECC)

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        with self._lock:
            if not self._events and timeout_ms > 0:
                self._lock.wait(timeout_ms / 1000)
            return self._events.popleft() if self._events else None

    def close(self) -> None:
        with self._lock:
            self._lock.notify_all()

    # ------------------------------------------------------------------ faults and load

    def inject_xid(self, gpu_index: int, xid: int, *, lose_gpu: bool | None = None) -> None:
        """Queue an XID event; XID 79 (fallen off the bus) also makes the GPU unreadable."""
        self._check_index(gpu_index)
        with self._lock:
            self._events.append(XidEvent(gpu_index, EventKind.XID, xid))
            if lose_gpu if lose_gpu is not None else xid == _XID_GPU_LOST:
                self._lost.add(gpu_index)
            self._lock.notify_all()

    def inject_ecc_event(self, gpu_index: int, *, double_bit: bool = True) -> None:
        self._check_index(gpu_index)
        kind = EventKind.DOUBLE_BIT_ECC if double_bit else EventKind.SINGLE_BIT_ECC
        with self._lock:
            self._events.append(XidEvent(gpu_index, kind))
            self._lock.notify_all()

    def set_ecc(self, gpu_index: int, **counts: Any) -> None:
        """Set ECC counters, e.g. `set_ecc(2, volatile_uncorrected=1, remap_pending=True)`."""
        self._check_index(gpu_index)
        for name, value in counts.items():
            if value is not None and (not isinstance(value, int) or value < 0):
                raise FaultCommandError(f"ECC field {name!r} must be a count or a flag, got {value!r}")
        with self._lock:
            try:
                self._ecc[gpu_index] = replace(self._ecc.get(gpu_index, _CLEAN_ECC), **counts)
            except TypeError as exc:
                raise FaultCommandError(f"unknown ECC field: {exc}") from exc

    def set_nvlink_active(self, gpu_index: int, link: int, active: bool) -> None:
        self._check_index(gpu_index)
        with self._lock:
            down = self._down_links.setdefault(gpu_index, set())
            if active:
                down.discard(link)
            else:
                down.add(link)

    def set_gpu_lost(self, gpu_index: int, lost: bool = True) -> None:
        self._check_index(gpu_index)
        with self._lock:
            if lost:
                self._lost.add(gpu_index)
            else:
                self._lost.discard(gpu_index)

    def set_process(self, gpu_index: int, pid: int, used_bytes: int | None) -> None:
        self._check_index(gpu_index)
        with self._lock:
            self._processes.setdefault(gpu_index, {})[pid] = used_bytes

    def remove_process(self, gpu_index: int, pid: int) -> None:
        with self._lock:
            self._processes.get(gpu_index, {}).pop(pid, None)

    def set_utilization(self, gpu_index: int, gpu_percent: int, memory_percent: int = 0) -> None:
        self._check_index(gpu_index)
        with self._lock:
            self._utilization[gpu_index] = Utilization(gpu_percent, memory_percent)

    def set_mig(self, gpu_index: int, info: MigInfo) -> None:
        self._check_index(gpu_index)
        with self._lock:
            self._mig[gpu_index] = info

    def clear_faults(self, gpu_index: int) -> None:
        """The GPU was "reset": readable again, ECC counters clean, every NVLink up."""
        self._check_index(gpu_index)
        with self._lock:
            self._lost.discard(gpu_index)
            self._ecc.pop(gpu_index, None)
            self._down_links.pop(gpu_index, None)

    def apply_fault(self, command: Mapping[str, Any]) -> str:
        """Apply one JSON fault command; returns what was done. See `FAULT_COMMAND_HELP`."""
        gpu = command.get("gpu")
        if isinstance(gpu, bool) or not isinstance(gpu, int):
            raise FaultCommandError(f"'gpu' must be a GPU index, got {gpu!r}")
        self._check_index(gpu)
        actions = [k for k in _FAULT_KEYS if k in command]
        unknown = sorted(set(command) - set(_FAULT_KEYS) - {"gpu"})
        if unknown or len(actions) != 1:
            raise FaultCommandError(
                f"a fault command needs 'gpu' and exactly one of {', '.join(_FAULT_KEYS)}"
                + (f"; unknown keys: {', '.join(unknown)}" if unknown else "")
            )
        action, value = actions[0], command[actions[0]]
        if action == "xid":
            self.inject_xid(gpu, _int_field(value, "xid"))
            return f"GPU {gpu}: XID {value} injected"
        if action == "eccEvent":
            self.inject_ecc_event(gpu, double_bit=value != "single")
            return f"GPU {gpu}: ECC event injected"
        if action == "ecc":
            if not isinstance(value, dict):
                raise FaultCommandError("'ecc' must be an object of counters")
            self.set_ecc(gpu, **{_ECC_FIELDS.get(str(k), str(k)): v for k, v in value.items()})
            return f"GPU {gpu}: ECC counters set"
        if action in ("nvlinkDown", "nvlinkUp"):
            self.set_nvlink_active(gpu, _int_field(value, action), action == "nvlinkUp")
            return f"GPU {gpu}: NVLink {value} {'up' if action == 'nvlinkUp' else 'down'}"
        if action == "lost":
            self.set_gpu_lost(gpu, bool(value))
            return f"GPU {gpu}: {'lost' if value else 'readable'}"
        if action == "process":
            if not isinstance(value, dict):
                raise FaultCommandError("'process' must be an object with 'pid' and 'usedMiB'")
            pid, used = _int_field(value.get("pid"), "process.pid"), value.get("usedMiB")
            if used is None:
                self.remove_process(gpu, pid)
                return f"GPU {gpu}: process {pid} removed"
            self.set_process(gpu, pid, _int_field(used, "process.usedMiB") * _MIB)
            return f"GPU {gpu}: process {pid} uses {used} MiB"
        self.clear_faults(gpu)
        return f"GPU {gpu}: faults cleared"

    # ------------------------------------------------------------------ internals

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self._gpus):
            raise FaultCommandError(f"no GPU with index {index} ({len(self._gpus)} GPUs)")

    def _gpu(self, index: int, call: str) -> Gpu:
        if not 0 <= index < len(self._gpus):
            raise NvmlReadError(call, f"no GPU with index {index}", gpu=index)
        with self._lock:
            if index in self._lost:
                raise NvmlReadError(call, "GPU is lost (NVML code 15)", gpu=index, gpu_lost=True)
        return self._gpus[index]

    def _link_kind(self, a: int, b: int) -> LinkKind:
        try:
            return self.topology.link(a, b).kind
        except KeyError:
            return LinkKind.SYS

    def _active_nvlink_between(self, a: int, b: int) -> bool:
        if self._link_kind(a, b) is not LinkKind.NV:
            return False
        if self._switched:
            return any(lk.active for lk in self.nvlinks(a)) and any(lk.active for lk in self.nvlinks(b))
        peer_bus = self._gpus[b].pci_bus_id
        return any(lk.active and lk.remote_pci_bus_id == peer_bus for lk in self.nvlinks(a))


def _int_field(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultCommandError(f"'{name}' must be an integer, got {value!r}")
    return value


_CLEAN_ECC = EccCounts(0, 0, 0, 0, False, False)
_FAULT_KEYS = ("xid", "eccEvent", "ecc", "nvlinkDown", "nvlinkUp", "lost", "process", "clear")
_ECC_FIELDS = {
    "volatileCorrected": "volatile_corrected",
    "volatileUncorrected": "volatile_uncorrected",
    "aggregateCorrected": "aggregate_corrected",
    "aggregateUncorrected": "aggregate_uncorrected",
    "remapPending": "remap_pending",
    "remapFailed": "remap_failed",
}

FAULT_COMMAND_HELP = """\
POST a JSON object with "gpu": <index> and exactly one of:
  "xid": 79                         queue an XID event (79 also makes the GPU unreadable)
  "eccEvent": "double" | "single"   queue an ECC event
  "ecc": {"volatileUncorrected": 2, "remapPending": true, ...}   set ECC counters
  "nvlinkDown": 3 / "nvlinkUp": 3   take an NVLink down / bring it back
  "lost": true | false              make the GPU unreadable / readable
  "process": {"pid": 4242, "usedMiB": 2048}   a process using memory (usedMiB null removes it)
  "clear": true                     reset the GPU: readable, clean ECC, all links up
"""

__all__ = [
    "DEFAULT_SIMULATED_CUDA",
    "DEFAULT_SIMULATED_DRIVER",
    "FAULT_COMMAND_HELP",
    "FaultCommandError",
    "SimulatedNvml",
    "looks_switched",
    "simulated_power",
    "simulated_uuid",
]
