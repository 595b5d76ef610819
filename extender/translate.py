"""Kubernetes objects (as JSON dicts) into the extender's own frozen types.

Pure functions, so the watch adapter and the in-memory cluster share one translation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.config import ExtenderConfig
from extender.ledger import LEDGER_PREFIX, Ledger, decode_ledger
from extender.pod_requests import read_pod_request
from extender.state import CORDON_ANNOTATION, NodeFacts, PodView, TopologyRecord, parse_cordons
from topology.allocation import ALLOCATION_ANNOTATION
from topology.codec import content_hash, decode_topology


def node_facts(node: Mapping[str, Any], config: ExtenderConfig | None = None) -> NodeFacts:
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    names = (config or ExtenderConfig()).resources
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    advertises = any(names.managed(r) and str(q) not in ("0", "") for r, q in allocatable.items())
    return NodeFacts(
        name=str(meta.get("name") or ""),
        cordoned_uuids=parse_cordons(annotations.get(CORDON_ANNOTATION)),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        advertises_gpus=advertises,
    )


def topology_record(obj: Mapping[str, Any]) -> tuple[str, TopologyRecord]:
    """(node name, record) from a GpuTopology object; raises ValueError (CodecError) when malformed."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    topology = decode_topology(obj.get("spec") or {})
    unhealthy = set()
    for health in (obj.get("status") or {}).get("gpuHealth") or []:
        if (
            isinstance(health, dict)
            and health.get("healthy") is False
            and isinstance(health.get("index"), int)
        ):
            unhealthy.add(int(health["index"]))
    return name, TopologyRecord(topology, frozenset(unhealthy), content_hash(topology))


def ledger_from_config_map(obj: Mapping[str, Any]) -> Ledger:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    node = name[len(LEDGER_PREFIX) :] if name.startswith(LEDGER_PREFIX) else name
    return decode_ledger(node, obj.get("data"), str(meta.get("resourceVersion") or ""))


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    phase = str((pod.get("status") or {}).get("phase") or "")
    return PodView(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node_name=str((pod.get("spec") or {}).get("nodeName") or ""),
        finished=phase in ("Succeeded", "Failed"),
    )


def pod_is_tracked(pod: Mapping[str, Any], config: ExtenderConfig) -> bool:
    """Pods that ask for a managed GPU resource or carry an allocation are tracked."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return ALLOCATION_ANNOTATION in annotations or read_pod_request(pod, config) is not None
