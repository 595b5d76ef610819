"""A pod's allocation record, split into what each of its containers is to get. Pure.

The kubelet asks the device plugin once per container and resource, so a pod-level record is
cut into slots: one per (container, resource) the pod requests from us.

- Whole GPUs and MIG instances: app containers take consecutive slices of the record's grants
  in container order; an init container takes the first slice (the kubelet hands an init
  container's devices on to the containers after it).
- Shares: every container gets the record's share GPUs with memory and units scaled by its
  part of the pod's request (rounded down, so the parts never add up to more than the record).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from node_agent.deviceplugin.inventory import Inventory, ResourceKind, mig_resource, resource_kind
from node_agent.deviceplugin.ledger import BoundPod, ContainerDemand, PodRef
from topology.allocation import (
    ALLOCATION_ANNOTATION,
    CONSUMED_ANNOTATION,
    Allocation,
    AllocationError,
    decode_allocation,
    decode_consumption,
)
from topology.workload import GpuGrant

#: (pod uid, record generation, container position, resource)
SlotKey = tuple[str, int, int, str]


@dataclass(frozen=True, slots=True)
class Slot:
    """One container's part of one resource in a pod's allocation record."""

    pod: PodRef
    bound_at: float
    generation: int
    position: int  # index into BoundPod.containers
    container: str
    init: bool
    resource: str
    amount: int  # device IDs the kubelet will ask for
    grants: tuple[GpuGrant, ...]  # what this container is given

    @property
    def key(self) -> SlotKey:
        return (self.pod.uid, self.generation, self.position, self.resource)

    @property
    def shape(self) -> tuple[int, bool, str, int]:
        return (self.position, self.init, self.resource, self.amount)


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
    def shape(self) -> tuple[tuple[int, bool, str, int], ...]:
        """What the kubelet will ask for, slot by slot; two records with one shape can be swapped."""
        return tuple(s.shape for s in self.slots)


@dataclass(frozen=True, slots=True)
class RecordProblem:
    pod: PodRef
    generation: int
    reason: str


def our_resources(pod: BoundPod) -> tuple[str, ...]:
    """The device-plugin resources the pod requests from us, sorted."""
    return tuple(
        sorted({r for c in pod.containers for r, n in c.resources if n > 0 and resource_kind(r) is not None})
    )


def effective_request(demands: Sequence[ContainerDemand], resource: str) -> int:
    """What the pod as a whole needs of a resource: the larger of any init container and the app sum."""
    init = max((c.amount(resource) for c in demands if c.init), default=0)
    app = sum(c.amount(resource) for c in demands if not c.init)
    return max(init, app)


def grants_for_resource(
    resource: str, grants: Iterable[GpuGrant], inventory: Inventory
) -> tuple[GpuGrant, ...]:
    kind = resource_kind(resource)
    if kind is ResourceKind.WHOLE:
        return tuple(g for g in grants if g.whole and not g.mig_uuid)
    if kind is ResourceKind.SHARE:
        return tuple(g for g in grants if not g.whole and not g.mig_uuid)
    return tuple(g for g in grants if g.mig_uuid and _mig_resource_of(g, inventory) == resource)


def split_record(pod: BoundPod, allocation: Allocation, inventory: Inventory) -> tuple[Slot, ...] | str:
    """The record's slots, or why the record does not fit the pod's requests."""
    resources = our_resources(pod)
    recorded = dict(allocation.resources)
    covered: set[GpuGrant] = set()
    slots: list[Slot] = []
    for resource in resources:
        needed = effective_request(pod.containers, resource)
        if resource in recorded and recorded[resource] != needed:
            return f"record grants {recorded[resource]} {resource}, the pod requests {needed}"
        grants = grants_for_resource(resource, allocation.grants, inventory)
        covered.update(grants)
        kind = resource_kind(resource)
        if kind is ResourceKind.SHARE:
            if not grants:
                return f"record has no shared GPU for {needed} {resource}"
        elif len(grants) != needed:
            return f"record has {len(grants)} devices for {resource}, the pod requests {needed}"
        offset = 0
        for position, container in enumerate(pod.containers):
            amount = container.amount(resource)
            if amount <= 0:
                continue
            if kind is ResourceKind.SHARE:
                given = tuple(_scaled(g, amount, needed) for g in grants)
            elif container.init:
                given = grants[:amount]
            else:
                given = grants[offset : offset + amount]
                offset += amount
            slots.append(
                Slot(
                    pod=pod.ref,
                    bound_at=pod.bound_at,
                    generation=allocation.generation,
                    position=position,
                    container=container.name,
                    init=container.init,
                    resource=resource,
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
        if not our_resources(pod):
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
    return mig_resource(found[1].profile) if found else ""
