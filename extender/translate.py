"""Kubernetes objects (as JSON dicts) into the extender's own frozen types.

Pure functions, so the watch adapter and the in-memory cluster share one translation. The
rules themselves (cordons, GpuTopology, ledgers) live in `contract`; this only applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.cordons import parse_cordons
from contract.gpu_topology import GpuTopologyError, PublishedTopology, decode_gpu_topology
from contract.keys import ALLOCATION_ANNOTATION, CORDON_ANNOTATION
from contract.pods import pod_finished, pod_ref
from contract.resources import ResourceNames
from contract.scheduling_policy import (
    PolicyError,
    SchedulingPolicy,
    decode_scheduling_policy,
    namespace_policy,
)
from extender.config import ExtenderConfig
from extender.pod_requests import read_pod_request
from extender.snapshot import NodeFacts, TrackedPod


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


def tracked_pod(pod: Mapping[str, Any]) -> TrackedPod:
    ref = pod_ref(pod)
    return TrackedPod(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        node_name=str((pod.get("spec") or {}).get("nodeName") or ""),
        finished=pod_finished(pod),
    )


def pod_is_tracked(pod: Mapping[str, Any], config: ExtenderConfig) -> bool:
    """Pods that ask for a managed GPU resource or carry an allocation are tracked."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return ALLOCATION_ANNOTATION in annotations or read_pod_request(pod, config) is not None
