"""The extender's debug endpoints (what operators ask when a GPU pod waits or lands oddly).

- GET /debug/topology: every node in one line (GPUs, free/shared/whole/unhealthy, memory,
  fragmentation);
- GET /debug/topology/{node}: the node's graph, per-GPU use and holders, pods, link matrix;
- GET /debug/explain/{namespace}/{pod}: the last filter and prioritize outcome per node, the
  chosen or best GPU set, and the committed allocation;
- POST /debug/what-if (a Pod manifest): where the extender would place it now; nothing is
  reserved or recorded.

The topology views answer JSON, or a self-contained HTML page for `?format=html` or a
`text/html` Accept header (a browser). Handlers only gather state; the `extender.debug` package
builds the answers (JSON documents and HTML pages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from contract.ledger import Ledger
from extender.debug.views.decision_documents import (
    Evaluation,
    ExplainInputs,
    PodPresence,
    entry_for,
    explain_doc,
    pod_manifest_problem,
    unseen_pod_doc,
    what_if_doc,
)
from extender.debug.views.node_documents import node_detail, topology_index
from extender.debug.views.pages import index_page, node_page
from extender.service import ExtenderService
from extender.state.cluster_api import ApiError, ApiNotFound
from extender.state.pod_requests import PodRequest, RequestError, read_pod_request
from extender.state.snapshot import ClusterSnapshot, TrackedNode


def register_debug_routes(app: FastAPI, service: ExtenderService) -> None:
    """Add the /debug routes to `app` (call once from `create_app`)."""

    @app.get("/debug/topology", response_model=None)
    def debug_topology(request: Request) -> Response:
        snapshot = service.store.snapshot()
        snaps = node_entries(snapshot, snapshot.node_names())
        if wants_html(request):
            return HTMLResponse(index_page(snaps))
        return JSONResponse(topology_index(snaps))

    @app.get("/debug/topology/{node}", response_model=None)
    def debug_node(node: str, request: Request) -> Response:
        snapshot = service.store.snapshot()
        if node not in snapshot.node_names():
            return _error(
                404, f"unknown node {node!r}: the extender knows no Node or GpuTopology of that name"
            )
        (snap,) = node_entries(snapshot, (node,))
        return HTMLResponse(node_page(snap)) if wants_html(request) else JSONResponse(node_detail(snap))

    @app.get("/debug/explain/{namespace}/{pod}", response_model=None)
    def debug_explain(namespace: str, pod: str) -> Response:
        inputs = explain_inputs(service, namespace, pod)
        if inputs.decisions is None and inputs.allocation is None:
            presence = pod_presence(service, namespace, pod)
            return JSONResponse(
                unseen_pod_doc(namespace, pod, presence, service.config.scheduler_name), status_code=404
            )
        return JSONResponse(explain_doc(inputs))

    @app.post("/debug/what-if", response_model=None)
    async def debug_what_if(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON: send a Pod manifest as JSON")
        result = await run_in_threadpool(evaluate_manifest, service, body)
        return _error(400, result) if isinstance(result, str) else JSONResponse(what_if_doc(result))


def wants_html(request: Request) -> bool:
    chosen = request.query_params.get("format", "").lower()
    if chosen in ("html", "json"):
        return chosen == "html"
    return "text/html" in request.headers.get("accept", "")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# ----------------------------------------------------------------------------- gathering


def node_entries(snapshot: ClusterSnapshot, names: Sequence[str]) -> list[TrackedNode]:
    return [snapshot.node(name) or TrackedNode(name, -1, ledger=Ledger(name)) for name in names]


def evaluate(
    service: ExtenderService, snapshot: ClusterSnapshot, pod: PodRequest, nodes: Sequence[str]
) -> Evaluation:
    """Filter and prioritize `pod` over `nodes` as the verbs would, without logging or reserving."""
    filtered = service.decider.filter(snapshot, pod, nodes)
    ranking = service.decider.prioritize(snapshot, pod, filtered.passed) if filtered.passed else None
    return Evaluation(pod, filtered, ranking)


def evaluate_manifest(service: ExtenderService, body: Any) -> Evaluation | str:
    """The what-if evaluation of a Pod manifest over every known node, or why it cannot be done."""
    problem = pod_manifest_problem(body)
    if problem is not None:
        return problem
    parsed = read_pod_request(body, service.config, service.store.snapshot().book)
    if parsed is None:
        names = service.config.resources
        return (
            f"the pod asks for no GPU resource the extender manages ({names.whole}, "
            f"{names.shared_units}, {names.memory_mib}, {names.mig_prefix}<profile>)"
        )
    if isinstance(parsed, RequestError):
        return parsed.message
    snapshot = service.store.snapshot()
    return evaluate(service, snapshot, parsed, snapshot.node_names())


def explain_inputs(service: ExtenderService, namespace: str, name: str) -> ExplainInputs:
    snapshot = service.store.snapshot()
    decisions = service.decisions_for(namespace, name)
    view = snapshot.pod_by_key(namespace, name)
    allocation = snapshot.allocation_of(view.uid) if view is not None else None
    if allocation is None:
        allocation = entry_for(snapshot.ledgers(), namespace, name)
    now = None
    if decisions is not None and isinstance(decisions.request, PodRequest) and allocation is None:
        asked = decisions.filtered
        nodes = (*asked.passed, *asked.failed, *asked.unresolvable) if asked else snapshot.node_names()
        now = evaluate(service, snapshot, decisions.request, sorted(nodes))
    considered = (
        (*asked.passed, *asked.failed, *asked.unresolvable)
        if decisions and (asked := decisions.filtered)
        else ()
    )
    return ExplainInputs(
        namespace, name, decisions, view, allocation, now, node_problems(snapshot, considered)
    )


def node_problems(snapshot: ClusterSnapshot, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """What is wrong with each node's cordon annotation or GpuTopology, for the explanation."""
    out: dict[str, tuple[str, ...]] = {}
    for name in names:
        entry = snapshot.node(name)
        if entry is None:
            continue
        problems = (
            *(entry.facts.cordons.problems if entry.facts else ()),
            *filter(None, [entry.topology_problem]),
        )
        if problems:
            out[name] = problems
    return out


def pod_presence(service: ExtenderService, namespace: str, name: str) -> PodPresence:
    """Ask the API about a pod the extender has no record of (for a helpful 404)."""
    try:
        pod = service.api.read_pod(namespace, name)
    except ApiNotFound:
        return PodPresence(known=True, exists=False)
    except ApiError as exc:
        return PodPresence(known=False, error=str(exc))
    spec = pod.manifest.get("spec") or {}
    return PodPresence(
        known=True,
        exists=True,
        node_name=pod.tracked.node_name,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        request=read_pod_request(pod.manifest, service.config),
    )
