"""What must hold for every pod running on the real node, as values (pure).

- `visible_gpus`: the GPUs a container was given, from its `NVIDIA_VISIBLE_DEVICES`;
- `kubelet_gpus`: the GPUs the kubelet's pod-resources account names for a pod (whole-GPU
  UUIDs, share units `<uuid>::u<k>` mapped to their GPU, MIG instances to their MIG UUID);
- `recorded_devices`: what an allocation record gives a pod, named as NVIDIA_VISIBLE_DEVICES names
  it (the MIG UUID for a MIG grant, the GPU UUID otherwise);
- `double_counted`: physical GPUs the kubelet has given whole to one pod and also to another pod,
  whole or shared;
- `mig_double_held`: MIG instances the kubelet has given to more than one pod.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from node_agent.deviceplugin.inventory import share_unit_gpu
from node_agent.deviceplugin.reconcile import KubeletAssignment
from topology.scheduling import GpuGrant


def visible_gpus(env: Mapping[str, str]) -> frozenset[str]:
    value = env.get("NVIDIA_VISIBLE_DEVICES", "")
    return frozenset(v for v in value.split(",") if v)


def kubelet_gpus(assignments: Iterable[KubeletAssignment], namespace: str, pod: str) -> frozenset[str]:
    out: set[str] = set()
    for a in assignments:
        if (a.namespace, a.pod) == (namespace, pod):
            out.update(share_unit_gpu(i) or i for i in a.device_ids)
    return frozenset(out)


def recorded_devices(grants: Iterable[GpuGrant]) -> frozenset[str]:
    """The devices a record grants, as NVIDIA_VISIBLE_DEVICES names them."""
    return frozenset(g.mig_uuid or g.uuid for g in grants)


def double_counted(assignments: Iterable[KubeletAssignment], whole_resource: str) -> dict[str, set[str]]:
    """GPU uuid -> the pods holding it, for GPUs held whole by one pod and by any other pod too."""
    whole: dict[str, set[str]] = defaultdict(set)
    any_holder: dict[str, set[str]] = defaultdict(set)
    for a in assignments:
        key = f"{a.namespace}/{a.pod}"
        for device in a.device_ids:
            gpu = share_unit_gpu(device) or device
            any_holder[gpu].add(key)
            if a.resource == whole_resource:
                whole[gpu].add(key)
    return {gpu: any_holder[gpu] for gpu, holders in whole.items() if len(any_holder[gpu]) > 1}


def mig_double_held(assignments: Iterable[KubeletAssignment], mig_prefix: str) -> dict[str, set[str]]:
    """MIG UUID -> the pods holding it, for MIG instances (resources named `mig_prefix`...) held by
    more than one pod."""
    holders: dict[str, set[str]] = defaultdict(set)
    for a in assignments:
        if a.resource.startswith(mig_prefix):
            for device in a.device_ids:
                holders[device].add(f"{a.namespace}/{a.pod}")
    return {mig: pods for mig, pods in holders.items() if len(pods) > 1}
