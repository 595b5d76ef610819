"""What a container is given for its grants: environment variables and mounts. Pure.

The enforcement is the record's (`Allocation.enforcement`, decided by the extender at bind from
the node's published `mps.active`); this module applies it and does not decide again:

- `NVIDIA_VISIBLE_DEVICES`: the GPU UUIDs (or MIG UUIDs), in GPU index order, so that CUDA
  ordinal i inside the container (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`) is the i-th grant.
- Shares get Linkpack's `LINKPACK_MEMORY_LIMIT_MIB` / `LINKPACK_MEMORY_FRACTION` (one value per
  visible device, comma-separated; 0 = no cap) read by the framework shim, and the shim itself:
  its host directory mounted read-only at /opt/linkpack/shim and put on PYTHONPATH.
- Shares whose record says hard MPS, on a node whose MPS pipe directory exists, also get the
  MPS client caps `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<ordinal>=<MiB>M,...`) and
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, and the pipe directory (`CUDA_MPS_PIPE_DIRECTORY`,
  mounted at the same path). When the directory is missing they fall back to cooperative.
- Shares whose record says interposer fall back to cooperative: this plugin does not deliver
  the CUDA interposer (node_agent/interposer) into containers yet, and the node says so in its
  status (`interposer.available` false), so the extender does not choose it for this node.
- Every container gets `LINKPACK_ENFORCEMENT`: the enforcement applied. When that is not what the
  record says (MPS or the interposer unavailable here, or a level the grants cannot have),
  `ContainerSpec.fallback` and `LINKPACK_ENFORCEMENT_FALLBACK` say why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contract.allocation import Enforcement
from node_agent.deviceplugin.inventory import Inventory
from topology.workload import GpuGrant

SHIM_CONTAINER_PATH = "/opt/linkpack/shim"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MEMORY_LIMIT_MIB = "LINKPACK_MEMORY_LIMIT_MIB"
ENV_MEMORY_FRACTION = "LINKPACK_MEMORY_FRACTION"
ENV_ENFORCEMENT = "LINKPACK_ENFORCEMENT"
ENV_ENFORCEMENT_FALLBACK = "LINKPACK_ENFORCEMENT_FALLBACK"
ENV_PYTHONPATH = "PYTHONPATH"


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """How this node serves shares.

    `shim_host_dir`: host directory holding the shim (sitecustomize.py, linkpack_shim.py); None
    leaves the shim out. `mps_pipe_dir`: the MPS control daemon's pipe directory, when one is
    configured (whether it exists is checked at each handout, `node_agent.mps`).
    """

    shim_host_dir: str | None = None
    mps_pipe_dir: str | None = None


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What goes into a ContainerAllocateResponse; `enforcement` is the one applied, `fallback`
    why it differs from the record's ("" when it does not)."""

    envs: tuple[tuple[str, str], ...]
    mounts: tuple[MountSpec, ...] = ()
    enforcement: Enforcement = Enforcement.NONE
    fallback: str = ""

    def env(self, name: str) -> str | None:
        return dict(self.envs).get(name)


def applied_enforcement(
    recorded: Enforcement, grants: Sequence[GpuGrant], mps_ready: bool
) -> tuple[Enforcement, str]:
    """The enforcement this node applies for a record's grants, and why it is not the record's
    ("" when it is). The record chooses among the levels its grants can have; hard MPS needs the
    node's pipe directory (`mps_ready`), and the interposer is not delivered by this node: without
    them shares are held cooperatively."""
    allowed: tuple[Enforcement, ...]  # the weakest first
    if any(g.mig_uuid for g in grants):
        allowed, what = (Enforcement.MIG,), "MIG instances"
    elif all(not g.whole for g in grants):
        allowed, what = (Enforcement.COOPERATIVE, Enforcement.INTERPOSER, Enforcement.HARD_MPS), "shares"
    else:
        allowed, what = (Enforcement.NONE,), "whole GPUs"
    if recorded not in allowed:
        weakest = allowed[0]
        return (
            weakest,
            f"the record says {recorded.value}, which {what} cannot have; applying {weakest.value}",
        )
    if recorded is Enforcement.HARD_MPS and not mps_ready:
        why = (
            f"the record says {recorded.value}, but this node has no MPS pipe directory; applying cooperative"
        )
        return Enforcement.COOPERATIVE, why
    if recorded is Enforcement.INTERPOSER:
        why = "the record says interposer, but this node does not deliver the CUDA interposer; applying cooperative"
        return Enforcement.COOPERATIVE, why
    return recorded, ""


def container_spec(
    grants: Sequence[GpuGrant],
    inventory: Inventory,
    sharing: SharingConfig,
    recorded: Enforcement,
    *,
    mps_ready: bool = False,
) -> ContainerSpec:
    """The container's environment and mounts for these grants under the record's enforcement;
    `mps_ready`: this node's MPS pipe directory exists."""
    ordered = sorted(grants, key=lambda g: (g.index, g.uuid, g.mig_uuid))
    enforcement, fallback = applied_enforcement(recorded, ordered, mps_ready)
    envs: dict[str, str] = {
        ENV_VISIBLE_DEVICES: ",".join(g.mig_uuid or g.uuid for g in ordered),
        ENV_DEVICE_ORDER: "PCI_BUS_ID",
        ENV_ENFORCEMENT: enforcement.value,
    }
    if fallback:
        envs[ENV_ENFORCEMENT_FALLBACK] = fallback
    mounts: list[MountSpec] = []
    if enforcement in (Enforcement.COOPERATIVE, Enforcement.HARD_MPS):
        envs.update(_share_envs(ordered, inventory))
        if sharing.shim_host_dir:
            mounts.append(MountSpec(SHIM_CONTAINER_PATH, sharing.shim_host_dir, read_only=True))
            envs[ENV_PYTHONPATH] = SHIM_CONTAINER_PATH
    if enforcement is Enforcement.HARD_MPS:
        envs.update(_mps_envs(ordered, inventory))
        if sharing.mps_pipe_dir:
            mounts.append(MountSpec(sharing.mps_pipe_dir, sharing.mps_pipe_dir, read_only=False))
            envs[ENV_MPS_PIPE_DIRECTORY] = sharing.mps_pipe_dir
    return ContainerSpec(tuple(sorted(envs.items())), tuple(mounts), enforcement, fallback)


def memory_fraction(granted_mib: int, total_mib: int) -> str:
    """The granted part of a GPU's memory, rounded down to 6 decimals so it never exceeds the grant."""
    if total_mib <= 0 or granted_mib <= 0:
        return "0"
    fraction = min(1.0, math.floor(granted_mib * 1_000_000 / total_mib) / 1_000_000)
    return f"{fraction:.6f}".rstrip("0").rstrip(".")


def _share_envs(shares: Sequence[GpuGrant], inventory: Inventory) -> dict[str, str]:
    limits: list[str] = []
    fractions: list[str] = []
    for g in shares:
        gpu = inventory.gpu(g.uuid)
        memory = g.memory_mib  # 0: the record reserves no memory, so none is capped
        limits.append(str(memory))
        fractions.append(memory_fraction(memory, gpu.memory_mib if gpu else 0))
    return {ENV_MEMORY_LIMIT_MIB: ",".join(limits), ENV_MEMORY_FRACTION: ",".join(fractions)}


def _mps_envs(shares: Sequence[GpuGrant], inventory: Inventory) -> dict[str, str]:
    pinned = [f"{ordinal}={g.memory_mib}M" for ordinal, g in enumerate(shares) if g.memory_mib > 0]
    percentages = [max(1, min(100, g.units * 100 // inventory.units_per_gpu)) for g in shares if g.units > 0]
    envs: dict[str, str] = {}
    if pinned:
        envs[ENV_MPS_MEMORY_LIMIT] = ",".join(pinned)
    if percentages:
        # one value for the whole client; the smallest share is the one that must not be exceeded
        envs[ENV_MPS_THREAD_PERCENTAGE] = str(min(percentages))
    return envs
