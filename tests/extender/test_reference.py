"""The decider that serves the verbs (memos, reuse, node choice kept per list) answers exactly what
the plain reference filter and prioritize (`extender.placing.reference`) decide from scratch."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from contract.compute_demand import ComputeDemand
from contract.gpu_topology import as_published
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.placing import reference
from extender.service import ExtenderService, handlers_for
from extender.state.pod_requests import PodRequest, read_pod_request
from extender.state.snapshot import NodeFacts
from tests.support.pods import filter_args, pod_manifest
from topology.catalog import load_machine

pytestmark = pytest.mark.timeout(180)

MACHINES = ("hgx-h100", "dgx-a100", "dgx1-v100", "pcie-nv12-pairs", "rtx3090-2socket")


def _cluster(config: ExtenderConfig, nodes: int) -> tuple[InMemoryCluster, ExtenderService]:
    """Nodes of five machine shapes, one of them without a published topology."""
    cluster = InMemoryCluster(config)
    for i in range(nodes):
        name = f"node-{i:03d}"
        base = load_machine(MACHINES[i % len(MACHINES)])
        topology = replace(base, gpus=tuple(replace(g, uuid=f"GPU-{name}-{g.index}") for g in base.gpus))
        published = None if i == 3 else as_published(name, topology)
        cluster.add_node(NodeFacts(name, allocatable=ComputeDemand(96_000, 1024 * 1024)), published)
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    return cluster, service


def _pod(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.randrange(5)
    name = f"p-{i:03d}"
    if kind == 0:
        return pod_manifest(name, gpus=rng.choice((1, 2, 4, 8)))
    if kind == 1:
        return pod_manifest(name, units=rng.choice((10, 25, 50)), memory=rng.choice((4096, 8192, 20480)))
    if kind == 2:
        return pod_manifest(name, gpus=2, policy="spread")
    if kind == 3:
        return pod_manifest(name, gpus=rng.choice((1, 2)), policy="binpack")
    return pod_manifest(name, gpus=1)


@pytest.mark.parametrize("decide_node", [True, False])
def test_filter_and_prioritize_equal_the_reference_at_every_step_as_pods_bind(decide_node: bool) -> None:
    """Sixty pods arrive one by one over 25 nodes, each asked with the node list in a new order
    (and now and then a few names short); before each bind the decider's filter outcome and
    ranking equal the reference's, and the pod binds where the service's filter sent it."""
    config = ExtenderConfig(decide_node=decide_node)
    cluster, service = _cluster(config, 25)
    rng = random.Random(11)
    names = [f"node-{i:03d}" for i in range(25)]
    compared = 0
    for i in range(60):
        manifest = _pod(rng, i)
        asked = rng.sample(names, len(names) - (rng.randrange(4) if i % 3 == 0 else 0))
        snapshot = service.store.snapshot()
        parsed = read_pod_request(manifest, config, snapshot.book)
        assert isinstance(parsed, PodRequest), parsed
        assert service.decider.filter(snapshot, parsed, asked) == reference.filter_nodes(
            snapshot, parsed, asked
        )
        assert service.decider.prioritize(snapshot, parsed, asked) == reference.prioritize_nodes(
            snapshot, parsed, asked
        )
        compared += 1
        answer = service.filter(filter_args(manifest, asked))
        if not answer["NodeNames"]:
            continue
        created = cluster.create_pod(manifest)["metadata"]
        bound = service.bind(
            {
                "PodName": created["name"],
                "PodNamespace": created["namespace"],
                "PodUID": created["uid"],
                "Node": answer["NodeNames"][0],
            }
        )
        assert bound["Error"] == ""
    assert compared == 60


def test_a_node_without_a_topology_is_unresolvable_and_every_node_lands_in_one_bucket_in_name_order() -> None:
    """On an empty fleet an 8-GPU pod fits every 8-GPU machine; the node with no topology is
    unresolvable, and every node asked lands in exactly one bucket."""
    config = ExtenderConfig()
    _, service = _cluster(config, 5)
    snapshot = service.store.snapshot()
    parsed = read_pod_request(pod_manifest("eight", gpus=8), config, snapshot.book)
    assert isinstance(parsed, PodRequest)
    outcome = reference.filter_nodes(snapshot, parsed, [f"node-{i:03d}" for i in range(5)])
    assert "node-003" in outcome.unresolvable
    assert set(outcome.passed) | set(outcome.failed) | set(outcome.unresolvable) == {
        f"node-{i:03d}" for i in range(5)
    }
    assert outcome.passed == tuple(sorted(outcome.passed))
