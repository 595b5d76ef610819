"""A pod's allocation record, split into what each of its containers is to get. Pure.

The kubelet asks the device plugin once per container and resource, so a pod-level record is
cut into slots: one per (container, resource) the pod requests from us. The record must grant
the pod's effective request of each resource (`contract.pod_demand.effective_amount`: sidecars
count for the pod's life and towards later init containers).

- Whole GPUs and MIG instances: containers that keep their devices (sidecars and app
  containers) take consecutive slices of the record's grants in container order; a plain init
  container takes the slice after those of the sidecars started before it (it runs beside
  them; the kubelet hands its devices on to the containers after it).
- Shares: every container gets the record's share GPUs with memory and units scaled by its
  part of the pod's request (rounded down, so the parts never add up to more than the record).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from contract.allocation import Allocation, AllocationError, decode_allocation, decode_consumption
from contract.keys import ALLOCATION_ANNOTATION, CONSUMED_ANNOTATION
from contract.pod_demand import ContainerRole, effective_amount
from contract.pods import PodRef
from contract.resources import ResourceKind
from node_agent.deviceplugin.inventory import Inventory
from node_agent.deviceplugin.record_store import BoundPod
from topology.scheduling import GpuGrant

#: (pod uid, record generation, container position, resource)
SlotKey = tuple[str, int, int, str]
#: (container position, role, resource, amount): what the kubelet will ask for
SlotShape = tuple[int, ContainerRole, str, int]


@dataclass(frozen=True, slots=True)
class Slot:
    """One container's part of one resource in a pod's allocation record."""

    pod: PodRef
    bound_at: float
    generation: int
    position: int  # index into BoundPod.containers
    container: str
    role: ContainerRole
    resource: str
    kind: ResourceKind
    amount: int  # device IDs the kubelet will ask for
    grants: tuple[GpuGrant, ...]  # what this container is given

    @property
    def key(self) -> SlotKey:
        return (self.pod.uid, self.generation, self.position, self.resource)

    @property
    def keeps_devices(self) -> bool:
        """Held for the pod's life (sidecar or app container), not handed on (plain init)."""
        return self.role is not ContainerRole.INIT

    @property
    def shape(self) -> SlotShape:
        return (self.position, self.role, self.resource, self.amount)


@dataclass(frozen=True)
class PodRecord:
    """A bound pod, the record it runs under, its slots, and the containers the API says consumed it."""

    pod: BoundPod
    allocation: Allocation
    slots: tuple[Slot, ...]
    consumed_in_api: frozenset[str] = frozenset()

    @property
    def ref(self) -> PodRef:
        return self.pod.ref

    @property
    def shape(self) -> tuple[SlotShape, ...]:
        """What the kubelet will ask for, slot by slot; two records with one shape can be swapped."""
        return tuple(s.shape for s in self.slots)


@dataclass(frozen=True, slots=True)
class RecordProblem:
    pod: PodRef
    generation: int
    reason: str


def our_resources(pod: BoundPod, inventory: Inventory) -> tuple[str, ...]:
    """The device-plugin resources the pod requests from us, sorted."""
    return tuple(sorted({r for c in pod.containers for r, n in c.amounts if n > 0 and inventory.kind(r)}))


def grants_for_resource(
    resource: str, grants: Iterable[GpuGrant], inventory: Inventory
) -> tuple[GpuGrant, ...]:
    kind = inventory.kind(resource)
    if kind is ResourceKind.WHOLE:
        return tuple(g for g in grants if g.whole and not g.mig_uuid)
    if kind is ResourceKind.SHARED_UNITS:
        return tuple(g for g in grants if not g.whole and not g.mig_uuid)
    return tuple(g for g in grants if g.mig_uuid and _mig_resource_of(g, inventory) == resource)


def split_record(pod: BoundPod, allocation: Allocation, inventory: Inventory) -> tuple[Slot, ...] | str:
    """The record's slots, or why the record does not fit the pod's requests."""
    recorded = dict(allocation.resources)
    covered: set[GpuGrant] = set()
    slots: list[Slot] = []
    for resource in our_resources(pod, inventory):
        kind = inventory.kind(resource)
        assert kind is not None
        needed = effective_amount(pod.containers, resource)
        if resource in recorded and recorded[resource] != needed:
            return f"record grants {recorded[resource]} {resource}, the pod requests {needed}"
        grants = grants_for_resource(resource, allocation.grants, inventory)
        covered.update(grants)
        if kind is ResourceKind.SHARED_UNITS:
            if not grants:
                return f"record has no shared GPU for {needed} {resource}"
        elif len(grants) != needed:
            return f"record has {len(grants)} devices for {resource}, the pod requests {needed}"
        kept = 0  # devices held by the sidecars and app containers so far
        for position, container in enumerate(pod.containers):
            amount = container.amount(resource)
            if amount <= 0:
                continue
            if kind is ResourceKind.SHARED_UNITS:
                given = tuple(_scaled(g, amount, needed) for g in grants)
            else:
                given = grants[kept : kept + amount]
                if container.keeps_devices:
                    kept += amount
            slots.append(
                Slot(
                    pod=pod.ref,
                    bound_at=pod.bound_at,
                    generation=allocation.generation,
                    position=position,
                    container=container.name,
                    role=container.role,
                    resource=resource,
                    kind=kind,
                    amount=amount,
                    grants=given,
                )
            )
    stray = [g for g in allocation.grants if g not in covered]
    if stray:
        return f"record grants {stray[0].mig_uuid or stray[0].uuid} that no container requests"
    return tuple(sorted(slots, key=lambda s: (s.position, s.resource)))


def read_records(
    pods: Iterable[BoundPod], inventory: Inventory, overrides: Mapping[str, Allocation] | None = None
) -> tuple[tuple[PodRecord, ...], tuple[RecordProblem, ...]]:
    """Records of the pods that have one, oldest bind first; and the records that cannot be used.

    `overrides` (by pod uid) are records this agent rewrote that the listing may not show yet;
    the one with the higher generation wins.
    """
    overrides = overrides or {}
    records: list[PodRecord] = []
    problems: list[RecordProblem] = []
    for pod in pods:
        if not our_resources(pod, inventory):
            continue
        allocation = _current_allocation(pod, overrides.get(pod.ref.uid))
        if isinstance(allocation, str):
            problems.append(RecordProblem(pod.ref, 0, allocation))
            continue
        if allocation is None:
            continue
        slots = split_record(pod, allocation, inventory)
        if isinstance(slots, str):
            problems.append(RecordProblem(pod.ref, allocation.generation, slots))
            continue
        records.append(PodRecord(pod, allocation, slots, _consumed_in_api(pod, allocation.generation)))
    records.sort(key=lambda r: (r.pod.bound_at, r.ref.namespace, r.ref.name, r.ref.uid))
    return tuple(records), tuple(problems)


def _current_allocation(pod: BoundPod, override: Allocation | None) -> Allocation | str | None:
    text = pod.annotations.get(ALLOCATION_ANNOTATION)
    listed: Allocation | None = None
    if text is not None:
        try:
            listed = decode_allocation(text)
        except AllocationError as exc:
            if override is None:
                return f"unreadable allocation record: {exc}"
    if override is not None and (listed is None or override.generation > listed.generation):
        return override
    return listed


def _consumed_in_api(pod: BoundPod, generation: int) -> frozenset[str]:
    text = pod.annotations.get(CONSUMED_ANNOTATION)
    if text is None:
        return frozenset()
    try:
        consumption = decode_consumption(text)
    except AllocationError:
        return frozenset()
    return frozenset(consumption.containers) if consumption.generation == generation else frozenset()


def _scaled(grant: GpuGrant, part: int, whole: int) -> GpuGrant:
    if part >= whole:
        return grant
    return replace(grant, memory_mib=grant.memory_mib * part // whole, units=grant.units * part // whole)


def _mig_resource_of(grant: GpuGrant, inventory: Inventory) -> str:
    found = inventory.mig_instance(grant.mig_uuid)
    return inventory.names.mig_resource(found[1].profile) if found else ""
