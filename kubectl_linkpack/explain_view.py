"""`kubectl linkpack explain`: the extender's GET /debug/explain answer, decoded and as text. Pure.

The answer is the extender's debug document, not a versioned contract, so it is read leniently:
a missing or odd field shows as "-" or is left out, never as a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.resources import ResourceNames
from kubectl_linkpack.tables import share_text, table
from topology.scheduling import GpuGrant

Number = int | float


@dataclass(frozen=True, slots=True)
class ExplainRequest:
    """What the pod asks for, as the extender read it (`error` set: it could not)."""

    kind: str = ""  # whole, share, mig
    gpus: int | None = None
    near_nic: str = ""
    memory_mib: int | None = None
    units: int | None = None
    profile: str = ""
    error: str = ""
    policy: str = ""
    weights: tuple[Number, Number, Number] | None = None  # link quality, fragmentation, packing
    min_bottleneck_gbps: Number | None = None


@dataclass(frozen=True, slots=True)
class ExplainAllocation:
    """The allocation the ledger holds for the pod."""

    node: str
    gpus: tuple[int, ...]
    grants: tuple[GpuGrant, ...]
    resources: tuple[str, ...]
    enforcement: str
    reserved_at: str


@dataclass(frozen=True, slots=True)
class ExplainRow:
    """The pod's outcome on one node: filter result, score and its terms, the GPUs chosen."""

    node: str
    filter: str
    score: Number | None = None
    link: Number | None = None
    fragmentation: Number | None = None
    packing: Number | None = None
    gpus: tuple[int, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a pod waits, or why it got its node and GPUs."""

    namespace: str
    name: str
    status: str
    summary: str
    request: ExplainRequest | None = None
    last_decision_at: str = ""
    bound: ExplainAllocation | None = None
    bind_error: str = ""
    rows: tuple[ExplainRow, ...] = ()
    now: str = ""


def decode_explanation(doc: Mapping[str, Any]) -> Explanation:
    """The extender's explain document into an `Explanation` (lenient; see the module docstring)."""
    pod = _obj(doc.get("pod"))
    request = doc.get("request")
    bound = doc.get("bound")
    now = doc.get("now")
    return Explanation(
        namespace=_text(pod.get("namespace")),
        name=_text(pod.get("name")),
        status=_text(doc.get("status")),
        summary=_text(doc.get("summary")),
        request=_request(request) if isinstance(request, Mapping) else None,
        last_decision_at=_text(doc.get("lastDecisionAt")),
        bound=_allocation(bound) if isinstance(bound, Mapping) else None,
        bind_error=_text(doc.get("bindError")),
        rows=tuple(_row(r) for r in _list(doc.get("nodes")) if isinstance(r, Mapping)),
        now=_text(_obj(now).get("summary")) if isinstance(now, Mapping) else "",
    )


def format_explain(explanation: Explanation, names: ResourceNames) -> str:
    """The explanation as text: status and summary, request, allocation, one row per node."""
    e = explanation
    lines = [f"Pod {e.namespace}/{e.name}: {e.status}", f"  {e.summary}"]
    if e.request is not None:
        lines.append("Request: " + request_text(e.request))
    if e.last_decision_at:
        lines.append(f"Last decision: {e.last_decision_at}")
    if e.bound is not None:
        b = e.bound
        lines.append(
            f"Allocation: {b.node or '?'} GPUs {list(b.gpus)} ({share_text(b.grants, b.resources, names)}, "
            f"enforcement {b.enforcement or '?'}, reserved {b.reserved_at or '?'})"
        )
    if e.bind_error:
        lines.append(f"Bind error: {e.bind_error}")
    if e.rows:
        rows = [
            [
                r.node,
                r.filter,
                _num(r.score),
                _num(r.link),
                _num(r.fragmentation),
                _num(r.packing),
                ",".join(str(g) for g in r.gpus) or "-",
                r.reason,
            ]
            for r in e.rows
        ]
        lines += ["", table(["NODE", "FILTER", "SCORE", "LINK", "FRAG", "PACK", "GPUS", "REASON"], rows)]
    if e.now:
        lines += ["", f"Now: {e.now}"]
    return "\n".join(lines)


def request_text(request: ExplainRequest) -> str:
    """`2 whole GPU(s) near NIC mlx5_0; policy balanced (link 1, ...)`."""
    if request.error:
        return f"invalid: {request.error}"
    if request.kind == "whole":
        text = f"{_known(request.gpus)} whole GPU(s)" + (
            f" near NIC {request.near_nic}" if request.near_nic else ""
        )
    elif request.kind == "share":
        text = f"a GPU share: {_known(request.memory_mib)} MiB, {_known(request.units)} units"
    elif request.kind == "mig":
        text = f"MIG slice {request.profile}"
    else:
        text = f"{request.kind or 'unknown'} request"
    if request.weights is not None:
        link, fragmentation, packing = request.weights
        text += (
            f"; policy {request.policy} (link {link:g}, fragmentation {fragmentation:g}, packing {packing:g})"
        )
    elif request.policy:
        text += f"; policy {request.policy}"
    if request.min_bottleneck_gbps:
        text += f", at least {request.min_bottleneck_gbps:g} GB/s between GPUs"
    return text


# ----------------------------------------------------------------------------- lenient readers


def _request(doc: Mapping[str, Any]) -> ExplainRequest:
    if "error" in doc:
        return ExplainRequest(error=_text(doc.get("error")))
    policy = _obj(doc.get("policy"))
    weights = _obj(policy.get("weights"))
    triple = tuple(_number(weights.get(k)) for k in ("linkQuality", "fragmentation", "packing"))
    link, fragmentation, packing = triple
    return ExplainRequest(
        kind=_text(doc.get("kind")),
        gpus=_int(doc.get("gpus")),
        near_nic=_text(doc.get("nearNic")),
        memory_mib=_int(doc.get("memoryMiB")),
        units=_int(doc.get("units")),
        profile=_text(doc.get("profile")),
        policy=_text(policy.get("name")),
        weights=(link, fragmentation, packing)
        if link is not None and fragmentation is not None and packing is not None
        else None,
        min_bottleneck_gbps=_number(policy.get("minBottleneckGbps")),
    )


def _allocation(doc: Mapping[str, Any]) -> ExplainAllocation:
    grants = tuple(_grant(g) for g in _list(doc.get("grants")) if isinstance(g, Mapping))
    return ExplainAllocation(
        node=_text(doc.get("node")),
        gpus=_ints(doc.get("gpus")),
        grants=tuple(g for g in grants if g is not None),
        resources=tuple(str(k) for k in _obj(doc.get("resources"))),
        enforcement=_text(doc.get("enforcement")),
        reserved_at=_text(doc.get("reservedAt")),
    )


def _grant(doc: Mapping[str, Any]) -> GpuGrant | None:
    index = _int(doc.get("index"))
    if index is None:
        return None
    return GpuGrant(
        index,
        _text(doc.get("uuid")),
        doc.get("whole") is True,
        _int(doc.get("memoryMiB")) or 0,
        _int(doc.get("units")) or 0,
        _text(doc.get("migUuid")),
    )


def _row(doc: Mapping[str, Any]) -> ExplainRow:
    terms = _obj(doc.get("terms"))
    return ExplainRow(
        node=_text(doc.get("node")),
        filter=_text(doc.get("filter")),
        score=_number(doc.get("score")),
        link=_number(terms.get("linkQuality")),
        fragmentation=_number(terms.get("fragmentation")),
        packing=_number(terms.get("packing")),
        gpus=_ints(doc.get("gpus")),
        reason=_text(doc.get("reason")),
    )


def _num(value: Number | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _known(value: int | None) -> str:
    return "?" if value is None else str(value)


def _obj(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _list(raw: object) -> Sequence[Any]:
    return raw if isinstance(raw, list) else []


def _text(raw: object) -> str:
    return "" if raw is None else str(raw)


def _number(raw: object) -> Number | None:
    return raw if isinstance(raw, int | float) and not isinstance(raw, bool) else None


def _int(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _ints(raw: object) -> tuple[int, ...]:
    return tuple(i for i in (_int(v) for v in _list(raw)) if i is not None)
