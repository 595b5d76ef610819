"""The extender deciding the node (decideNode) with the real API server and kube-scheduler: the
in-tree filters still run first (node selectors, taints), the extender's filter then answers one
node, which overrides in-tree preferences such as preferred node affinity; a policy with
decideNode: false leaves the choice to the scores, where that preference wins."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from contract.keys import GROUP
from contract.scheduling_policy import POLICY_PLURAL, POLICY_VERSION
from tests.cluster.controlplane import ControlPlane, temporary_namespace
from tests.cluster.linkpack_env import (
    HOSTNAME,
    node_topology,
    published_nodes,
    running_extender,
    scheduler_config,
    wait_until,
)
from tests.support.pods import api_pod_manifest
from topology.node_choice import name_rank

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

# Three groups of three identical empty nodes, one group per test: on identical empty nodes
# the extender's name order decides.
GROUPS = ("prefer", "filter", "mix")
NODES = {g: tuple(f"decide-{g}-{i}" for i in range(3)) for g in GROUPS}


def _ranked(group: str) -> list[str]:
    return sorted(NODES[group], key=name_rank)


@pytest.fixture(scope="module")
def deciding(linkpack_crd: ControlPlane) -> Iterator[ControlPlane]:
    cp = linkpack_crd
    topologies = {node: node_topology(node, "rtx3090-2socket") for nodes in NODES.values() for node in nodes}
    with contextlib.ExitStack() as stack:
        stack.enter_context(published_nodes(cp, topologies))
        for group, nodes in NODES.items():
            for node in nodes:
                client.CoreV1Api(cp.api_client()).patch_node(
                    node, {"metadata": {"labels": {"linkpack-e2e": group}}}
                )
        extender = stack.enter_context(running_extender(cp, "extender-decide"))
        cp.start_scheduler(scheduler_config(cp, extender.url, extender.tls))
        try:
            yield cp
        finally:
            cp.stop_scheduler()


@pytest.fixture
def namespace(deciding: ControlPlane) -> Iterator[str]:
    with temporary_namespace(deciding.api_client(), prefix="decide-") as name:
        yield name


def _pod(name: str, group: str, prefer: str = "", policy: str = "") -> dict[str, Any]:
    """A 1-GPU pod kept to `group`'s nodes, preferring node `prefer` and naming `policy` if given."""
    affinity = None
    if prefer:
        term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [prefer]}]}
        preferred = [{"weight": 100, "preference": term}]
        affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    return api_pod_manifest(
        name, gpus=1, node_selector={"linkpack-e2e": group}, affinity=affinity, policy=policy or None
    )


def _bound_to(cp: ControlPlane, namespace: str, pod: dict[str, Any]) -> str:
    core = client.CoreV1Api(cp.api_client())
    core.create_namespaced_pod(namespace, pod)
    name = pod["metadata"]["name"]
    wait_until(lambda: core.read_namespaced_pod(name, namespace).spec.node_name, 60, f"{name} bound")
    node = core.read_namespaced_pod(name, namespace).spec.node_name
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_until(
        lambda: not core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items,
        60,
        f"{name} gone",
    )
    return str(node)


def test_the_extender_decides_over_a_preferred_affinity(deciding: ControlPlane, namespace: str) -> None:
    """On identical empty nodes the decided node is the first in the extender's name order, even
    when the pod prefers another node (a decided node overrides in-tree scoring preferences)."""
    first, second, _ = _ranked("prefer")
    assert _bound_to(deciding, namespace, _pod("prefers", "prefer", prefer=second)) == first


def test_in_tree_filters_run_before_the_decision(deciding: ControlPlane, namespace: str) -> None:
    """A node selector and a NoSchedule taint take nodes out before the extender decides."""
    cp = deciding
    first, second, third = _ranked("filter")
    core = client.CoreV1Api(cp.api_client())
    taint = {"key": "linkpack-e2e/drain", "value": "yes", "effect": "NoSchedule"}
    core.patch_node(first, {"spec": {"taints": [taint]}})
    try:
        assert _bound_to(cp, namespace, _pod("tainted", "filter")) == second
    finally:
        core.patch_node(first, {"spec": {"taints": []}})
    pinned = _pod("pinned", "filter")
    pinned["spec"]["nodeSelector"]["kubernetes.io/hostname"] = third
    assert _bound_to(cp, namespace, pinned) == third


def test_a_policy_that_does_not_decide_leaves_the_preference_to_win(
    deciding: ControlPlane, namespace: str
) -> None:
    """With decideNode: false every fitting node goes back to the scheduler, whose preferred node
    affinity outweighs the extender's equal scores on identical nodes."""
    custom = client.CustomObjectsApi(deciding.api_client())
    policy = {
        "apiVersion": f"{GROUP}/{POLICY_VERSION}",
        "kind": "GpuSchedulingPolicy",
        "metadata": {"name": "decide-mix"},
        "spec": {"decideNode": False},
    }
    custom.create_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL, policy)
    try:
        wait_until(
            lambda: bool(
                custom.get_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL, "decide-mix")
            ),
            10,
            "policy",
        )
        _, second, _ = _ranked("mix")
        assert (
            _bound_to(deciding, namespace, _pod("mixed", "mix", prefer=second, policy="decide-mix")) == second
        )
    finally:
        custom.delete_cluster_custom_object(GROUP, POLICY_VERSION, POLICY_PLURAL, "decide-mix")
