"""Read what a pod asks for out of its Kubernetes JSON, into a `topology` request.

This is the edge where a Pod object becomes a frozen `PodRequest`; nothing past it sees JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from extender.config import ExtenderConfig
from topology.allocation import POLICY_ANNOTATION
from topology.workload import GpuShare, MigSlice, Policy, Request, WholeGpus

NEAR_NIC_ANNOTATION = "linkpack.io/near-nic"
MIN_LINK_ANNOTATION = "linkpack.io/min-link-gbps"


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's GPU request, the policy it runs under, and the raw resource amounts it asked for."""

    pod: PodRef
    request: Request
    policy: Policy
    resources: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class RequestError:
    """The pod's GPU request cannot be served by any node; `message` says exactly why."""

    pod: PodRef
    message: str


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(
        str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or "")
    )


def read_pod_request(pod: Mapping[str, Any], config: ExtenderConfig) -> PodRequest | RequestError | None:
    """The pod's GPU request; None when it asks for no GPU resource we manage."""
    ref = pod_ref(pod)
    try:
        amounts = _managed_amounts(pod, config)
    except ValueError as exc:
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
    return PodRequest(ref, request, policy, tuple(sorted(amounts.items())))


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


def _managed_amounts(pod: Mapping[str, Any], config: ExtenderConfig) -> dict[str, int]:
    """Effective amount per managed resource: max(sum over containers, largest init container)."""
    spec = pod.get("spec") or {}
    running: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_amounts(container, config).items():
            running[name] = running.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_amounts(container, config).items():
            running[name] = max(running.get(name, 0), amount)
    return {name: amount for name, amount in running.items() if amount > 0}


def _container_amounts(container: Mapping[str, Any], config: ExtenderConfig) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged: dict[str, Any] = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    out: dict[str, int] = {}
    for name, raw in merged.items():
        if config.resources.managed(name):
            out[name] = _quantity(name, raw, str(container.get("name") or "?"))
    return out


_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes resource quantity ("2", "900k", "1Gi", "500m", "1e3") as an exact number."""
    text = text.strip()
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix):
            return _number(text[: -len(suffix)], text) * factor
    if text.endswith("m"):
        return _number(text[:-1], text) / 1000
    if text[-1:] in _DECIMAL and not text[-1:].isdigit():
        return _number(text[:-1], text) * _DECIMAL[text[-1]]
    mantissa, sep, exponent = text.lower().partition("e")
    if sep:
        if not exponent.lstrip("+-").isdigit():
            raise ValueError(f"not a quantity: {text!r}")
        return _number(mantissa, text) * Fraction(10) ** int(exponent)
    return _number(text, text)


def _number(digits: str, whole: str) -> Fraction:
    body = digits[1:] if digits[:1] in "+-" else digits
    if not body or not body.replace(".", "", 1).isdigit():
        raise ValueError(f"not a quantity: {whole!r}")
    return Fraction(digits)


def _quantity(name: str, raw: object, container: str) -> int:
    """Extended resources are whole numbers; the API server may write them as "900k" or "1Ki"."""
    text = str(raw).strip()
    try:
        value = parse_quantity(text)
    except ValueError:
        raise ValueError(f"container {container}: {name}={text!r} is not a resource quantity") from None
    if value.denominator != 1 or value < 0:
        raise ValueError(f"container {container}: {name}={text!r} must be a whole number")
    return int(value)
