"""The HTTP routes answer kube-scheduler's calls, including bad bodies, with 200 and a clear Error."""

from __future__ import annotations

from fastapi.testclient import TestClient

from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService
from extender.serving.app import create_app
from tests.support.nodes import node_object
from tests.support.pods import filter_args, pod_manifest
from tests.support.resources import GPU


def test_filter_prioritize_bind_over_http(service: ExtenderService, cluster: InMemoryCluster) -> None:
    http = TestClient(create_app(service))
    pod = cluster.create_pod(pod_manifest("web", gpus=2))
    body = filter_args(pod, ["nv-node", "pcie-node"])
    filtered = http.post("/filter", json=body)
    assert filtered.status_code == 200 and filtered.json()["NodeNames"] == ["nv-node", "pcie-node"]
    scores = http.post("/prioritize", json=body).json()
    best = max(scores, key=lambda s: s["Score"])["Host"]
    bound = http.post(
        "/bind", json={"PodName": "web", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": best}
    )
    assert bound.status_code == 200 and bound.json() == {"Error": ""}


def test_a_body_that_is_not_json_gets_an_error_not_a_422(service: ExtenderService) -> None:
    http = TestClient(create_app(service))
    reply = http.post("/filter", content=b"{not json", headers={"Content-Type": "application/json"})
    assert reply.status_code == 200
    assert reply.json()["Error"] == "request body must be a JSON object"
    assert http.post("/bind", content=b"[]").json() == {"Error": "request body must be a JSON object"}


def test_health_readiness_and_metrics(service: ExtenderService) -> None:
    http = TestClient(create_app(service))
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").status_code == 200
    service.filter(filter_args(pod_manifest(gpus=1), ["nv-node", "bare-node"]))
    text = http.get("/metrics").text
    assert "linkpack_extender_request_seconds_bucket" in text
    assert (
        'linkpack_extender_decisions_total{outcome="unresolvable",reason="node has no GPU topology record",verb="filter"}'
        in text
    )
    assert 'linkpack_gpus{model="NVIDIA H100 80GB HBM3",node="nv-node",state="free"} 8.0' in text


def test_not_ready_until_every_watch_has_listed(config) -> None:
    svc = ExtenderService(config, InMemoryCluster(config))
    reply = TestClient(create_app(svc)).get("/readyz")
    assert reply.status_code == 503
    assert reply.json() == {
        "ready": False,
        "waiting_for": ["nodes", "topologies", "ledgers", "pods", "policies", "namespaces"],
    }


def test_a_gpu_node_without_topology_record_is_exported(
    service: ExtenderService, cluster: InMemoryCluster
) -> None:
    """The alert on nodes without topology reads this gauge; CPU-only nodes never appear in it."""
    from extender.kube.translate import node_facts
    from extender.state.snapshot import NodeFacts

    facts = node_facts(node_object("gpu-orphan", allocatable={GPU: "8"}))
    assert facts.advertises_gpus
    assert not node_facts(node_object("cpu", allocatable={"cpu": "64"})).advertises_gpus
    cluster.add_node(facts, None)
    cluster.add_node(NodeFacts("cpu-only"), None)
    text = TestClient(create_app(service)).get("/metrics").text
    assert 'linkpack_node_topology_missing{node="gpu-orphan"} 1.0' in text
    assert 'node="cpu-only"' not in text.split("linkpack_node_topology_missing", 1)[1].split("# HELP", 1)[0]
