"""What a pod's containers ask for, and the pod's effective request as Kubernetes counts it.

The kubelet admits a pod against the effective request of each resource, and the scheduler
(and so the extender) must grant exactly that much, or the pod is refused at admission. The
rule (KEP-753, sidecar containers):

- app containers run together: their requests add up;
- a sidecar (an init container with `restartPolicy: Always`) starts in init order and keeps
  running for the pod's life: it counts towards every later init container and towards the
  app containers;
- a plain init container runs alone to completion, beside the sidecars started before it.

    effective = max( sum(app) + sum(sidecars),
                     max over init containers i of (i's request + sidecars started before i) )

where a sidecar's own step counts itself and the sidecars before it.

Requests fall back to limits (for extended resources they must be equal when both are set).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contract.quantity import QuantityError, parse_quantity


class ContainerRole(StrEnum):
    INIT = "init"  # runs to completion before the app containers; its devices are handed on
    SIDECAR = "sidecar"  # restartable init container: runs for the pod's life
    APP = "app"


class PodSpecError(ValueError):
    """A container's resources cannot be read; the message names the container and resource."""


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """The resources one container asks for (only those the reader was asked about)."""

    name: str
    role: ContainerRole
    amounts: tuple[tuple[str, int], ...] = ()  # sorted by resource name, amounts > 0

    def amount(self, resource: str) -> int:
        for name, value in self.amounts:
            if name == resource:
                return value
        return 0

    @property
    def keeps_devices(self) -> bool:
        """True when the container holds its devices for the pod's life (app or sidecar)."""
        return self.role is not ContainerRole.INIT


def container_demands(spec: Mapping[str, Any], wanted: Callable[[str], bool]) -> tuple[ContainerDemand, ...]:
    """Init containers (plain and sidecar) in spec order, then app containers in spec order.

    `spec` is a pod's `.spec` as JSON; only resources for which `wanted(name)` is true are read.
    Raises PodSpecError for a quantity that is not a whole number."""
    out: list[ContainerDemand] = []
    for raw in _containers(spec.get("initContainers")):
        sidecar = str(raw.get("restartPolicy") or "") == "Always"
        out.append(_demand(raw, ContainerRole.SIDECAR if sidecar else ContainerRole.INIT, wanted))
    for raw in _containers(spec.get("containers")):
        out.append(_demand(raw, ContainerRole.APP, wanted))
    return tuple(out)


def effective_amounts(demands: Sequence[ContainerDemand]) -> dict[str, int]:
    """The pod's effective request per resource (only resources with a positive amount)."""
    resources = sorted({name for d in demands for name, _ in d.amounts})
    out: dict[str, int] = {}
    for resource in resources:
        amount = effective_amount(demands, resource)
        if amount > 0:
            out[resource] = amount
    return out


def effective_amount(demands: Iterable[ContainerDemand], resource: str) -> int:
    """The effective request of one resource (see the module docstring)."""
    sidecars = 0
    init_peak = 0
    apps = 0
    for demand in demands:
        amount = demand.amount(resource)
        if demand.role is ContainerRole.SIDECAR:
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        elif demand.role is ContainerRole.INIT:
            init_peak = max(init_peak, amount + sidecars)
        else:
            apps += amount
    return max(apps + sidecars, init_peak)


def _containers(raw: object) -> list[Mapping[str, Any]]:
    if not isinstance(raw, list):
        return []
    return [c for c in raw if isinstance(c, Mapping)]


def _demand(
    container: Mapping[str, Any], role: ContainerRole, wanted: Callable[[str], bool]
) -> ContainerDemand:
    name = str(container.get("name") or "?")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise PodSpecError(f"container {name}: resources is not an object")
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise PodSpecError(f"container {name}: resources.limits and resources.requests must be objects")
    merged = {**limits, **requests}
    amounts: list[tuple[str, int]] = []
    for resource, raw in merged.items():
        resource = str(resource)
        if not wanted(resource):
            continue
        text = str(raw).strip()
        try:
            value = parse_quantity(text)
        except QuantityError:
            raise PodSpecError(f"container {name}: {resource}={text!r} is not a resource quantity") from None
        if value.denominator != 1 or value < 0:
            raise PodSpecError(f"container {name}: {resource}={text!r} must be a whole number")
        if value > 0:
            amounts.append((resource, int(value)))
    return ContainerDemand(name, role, tuple(sorted(amounts)))
