"""Read what a pod asks for out of its Kubernetes JSON, into a `topology` request.

This is the edge where a Pod object becomes a frozen `PodRequest`; nothing past it sees JSON.
The effective request of the pod (sidecars included) is the contract's rule
(`contract.pod_demand`), the same one the node's device plugin applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from contract.allocation import ComputePriority
from contract.compute_demand import ComputeDemand, pod_compute_demand
from contract.keys import (
    COMPUTE_PRIORITY_ANNOTATION,
    CUDA_VERSION_ANNOTATION,
    GPU_POWER_ANNOTATION,
    INTERPOSER_ANNOTATION,
    MIN_LINK_ANNOTATION,
    NEAR_NIC_ANNOTATION,
    POLICY_ANNOTATION,
)
from contract.pod_demand import PodSpecError, container_demands, effective_amounts
from contract.pods import PodRef, pod_ref
from contract.scheduling_policy import (
    CLUSTER_DEFAULT_POLICY,
    POLICY_KIND,
    SchedulingPolicy,
    chosen_policy_name,
    cuda_version_tuple,
)
from extender.config import ExtenderConfig
from extender.state.snapshot import PolicyBook
from topology.scheduling import GpuShare, MigSlice, Policy, Request, WholeGpus


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU request, the policy it runs under, and the raw resource amounts it asked for."""

    pod: PodRef
    request: Request
    policy: Policy
    resources: tuple[tuple[str, int], ...]
    priority: ComputePriority = ComputePriority.NORMAL
    interposer_opt_out: bool = False  # annotation linkpack.io/interposer: "off"
    policy_source: str = "built-in default"  # why this policy: pod annotation, namespace, default
    cuda_version: str = ""  # the CUDA version the pod needs of the node's driver ("" any)
    compute: ComputeDemand = field(default_factory=ComputeDemand)  # effective CPU and memory request
    decide_node: bool = True  # filter answers the one best node (the policy's decideNode)


@dataclass(frozen=True, slots=True)
class RequestError:
    """The pod's GPU request cannot be served by any node; `message` says exactly why."""

    pod: PodRef
    message: str


def resolve_policy(
    pod_policy: str | None, namespace: str, config: ExtenderConfig, book: PolicyBook | None
) -> tuple[SchedulingPolicy, str] | str:
    """The pod's policy and where it came from, or why it cannot have one.

    The pod's annotation, else its namespace's default, else the GpuSchedulingPolicy named
    `default`, else the extender's built-in default. A name is looked up among the
    GpuSchedulingPolicy objects first, then the built-in policies."""
    book = book or PolicyBook()
    name, source = chosen_policy_name(
        pod_policy,
        namespace,
        book.namespace_defaults,
        CLUSTER_DEFAULT_POLICY in book.policies,
        config.default_policy,
    )
    found = book.policies.get(name)
    if isinstance(found, str):
        return f"{POLICY_KIND} {name!r} ({source}) cannot be used: {found}"
    if found is not None:
        return found, source
    built_in = config.policies.get(name)
    if built_in is not None:
        return SchedulingPolicy(built_in, decide_node=config.decide_node), source
    known = ", ".join(sorted({*book.policies, *config.policies}))
    return f"unknown {POLICY_ANNOTATION} {name!r} ({source}); known policies: {known}"


def read_pod_request(
    pod: Mapping[str, Any], config: ExtenderConfig, book: PolicyBook | None = None
) -> PodRequest | RequestError | None:
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
    resolved = resolve_policy(annotations.get(POLICY_ANNOTATION), ref.namespace, config, book)
    if isinstance(resolved, str):
        return RequestError(ref, resolved)
    chosen, source = resolved
    policy = chosen.policy
    min_link = annotations.get(MIN_LINK_ANNOTATION)
    if min_link is not None:
        try:
            policy = replace(policy, min_bottleneck_gbps=float(min_link))
        except ValueError:
            return RequestError(ref, f"{MIN_LINK_ANNOTATION} {min_link!r} is not a number of GB/s")
    near_nic = annotations.get(NEAR_NIC_ANNOTATION) or chosen.near_nic
    request = _request_from(amounts, near_nic, config, chosen.memory_per_unit_mib)
    if isinstance(request, str):
        return RequestError(ref, request)
    power = annotations.get(GPU_POWER_ANNOTATION)
    if power is not None:
        with_power = _with_power(request, power)
        if isinstance(with_power, str):
            return RequestError(ref, with_power)
        request = with_power
    cuda = annotations.get(CUDA_VERSION_ANNOTATION, chosen.cuda_version).strip()
    if cuda and cuda_version_tuple(cuda) is None:
        return RequestError(ref, f'{CUDA_VERSION_ANNOTATION} {cuda!r}: expected MAJOR.MINOR such as "12.4"')
    priority = compute_priority(
        annotations.get(COMPUTE_PRIORITY_ANNOTATION), spec.get("priority"), chosen.compute_priority
    )
    if priority is None:
        return RequestError(
            ref,
            f"{COMPUTE_PRIORITY_ANNOTATION} {annotations.get(COMPUTE_PRIORITY_ANNOTATION)!r}: expected high, normal or low",
        )
    opt_out = annotations.get(INTERPOSER_ANNOTATION, "").strip().lower()
    if opt_out not in ("", "on", "off"):
        return RequestError(ref, f"{INTERPOSER_ANNOTATION} {opt_out!r}: expected on or off")
    return PodRequest(
        ref,
        request,
        policy,
        tuple(sorted(amounts.items())),
        priority,
        opt_out == "off",
        source,
        cuda,
        pod_compute_demand(pod),
        chosen.decide_node,
    )


#: Far above any GPU's power limit: a budget beyond it is a typo.
MAX_POWER_BUDGET_W = 5000


def _with_power(request: Request, text: str) -> Request | str:
    """The request with its per-GPU power budget, or why the annotation cannot be used."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) <= MAX_POWER_BUDGET_W:
        return f'{GPU_POWER_ANNOTATION} {text[:40]!r}: expected whole watts between 1 and {MAX_POWER_BUDGET_W}, e.g. "150"'
    if isinstance(request, MigSlice):
        return f"{GPU_POWER_ANNOTATION}: a MIG slice has no power budget of its own; ask for whole GPUs or a share"
    return replace(request, power_w=int(value))


#: A PriorityClass value at or above this makes a share high priority; below zero, low.
HIGH_PRIORITY_CLASS_VALUE = 1000


def compute_priority(
    annotation: str | None, priority_class_value: object, policy_default: ComputePriority | None = None
) -> ComputePriority | None:
    """The annotation when given (None if it is not a level), else the policy's default, else
    from the pod's PriorityClass value."""
    if annotation is not None:
        try:
            return ComputePriority(annotation.strip().lower())
        except ValueError:
            return None
    if policy_default is not None:
        return policy_default
    if isinstance(priority_class_value, int) and not isinstance(priority_class_value, bool):
        if priority_class_value >= HIGH_PRIORITY_CLASS_VALUE:
            return ComputePriority.HIGH
        if priority_class_value < 0:
            return ComputePriority.LOW
    return ComputePriority.NORMAL


def _request_from(
    amounts: dict[str, int], near_nic: str | None, config: ExtenderConfig, memory_per_unit_mib: int = 0
) -> Request | str:
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
        if memory == 0 and memory_per_unit_mib:
            memory = units * memory_per_unit_mib  # the policy's memory per share unit
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
