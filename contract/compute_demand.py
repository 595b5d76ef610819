"""A pod's effective CPU and memory request, and a node's allocatable CPU and memory.

The same effective-request rule as `contract.pod_demand` (KEP-753: app containers add up,
sidecars count for the pod's life, a plain init container runs beside the sidecars started
before it, the pod's effective request is the larger of the app phase and the init peak),
plus the pod's `spec.overhead` (RuntimeClass overhead, which the scheduler adds on top). A
container's request falls back to its limit when only the limit is set, as the API server
defaults it.

Units: CPU in milli-cores (rounded up, as the scheduler counts "0.5" = 500m), memory in MiB
(rounded up from bytes). A quantity that cannot be read counts as 0 for that container, so a
pod the API server admitted is never refused here; it only makes the node look emptier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from contract.pod_demand import ContainerDemand, ContainerRole, effective_amount
from contract.quantity import QuantityError, parse_quantity

CPU = "cpu"
MEMORY = "memory"
_MIB = 2**20


@dataclass(frozen=True, slots=True)
class ComputeDemand:
    """CPU (milli-cores) and memory (MiB) a pod or node has or asks for."""

    cpu_milli: int = 0
    memory_mib: int = 0


def _scaled(raw: object, resource: str) -> int:
    try:
        value = parse_quantity(str(raw))
    except QuantityError:
        return 0
    if value <= 0:
        return 0
    scaled = value * 1000 if resource == CPU else value / _MIB
    return math.ceil(Fraction(scaled))


def _container(raw: Mapping[str, Any], role: ContainerRole) -> ContainerDemand:
    resources = raw.get("resources")
    resources = resources if isinstance(resources, Mapping) else {}
    limits = resources.get("limits")
    requests = resources.get("requests")
    merged = {
        **(limits if isinstance(limits, Mapping) else {}),
        **(requests if isinstance(requests, Mapping) else {}),
    }
    amounts = tuple(sorted((r, v) for r in (CPU, MEMORY) if r in merged and (v := _scaled(merged[r], r)) > 0))
    return ContainerDemand(str(raw.get("name") or "?"), role, amounts)


def pod_compute_demand(pod: Mapping[str, Any]) -> ComputeDemand:
    """The CPU and memory the scheduler counts for this pod (a Pod object as JSON)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return ComputeDemand()
    demands: list[ContainerDemand] = []
    for key, app_role in (("initContainers", None), ("containers", ContainerRole.APP)):
        containers = spec.get(key)
        for raw in containers if isinstance(containers, list) else []:
            if not isinstance(raw, Mapping):
                continue
            role = app_role
            if role is None:
                role = ContainerRole.SIDECAR if raw.get("restartPolicy") == "Always" else ContainerRole.INIT
            demands.append(_container(raw, role))
    overhead = spec.get("overhead")
    overhead = overhead if isinstance(overhead, Mapping) else {}
    return ComputeDemand(
        effective_amount(demands, CPU) + (_scaled(overhead[CPU], CPU) if CPU in overhead else 0),
        effective_amount(demands, MEMORY) + (_scaled(overhead[MEMORY], MEMORY) if MEMORY in overhead else 0),
    )


def node_allocatable_compute(node: Mapping[str, Any]) -> ComputeDemand | None:
    """The node's allocatable CPU and memory; None when its status does not say both."""
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or CPU not in allocatable or MEMORY not in allocatable:
        return None
    try:
        cpu = parse_quantity(str(allocatable[CPU]))
        memory = parse_quantity(str(allocatable[MEMORY]))
    except QuantityError:
        return None
    # allocatable is rounded down: a node never looks larger than it is
    return ComputeDemand(max(0, math.floor(cpu * 1000)), max(0, math.floor(memory / _MIB)))
