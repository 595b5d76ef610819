"""Which allocation record a kubelet request is for, and what may be handed out. Pure.

Neither GetPreferredAllocation nor Allocate says which pod it is for. A request for N devices
of a resource is matched to the next unconsumed slot, with exactly N devices of that resource,
of a record on this node; among those, a record whose devices are the ones the kubelet passed
wins (it follows our preference), else the oldest bind. Each slot is consumed once.

Capacity is the last word: a record is served only if its GPUs are free of every other
record this agent has handed out (whole, MIG, or share memory and units within the GPU's
size), so whatever order requests come in, no GPU is ever given beyond its capacity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from contract.allocation import Consumption
from contract.pods import PodRef
from contract.resources import ResourceKind
from node_agent.deviceplugin.inventory import Inventory, share_unit_gpu, share_unit_number
from node_agent.deviceplugin.records import PodRecord, Slot, SlotKey
from topology.scheduling import GpuGrant

#: (pod uid, record generation)
RecordKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RecordClaim:
    """A hold on a record's GPUs, from its first handout until `holder` (the pod using them) is gone."""

    record: RecordKey
    holder: PodRef
    grants: tuple[GpuGrant, ...]
    since: float


@dataclass(frozen=True, slots=True)
class Handout:
    """One Allocate answered: the slot consumed, who got it, and the IDs the kubelet accounted."""

    slot: Slot
    holder: PodRef
    kubelet_ids: tuple[str, ...]  # sorted
    at: float
    ids_agree: bool  # the kubelet passed the record's own devices


@dataclass(frozen=True)
class HandoutState:
    handouts: tuple[Handout, ...] = ()
    claims: tuple[RecordClaim, ...] = ()

    @cached_property
    def consumed(self) -> frozenset[SlotKey]:
        return frozenset(h.slot.key for h in self.handouts)

    def claim_of(self, record: RecordKey) -> RecordClaim | None:
        return next((h for h in self.claims if h.record == record), None)


def capacity_conflict(
    grants: Sequence[GpuGrant], record: RecordKey, holds: Iterable[RecordClaim], inventory: Inventory
) -> str | None:
    """Why these grants cannot be handed out beside the other records' holds (None: they can)."""
    whole: set[str] = set()
    migs: set[str] = set()
    mig_parents: set[str] = set()
    memory: Counter[str] = Counter()
    units: Counter[str] = Counter()
    shared: set[str] = set()

    def take(g: GpuGrant) -> str | None:
        if g.mig_uuid:
            found = inventory.mig_instance(g.mig_uuid)
            if found is None:
                return f"MIG instance {g.mig_uuid} is not on this node"
            parent = found[0].uuid
            if g.mig_uuid in migs:
                return f"MIG instance {g.mig_uuid} is already handed out"
            migs.add(g.mig_uuid)
            mig_parents.add(parent)
            return None
        gpu = inventory.gpu(g.uuid)
        if gpu is None or gpu.mig_enabled:
            return f"GPU {g.uuid} is not offered whole or shared on this node"
        if g.uuid in whole or (g.whole and (g.uuid in shared or g.uuid in mig_parents)):
            return f"GPU {g.uuid} is already handed out"
        if g.whole:
            whole.add(g.uuid)
            return None
        shared.add(g.uuid)
        memory[g.uuid] += g.memory_mib
        units[g.uuid] += g.units
        if memory[g.uuid] > gpu.memory_mib:
            return f"GPU {g.uuid} has {gpu.memory_mib - memory[g.uuid] + g.memory_mib} MiB free, not {g.memory_mib}"
        if units[g.uuid] > inventory.units_per_gpu:
            free = inventory.units_per_gpu - units[g.uuid] + g.units
            return f"GPU {g.uuid} has {free} share units free, not {g.units}"
        return None

    for held in holds:
        if held.record != record:
            for g in held.grants:
                take(g)  # what is already out counts whatever it says
    for g in grants:
        problem = take(g)
        if problem:
            return problem
    return None


def servable(record: PodRecord, state: HandoutState, inventory: Inventory) -> bool:
    key = (record.ref.uid, record.allocation.generation)
    if state.claim_of(key) is not None:
        return True
    return capacity_conflict(record.allocation.grants, key, state.claims, inventory) is None


def next_slot(record: PodRecord, resource: str, state: HandoutState) -> Slot | None:
    """The record's first slot of `resource` the kubelet has not asked for yet."""
    for slot in record.slots:
        if slot.resource != resource:
            continue
        if slot.key in state.consumed or slot.container in record.consumed_in_api:
            continue
        return slot
    return None


def candidates(
    resource: str, amount: int, records: Sequence[PodRecord], state: HandoutState, inventory: Inventory
) -> tuple[Slot, ...]:
    """Slots a request for `amount` devices of `resource` may be for, oldest bind first."""
    found: list[Slot] = []
    for record in records:  # already sorted oldest bind first
        slot = next_slot(record, resource, state)
        if slot is not None and slot.amount == amount and servable(record, state, inventory):
            found.append(slot)
    return tuple(found)


def ids_agree(slot: Slot, device_ids: Iterable[str]) -> bool:
    """Whether these kubelet device IDs are the slot's own devices."""
    ids = list(device_ids)
    kind = slot.kind
    if kind is ResourceKind.WHOLE:
        return sorted(ids) == sorted(g.uuid for g in slot.grants)
    if kind is ResourceKind.MIG:
        return sorted(ids) == sorted(g.mig_uuid for g in slot.grants)
    gpus = {g.uuid for g in slot.grants}
    return len(ids) == slot.amount and all(share_unit_gpu(i) in gpus for i in ids)


def choose_slot(
    resource: str,
    device_ids: Sequence[str],
    records: Sequence[PodRecord],
    state: HandoutState,
    inventory: Inventory,
) -> Slot | None:
    """The slot an Allocate for these device IDs consumes; None when no record fits."""
    found = candidates(resource, len(device_ids), records, state, inventory)
    agreeing = [s for s in found if ids_agree(s, device_ids)]
    if agreeing:
        return agreeing[0]
    return found[0] if found else None


def lost_handout(
    resource: str,
    device_ids: Sequence[str],
    records: Sequence[PodRecord],
    state: HandoutState,
    kubelet_holding: Iterable[tuple[str, str, str]],
) -> Slot | None:
    """A slot handed out before that the kubelet asks for again: its Allocate was answered, but
    the kubelet holds no devices of this resource for that container now (it stopped after the
    answer and before it recorded it, and admits the pod again after its restart). Used only
    when no unconsumed slot fits, and only with the kubelet's account (`kubelet_holding`:
    (namespace, pod, resource) of every container its pod-resources List names with devices):
    a pod the kubelet accounts devices of this resource to is not served again unless it asks
    for exactly the IDs it got before (the kubelet never passes IDs it accounts to one
    container to another, so that is the same container asking again). Among several, the one
    whose earlier handout had these very device IDs wins, else the oldest bind."""
    holding = {(ns, pod, res) for ns, pod, res in kubelet_holding}
    wanted = tuple(sorted(device_ids, key=device_order))
    earlier = {h.slot.key: h for h in state.handouts}
    found: list[Slot] = []
    for record in records:  # already sorted oldest bind first
        accounted = (record.ref.namespace, record.ref.name, resource) in holding
        for slot in record.slots:
            if slot.resource != resource or slot.amount != len(device_ids):
                continue
            handout = earlier.get(slot.key)
            same_ids = handout is not None and handout.kubelet_ids == wanted
            if accounted and not same_ids:
                continue  # the kubelet has this container's devices: the request is not for it
            if handout is not None or slot.container in record.consumed_in_api:
                found.append(slot)
                break
    for slot in found:
        handout = earlier.get(slot.key)
        if handout is not None and handout.kubelet_ids == wanted:
            return slot
    return found[0] if found else None


def forget_handout(state: HandoutState, slot: Slot) -> HandoutState:
    """The state without the earlier handout of `slot` (it is being handed out again)."""
    handouts = tuple(h for h in state.handouts if h.slot.key != slot.key)
    return state if handouts == state.handouts else HandoutState(handouts, state.claims)


def fit_within_record(slot: Slot, record: PodRecord, device_ids: Sequence[str], state: HandoutState) -> Slot:
    """Which of its pod's whole GPUs / MIG instances the container gets.

    The record is per pod; the kubelet decides which of the pod's devices each container gets
    (from a plain init container's devices it hands on, in no set order). When the kubelet's IDs
    are among the pod's granted devices not held by a sidecar or app container already served,
    the container gets exactly those, so its environment and the kubelet's account agree.
    Otherwise it gets its own slice, or the first devices of the pod still free.
    """
    kind = slot.kind
    if kind not in (ResourceKind.WHOLE, ResourceKind.MIG):
        return slot

    def device(g: GpuGrant) -> str:
        return g.uuid if kind is ResourceKind.WHOLE else g.mig_uuid

    pool = list(dict.fromkeys(g for s in record.slots if s.resource == slot.resource for g in s.grants))
    taken: set[str] = set()
    record_key = (record.ref.uid, record.allocation.generation)
    for h in state.handouts:
        same = (h.slot.pod.uid, h.slot.generation) == record_key and h.slot.resource == slot.resource
        if same and h.slot.keeps_devices:
            taken.update(device(g) for g in h.slot.grants)
    free = [g for g in pool if device(g) not in taken]
    wanted = [g for g in free if device(g) in set(device_ids)]
    if len(wanted) == slot.amount:
        return replace(slot, grants=tuple(wanted))
    if all(device(g) not in taken for g in slot.grants):
        return slot
    return replace(slot, grants=tuple(free[: slot.amount]))


def device_order(device_id: str) -> tuple[str, int, str]:
    """A stable, natural order for device IDs (share units by GPU, then unit number)."""
    gpu = share_unit_gpu(device_id)
    return (gpu, share_unit_number(device_id), "") if gpu else (device_id, -1, device_id)


def preferred_ids(
    resource: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    records: Sequence[PodRecord],
    state: HandoutState,
    inventory: Inventory,
) -> tuple[str, ...]:
    """The devices to prefer: the oldest fitting record's own devices if the kubelet still has them."""
    offered = sorted(set(available) | set(must_include), key=device_order)
    found = candidates(resource, size, records, state, inventory)
    for slot in found:
        picked = _pick_for_slot(slot, offered, must_include, size)
        if len(picked) == size and ids_agree(slot, picked):
            return picked
    start = _pick_for_slot(found[0], offered, must_include, size) if found else tuple(must_include)
    rest = [i for i in offered if i not in start]
    return (*start, *rest)[: max(size, len(must_include))]


def _pick_for_slot(
    slot: Slot, offered: Sequence[str], must_include: Sequence[str], size: int
) -> tuple[str, ...]:
    picked = list(dict.fromkeys(must_include))
    kind = slot.kind
    if kind is ResourceKind.WHOLE:
        wanted = [g.uuid for g in slot.grants]
    elif kind is ResourceKind.MIG:
        wanted = [g.mig_uuid for g in slot.grants]
    else:
        gpus = {g.uuid for g in slot.grants}
        wanted = [i for i in offered if share_unit_gpu(i) in gpus]
    present = set(offered)
    for device_id in wanted:
        if len(picked) >= size:
            break
        if device_id in present and device_id not in picked:
            picked.append(device_id)
    return tuple(picked)


def consume(
    state: HandoutState, record: PodRecord, slot: Slot, device_ids: Sequence[str], now: float
) -> HandoutState:
    """The state after handing `slot` out for these kubelet device IDs."""
    handout = Handout(
        slot, slot.pod, tuple(sorted(device_ids, key=device_order)), now, ids_agree(slot, device_ids)
    )
    key = (record.ref.uid, record.allocation.generation)
    holds = state.claims
    if state.claim_of(key) is None:
        holds = (
            *(h for h in holds if h.record[0] != key[0]),
            RecordClaim(key, record.ref, record.allocation.grants, now),
        )
    return HandoutState((*state.handouts, handout), holds)


def consumption_of(state: HandoutState, record: RecordKey) -> Consumption:
    """What to write back as `linkpack.io/consumed` for a record: its consumed containers and IDs."""
    mine = sorted(
        (h for h in state.handouts if (h.slot.pod.uid, h.slot.generation) == record),
        key=lambda h: (h.slot.position, h.slot.resource),
    )
    containers = tuple(dict.fromkeys(h.slot.container for h in mine))
    device_ids = tuple(i for h in mine for i in h.kubelet_ids)
    return Consumption(generation=record[1], containers=containers, device_ids=device_ids)


def release_departed(
    state: HandoutState,
    present: Iterable[str],
    now: float,
    grace_s: float,
    kubelet_active: Iterable[tuple[str, str]] | None = None,
) -> HandoutState:
    """Forget what pods no longer on the node held.

    With the kubelet's account (`kubelet_active`: (namespace, name) of the pods its
    pod-resources List names with our devices) a pod missing from the API listing (deleted, or
    finished) is released at once when the kubelet no longer holds devices for it, and kept as
    long as it does (a terminating pod, or one deleted with --force whose containers still
    run). Without it (no pod-resources socket), a pod must be missing for `grace_s` after its
    handout first (so a listing that lags behind a fresh bind does not release it)."""
    alive = set(present)
    active = set(kubelet_active) if kubelet_active is not None else None

    def keep(holder: PodRef, since: float) -> bool:
        if holder.uid in alive:
            return True
        if active is not None:
            return (holder.namespace, holder.name) in active
        return now - since < grace_s

    holds = tuple(h for h in state.claims if keep(h.holder, h.since))
    handouts = tuple(h for h in state.handouts if keep(h.holder, h.at))
    if holds == state.claims and handouts == state.handouts:
        return state
    return HandoutState(handouts, holds)


def resync(records: Iterable[PodRecord], now: float) -> HandoutState:
    """The state after an agent restart, rebuilt from the consumed annotations in the API."""
    handouts: list[Handout] = []
    holds: list[RecordClaim] = []
    for record in records:
        consumed = [s for s in record.slots if s.container in record.consumed_in_api]
        if not consumed:
            continue
        for slot in consumed:
            handouts.append(Handout(slot, slot.pod, (), now, ids_agree=True))
        holds.append(
            RecordClaim(
                (record.ref.uid, record.allocation.generation), record.ref, record.allocation.grants, now
            )
        )
    return HandoutState(tuple(handouts), tuple(holds))


def reassign_claim(state: HandoutState, record: RecordKey, holder: PodRef) -> HandoutState:
    """Say that another pod is the one using a record's GPUs (and its handouts)."""
    holds = tuple(replace(h, holder=holder) if h.record == record else h for h in state.claims)
    handouts = tuple(
        replace(h, holder=holder) if (h.slot.pod.uid, h.slot.generation) == record else h
        for h in state.handouts
    )
    return HandoutState(handouts, holds)
