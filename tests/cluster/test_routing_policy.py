"""manifests/routing-policy.yaml against a real API server: GPU pods that name the default scheduler
are given Linkpack's, everything else is left alone.

The module runs its own control plane: the policy would otherwise route the pods other modules
create with the default scheduler on purpose. Pods are created with `dryRun=All` (admitted,
mutated, not stored) except one, created for real as a ReplicaSet controller would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.binaries import Binaries
from tests.cluster.controlplane import MANIFESTS, ControlPlane, load_manifest, temporary_namespace
from tests.support.pods import api_pod_manifest
from tests.support.resources import GPU

pytestmark = pytest.mark.cluster

LINKPACK = "linkpack"
DEFAULT = "default-scheduler"
OPT_OUT = {"linkpack.io/routing": "disabled"}
_EFFECTIVE_WITHIN_S = 60.0


class Routing:
    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.core: Any = client.CoreV1Api(cp.api_client())
        self.namespace = namespace

    def admitted(self, manifest: dict[str, Any], namespace: str | None = None) -> str:
        """The scheduler name the pod is admitted with (not stored)."""
        pod = self.core.create_namespaced_pod(namespace or self.namespace, manifest, dry_run="All")
        return str(pod.spec.scheduler_name)


@pytest.fixture(scope="module")
def routing(request: pytest.FixtureRequest, k8s_binaries: Binaries) -> Iterator[Routing]:
    failed_before = request.session.testsfailed
    with ControlPlane(k8s_binaries) as cp:
        try:
            cp.create_objects(load_manifest(MANIFESTS / "routing-policy.yaml"))
            with temporary_namespace(cp.api_client(), prefix="routing-") as namespace:
                routing = Routing(cp, namespace)
                deadline = time.monotonic() + _EFFECTIVE_WITHIN_S
                while routing.admitted(_unscheduled("probe", gpus=1)) != LINKPACK:
                    assert time.monotonic() < deadline, "the routing policy never took effect"
                    time.sleep(0.5)
                yield routing
        finally:
            if request.session.testsfailed > failed_before:
                cp.mark_failed()


def _unscheduled(name: str, **kwargs: Any) -> dict[str, Any]:
    """A pod as a controller or a user writes it: no scheduler named (the API defaults it)."""
    return api_pod_manifest(name, scheduler=None, **kwargs)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("whole GPUs", {"gpus": 2}),
        ("a share", {"units": 25, "memory": 8192}),
        ("GPU memory alone", {"memory": 4096}),
        ("a MIG slice", {"mig": {"1g.5gb": 1}}),
    ],
)
def test_a_pod_asking_for_a_linkpack_resource_is_routed(
    routing: Routing, case: str, kwargs: dict[str, Any]
) -> None:
    """Whatever Linkpack resource a pod asks for, it is admitted with Linkpack's scheduler."""
    assert routing.admitted(_unscheduled(f"asks-{len(case)}", **kwargs)) == LINKPACK, case


@pytest.mark.timeout(240)
def test_an_init_container_asking_for_gpus_routes_its_pod(routing: Routing) -> None:
    manifest = _unscheduled("init-gpu")
    manifest["spec"]["initContainers"] = [
        {"name": "warm", "image": "busybox", "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}}
    ]
    assert routing.admitted(manifest) == LINKPACK


@pytest.mark.timeout(240)
def test_pods_without_linkpack_resources_or_naming_another_scheduler_are_left_alone(routing: Routing) -> None:
    """A CPU-only pod keeps the default scheduler; a GPU pod naming a third scheduler keeps it."""
    assert routing.admitted(_unscheduled("cpu-only", limits={"cpu": "1"})) == DEFAULT
    assert routing.admitted(api_pod_manifest("other-scheduler", gpus=1, scheduler="volcano")) == "volcano"
    assert routing.admitted(api_pod_manifest("already-linkpack", gpus=1, scheduler=LINKPACK)) == LINKPACK


@pytest.mark.timeout(240)
def test_a_pod_or_a_namespace_can_opt_out(routing: Routing) -> None:
    """The label `linkpack.io/routing: disabled` on the pod, or on its namespace, keeps the pod
    on the default scheduler."""
    assert routing.admitted(_unscheduled("opted-out", gpus=1, labels=OPT_OUT)) == DEFAULT
    with temporary_namespace(routing.cp.api_client(), prefix="routing-off-") as namespace:
        routing.core.patch_namespace(namespace, {"metadata": {"labels": OPT_OUT}})
        deadline = time.monotonic() + _EFFECTIVE_WITHIN_S
        while routing.admitted(_unscheduled("in-opted-out-namespace", gpus=1), namespace) != DEFAULT:
            assert time.monotonic() < deadline, "the namespace's opt-out never took effect"
            time.sleep(0.5)


@pytest.mark.timeout(240)
def test_a_stored_pod_carries_the_scheduler_and_nothing_else_changes(routing: Routing) -> None:
    """A pod created for real, as a Deployment's ReplicaSet creates one, is stored with Linkpack's
    scheduler and otherwise as written."""
    manifest = _unscheduled("from-a-deployment", gpus=1, labels={"app": "trainer"})
    created = routing.core.create_namespaced_pod(routing.namespace, manifest)
    assert created.spec.scheduler_name == LINKPACK
    assert created.metadata.labels == {"app": "trainer"}
    assert created.spec.containers[0].resources.limits == {GPU: "1"}
