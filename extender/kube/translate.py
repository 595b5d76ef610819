"""Kubernetes objects (as JSON dicts) into the extender's own frozen types.

Pure functions, so the watch adapter and the in-memory cluster share one translation. The
rules themselves (cordons, GpuTopology, ledgers) live in `contract`; this only applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.compute_demand import node_allocatable_compute, pod_compute_demand
from contract.cordons import parse_cordons
from contract.gpu_topology import GpuTopologyError, PublishedTopology, decode_gpu_topology
from contract.keys import ALLOCATION_ANNOTATION, CORDON_ANNOTATION
from contract.pod_demand import PodSpecError, container_demands, effective_amounts
from contract.pods import pod_finished, pod_ref
from contract.resources import ResourceNames
from contract.scheduling_policy import (
    PolicyError,
    SchedulingPolicy,
    decode_scheduling_policy,
    namespace_policy,
)
from extender.config import ExtenderConfig
from extender.state.pod_requests import read_pod_request
from extender.state.snapshot import NodeFacts, TrackedPod
from topology.fragmentation import PodShape


def node_facts(node: Mapping[str, Any], names: ResourceNames | None = None) -> NodeFacts:
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    names = names or ResourceNames()
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    advertises = any(names.managed(r) and str(q) not in ("0", "") for r, q in allocatable.items())
    return NodeFacts(
        name=str(meta.get("name") or ""),
        cordons=parse_cordons(annotations.get(CORDON_ANNOTATION)),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        advertises_gpus=advertises,
        allocatable=node_allocatable_compute(node),
    )


def read_gpu_topology(obj: Mapping[str, Any]) -> tuple[str, PublishedTopology | None, str]:
    """(node name, the decoded GpuTopology or None, why it could not be read or "")."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    try:
        return name, decode_gpu_topology(obj), ""
    except GpuTopologyError as exc:
        return name, None, str(exc)


def read_scheduling_policy(obj: Mapping[str, Any]) -> tuple[str, SchedulingPolicy | None, str]:
    """(name, the decoded GpuSchedulingPolicy or None, why it cannot be used or "")."""
    meta = obj.get("metadata")
    name = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
    try:
        return name, decode_scheduling_policy(obj), ""
    except PolicyError as exc:
        return name, None, str(exc)


def namespace_default_policy(namespace: Mapping[str, Any]) -> tuple[str, str | None]:
    """(namespace name, the policy its label or annotation linkpack.io/policy names, or None)."""
    meta = namespace.get("metadata") or {}
    return str(meta.get("name") or ""), namespace_policy(namespace)


def gpu_shape(pod: Mapping[str, Any], config: ExtenderConfig) -> PodShape | None:
    """What the pod asks of GPUs, as the learned workload counts it (None: no whole GPUs or share).

    A share counts as its units over the units per GPU, in milli-GPU. The GPU models its policy
    allows are not part of it (the policy may not be known yet when the pod is first seen)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    names = config.resources
    try:
        amounts = effective_amounts(container_demands(spec, names.managed))
    except PodSpecError:
        return None
    whole = amounts.get(names.whole, 0)
    units = amounts.get(names.shared_units, 0)
    if whole > 0:
        milli, count = 1000, whole
    elif units > 0 and config.units_per_gpu > 0:
        milli, count = max(1, min(1000, 1000 * units // config.units_per_gpu)), 1
    else:
        return None
    return PodShape(pod_compute_demand(pod).cpu_milli, milli, count)


def tracked_pod(pod: Mapping[str, Any], config: ExtenderConfig | None = None) -> TrackedPod:
    ref = pod_ref(pod)
    return TrackedPod(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        node_name=str((pod.get("spec") or {}).get("nodeName") or ""),
        finished=pod_finished(pod),
        compute=pod_compute_demand(pod),
        gpu_shape=gpu_shape(pod, config or ExtenderConfig()),
    )


def pod_is_tracked(pod: Mapping[str, Any], config: ExtenderConfig) -> bool:
    """Pods that ask for a managed GPU resource or carry an allocation are tracked, and so is
    every pod bound to a node (its CPU and memory requests count against the node's)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return ALLOCATION_ANNOTATION in annotations or read_pod_request(pod, config) is not None
