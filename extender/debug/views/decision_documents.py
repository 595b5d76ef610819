"""GET /debug/explain/{namespace}/{pod} and POST /debug/what-if as JSON-ready dicts.

Both answer from the extender's filter and prioritize decisions: explain from the outcome
logged for the pod (and where it would go now), what-if from a fresh evaluation of a manifest
that reserves nothing. `extender.debug.routes` gathers the inputs (`ExplainInputs`,
`Evaluation`, `PodPresence`); these turn them into documents. Keys are camelCase like the rest
of Linkpack's API objects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from contract.ledger import Ledger, LedgerEntry
from extender.debug.views.node_documents import Doc, entry_doc, grant_doc, iso_time
from extender.explain_log import PodDecisions
from extender.placing.filter_outcome import FilterOutcome
from extender.state.pod_requests import PodRequest, RequestError
from extender.state.snapshot import TrackedPod
from topology.node_choice import NodeChoice
from topology.scheduling import GpuShare, MigSlice, MisfitReason, Placement, Policy, Request, WholeGpus
from topology.scoring import NodeRanking, Ranking, combine


def policy_doc(policy: Policy) -> Doc:
    return {
        "name": policy.name,
        "weights": {
            "linkQuality": policy.weight_link_quality,
            "fragmentation": policy.weight_fragmentation,
            "packing": policy.weight_packing,
        },
        "minBottleneckGbps": policy.min_bottleneck_gbps,
        "requireNvswitch": policy.require_nvswitch,
        "requireSameNuma": policy.require_same_numa,
        "allowedGpuModels": list(policy.allowed_models),
        "maxSharersPerGpu": policy.max_sharers_per_gpu,
    }


def request_shape(request: Request) -> Doc:
    if isinstance(request, WholeGpus):
        return {"kind": "whole", "gpus": request.count, "nearNic": request.near_nic}
    if isinstance(request, GpuShare):
        return {"kind": "share", "memoryMiB": request.memory_mib, "units": request.units}
    if isinstance(request, MigSlice):
        return {"kind": "mig", "profile": request.profile}
    raise TypeError(f"unknown request type {type(request).__name__}")


def request_doc(parsed: PodRequest | RequestError | None) -> Doc | None:
    if parsed is None:
        return None
    if isinstance(parsed, RequestError):
        return {"error": parsed.message}
    return {
        **request_shape(parsed.request),
        "policy": policy_doc(parsed.policy),
        "policySource": parsed.policy_source,
        "resources": dict(parsed.resources),
        "computePriority": parsed.priority.value,
        "cudaVersion": parsed.cuda_version or None,
    }


def placement_doc(placement: Placement) -> Doc:
    s = placement.score
    return {
        "gpus": list(placement.gpus),
        "grants": [grant_doc(g) for g in placement.grants],
        "breakdown": {
            "bottleneckGbps": s.bottleneck_gbps,
            "totalPairGbps": s.total_pair_gbps,
            "locality": s.locality,
            "leftoverGbps": s.leftover_gbps,
            "fragmentationDeltaMilliGpu": s.fragmentation_delta,
            "terms": dict(s.terms),
        },
    }


def _terms_doc(r: NodeRanking) -> Doc:
    return {
        "raw": round(r.raw, 6),
        "linkQuality": round(r.link, 6),
        "fragmentation": round(r.fragmentation, 6),
        "packing": round(r.packing, 6),
        "fragmentationDeltaMilliGpu": round(r.fragmentation_delta, 6),
    }


def settled(filtered: FilterOutcome | None) -> FilterOutcome | None:
    """A copy in which every node is in one bucket only: `passed` wins, then `failed`.

    The buckets are copied because a logged outcome may share its dicts with the decider's
    memo, which later filter calls update in place.
    """
    if filtered is None:
        return None
    passed = set(filtered.passed)
    failed = {n: r for n, r in dict(filtered.failed).items() if n not in passed}
    unresolvable = {
        n: r for n, r in dict(filtered.unresolvable).items() if n not in passed and n not in failed
    }
    return FilterOutcome(filtered.passed, failed, unresolvable)


def decision_rows(filtered: FilterOutcome | None, ranking: Ranking | None) -> list[Doc]:
    """One row per node the pod was filtered or scored on: outcome, reason, score terms, GPUs.

    Scored nodes come first (best first), then nodes that passed unscored, then failures.
    `filtered` should be `settled`.
    """
    ranked = {r.node: r for r in ranking} if ranking is not None else {}
    names: list[str] = []
    if filtered is not None:
        names.extend(filtered.passed)
        names.extend(sorted(filtered.failed))
        names.extend(sorted(filtered.unresolvable))
    names.extend(sorted(n for n in ranked if n not in set(names)))
    rows: list[Doc] = []
    for name in names:
        row: Doc = {"node": name, "filter": "not filtered", "reason": "", "score": None, "terms": None}
        if filtered is not None:
            if name in filtered.passed:
                row["filter"] = "passed"
            elif name in filtered.failed:
                row["filter"], row["reason"] = "failed", filtered.failed[name]
            elif name in filtered.unresolvable:
                row["filter"], row["reason"] = "unresolvable", filtered.unresolvable[name]
        found = ranked.get(name)
        if found is not None:
            row["score"] = found.score
            row["terms"] = _terms_doc(found)
            row.update(placement_doc(found.placement))
        rows.append(row)
    order = {"passed": 0, "not filtered": 1, "failed": 2, "unresolvable": 3}
    rows.sort(
        key=lambda r: (
            r["score"] is None,
            -(r["score"] or 0),
            -(r["terms"]["raw"] if r["terms"] else 0.0),
            order[r["filter"]],
            r["node"],
        )
    )
    return rows


def best_doc(rows: Sequence[Doc]) -> Doc | None:
    """The node the extender scores highest (the first row), or the only one that passed."""
    scored = [r for r in rows if r["score"] is not None]
    if scored:
        top = scored[0]
        return {"node": top["node"], "score": top["score"], "gpus": top["gpus"], "grants": top["grants"]}
    passed = [r for r in rows if r["filter"] == "passed"]
    return {"node": passed[0]["node"], "score": None, "gpus": None, "grants": None} if passed else None


def unavailable_summary(filtered: FilterOutcome) -> str:
    """kube-scheduler style: "0/3 nodes are available: 2 too few free GPUs, 1 node has no ..."."""
    reasons = Counter(_short_reason(m) for m in (*filtered.failed.values(), *filtered.unresolvable.values()))
    total = len(filtered.passed) + len(filtered.failed) + len(filtered.unresolvable)
    parts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(filtered.passed)}/{total} nodes are available" + (f": {parts}" if parts else "")


def _short_reason(message: str) -> str:
    """The reason without per-node detail ("too few free GPUs: 2 asked, 1 free" -> the head)."""
    for reason in MisfitReason:
        if message.startswith(reason.value):
            return reason.value
    return message


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Where a request would go now: filter buckets and ranking over the nodes asked about."""

    request: PodRequest
    filtered: FilterOutcome
    ranking: Ranking | None


def what_if_doc(evaluation: Evaluation) -> Doc:
    """POST /debug/what-if: the placement the extender would make now, nothing reserved."""
    filtered = settled(evaluation.filtered)
    assert filtered is not None
    rows = decision_rows(filtered, evaluation.ranking)
    best = best_doc(rows)
    pod = evaluation.request.pod
    if best is None:
        summary = unavailable_summary(filtered)
    else:
        summary = f"would go to {best['node']} on GPUs {best['gpus']} (score {best['score']})"
    return {
        "pod": {"namespace": pod.namespace, "name": pod.name},
        "request": request_doc(evaluation.request),
        "summary": summary,
        "best": best,
        "passed": list(filtered.passed),
        "nodes": rows,
    }


@dataclass(frozen=True, slots=True)
class ExplainInputs:
    """What the extender knows about one pod: its decisions log, watch view and ledger entry."""

    namespace: str
    name: str
    decisions: PodDecisions | None
    view: TrackedPod | None
    allocation: tuple[str, LedgerEntry] | None
    now: Evaluation | None = None
    # per node the pod was filtered against: what is wrong with its cordons or GpuTopology
    node_problems: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def explain_doc(inputs: ExplainInputs) -> Doc:
    """GET /debug/explain/{ns}/{pod}: why the pod is pending, or why it got its node and GPUs."""
    d = inputs.decisions
    choice = d.filtered.choice if d is not None and d.filtered is not None else None
    filtered = settled(d.filtered if d else None)
    ranking = d.ranking if d else None
    if ranking is None and choice is not None and d is not None and isinstance(d.request, PodRequest):
        # the policy decided the node, so nothing was prioritized: score the two it weighed
        ranking = combine([t for t in (choice.chosen, choice.runner_up) if t is not None], d.request.policy)
    rows = decision_rows(filtered, ranking)
    bound = entry_doc(inputs.allocation[1]) if inputs.allocation else None
    status, summary = _status(inputs, filtered, rows, bound)
    if choice is not None and choice.runner_up is not None:
        summary += f"; chosen over {choice.runner_up.node} by {choice.decided_by}"
    doc: Doc = {
        "pod": {
            "namespace": inputs.namespace,
            "name": inputs.name,
            "uid": inputs.view.uid if inputs.view else None,
            "nodeName": inputs.view.node_name if inputs.view else None,
        },
        "status": status,
        "summary": summary,
        "request": request_doc(d.request) if d else None,
        "lastDecisionAt": iso_time(d.at) if d else None,
        "filter": _filter_doc(filtered),
        "best": best_doc(rows),
        "decision": _choice_doc(choice),
        "bound": bound,
        "bindError": d.bind_error if d else "",
        "nodes": rows,
        "nodeProblems": {n: list(p) for n, p in sorted(inputs.node_problems.items()) if p},
    }
    if inputs.now is not None:
        now = what_if_doc(inputs.now)
        doc["now"] = {"summary": now["summary"], "best": now["best"], "passed": now["passed"]}
    return doc


def _choice_doc(choice: NodeChoice | None) -> Doc | None:
    """When the pod's policy decided the node: the node chosen, the runner-up, and the first step
    of the ranking (`topology.node_choice`) that told them apart."""
    if choice is None:
        return None
    runner_up = choice.runner_up
    return {
        "chosen": choice.chosen.node,
        "runnerUp": runner_up.node if runner_up is not None else None,
        "decidedBy": choice.decided_by or None,
    }


def _filter_doc(filtered: FilterOutcome | None) -> Doc | None:
    if filtered is None:
        return None
    return {
        "passed": list(filtered.passed),
        "failed": dict(sorted(filtered.failed.items())),
        "unresolvable": dict(sorted(filtered.unresolvable.items())),
        "summary": unavailable_summary(filtered),
    }


def _status(
    inputs: ExplainInputs, filtered: FilterOutcome | None, rows: Sequence[Doc], bound: Doc | None
) -> tuple[str, str]:
    d = inputs.decisions
    if bound is not None:
        node = bound["node"]
        placed = inputs.view is not None and inputs.view.node_name == node
        if placed or (d is not None and d.bound_node == node):
            why = ""
            top = next((r for r in rows if r["node"] == node and r["score"] is not None), None)
            if top is not None:
                why = f"; it scored {top['score']}" + (
                    " (the highest)" if rows and rows[0]["node"] == node else ""
                )
            return "bound", f"bound to {node} on GPUs {bound['gpus']}{why}"
        return (
            "reserved",
            f"GPUs {bound['gpus']} on {node} are committed in the ledger; the Binding is not seen yet",
        )
    if d is None:
        return "unknown", "the extender has not been asked about this pod"
    if d.bind_error:
        return "bind-failed", f"the last bind failed: {d.bind_error}"
    if isinstance(d.request, RequestError):
        return "invalid-request", d.request.message
    if d.request is None:
        return "not-a-gpu-pod", "the pod asks for no GPU resource the extender manages"
    if filtered is not None and not filtered.passed:
        return "pending", unavailable_summary(filtered)
    best = best_doc(rows)
    if best is not None:
        where = f"{best['node']}" + (f" (GPUs {best['gpus']}, score {best['score']})" if best["gpus"] else "")
        return "pending", f"fits; the best node was {where}; waiting for kube-scheduler to bind"
    return "pending", "filtered, not yet scored"


@dataclass(frozen=True, slots=True)
class PodPresence:
    """What the API says about a pod the extender has no decisions for (`known` False: could not ask)."""

    known: bool
    exists: bool = False
    node_name: str = ""
    scheduler_name: str = ""
    request: PodRequest | RequestError | None = None
    error: str = ""


def unseen_pod_doc(namespace: str, name: str, presence: PodPresence, scheduler_name: str) -> Doc:
    """The 404 body of explain for a pod the extender was never asked about, with the likely why."""
    message = f"the extender has not been asked about pod {namespace}/{name} yet"
    hint = ""
    if not presence.known:
        in_cluster: bool | None = None
        hint = f"whether the pod exists is unknown ({presence.error})" if presence.error else ""
    elif not presence.exists:
        in_cluster = False
        hint = "no such pod in the cluster"
    else:
        in_cluster = True
        if presence.scheduler_name != scheduler_name:
            hint = (
                f"the pod exists but its schedulerName is {presence.scheduler_name or 'default-scheduler'!r}, "
                f"not {scheduler_name!r}, so this extender is never called for it"
            )
        elif presence.request is None:
            hint = (
                "the pod exists but asks for no GPU resource the extender manages, "
                "so kube-scheduler does not call the extender for it"
            )
        elif presence.node_name:
            hint = (
                f"the pod exists and is bound to {presence.node_name} (decided before this extender started?)"
            )
        else:
            hint = "the pod exists and is not bound yet: kube-scheduler has not reached it (see its events)"
    return {
        "error": message + (f"; {hint}" if hint else ""),
        "pod": {"namespace": namespace, "name": name},
        "inCluster": in_cluster,
        "nodeName": presence.node_name or None,
    }


def entry_for(ledgers: Iterable[Ledger], namespace: str, name: str) -> tuple[str, LedgerEntry] | None:
    """The ledger entry of pod namespace/name on any node (for pods the watch does not track)."""
    for ledger in ledgers:
        for entry in ledger.entries:
            if entry.namespace == namespace and entry.name == name:
                return ledger.node, entry
    return None


def pod_manifest_problem(body: object) -> str | None:
    """Why `body` is not a Pod manifest the what-if view can evaluate, or None when it is."""
    if not isinstance(body, Mapping):
        return "request body must be a JSON Pod manifest (an object with metadata and spec)"
    kind = body.get("kind")
    if kind is not None and kind != "Pod":
        return f"kind must be Pod, got {kind!r}"
    metadata = body.get("metadata", {})
    if not isinstance(metadata, Mapping):
        return "metadata must be an object"
    annotations = metadata.get("annotations", {})
    if annotations is not None and not isinstance(annotations, Mapping):
        return "metadata.annotations must be an object of strings"
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return "spec is missing or not an object"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return "spec.containers must be a non-empty list"
    for key in ("containers", "initContainers"):
        for position, container in enumerate(spec.get(key) or []):
            if not isinstance(container, Mapping):
                return f"spec.{key}[{position}] must be an object"
            resources = container.get("resources", {})
            if resources is not None and not isinstance(resources, Mapping):
                return f"spec.{key}[{position}].resources must be an object"
            for part in ("limits", "requests"):
                amounts = (resources or {}).get(part, {})
                if amounts is not None and not isinstance(amounts, Mapping):
                    return f"spec.{key}[{position}].resources.{part} must be an object"
    return None
