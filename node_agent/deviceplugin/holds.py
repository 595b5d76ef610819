"""What this node holds, from the kubelet's own account, and when to publish it again. Pure.

The kubelet's pod-resources List names, per pod and container, the device IDs it accounts to
it; a pod stays there while the kubelet keeps it active (running, terminating, or deleted with
`--force` while its containers still run). `node_holds` turns that into the `NodeHolds` the
node publishes (`contract.handoff`): for a pod with a hold of ours, its record's grants (share
memory included); for any other pod, the grants its device IDs name (whole GPU, share units
of a GPU, MIG instance). `kubelet_active` is the set of pods that list names.

`report_holds` keeps the published report steady: a new report goes out when the held pods
change, and otherwise at most every `refresh_s` (only its revision moves then), so a busy node
does not rewrite its status on every look.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from contract.handoff import HeldPod, NodeHolds, sorted_holds
from node_agent.deviceplugin.inventory import Inventory, share_unit_gpu
from node_agent.deviceplugin.reconcile import KubeletAssignment
from node_agent.deviceplugin.request_matching import HandoutState
from topology.scheduling import GpuGrant


def kubelet_active(assignments: Iterable[KubeletAssignment]) -> frozenset[tuple[str, str]]:
    """(namespace, name) of every pod the kubelet accounts any of our devices to."""
    return frozenset((a.namespace, a.pod) for a in assignments if a.device_ids)


def kubelet_holding(assignments: Iterable[KubeletAssignment]) -> frozenset[tuple[str, str, str]]:
    """(namespace, pod, resource) of every pod the kubelet accounts devices of that resource to."""
    return frozenset((a.namespace, a.pod, a.resource) for a in assignments if a.device_ids)


def grants_of_devices(device_ids: Iterable[str], inventory: Inventory) -> tuple[GpuGrant, ...]:
    """The grants a set of kubelet device IDs stands for (IDs not of this node are left out)."""
    whole: list[GpuGrant] = []
    units: Counter[str] = Counter()
    migs: list[GpuGrant] = []
    for device in sorted(set(device_ids)):
        gpu_uuid = share_unit_gpu(device)
        if gpu_uuid:
            units[gpu_uuid] += 1
            continue
        gpu = inventory.gpu(device)
        if gpu is not None:
            whole.append(GpuGrant(gpu.index, gpu.uuid, whole=True))
            continue
        found = inventory.mig_instance(device)
        if found is not None:
            parent, mig = found
            migs.append(
                GpuGrant(parent.index, parent.uuid, whole=False, memory_mib=mig.memory_mib, mig_uuid=mig.uuid)
            )
    shares = []
    for gpu_uuid, count in sorted(units.items()):
        gpu = inventory.gpu(gpu_uuid)
        if gpu is not None:
            memory = gpu.memory_mib * count // inventory.units_per_gpu
            shares.append(GpuGrant(gpu.index, gpu.uuid, whole=False, memory_mib=memory, units=count))
    return tuple(sorted((*whole, *shares, *migs), key=lambda g: (g.index, g.mig_uuid)))


def node_holds(
    revision: str,
    assignments: Sequence[KubeletAssignment],
    state: HandoutState,
    uids: Mapping[tuple[str, str], str],
    inventory: Inventory,
    admitting: bool = True,
) -> NodeHolds:
    """The pods the kubelet holds our devices for. `uids`: (namespace, name) -> uid of the pods
    the API lists on this node now; `revision`: that list's resourceVersion."""
    devices: dict[tuple[str, str], set[str]] = {}
    for a in assignments:
        if a.device_ids and inventory.serves(a.resource):
            devices.setdefault((a.namespace, a.pod), set()).update(a.device_ids)
    held: list[HeldPod] = []
    for (namespace, name), ids in sorted(devices.items()):
        hold = next(
            (h for h in state.claims if (h.holder.namespace, h.holder.name) == (namespace, name)), None
        )
        uid = uids.get((namespace, name)) or (hold.holder.uid if hold is not None else "")
        if hold is not None and (not uid or hold.holder.uid == uid):
            grants = tuple(hold.grants)
        else:
            grants = grants_of_devices(ids, inventory)
        held.append(HeldPod(namespace, name, uid, grants))
    return sorted_holds(revision, held, admitting)


def report_holds(
    previous: NodeHolds | None, previous_at: float, current: NodeHolds, now: float, refresh_s: float
) -> tuple[NodeHolds, float]:
    """The report to publish and since when: `current` when the pods changed or `refresh_s` passed."""
    if previous is None or (previous.pods, previous.admitting) != (current.pods, current.admitting):
        return current, now
    if now - previous_at >= refresh_s:
        return current, now
    return previous, previous_at
