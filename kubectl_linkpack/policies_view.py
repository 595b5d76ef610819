"""`kubectl linkpack policies`: the GpuSchedulingPolicy objects and which pods use each. Pure.

Which policy a pod runs under is the contract's rule (`contract.scheduling_policy`), the same the
extender applies: the pod's annotation, its namespace's default, the policy named `default`, else
the extender's built-in default. Pods are the ones asking for a GPU resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.keys import POLICY_ANNOTATION
from contract.pod_demand import PodSpecError, container_demands, effective_amounts
from contract.pods import pod_finished, pod_ref
from contract.resources import ResourceNames
from contract.scheduling_policy import (
    CLUSTER_DEFAULT_POLICY,
    PolicyError,
    SchedulingPolicy,
    chosen_policy_name,
    decode_scheduling_policy,
    namespace_policy,
)
from kubectl_linkpack.tables import table

#: The extender's built-in policies (extender configuration; shown when pods use them).
BUILT_IN = ("balanced", "binpack", "spread")
BUILT_IN_DEFAULT = "balanced"
SHOWN_PODS = 3


@dataclass(frozen=True, slots=True)
class PolicyRow:
    name: str
    policy: SchedulingPolicy | None  # None: built in, or unusable (see problem)
    problem: str
    pods: tuple[str, ...]  # "ns/name", sorted


def policy_rows(
    policy_objects: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    names: ResourceNames,
) -> list[PolicyRow]:
    decoded: dict[str, SchedulingPolicy | str] = {}
    for obj in policy_objects:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "?") if isinstance(meta, Mapping) else "?"
        try:
            decoded[name] = decode_scheduling_policy(obj)
        except PolicyError as exc:
            decoded[name] = str(exc)
    defaults = {
        str((ns.get("metadata") or {}).get("name") or ""): named
        for ns in namespaces
        if (named := namespace_policy(ns)) is not None
    }
    users: dict[str, list[str]] = {}
    for pod in pods:
        if pod_finished(pod) or not _asks_for_gpus(pod, names):
            continue
        ref = pod_ref(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        name, _ = chosen_policy_name(
            annotations.get(POLICY_ANNOTATION),
            ref.namespace,
            defaults,
            CLUSTER_DEFAULT_POLICY in decoded,
            BUILT_IN_DEFAULT,
        )
        users.setdefault(name, []).append(ref.key)
    rows = []
    for name in sorted({*decoded, *(n for n in users if n in BUILT_IN or n not in decoded)}):
        found = decoded.get(name)
        if isinstance(found, SchedulingPolicy):
            policy, problem = found, ""
        elif isinstance(found, str):
            policy, problem = None, found
        else:
            policy, problem = None, "" if name in BUILT_IN else "no such policy: its pods are not scheduled"
        rows.append(PolicyRow(name, policy, problem, tuple(sorted(users.get(name, ())))))
    return rows


def format_policies(rows: list[PolicyRow]) -> str:
    body = []
    for row in rows:
        p = row.policy
        if p is None:
            kind = "built-in" if row.name in BUILT_IN and not row.problem else "INVALID"
            cells = [row.name, kind, "-", "-", "-", "-", "yes" if kind == "built-in" else "-"]
        else:
            pol = p.policy
            needs = [
                *(["nvswitch"] if pol.require_nvswitch else []),
                *(["same-numa"] if pol.require_same_numa else []),
                *([f">={pol.min_bottleneck_gbps:g}GB/s"] if pol.min_bottleneck_gbps else []),
                *([f"nic={p.near_nic}"] if p.near_nic else []),
                *([f"models={len(pol.allowed_models)}"] if pol.allowed_models else []),
                *([f"cuda>={p.cuda_version}"] if p.cuda_version else []),
            ]
            sharing = [
                *([f"{p.memory_per_unit_mib}Mi/unit"] if p.memory_per_unit_mib else []),
                *([f"max {pol.max_sharers_per_gpu}/gpu"] if pol.max_sharers_per_gpu else []),
                *([f"priority {p.compute_priority.value}"] if p.compute_priority else []),
            ]
            weights = f"{pol.weight_link_quality:g}/{pol.weight_fragmentation:g}/{pol.weight_packing:g}"
            cells = [row.name, "policy", weights, ",".join(needs) or "-", ",".join(sharing) or "-"]
            cells.append("spread" if pol.spread else "pack")
            cells.append("yes" if p.decide_node else "no")
        shown = ", ".join(row.pods[:SHOWN_PODS]) + (
            f" +{len(row.pods) - SHOWN_PODS}" if len(row.pods) > SHOWN_PODS else ""
        )
        body.append([*cells, str(len(row.pods)), shown or "-"])
    text = table(
        [
            "NAME",
            "KIND",
            "WEIGHTS(L/F/P)",
            "REQUIRES",
            "SHARING",
            "PREFERS",
            "DECIDES NODE",
            "PODS",
            "USED BY",
        ],
        body,
    )
    problems = [f"warning: {row.name}: {row.problem}" for row in rows if row.problem]
    return "\n".join([text, *problems])


def _asks_for_gpus(pod: Mapping[str, Any], names: ResourceNames) -> bool:
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return False
    try:
        return bool(effective_amounts(container_demands(spec, names.managed)))
    except PodSpecError:
        return True  # it asks, wrongly: the extender will say why
