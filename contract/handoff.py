"""The hand-off of GPUs between the extender and the node: what the node still holds. Pure.

The extender decides who gets which GPU; the kubelet decides when a GPU is really free again
(its device manager keeps a pod's devices until the pod is no longer active: a terminating
pod, or one deleted with `--force` whose containers still run). So the node agent publishes,
in its GpuTopology status, the pods the kubelet's pod-resources account still lists with our
devices (`NodeHolds`), together with the resourceVersion of the pod list it read just before
asking the kubelet (`revision`). Both sides apply these rules:

- a GPU held on the node is not free for the extender (`held_outside`: held pods the ledger no
  longer carries still count);
- a departed pod's ledger entry is released only once the node has looked after the departure
  and no longer holds the pod (`released_by_node`): `revision` at least the pods' revision the
  extender had seen when it found the entry stale, and the pod not among the holds.

A node that publishes no holds (an older agent, or no pod-resources socket) is not waited for.
A node whose holds say `admitting: false` (its agent is stopping, or cannot reach the kubelet)
gets no new pods: the kubelet would reject them while no device plugin serves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.allocation import AllocationError, decode_grant, encode_grant
from contract.pods import PodRef
from topology.scheduling import GpuGrant


@dataclass(frozen=True, slots=True)
class HeldPod:
    """A pod the kubelet still accounts our devices to; `uid` is "" when the node does not know it."""

    namespace: str
    name: str
    uid: str
    grants: tuple[GpuGrant, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeHolds:
    """What the node holds, as of the pod list at `revision` (read before the kubelet was asked)."""

    revision: str
    pods: tuple[HeldPod, ...] = ()
    admitting: bool = True  # the node's device plugin serves the kubelet and takes new pods

    def holds(self, pod: PodRef) -> bool:
        """Whether `pod` (this incarnation) still holds devices on the node."""
        for held in self.pods:
            if held.key == pod.key and (not held.uid or not pod.uid or held.uid == pod.uid):
                return True
        return False


def revision_at_least(revision: str, wanted: str) -> bool:
    """Whether resourceVersion `revision` is known to be at or after `wanted` (etcd's are numbers;
    anything else is never known to be, unless nothing is wanted)."""
    if not wanted:
        return True
    return revision.isdigit() and wanted.isdigit() and int(revision) >= int(wanted)


def released_by_node(holds: NodeHolds | None, pod: PodRef, departed_at: str) -> bool:
    """Whether a departed pod's GPUs may be given again: the node looked at or after `departed_at`
    (the extender's pods revision when it saw the departure) and no longer holds the pod."""
    if holds is None:
        return True
    return revision_at_least(holds.revision, departed_at) and not holds.holds(pod)


def held_outside(
    holds: NodeHolds | None, ledger: Mapping[str, tuple[str, Iterable[GpuGrant]]]
) -> tuple[GpuGrant, ...]:
    """Held grants the ledger does not account for (`ledger`: pod uid -> ("ns/name", its grants)):
    everything held for a pod the ledger does not carry, and for a pod it does carry the GPUs held
    beyond its entry (two pods whose records the node swapped, until the ledger follows)."""
    if holds is None:
        return ()
    by_key = {key: uid for uid, (key, _) in ledger.items()}
    out: list[GpuGrant] = []
    for held in holds.pods:
        uid = held.uid if held.uid else by_key.get(held.key, "")  # a name-only hold goes by name
        if uid not in ledger:
            out.extend(held.grants)
            continue
        carried = {_device(g) for g in ledger[uid][1]}
        out.extend(g for g in held.grants if _device(g) not in carried)
    return tuple(out)


def _device(grant: GpuGrant) -> tuple[str, str, bool]:
    return (grant.uuid, grant.mig_uuid, grant.whole)


def admits_pods(holds: NodeHolds | None) -> bool:
    """Whether new pods may be placed on the node (False while its device plugin is not serving)."""
    return holds is None or holds.admitting


def encode_holds(holds: NodeHolds) -> dict[str, Any]:
    return {
        "revision": holds.revision,
        "admitting": holds.admitting,
        "pods": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "uid": p.uid,
                "gpus": [encode_grant(g) for g in p.grants],
            }
            for p in holds.pods
        ],
    }


class HoldsError(ValueError):
    """A published `held` is malformed; the message names the field."""


def decode_holds(raw: object, where: str = "held") -> NodeHolds:
    if not isinstance(raw, Mapping):
        raise HoldsError(f"{where}: expected an object, got {type(raw).__name__}")
    revision = raw.get("revision", "")
    if not isinstance(revision, str):
        raise HoldsError(f"{where}.revision: expected a string")
    pods_raw = raw.get("pods") or []
    if not isinstance(pods_raw, list):
        raise HoldsError(f"{where}.pods: expected a list")
    pods = []
    for i, entry in enumerate(pods_raw):
        at = f"{where}.pods[{i}]"
        if not isinstance(entry, Mapping):
            raise HoldsError(f"{at}: expected an object")
        texts = [entry.get(k, "") for k in ("namespace", "name", "uid")]
        if not all(isinstance(t, str) for t in texts) or not texts[1]:
            raise HoldsError(f"{at}: namespace, name and uid must be strings, name not empty")
        gpus = entry.get("gpus") or []
        if not isinstance(gpus, list):
            raise HoldsError(f"{at}.gpus: expected a list")
        try:
            grants = tuple(
                decode_grant(dict(g) if isinstance(g, Mapping) else g, n) for n, g in enumerate(gpus)
            )
        except AllocationError as exc:
            raise HoldsError(f"{at}.gpus: {exc}") from exc
        pods.append(HeldPod(texts[0] or "default", texts[1], texts[2], grants))
    admitting = raw.get("admitting", True)
    if not isinstance(admitting, bool):
        raise HoldsError(f"{where}.admitting: expected true or false")
    return NodeHolds(revision, tuple(sorted(pods, key=lambda p: (p.key, p.uid))), admitting)


def sorted_holds(revision: str, pods: Iterable[HeldPod], admitting: bool = True) -> NodeHolds:
    return NodeHolds(revision, tuple(sorted(pods, key=lambda p: (p.key, p.uid))), admitting)
