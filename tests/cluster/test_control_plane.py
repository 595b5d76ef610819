"""The test control plane itself, and Linkpack's manifests against a real API server and scheduler."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from tests.cluster.controlplane import (
    MANIFESTS,
    SCHEDULER_CONFIG,
    ControlPlane,
    delete_fake_node,
    load_manifest,
    render_scheduler_config,
    wait_for,
)
from tests.cluster.fixtures import CRD_NAME
from tests.cluster.noop_extender import NoopExtender
from tests.support.pods import api_pod_manifest
from tests.support.resources import GPU, MEMORY, SHARED
from topology.catalog import load_machine, machine_names
from topology.codec import decode_topology, encode_topology
from topology.model import MigDevice, MigMode, NodeTopology

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "linkpack.io", "v1alpha1", "gputopologies"
SYSTEM_NAMESPACE = "linkpack-system"


# The client's models type every field Optional; these tests read them as the server filled them.
def _custom(cp: ControlPlane) -> Any:
    return client.CustomObjectsApi(cp.api_client())


def _core(cp: ControlPlane) -> Any:
    return client.CoreV1Api(cp.api_client())


def _topology_object(name: str, topology: NodeTopology) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuTopology",
        "metadata": {"name": name},
        "spec": encode_topology(topology),
    }


def _with_mig(topology: NodeTopology) -> NodeTopology:
    """GPU 0 in MIG mode with two 3g.40gb instances (no catalog capture has MIG)."""
    first = topology.gpus[0]
    migs = tuple(
        MigDevice(
            f"MIG-{first.uuid[4:]}-{i}",
            "3g.40gb",
            gpu_instance_id=i + 1,
            compute_instance_id=0,
            memory_mib=40192,
        )
        for i in range(2)
    )
    gpu0 = replace(first, mig_mode=MigMode.ENABLED, mig_devices=migs)
    return replace(topology, gpus=(gpu0, *topology.gpus[1:]))


# ---------------------------------------------------------------------- the harness


def test_control_plane_serves_the_api_through_its_kubeconfig(control_plane: ControlPlane) -> None:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
    core: Any = client.CoreV1Api(api)
    names = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"default", "kube-system"} <= names
    version = client.VersionApi(api).get_code()
    assert version.git_version.startswith(control_plane.binaries.version.split("-")[0])
    assert set(control_plane.pids()) >= {"etcd", "kube-apiserver"}


def test_fake_node_is_ready_untainted_and_advertises_gpus(control_plane: ControlPlane) -> None:
    node = control_plane.create_fake_node(
        "fake-node-check", {GPU: "8"}, labels={"nvidia.com/gpu.present": "true"}
    )
    try:
        read = _core(control_plane).read_node("fake-node-check")
        assert read.status.allocatable[GPU] == "8"
        assert read.status.capacity["pods"] == "110"
        assert [(c.type, c.status) for c in read.status.conditions] == [("Ready", "True")]
        assert not read.spec.taints
        assert read.metadata.labels["nvidia.com/gpu.present"] == "true"
        assert node["metadata"]["name"] == "fake-node-check"
    finally:
        delete_fake_node(control_plane.api_client(), "fake-node-check")


# ---------------------------------------------------------------------- manifests


def test_crd_is_established_with_status_subresource_and_columns(linkpack_crd: ControlPlane) -> None:
    extensions: Any = client.ApiextensionsV1Api(linkpack_crd.api_client())
    crd = extensions.read_custom_resource_definition(CRD_NAME)
    assert crd.spec.scope == "Cluster"
    (version,) = crd.spec.versions
    assert (version.name, version.served, version.storage) == (VERSION, True, True)
    assert version.subresources.status is not None
    assert {c.name for c in version.additional_printer_columns} >= {"GPUs", "Model", "Age"}


def test_every_catalog_topology_round_trips_through_the_crd(linkpack_crd: ControlPlane) -> None:
    """The schema accepts what the codec writes and prunes nothing from it."""
    custom = _custom(linkpack_crd)
    topologies = {name: load_machine(name) for name in machine_names()}
    topologies["mig-node"] = _with_mig(topologies["hgx-a100-80gb"])
    for name, topology in topologies.items():
        obj_name = f"roundtrip-{name}"
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _topology_object(obj_name, topology))
        try:
            stored = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, obj_name)
            assert stored["spec"] == json.loads(json.dumps(encode_topology(topology))), name
            assert decode_topology(stored["spec"]) == topology, name
        finally:
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, obj_name)


def test_status_subresource_takes_health_and_heartbeat(linkpack_crd: ControlPlane) -> None:
    custom = _custom(linkpack_crd)
    name = "status-node"
    custom.create_cluster_custom_object(
        GROUP, VERSION, PLURAL, _topology_object(name, load_machine("hgx-h100"))
    )
    try:
        status = {
            "heartbeat": "2026-01-02T03:04:05Z",
            "agentVersion": "0.1.0",
            "gpuHealth": [
                {
                    "index": 3,
                    "uuid": "GPU-x",
                    "healthy": False,
                    "reason": "XID 79",
                    "since": "2026-01-02T03:00:00Z",
                    "severity": "fatal",
                    "cordoned": False,
                }
            ],
        }
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, name, {"status": status}, _content_type="application/merge-patch+json"
        )
        stored = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        assert stored["status"] == status
        # A status written through the main resource is ignored (status subresource enabled).
        changed = copy.deepcopy(stored)
        changed["status"]["agentVersion"] = "9.9.9"
        custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, name, changed)
        assert (
            custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)["status"]["agentVersion"]
            == "0.1.0"
        )
        with pytest.raises(ApiException) as bad_time:
            custom.patch_cluster_custom_object_status(
                GROUP,
                VERSION,
                PLURAL,
                name,
                {"status": {"heartbeat": "yesterday"}},
                _content_type="application/merge-patch+json",
            )
        assert bad_time.value.status == 422
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def _spec_breakers() -> dict[str, Any]:
    def link_kind(spec: dict[str, Any]) -> None:
        spec["links"][0]["kind"] = "NVLINK"

    def missing_uuid(spec: dict[str, Any]) -> None:
        del spec["gpus"][0]["uuid"]

    def duplicate_index(spec: dict[str, Any]) -> None:
        spec["gpus"][1]["index"] = spec["gpus"][0]["index"]

    def negative_memory(spec: dict[str, Any]) -> None:
        spec["gpus"][0]["memoryMiB"] = -1

    def mig_mode(spec: dict[str, Any]) -> None:
        spec["gpus"][0]["migMode"] = "on"

    def nvswitch_type(spec: dict[str, Any]) -> None:
        spec["nvswitch"] = "yes"

    def no_gpus(spec: dict[str, Any]) -> None:
        del spec["gpus"]

    def schema_version(spec: dict[str, Any]) -> None:
        spec["schemaVersion"] = "linkpack.io/topology/v0"

    return {
        f.__name__: f
        for f in (
            link_kind,
            missing_uuid,
            duplicate_index,
            negative_memory,
            mig_mode,
            nvswitch_type,
            no_gpus,
            schema_version,
        )
    }


@pytest.mark.parametrize("breaker", sorted(_spec_breakers()))
def test_gputopology_violating_the_schema_is_rejected(linkpack_crd: ControlPlane, breaker: str) -> None:
    obj = _topology_object(f"invalid-{breaker.replace('_', '-')}", load_machine("dgx-a100"))
    _spec_breakers()[breaker](obj["spec"])
    with pytest.raises(ApiException) as rejected:
        _custom(linkpack_crd).create_cluster_custom_object(GROUP, VERSION, PLURAL, obj)
    assert rejected.value.status == 422, rejected.value.body


def test_rbac_objects_exist(linkpack_crd: ControlPlane) -> None:
    api = linkpack_crd.api_client()
    accounts = _core(linkpack_crd).list_namespaced_service_account(SYSTEM_NAMESPACE).items
    assert {"linkpack-extender", "linkpack-node-agent"} <= {a.metadata.name for a in accounts}
    rbac: Any = client.RbacAuthorizationV1Api(api)
    assert rbac.read_cluster_role("linkpack-extender").rules
    assert rbac.read_cluster_role_binding("linkpack-node-agent").subjects[0].name == "linkpack-node-agent"
    assert rbac.read_namespaced_role("linkpack-extender", SYSTEM_NAMESPACE).rules


def _allowed(cp: ControlPlane, account: str, verb: str, resource: str, namespace: str = "") -> bool:
    group, _, rest = resource.rpartition(":")
    plural, _, sub = rest.partition("/")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}",
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{SYSTEM_NAMESPACE}",
                "system:authenticated",
            ],
            resource_attributes=client.V1ResourceAttributes(
                group=group,
                resource=plural,
                subresource=sub or None,
                verb=verb,
                namespace=namespace or None,
            ),
        )
    )
    authorization: Any = client.AuthorizationV1Api(cp.api_client())
    result = authorization.create_subject_access_review(review)
    return bool(result.status.allowed)


EXTENDER_ALLOWED = [
    ("list", "nodes", ""),
    ("watch", "pods", ""),
    ("patch", "pods", "ml"),
    ("create", "pods/binding", "ml"),
    ("list", "linkpack.io:gputopologies", ""),
    ("watch", "linkpack.io:gpuschedulingpolicies", ""),
    ("list", "namespaces", ""),
    ("create", "events", "ml"),
    ("update", "configmaps", SYSTEM_NAMESPACE),
    ("update", "coordination.k8s.io:leases", SYSTEM_NAMESPACE),
]
EXTENDER_DENIED = [
    ("delete", "pods", "ml"),
    ("get", "secrets", SYSTEM_NAMESPACE),
    ("update", "configmaps", "ml"),
    ("update", "linkpack.io:gputopologies", ""),
    ("update", "linkpack.io:gpuschedulingpolicies", ""),
    ("patch", "namespaces", ""),
    ("patch", "nodes", ""),
    ("update", "coordination.k8s.io:leases", "kube-system"),
]
AGENT_ALLOWED = [
    ("create", "linkpack.io:gputopologies", ""),
    ("patch", "linkpack.io:gputopologies/status", ""),
    ("list", "pods", ""),
    ("patch", "pods", "ml"),
    ("patch", "nodes", ""),
    ("create", "events", "ml"),
]
AGENT_DENIED = [
    ("create", "pods/binding", "ml"),
    ("delete", "linkpack.io:gputopologies", ""),
    ("get", "secrets", "ml"),
    ("delete", "pods", "ml"),
    ("get", "configmaps", SYSTEM_NAMESPACE),
]


@pytest.mark.parametrize(
    ("account", "verb", "resource", "namespace", "expected"),
    [("linkpack-extender", *case, True) for case in EXTENDER_ALLOWED]
    + [("linkpack-extender", *case, False) for case in EXTENDER_DENIED]
    + [("linkpack-node-agent", *case, True) for case in AGENT_ALLOWED]
    + [("linkpack-node-agent", *case, False) for case in AGENT_DENIED],
)
def test_rbac_is_least_privilege(
    linkpack_crd: ControlPlane, account: str, verb: str, resource: str, namespace: str, expected: bool
) -> None:
    assert _allowed(linkpack_crd, account, verb, resource, namespace) is expected


def test_kustomization_lists_every_install_manifest() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    # scheduler-config.yaml is a file for kube-scheduler, not an API object.
    not_objects = {"kustomization.yaml", SCHEDULER_CONFIG.name}
    present = sorted(p.name for p in MANIFESTS.glob("*.yaml") if p.name not in not_objects)
    assert sorted(listed) == present
    examples = yaml.safe_load((MANIFESTS / "examples" / "kustomization.yaml").read_text())["resources"]
    assert sorted(examples) == sorted(
        p.name for p in (MANIFESTS / "examples").glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_scheduler_configmap_carries_the_scheduler_config() -> None:
    (config_map,) = [
        o for o in load_manifest(MANIFESTS / "scheduler-deployment.yaml") if o["kind"] == "ConfigMap"
    ]
    in_pod = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    on_host = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    on_host.pop("clientConnection")  # in a pod the scheduler uses its ServiceAccount
    assert in_pod == on_host
    (deployment,) = [
        o for o in load_manifest(MANIFESTS / "scheduler-deployment.yaml") if o["kind"] == "Deployment"
    ]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    pinned = (Path(__file__).parent / "k8s" / "go.mod").read_text()
    assert f"k8s.io/kubernetes {image.rsplit(':', 1)[1]}" in pinned


@pytest.mark.parametrize(
    "manifest",
    [
        "scheduler-deployment.yaml",
        "extender-deployment.yaml",
        "node-agent-daemonset.yaml",
        "examples/pod-1gpu.yaml",
        "examples/pod-4gpu.yaml",
        "examples/pod-fractional.yaml",
        "examples/pod-mig.yaml",
        "examples/pod-sxm-affinity.yaml",
        "extender-access.yaml",
    ],
)
def test_manifest_passes_server_side_validation(linkpack_crd: ControlPlane, manifest: str) -> None:
    """Created with dryRun=All: the API server validates and admits, stores nothing."""
    objects = load_manifest(MANIFESTS / manifest)
    for obj in objects:
        if manifest.startswith("examples/"):
            assert obj["spec"]["schedulerName"] == "linkpack"
    try:
        created = linkpack_crd.create_objects(objects, dry_run=True)
    except UnprocessibleEntityError as exc:
        pytest.fail(f"{manifest} rejected: {exc.summary()}")
    assert [o["kind"] for o in created] == [o["kind"] for o in objects]


# ---------------------------------------------------------------------- the real scheduler


def _gpu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return api_pod_manifest(name, limits=limits, limits_only=True)


def test_real_scheduler_uses_the_extender_config_and_binds_through_it(
    linkpack_crd: ControlPlane, cluster_namespace: str
) -> None:
    cp = linkpack_crd
    node = "sched-gpu-node"
    cp.create_fake_node(node, {GPU: "8", SHARED: "800"})
    # The no-op extender binds with the extender's own ServiceAccount token: its RBAC is used for real.
    extender_token = cp.service_account_token(SYSTEM_NAMESPACE, "linkpack-extender")
    core = _core(cp)
    try:
        with NoopExtender(cp.api_client(token=extender_token)) as extender:
            log_path = cp.start_scheduler(render_scheduler_config(extender.url, cp.kubeconfig_path))
            try:
                log = log_path.read_text()
                assert "Creating extender" in log, log[-3000:]
                assert extender.url in log

                core.create_namespaced_pod(cluster_namespace, _gpu_pod("one-gpu", {GPU: "1"}))
                # Fractional: gpu.memory is advertised by no node and must be ignored by the fit check.
                core.create_namespaced_pod(
                    cluster_namespace,
                    _gpu_pod("fractional", {SHARED: "25", MEMORY: "10240"}),
                )
                # No managed resource: the extender is not interested, the default binder binds.
                core.create_namespaced_pod(cluster_namespace, _gpu_pod("cpu-only", {"cpu": "100m"}))

                def bound(name: str) -> str:
                    return str(core.read_namespaced_pod(name, cluster_namespace).spec.node_name or "")

                for pod in ("one-gpu", "fractional", "cpu-only"):
                    assert (
                        wait_for(
                            lambda pod=pod: bound(pod),  # type: ignore[misc]
                            60,
                            f"pod {pod} bound",
                            on_timeout=lambda: cp.scheduler_log()[-3000:],
                        )
                        == node
                    )
            finally:
                cp.stop_scheduler()
            calls = extender.calls
    finally:
        delete_fake_node(cp.api_client(), node)

    bound_by_extender = {c.body["PodName"] for c in calls if c.verb == "bind"}
    assert bound_by_extender == {"one-gpu", "fractional"}
    assert all(c.response == {"Error": ""} for c in calls if c.verb == "bind")
    filters = [c.body for c in calls if c.verb == "filter"]
    assert {f["Pod"]["metadata"]["name"] for f in filters} == {"one-gpu", "fractional"}
    assert all(f["Nodes"] is None and node in f["NodeNames"] for f in filters)
    one_gpu = core.read_namespaced_pod("one-gpu", cluster_namespace)
    assert any(c.type == "PodScheduled" and c.status == "True" for c in one_gpu.status.conditions)
