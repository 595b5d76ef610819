"""Read what a pod asks for out of its Kubernetes JSON, into a `topology` request.

This is the edge where a Pod object becomes a frozen `PodRequest`; nothing past it sees JSON.
The effective request of the pod (sidecars included) is the contract's rule
(`contract.pod_demand`), the same one the node's device plugin applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from contract.allocation import ComputePriority
from contract.keys import (
    COMPUTE_PRIORITY_ANNOTATION,
    INTERPOSER_ANNOTATION,
    MIN_LINK_ANNOTATION,
    NEAR_NIC_ANNOTATION,
    POLICY_ANNOTATION,
)
from contract.pod_demand import PodSpecError, container_demands, effective_amounts
from contract.pods import PodRef, pod_ref
from extender.config import ExtenderConfig
from topology.workload import GpuShare, MigSlice, Policy, Request, WholeGpus


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU request, the policy it runs under, and the raw resource amounts it asked for."""

    pod: PodRef
    request: Request
    policy: Policy
    resources: tuple[tuple[str, int], ...]
    priority: ComputePriority = ComputePriority.NORMAL
    interposer_opt_out: bool = False  # annotation linkpack.io/interposer: "off"


@dataclass(frozen=True, slots=True)
class RequestError:
    """The pod's GPU request cannot be served by any node; `message` says exactly why."""

    pod: PodRef
    message: str


def read_pod_request(pod: Mapping[str, Any], config: ExtenderConfig) -> PodRequest | RequestError | None:
    """The pod's GPU request; None when it asks for no GPU resource we manage."""
    ref = pod_ref(pod)
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return RequestError(ref, "the pod's spec is not an object")
    try:
        amounts = effective_amounts(container_demands(spec, config.resources.managed))
    except PodSpecError as exc:
        return RequestError(ref, str(exc))
    if not amounts:
        return None
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    policy = config.policy(annotations.get(POLICY_ANNOTATION))
    if policy is None:
        known = ", ".join(sorted(config.policies))
        return RequestError(
            ref,
            f"unknown {POLICY_ANNOTATION} {annotations.get(POLICY_ANNOTATION)!r}; known policies: {known}",
        )
    min_link = annotations.get(MIN_LINK_ANNOTATION)
    if min_link is not None:
        try:
            policy = replace(policy, min_bottleneck_gbps=float(min_link))
        except ValueError:
            return RequestError(ref, f"{MIN_LINK_ANNOTATION} {min_link!r} is not a number of GB/s")
    request = _request_from(amounts, annotations.get(NEAR_NIC_ANNOTATION), config)
    if isinstance(request, str):
        return RequestError(ref, request)
    priority = compute_priority(annotations.get(COMPUTE_PRIORITY_ANNOTATION), spec.get("priority"))
    if priority is None:
        return RequestError(
            ref,
            f"{COMPUTE_PRIORITY_ANNOTATION} {annotations.get(COMPUTE_PRIORITY_ANNOTATION)!r}: expected high, normal or low",
        )
    opt_out = annotations.get(INTERPOSER_ANNOTATION, "").strip().lower()
    if opt_out not in ("", "on", "off"):
        return RequestError(ref, f"{INTERPOSER_ANNOTATION} {opt_out!r}: expected on or off")
    return PodRequest(ref, request, policy, tuple(sorted(amounts.items())), priority, opt_out == "off")


#: A PriorityClass value at or above this makes a share high priority; below zero, low.
HIGH_PRIORITY_CLASS_VALUE = 1000


def compute_priority(annotation: str | None, priority_class_value: object) -> ComputePriority | None:
    """The annotation when given (None if it is not a level), else from the pod's PriorityClass value."""
    if annotation is not None:
        try:
            return ComputePriority(annotation.strip().lower())
        except ValueError:
            return None
    if isinstance(priority_class_value, int) and not isinstance(priority_class_value, bool):
        if priority_class_value >= HIGH_PRIORITY_CLASS_VALUE:
            return ComputePriority.HIGH
        if priority_class_value < 0:
            return ComputePriority.LOW
    return ComputePriority.NORMAL


def _request_from(amounts: dict[str, int], near_nic: str | None, config: ExtenderConfig) -> Request | str:
    names = config.resources
    whole = amounts.get(names.whole, 0)
    units = amounts.get(names.shared_units, 0)
    memory = amounts.get(names.memory_mib, 0)
    migs = {k: v for k, v in amounts.items() if k.startswith(names.mig_prefix)}
    kinds = sum(1 for present in (whole > 0, units > 0 or memory > 0, bool(migs)) if present)
    if kinds > 1:
        return "a pod may ask for whole GPUs, a GPU share or a MIG slice, not several of these at once"
    if whole > 0:
        return WholeGpus(whole, near_nic)
    if units or memory:
        if units == 0:
            return (
                f"{names.memory_mib} needs at least 1 {names.shared_units} unit with it: the share units are "
                "what the node's device plugin hands to the container, so a memory-only share would run "
                "without a GPU"
            )
        if units > config.units_per_gpu:
            return (
                f"{names.shared_units}={units} exceeds one GPU ({config.units_per_gpu} units); "
                f"ask for {names.whole} instead"
            )
        return GpuShare(memory_mib=memory, units=units)
    if len(migs) > 1 or any(v != 1 for v in migs.values()):
        return "a pod may ask for exactly one MIG slice (one resource, quantity 1)"
    (resource,) = migs
    return MigSlice(resource[len(names.mig_prefix) :])


def scheduler_mismatch(pod: Mapping[str, Any], scheduler_name: str) -> str:
    """Why a pod is not this extender's to decide ("" when it is): its schedulerName differs."""
    spec = pod.get("spec") or {}
    named = str((spec.get("schedulerName") if isinstance(spec, Mapping) else "") or "default-scheduler")
    if named != scheduler_name:
        return f"pod {pod_ref(pod).key} is for scheduler {named!r}, not {scheduler_name!r}"
    return ""
