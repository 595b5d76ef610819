"""The whole path on a real node: kube-scheduler asks the extender, the extender binds and
records GPUs, the kubelet admits the pod through the node agent's device plugin, containerd
and runc start the container, and the container sees exactly the recorded GPUs (or MIG instance);
the kubelet's own pod-resources account names the same devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.controlplane import temporary_namespace, wait_for
from tests.node.checks import double_counted, kubelet_gpus, mig_double_held, recorded_devices, visible_gpus
from tests.node.linkpack_stack import (
    MIG_GPU,
    MIG_RESOURCE,
    LinkpackStack,
    env_of,
    recorded,
    running_stack,
    wait_pod_phase,
)
from tests.node.real_node import RealNode, host_pod, stop_signal_safe
from tests.support.resources import GPU, NAMES, SHARED

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def stack(real_node: RealNode) -> Iterator[LinkpackStack]:
    with running_stack(real_node) as running:
        yield running


@pytest.fixture
def namespace(stack: LinkpackStack) -> Iterator[str]:
    with temporary_namespace(stack.cp.api_client(), prefix="node-") as name:
        yield name


def _printed_env(stack: LinkpackStack, core: Any, namespace: str, name: str) -> dict[str, str]:
    pod = core.read_namespaced_pod(name, namespace)

    def printed() -> dict[str, str]:
        env = env_of(stack.node.container_log(namespace, name, pod.metadata.uid, "main"))
        return env if "PATH" in env else {}

    return wait_for(printed, 30, f"{name}'s environment in its log")


def test_whole_share_and_mig_pods_see_exactly_their_recorded_gpus(
    stack: LinkpackStack, namespace: str
) -> None:
    """A 4-GPU, a 2-GPU, a 25-unit share and a MIG pod on one simulated DGX A100 (GPU 7 in MIG
    mode, so the whole-GPU and share pods use GPUs 0-6) run; each container's
    NVIDIA_VISIBLE_DEVICES is its record's GPUs (the MIG pod: its MIG instance's UUID), the
    kubelet's pod-resources names the same devices, and no GPU held whole or MIG instance is
    counted for a second pod."""
    core = client.CoreV1Api(stack.cp.api_client())
    pods = {
        "four": {GPU: "4"},
        "two": {GPU: "2"},
        "share": {SHARED: "25"},
        "mig": {MIG_RESOURCE: "1"},
    }
    for name, limits in pods.items():
        core.create_namespaced_pod(
            namespace, host_pod(name, stop_signal_safe("env; sleep 300 & wait"), limits=limits)
        )
    for name in pods:
        pod = wait_pod_phase(core, namespace, name, {"Running", "Failed"}, 90)
        assert pod.status.phase == "Running", (pod.status, stack.node.kubelet_log())
    account = stack.pod_resources()
    for name in pods:
        pod = core.read_namespaced_pod(name, namespace)
        record = recorded(pod)
        assert record is not None and record.node == stack.node.node
        want = recorded_devices(record.grants)
        env = _printed_env(stack, core, namespace, name)
        assert visible_gpus(env) == want, (name, env)
        assert kubelet_gpus(account, namespace, name) == want, (name, account)
    assert double_counted(account, GPU) == {}
    assert mig_double_held(account, NAMES.mig_prefix) == {}
    mig_record = recorded(core.read_namespaced_pod("mig", namespace))
    assert mig_record is not None
    assert [(g.index, g.mig_uuid.startswith("MIG-")) for g in mig_record.grants] == [(MIG_GPU, True)]
    share_env = _printed_env(stack, core, namespace, "share")
    assert share_env.get("LINKPACK_ENFORCEMENT"), share_env
