"""A node as its device plugin sees it: the inventory, GPU grants, and pods bound to the node with
their allocation records (`BoundPod`)."""

from __future__ import annotations

from contract.allocation import Allocation, ComputePriority, Enforcement, encode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from contract.pod_demand import ContainerDemand, ContainerRole, effective_amounts
from contract.pods import PodRef
from contract.resources import ResourceNames
from node_agent.deviceplugin.inventory import Inventory, MigInstance, NodeGpu
from node_agent.deviceplugin.record_store import BoundPod
from tests.support.resources import GPU, NAMES, SHARED, mig_resource
from topology.scheduling import GpuGrant

GPU_MEMORY_MIB = 81920
MIG_PROFILE = "1g.10gb"
#: the resource the inventory's MIG instances are advertised as
MIG_GPU = mig_resource(MIG_PROFILE)


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def mig_uuid(i: int, k: int) -> str:
    return f"MIG-{i:08d}-{k:04d}-0000-0000-000000000000"


def inventory(
    gpus: int = 4, units_per_gpu: int = 100, mig_gpus: tuple[int, ...] = (), names: ResourceNames = NAMES
) -> Inventory:
    return Inventory(
        tuple(
            NodeGpu(
                index=i,
                uuid=uuid(i),
                memory_mib=GPU_MEMORY_MIB,
                numa_node=i // 2,
                mig_enabled=i in mig_gpus,
                mig=tuple(MigInstance(mig_uuid(i, k), MIG_PROFILE, 9984) for k in range(2))
                if i in mig_gpus
                else (),
            )
            for i in range(gpus)
        ),
        units_per_gpu,
        names,
    )


def whole(*indices: int) -> tuple[GpuGrant, ...]:
    return tuple(GpuGrant(i, uuid(i), whole=True) for i in indices)


def share(index: int, memory_mib: int, units: int) -> tuple[GpuGrant, ...]:
    return (GpuGrant(index, uuid(index), whole=False, memory_mib=memory_mib, units=units),)


def mig(index: int, k: int) -> tuple[GpuGrant, ...]:
    return (GpuGrant(index, uuid(index), whole=False, mig_uuid=mig_uuid(index, k)),)


def app(name: str, resource: str, amount: int) -> ContainerDemand:
    return ContainerDemand(name, ContainerRole.APP, ((resource, amount),))


def init(name: str, resource: str, amount: int) -> ContainerDemand:
    return ContainerDemand(name, ContainerRole.INIT, ((resource, amount),))


def sidecar(name: str, resource: str, amount: int) -> ContainerDemand:
    return ContainerDemand(name, ContainerRole.SIDECAR, ((resource, amount),))


def enforcement_of(grants: tuple[GpuGrant, ...]) -> Enforcement:
    if any(g.mig_uuid for g in grants):
        return Enforcement.MIG
    return Enforcement.NONE if all(g.whole for g in grants) else Enforcement.COOPERATIVE


def bound_pod(
    name: str,
    grants: tuple[GpuGrant, ...] | None,
    containers: tuple[ContainerDemand, ...] | None = None,
    *,
    bound_at: float = 0.0,
    generation: int = 1,
    resource: str | None = None,
    amount: int | None = None,
    enforcement: Enforcement | None = None,
    priority: ComputePriority = ComputePriority.NORMAL,
) -> BoundPod:
    """A pod bound to the node. Without `containers`, one container asks for what the grants give;
    the record grants the pod's effective request (the contract's rule)."""
    if containers is None:
        if grants is None:
            raise ValueError("give grants or containers")
        resource = resource or _resource_of(grants)
        amount = amount if amount is not None else _amount_of(grants)
        containers = (app("main", resource, amount),)
    annotations: dict[str, str] = {}
    if grants is not None:
        record = Allocation(
            node="node-a",
            grants=grants,
            generation=generation,
            enforcement=enforcement or enforcement_of(grants),
            priority=priority,
            resources=tuple(sorted(effective_amounts(containers).items())),
        )
        annotations[ALLOCATION_ANNOTATION] = encode_allocation(record)
    return BoundPod(PodRef("default", name, f"uid-{name}"), bound_at, containers, annotations)


def _resource_of(grants: tuple[GpuGrant, ...]) -> str:
    if grants[0].mig_uuid:
        return MIG_GPU
    return GPU if grants[0].whole else SHARED


def _amount_of(grants: tuple[GpuGrant, ...]) -> int:
    if grants[0].whole or grants[0].mig_uuid:
        return len(grants)
    return sum(g.units for g in grants)
