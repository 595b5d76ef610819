"""The debug endpoints: topology overview and node pages (JSON and HTML), explain, what-if."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from contract.cordons import Cordons, canonical_gpu_uuid
from contract.gpu_topology import as_published
from extender.debug.routes import register_debug_routes
from extender.debug.views.geometry import radial_layout
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService
from extender.serving.app import create_app
from extender.state.snapshot import NodeFacts
from tests.support.machines import hgx_h100, rtx3090_two_socket
from tests.support.pods import filter_args, pod_manifest
from topology.catalog import load_machine
from topology.graph import build_graph
from topology.model import LinkKind

NODES = ["nv-node", "pcie-node", "bare-node"]


@pytest.fixture
def http(service: ExtenderService) -> TestClient:
    app = create_app(service)
    register_debug_routes(app, service)
    return TestClient(app)


def _schedule(
    service: ExtenderService, cluster: InMemoryCluster, pod: dict[str, Any], nodes: list[str] = NODES
) -> str:
    """One cycle as kube-scheduler runs it; returns the node bound to ("" when none fits)."""
    created = cluster.create_pod(pod)
    passed = service.filter(filter_args(created, nodes))["NodeNames"]
    if not passed:
        return ""
    scores = service.prioritize(filter_args(created, passed))
    best = max(scores, key=lambda s: s["Score"])["Host"]
    meta = created["metadata"]
    error = service.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
    )
    assert error == {"Error": ""}
    return str(best)


# ----------------------------------------------------------------------------- /debug/topology


def test_the_overview_lists_every_node_with_counts_and_totals(http: TestClient) -> None:
    doc = http.get("/debug/topology").json()
    rows = {r["name"]: r for r in doc["nodes"]}
    assert list(rows) == ["bare-node", "nv-node", "pcie-node"]
    nv = rows["nv-node"]
    assert (nv["gpus"], nv["free"], nv["shared"], nv["whole"], nv["unhealthy"]) == (8, 8, 0, 0, 0)
    assert nv["model"] == "NVIDIA H100 80GB HBM3" and nv["nvswitch"] is True
    assert nv["freeMemoryMiB"] == 8 * 81559 and nv["fragmentationMilliGpu"] >= 0
    assert (
        rows["bare-node"]["hasTopology"] is False and "no GPU topology record" in rows["bare-node"]["message"]
    )
    assert doc["totals"] == {
        "nodes": 3,
        "nodesWithoutTopology": 1,
        "gpus": 16,
        "free": 16,
        "shared": 0,
        "whole": 0,
        "unhealthy": 0,
        "cordoned": 0,
        "freeMemoryMiB": 8 * 81559 + 8 * 24576,
        "totalMemoryMiB": 8 * 81559 + 8 * 24576,
        "pods": 0,
    }


def test_a_node_page_shows_use_holders_graph_and_pods(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    assert _schedule(service, cluster, pod_manifest("trainer", gpus=2), ["nv-node"]) == "nv-node"
    assert (
        _schedule(service, cluster, pod_manifest("infer", units=30, memory=10000), ["nv-node"]) == "nv-node"
    )
    doc = http.get("/debug/topology/nv-node").json()
    assert doc["node"]["whole"] == 2 and doc["node"]["shared"] == 1 and doc["node"]["free"] == 5
    by_status: dict[str, list[dict[str, Any]]] = {}
    for gpu in doc["gpus"]:
        by_status.setdefault(gpu["status"], []).append(gpu)
    assert all(g["holders"][0]["name"] == "trainer" and g["freeMemoryMiB"] == 0 for g in by_status["whole"])
    (shared,) = by_status["shared"]
    assert shared["freeMemoryMiB"] == 81559 - 10000 and shared["freeUnits"] == 70
    assert shared["holders"] == [
        {"namespace": "ml", "name": "infer", "uid": shared["holders"][0]["uid"], "whole": False,
         "memoryMiB": 10000, "units": 30, "migUuid": ""}
    ]  # fmt: skip
    assert {p["name"] for p in doc["pods"]} == {"trainer", "infer"}
    vertices = {v["id"]: v for v in doc["graph"]["vertices"]}
    assert vertices["nvswitch"]["type"] == "nvswitch"
    assert {f"gpu{i}" for i in range(8)} <= set(vertices)
    spoke = next(e for e in doc["graph"]["edges"] if e["target"] == "nvswitch" and e["role"] == "fabric")
    assert spoke["kind"] == "NV" and spoke["nvlinks"] == 18 and spoke["bandwidthGBps"] == 450.0
    assert len(doc["links"]) == 28 and doc["problems"] == []


def test_unhealthy_and_cordoned_gpus_are_marked(http: TestClient, cluster: InMemoryCluster) -> None:
    topology = rtx3090_two_socket("cordon")
    cluster.add_node(
        NodeFacts("sick", cordons=Cordons(frozenset({canonical_gpu_uuid(topology.gpus[5].uuid)}))),
        as_published("sick", topology, unhealthy=frozenset({2})),
    )
    doc = http.get("/debug/topology/sick").json()
    statuses = [g["status"] for g in doc["gpus"]]
    assert statuses[2] == "unhealthy" and statuses[5] == "cordoned" and statuses.count("free") == 6
    assert doc["gpus"][2]["healthy"] is False and doc["gpus"][5]["cordoned"] is True
    assert (doc["node"]["unhealthy"], doc["node"]["cordoned"]) == (1, 1)


def test_an_unknown_node_is_a_404_with_a_message(http: TestClient) -> None:
    reply = http.get("/debug/topology/nope", headers={"Accept": "text/html"})
    assert reply.status_code == 404
    assert reply.json() == {
        "error": "unknown node 'nope': the extender knows no Node or GpuTopology of that name"
    }


def test_a_node_without_topology_still_answers(http: TestClient) -> None:
    doc = http.get("/debug/topology/bare-node").json()
    assert doc["node"]["hasTopology"] is False and doc["gpus"] == []
    page = http.get("/debug/topology/bare-node?format=html").text
    assert "no GPU topology record" in page


def test_the_html_page_draws_every_gpu_with_a_legend_and_nothing_external(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    _schedule(service, cluster, pod_manifest("trainer", gpus=4), ["pcie-node"])
    reply = http.get("/debug/topology/pcie-node", headers={"Accept": "text/html,application/xhtml+xml"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    page = reply.text
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert sorted(int(i) for i in re.findall(r'data-gpu="(\d+)"', svg)) == list(range(8))
    assert re.findall(r'data-status="(\w+)"', svg).count("whole") == 4
    for word in ("free", "shared", "whole", "unhealthy", "cordoned", *(k.value for k in LinkKind)):
        assert f"<b>{word}</b>" in page, word
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert re.findall(r"https?://[^\"' )]+", page) == ["http://www.w3.org/2000/svg"]  # the SVG namespace only
    assert "GPU0" in page and "NODE" in page and "SYS" in page  # the link matrix


def test_the_overview_page_links_every_node(http: TestClient) -> None:
    page = http.get("/debug/topology?format=html").text
    for node in NODES:
        assert f'href="/debug/topology/{node}?format=html"' in page
    assert http.get("/debug/topology?format=json").headers["content-type"] == "application/json"


def test_names_from_the_cluster_are_escaped_in_the_html_pages(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    node, pod = "evil<script>", "p<script>alert('x')</script>"  # a path parameter cannot hold "/"
    cluster.add_node(NodeFacts(node), as_published(node, rtx3090_two_socket("evil")))
    assert _schedule(service, cluster, pod_manifest(pod, units=20, memory=1000), [node]) == node
    page = http.get(f"/debug/topology/{quote(node, safe='')}?format=html").text
    assert "<script" not in page and "alert('x')" not in page
    assert "<h1>evil&lt;script&gt;</h1>" in page  # the heading
    pod_html = "ml/p&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    assert f"<td>{pod_html}: 1000 MiB, 20 units</td>" in page  # the GPU table's holders
    assert f"<td>{pod_html}</td>" in page  # the ledger table
    assert 'aria-label="GPU topology of evil&lt;script&gt;"' in page  # the drawing
    assert "ml/p&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;: 1000 MiB" in page  # its tooltip
    overview = http.get("/debug/topology?format=html").text
    assert "<script" not in overview
    assert '<a href="/debug/topology/evil&lt;script&gt;?format=html">evil&lt;script&gt;</a>' in overview


def test_the_layout_is_deterministic_and_keeps_gpus_apart() -> None:
    for topology in (hgx_h100(), rtx3090_two_socket(), load_machine("dgx-a100"), load_machine("dgx1-v100")):
        graph = build_graph(topology)
        first, again = radial_layout(topology, graph), radial_layout(topology)
        assert first.angles == again.angles and first.radii == again.radii
        points = [first.at(f"gpu{g.index}") for g in topology.gpus]
        for i, p in enumerate(points):
            assert 0 < p.x < first.size and 0 < p.y < first.size
            for q in points[i + 1 :]:
                assert abs(p.x - q.x) >= 99 or abs(p.y - q.y) >= 59, "GPU boxes overlap"
        assert set(first.angles) == {str(v) for v in graph.nodes}


# ----------------------------------------------------------------------------- explain


def test_explain_a_bound_pod_gives_its_node_gpus_and_scores(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    node = _schedule(service, cluster, pod_manifest("trainer", gpus=4), ["nv-node", "pcie-node", "bare-node"])
    doc = http.get("/debug/explain/ml/trainer").json()
    assert doc["status"] == "bound" and doc["bound"]["node"] == node == "nv-node"
    assert len(doc["bound"]["gpus"]) == 4 and doc["summary"].startswith("bound to nv-node on GPUs")
    rows = {r["node"]: r for r in doc["nodes"]}
    assert rows["nv-node"]["filter"] == "passed" and doc["nodes"][0]["node"] == "nv-node"
    assert rows["nv-node"]["terms"]["linkQuality"] > rows["pcie-node"]["terms"]["linkQuality"]
    assert rows["nv-node"]["breakdown"]["bottleneckGbps"] == 450.0
    assert rows["pcie-node"]["score"] < rows["nv-node"]["score"]
    assert rows["bare-node"] == {
        "node": "bare-node", "filter": "unresolvable", "reason": "node has no GPU topology record",
        "score": None, "terms": None,
    }  # fmt: skip
    assert doc["request"]["kind"] == "whole" and doc["request"]["gpus"] == 4
    assert doc["request"]["policy"]["name"] == "balanced"
    assert doc["best"]["node"] == "nv-node" and doc["bindError"] == "" and "now" not in doc


def test_explain_a_pending_pod_says_why_node_by_node(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    assert (
        _schedule(service, cluster, pod_manifest("big", gpus=8), ["nv-node", "pcie-node", "bare-node"]) != ""
    )
    assert _schedule(service, cluster, pod_manifest("bigger", gpus=8), NODES) != ""
    assert _schedule(service, cluster, pod_manifest("waiting", gpus=3), NODES) == ""
    doc = http.get("/debug/explain/ml/waiting").json()
    assert doc["status"] == "pending"
    assert doc["summary"] == (
        "0/3 nodes are available: 2 too few free GPUs, 1 node has no GPU topology record"
    )
    rows = {r["node"]: r for r in doc["nodes"]}
    assert (
        rows["nv-node"]["filter"] == "failed"
        and rows["nv-node"]["reason"] == "too few free GPUs: 3 asked, 0 free"
    )
    assert rows["bare-node"]["filter"] == "unresolvable"
    assert doc["best"] is None and doc["bound"] is None
    assert doc["now"]["best"] is None and doc["now"]["summary"].startswith("0/3 nodes are available")


def test_explain_keeps_each_pods_own_filter_outcome(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """Later filter calls for the same request shape must not rewrite an earlier pod's answer."""
    assert _schedule(service, cluster, pod_manifest("first", gpus=8), ["nv-node", "pcie-node"]) == "nv-node"
    assert (
        _schedule(service, cluster, pod_manifest("second", gpus=8), ["nv-node", "pcie-node"]) == "pcie-node"
    )
    first = http.get("/debug/explain/ml/first").json()
    assert first["filter"]["passed"] == ["nv-node", "pcie-node"]
    assert first["filter"]["failed"] == {} and first["status"] == "bound"


def test_explain_a_pod_never_seen_is_a_404_saying_so(http: TestClient, cluster: InMemoryCluster) -> None:
    reply = http.get("/debug/explain/ml/ghost")
    assert reply.status_code == 404
    assert (
        reply.json()["error"]
        == "the extender has not been asked about pod ml/ghost yet; no such pod in the cluster"
    )
    assert reply.json()["inCluster"] is False
    cluster.create_pod(pod_manifest("queued", gpus=1))
    doc = http.get("/debug/explain/ml/queued").json()
    assert doc["inCluster"] is True and "not bound yet" in doc["error"]
    other = pod_manifest("elsewhere", gpus=1)
    other["spec"]["schedulerName"] = "default-scheduler"
    cluster.create_pod(other)
    assert (
        "schedulerName is 'default-scheduler', not 'linkpack'"
        in http.get("/debug/explain/ml/elsewhere").json()["error"]
    )


def test_explain_an_invalid_request(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    pod = cluster.create_pod(pod_manifest("odd", gpus=1, policy="yolo"))
    service.filter(filter_args(pod, NODES))
    doc = http.get("/debug/explain/ml/odd").json()
    assert doc["status"] == "invalid-request" and "unknown linkpack.io/policy 'yolo'" in doc["summary"]
    assert doc["request"] == {"error": doc["summary"]}


# ----------------------------------------------------------------------------- what-if


def _fingerprint(service: ExtenderService) -> tuple[Any, ...]:
    state = service.store.snapshot()
    return (
        state.ledgers(),
        tuple(state.node_state(n) for n in state.node_names()),
        state.cluster_version,
    )


def test_what_if_places_without_reserving(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    _schedule(service, cluster, pod_manifest("resident", gpus=4), ["nv-node"])
    before = _fingerprint(service)
    reply = http.post("/debug/what-if", json=pod_manifest("maybe", gpus=4))
    assert reply.status_code == 200
    doc = reply.json()
    assert doc["best"]["node"] == "nv-node" and len(doc["best"]["gpus"]) == 4
    assert set(doc["best"]["gpus"]).isdisjoint(
        service.store.snapshot().ledger("nv-node").entries[0].allocation.gpu_indices
    )
    assert doc["passed"] == ["nv-node", "pcie-node"] and doc["summary"].startswith("would go to nv-node")
    assert {r["node"]: r["filter"] for r in doc["nodes"]}["bare-node"] == "unresolvable"
    assert _fingerprint(service) == before
    assert service.decisions_for("ml", "maybe") is None
    assert http.post("/debug/what-if", json=pod_manifest("maybe", gpus=4)).json() == doc


def test_what_if_when_nothing_fits(http: TestClient) -> None:
    doc = http.post("/debug/what-if", json=pod_manifest(gpus=9)).json()
    assert doc["best"] is None and doc["summary"].startswith("0/3 nodes are available")


# Raw request bodies and the messages users read: resource names stay literal, as the text itself.
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "request body is not JSON: send a Pod manifest as JSON"),
        (b"[1, 2]", "request body must be a JSON Pod manifest (an object with metadata and spec)"),
        (b'{"kind": "Deployment", "spec": {}}', "kind must be Pod, got 'Deployment'"),
        (b'{"metadata": {}}', "spec is missing or not an object"),
        (b'{"spec": {"containers": []}}', "spec.containers must be a non-empty list"),
        (
            b'{"spec": {"containers": [{"resources": {"limits": [1]}}]}}',
            "spec.containers[0].resources.limits must be an object",
        ),
        (
            b'{"spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}}',
            "the pod asks for no GPU resource the extender manages (nvidia.com/gpu, nvidia.com/gpu.shared, "
            "nvidia.com/gpu.memory, nvidia.com/mig-<profile>)",
        ),
        (
            b'{"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "two"}}}]}}',
            "container c: nvidia.com/gpu='two' is not a resource quantity",
        ),
        (
            b'{"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "150"}}}]}}',
            "nvidia.com/gpu.shared=150 exceeds one GPU (100 units); ask for nvidia.com/gpu instead",
        ),
    ],
)
def test_what_if_rejects_bad_input_with_a_specific_message(
    http: TestClient, body: bytes, message: str
) -> None:
    reply = http.post("/debug/what-if", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    assert reply.json() == {"error": message}


def test_the_app_serves_the_debug_routes(service: ExtenderService) -> None:
    """create_app registers exactly these debug routes beside the scheduler verbs."""
    app = create_app(service)
    paths = {getattr(r, "path", "") for r in app.routes}
    added = {p for p in paths if p.startswith("/debug")}
    assert added == {
        "/debug/topology",
        "/debug/topology/{node}",
        "/debug/explain/{namespace}/{pod}",
        "/debug/what-if",
    }
    assert hgx_h100().gpu_count == 8


def test_cordon_junk_reaches_the_node_page_and_the_explanation(
    http: TestClient, service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """An unreadable entry in a node's cordon annotation is shown on its node page and in the
    explanation of a pod filtered against that node, naming the entry."""
    from contract.keys import CORDON_ANNOTATION
    from extender.kube.translate import node_facts

    facts = node_facts(
        {"metadata": {"name": "typo-node", "annotations": {CORDON_ANNOTATION: "GPU-7,MIG-abc"}}}
    )
    cluster.add_node(facts, as_published("typo-node", hgx_h100("typo")))
    node_doc = http.get("/debug/topology/typo-node").json()["node"]
    assert len(node_doc["cordonProblems"]) == 2 and "MIG instance" in node_doc["cordonProblems"][1]
    assert _schedule(service, cluster, pod_manifest("ask", gpus=1), ["typo-node"]) == "typo-node"
    explained = http.get("/debug/explain/ml/ask").json()
    assert "not a GPU UUID" in explained["nodeProblems"]["typo-node"][0]
