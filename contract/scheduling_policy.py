"""The GpuSchedulingPolicy object: a platform team's scheduling rules, by name.

Cluster-scoped, `linkpack.io/v1alpha1`. A pod names one with the annotation `linkpack.io/policy`;
a namespace may name its default with the label or annotation `linkpack.io/policy`; the policy
named `default` is the cluster's default. The CRD's OpenAPI schema rejects bad values at
admission; this decoder checks the same rules again (an object written before a schema change,
or through a path without validation, must not reach a decision) and names the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.allocation import ComputePriority
from contract.keys import POLICY_ANNOTATION
from topology.scheduling import Policy

POLICY_KIND = "GpuSchedulingPolicy"
POLICY_PLURAL = "gpuschedulingpolicies"
POLICY_VERSION = "v1alpha1"
#: The policy every pod gets when neither it nor its namespace names one.
CLUSTER_DEFAULT_POLICY = "default"

_CUDA_VERSION = re.compile(r"^([0-9]{1,2})\.([0-9]{1,2})$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class PolicyError(ValueError):
    """A GpuSchedulingPolicy cannot be used; the message names the policy and the field."""


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """A decoded GpuSchedulingPolicy: the placement policy plus the defaults it gives its pods."""

    policy: Policy
    near_nic: str | None = None  # pods that name no NIC get GPUs close to this one
    memory_per_unit_mib: int = 0  # a share that asks units only gets this much memory per unit
    compute_priority: ComputePriority | None = None  # for pods that do not say
    cuda_version: str = ""  # the CUDA version its pods need, unless a pod says ("12.4")
    decide_node: bool = True  # filter answers the single best node instead of leaving it to scores

    @property
    def name(self) -> str:
        return self.policy.name


def chosen_policy_name(
    pod_policy: str | None,
    namespace: str,
    namespace_defaults: Mapping[str, str],
    has_cluster_default: bool,
    built_in_default: str,
) -> tuple[str, str]:
    """Which policy a pod runs under, and why: (name, source).

    The pod's annotation, else its namespace's default (label or annotation `linkpack.io/policy`),
    else the GpuSchedulingPolicy named `default`, else the extender's built-in default."""
    if pod_policy:
        return pod_policy, "pod annotation"
    if namespace in namespace_defaults:
        return namespace_defaults[namespace], f"namespace {namespace}"
    if has_cluster_default:
        return CLUSTER_DEFAULT_POLICY, "cluster default policy"
    return built_in_default, "built-in default"


def namespace_policy(namespace: Mapping[str, Any]) -> str | None:
    """The default policy a Namespace object names (its label, else annotation, linkpack.io/policy)."""
    meta = namespace.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return None
    for source in (meta.get("labels"), meta.get("annotations")):
        if isinstance(source, Mapping):
            named = source.get(POLICY_ANNOTATION)
            if isinstance(named, str) and named.strip():
                return named.strip()
    return None


def cuda_version_tuple(text: str) -> tuple[int, int] | None:
    """ "12.4" -> (12, 4); None when it is not MAJOR.MINOR."""
    found = _CUDA_VERSION.match(text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def decode_scheduling_policy(obj: Mapping[str, Any]) -> SchedulingPolicy:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not _NAME.match(name):
        raise PolicyError(f"{POLICY_KIND}: metadata.name {name!r} is not a valid name")
    where = f"{POLICY_KIND} {name}: spec"
    spec = _object(obj.get("spec") or {}, where)
    weights = _object(spec.get("weights") or {}, f"{where}.weights")
    topology = _object(spec.get("topology") or {}, f"{where}.topology")
    sharing = _object(spec.get("sharing") or {}, f"{where}.sharing")
    models = spec.get("allowedGpuModels") or []
    if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
        raise PolicyError(f"{where}.allowedGpuModels: expected a list of GPU model names")
    priority_name = spec.get("computePriority")
    priority = None
    if priority_name is not None:
        if priority_name not in set(ComputePriority):
            raise PolicyError(f"{where}.computePriority: expected high, normal or low, got {priority_name!r}")
        priority = ComputePriority(priority_name)
    cuda = spec.get("cudaVersion", "")
    if not isinstance(cuda, str) or (cuda and cuda_version_tuple(cuda) is None):
        raise PolicyError(f'{where}.cudaVersion: expected MAJOR.MINOR such as "12.4", got {cuda!r}')
    near_nic = topology.get("nearNic")
    if near_nic is not None and (not isinstance(near_nic, str) or not near_nic.strip()):
        raise PolicyError(f"{where}.topology.nearNic: expected a NIC name")
    policy = Policy(
        name=name,
        weight_link_quality=_weight(weights, "linkQuality", f"{where}.weights"),
        weight_fragmentation=_weight(weights, "fragmentation", f"{where}.weights"),
        weight_packing=_weight(weights, "packing", f"{where}.weights"),
        min_bottleneck_gbps=_number(topology, "minLinkGbps", f"{where}.topology"),
        require_nvswitch=_flag(topology, "requireNvswitch", f"{where}.topology"),
        require_same_numa=_flag(topology, "requireSameNuma", f"{where}.topology"),
        allowed_models=tuple(m.strip() for m in models),
        max_sharers_per_gpu=_count(sharing, "maxSharersPerGpu", f"{where}.sharing"),
        spread=_flag(spec, "spread", where),
    )
    return SchedulingPolicy(
        policy=policy,
        near_nic=near_nic.strip() if isinstance(near_nic, str) else None,
        memory_per_unit_mib=_count(sharing, "memoryPerUnitMiB", f"{where}.sharing"),
        compute_priority=priority,
        cuda_version=cuda.strip(),
        decide_node=_flag(spec, "decideNode", where, default=True),
    )


def _object(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: expected an object, got {type(raw).__name__}")
    return raw


def _number(doc: Mapping[str, Any], key: str, where: str, default: float = 0.0) -> float:
    value = doc.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise PolicyError(f"{where}.{key}: expected a non-negative number, got {value!r}")
    return float(value)


def _weight(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = _number(doc, key, where, 1.0)
    if value > 100:
        raise PolicyError(f"{where}.{key}: {value:g} is above 100")
    return value


def _count(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{where}.{key}: expected a non-negative whole number, got {value!r}")
    return value


def _flag(doc: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{where}.{key}: expected true or false, got {value!r}")
    return value
