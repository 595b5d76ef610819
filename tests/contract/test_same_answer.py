"""The extender and the node agent read the same pods the same way.

Each fixture pod (plain, init, sidecar, sidecar before init, MIG, shares, several containers) is
read by the extender (`extender.state.pod_requests`, what it grants) and by the node agent
(`node_agent.kube.node_api.pod_from_dict`, what its device plugin hands out). Both must find the
fixture's effective request; and the allocation the extender commits for the pod must be one
the device plugin can cut into the containers' slots, so the kubelet admits the pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from contract.allocation import decode_allocation
from contract.gpu_topology import as_published
from contract.keys import ALLOCATION_ANNOTATION
from contract.pod_demand import effective_amount
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.pod_requests import PodRequest, read_pod_request
from extender.state.snapshot import NodeFacts
from node_agent.deviceplugin.inventory import Inventory
from node_agent.deviceplugin.pod_records import bound_pod
from node_agent.deviceplugin.records import split_record
from node_agent.kube.node_api import pod_from_dict
from tests.contract.pod_fixtures import CASES, Case
from tests.support.machines import dgx_a100_with_mig
from tests.support.resources import NAMES

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"


TOPOLOGY = dgx_a100_with_mig()
GPU_CASES = [c for c in CASES if c.effective]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.manifest["metadata"]["name"])
def test_both_sides_find_the_effective_request(case: Case) -> None:
    """The extender's granted amounts and the node agent's per-resource totals are the fixture's."""
    extender_side = read_pod_request(case.manifest, ExtenderConfig())
    node_pod = pod_from_dict(case.manifest, NAMES.managed)
    node_side = {
        r: effective_amount(node_pod.demands, r)
        for r in sorted({r for d in node_pod.demands for r, _ in d.amounts})
    }
    node_side = {r: n for r, n in node_side.items() if n}
    if not case.effective:
        assert extender_side is None and node_side == {}
        return
    assert isinstance(extender_side, PodRequest), extender_side
    assert dict(extender_side.resources) == case.effective == node_side, case.description


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.manifest["metadata"]["name"])
def test_what_the_extender_commits_the_device_plugin_can_hand_out(case: Case) -> None:
    """Bind the pod with the extender, then give its record to the device plugin's splitter:
    every container gets slots and the record covers exactly the pod's request."""
    config = ExtenderConfig()
    cluster = InMemoryCluster(config)
    cluster.add_node(NodeFacts(NODE), as_published(NODE, TOPOLOGY))
    service = ExtenderService(config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)
    manifest: dict[str, Any] = {
        **case.manifest,
        "spec": {k: v for k, v in case.manifest["spec"].items() if k != "nodeName"},
    }
    created = cluster.create_pod(manifest)
    meta = created["metadata"]
    reply = service.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": NODE}
    )
    assert reply == {"Error": ""}, case.description
    stored = cluster.read_pod(meta["namespace"], meta["name"]).manifest
    allocation = decode_allocation(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    pod = bound_pod(pod_from_dict(stored, NAMES.managed))
    slots = split_record(pod, allocation, Inventory.from_topology(TOPOLOGY))
    assert not isinstance(slots, str), f"{case.description}: {slots}"
    asked = {
        (i, r)
        for i, d in enumerate(pod.containers)
        for r, n in d.amounts
        if n and NAMES.kind(r) is not NAMES.kind(NAMES.memory_mib)
    }
    assert {(s.position, s.resource) for s in slots} == asked
