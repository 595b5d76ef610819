"""manifests/node-agent-policy.yaml and ledger-policy.yaml against a real API server.

Node agents may write only their own node's objects; only the extender writes ledgers. The
module runs its own control plane, so these policies (which refuse writes that other tests make
freely, e.g. the admin writing ledgers) never reach the shared one. The agent's token is a
pod-bound token from the TokenRequest API for a pod bound to node A, so it carries
`authentication.kubernetes.io/node-name: A` as a real DaemonSet pod's token does.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from node_agent.loop.node_labels import LABEL_KEYS
from tests.cluster.binaries import Binaries
from tests.cluster.controlplane import (
    MANIFESTS,
    ControlPlane,
    load_manifest,
    temporary_namespace,
    wait_for_crd,
)
from tests.cluster.fixtures import CRD_NAME
from tests.support.pods import api_pod_manifest
from tests.support.resources import GPU
from topology.codec import encode_topology
from topology.model import Gpu, NodeTopology

pytestmark = pytest.mark.cluster

SYSTEM_NAMESPACE = "linkpack-system"
AGENT_ACCOUNT = "linkpack-node-agent"
EXTENDER_ACCOUNT = "linkpack-extender"
AGENT_POLICY = "linkpack-node-agent-own-node"
LEDGER_POLICY = "linkpack-ledger-writers"
GROUP, VERSION, PLURAL = "linkpack.io", "v1alpha1", "gputopologies"
NODE_A, NODE_B = "policy-node-a", "policy-node-b"
AGENT_POD = "linkpack-node-agent-a"
MERGE = "application/merge-patch+json"
_ENFORCED_WITHIN_S = 60.0


class Cluster:
    """The module's control plane with the agent's and the extender's clients."""

    def __init__(self, cp: ControlPlane, agent_token: str, extender_token: str, namespace: str) -> None:
        self.cp = cp
        self.admin = cp.api_client()
        self.agent = cp.api_client(token=agent_token)
        self.extender = cp.api_client(token=extender_token)
        self.namespace = namespace  # holds the workload pods of both nodes


def _core(api: client.ApiClient) -> Any:
    return client.CoreV1Api(api)


def _custom(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def _topology(node: str) -> dict[str, Any]:
    gpu = Gpu(
        0,
        uuid="GPU-00000000-0000-0000-0000-000000000001",
        model="Test GPU",
        memory_mib=1024,
        pci_bus_id="00000000:01:00.0",
    )
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuTopology",
        "metadata": {"name": node},
        "spec": encode_topology(NodeTopology(gpus=(gpu,))),
    }


def _pod(name: str, node: str, account: str | None = None) -> dict[str, Any]:
    """A pod already on `node` ("" unbound), run as `account` if given, asking for nothing."""
    return api_pod_manifest(name, node=node, scheduler=None, service_account=account, image="busybox")


def _ledger(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"linkpack.io/ledger": "true"}},
        "data": {"ledger": "{}"},
    }


def _pod_bound_token(cp: ControlPlane, pod: Any) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=3600,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
            ),
        )
    )
    response = _core(cp.api_client()).create_namespaced_service_account_token(
        AGENT_ACCOUNT, SYSTEM_NAMESPACE, request
    )
    return str(response.status.token)


def refusal(call: Callable[[], Any]) -> tuple[int, str]:
    """The status and message of the API's refusal of `call` (fails the test if it succeeds)."""
    try:
        call()
    except ApiException as exc:
        try:
            message = str(json.loads(exc.body).get("message", exc.body))
        except (TypeError, ValueError):
            message = str(exc.body)
        return int(exc.status), message
    pytest.fail("the request was allowed, expected a refusal")


def refused_by(policy: str, call: Callable[[], Any]) -> str:
    """Assert that `policy` refused `call` with 403 Forbidden; its message."""
    status, message = refusal(call)
    assert status == 403, message
    assert f"ValidatingAdmissionPolicy '{policy}'" in message, message
    return message


def _wait_until_refused(policy: str | tuple[str, ...], call: Callable[[], Any], what: str) -> None:
    """Policies are enforced a moment after they are created: retry a known-bad request."""
    deadline = time.monotonic() + _ENFORCED_WITHIN_S
    last = ""
    while time.monotonic() < deadline:
        try:
            call()
            last = "allowed"
        except ApiException as exc:
            last = f"{exc.status}: {exc.body}"
            names = (policy,) if isinstance(policy, str) else policy
            if exc.status == 403 and any(f"ValidatingAdmissionPolicy '{p}'" in str(exc.body) for p in names):
                return
        time.sleep(0.2)
    raise TimeoutError(
        f"policy {policy} not enforced within {_ENFORCED_WITHIN_S:.0f}s ({what}); last: {last}"
    )


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, k8s_binaries: Binaries) -> Iterator[Cluster]:
    failed_before = request.session.testsfailed
    with ControlPlane(k8s_binaries) as cp:
        try:
            objects = []
            for name in (
                "namespace.yaml",
                "crd-gputopology.yaml",
                "rbac.yaml",
                "node-agent-policy.yaml",
                "ledger-policy.yaml",
            ):
                objects += load_manifest(MANIFESTS / name)
            cp.create_objects(objects)
            wait_for_crd(cp.api_client(), CRD_NAME)
            for node in (NODE_A, NODE_B):
                cp.create_fake_node(node, {GPU: "1"})
            core = _core(cp.api_client())
            agent_pod = core.create_namespaced_pod(SYSTEM_NAMESPACE, _pod(AGENT_POD, NODE_A, AGENT_ACCOUNT))
            agent_token = _pod_bound_token(cp, agent_pod)
            extender_token = cp.service_account_token(SYSTEM_NAMESPACE, EXTENDER_ACCOUNT)
            with temporary_namespace(cp.api_client(), prefix="policy-") as namespace:
                cluster = Cluster(cp, agent_token, extender_token, namespace)
                _wait_until_refused(
                    AGENT_POLICY,
                    lambda: _core(cluster.agent).patch_node(
                        NODE_B,
                        {"metadata": {"annotations": {"linkpack.io/probe": "1"}}},
                        dry_run="All",
                        _content_type=MERGE,
                    ),
                    "the agent patching another node",
                )
                _wait_until_refused(
                    LEDGER_POLICY,
                    lambda: core.create_namespaced_config_map(
                        SYSTEM_NAMESPACE, _ledger("linkpack-ledger-probe"), dry_run="All"
                    ),
                    "the admin creating a ledger",
                )
                yield cluster
        finally:
            if request.session.testsfailed > failed_before:
                cp.mark_failed()


# ---------------------------------------------------------------------- nodes


@pytest.mark.timeout(240)
def test_agent_may_patch_linkpack_annotations_and_labels_of_its_own_node(cluster: Cluster) -> None:
    """The agent on node A may set and remove `linkpack.io/` annotations and labels on node A."""
    core = _core(cluster.agent)
    body = {
        "metadata": {
            "annotations": {"linkpack.io/cordoned-gpus": "GPU-00000000-0000-0000-0000-000000000001"},
            "labels": {"linkpack.io/agent": "ready"},
        }
    }
    patched = core.patch_node(NODE_A, body, _content_type=MERGE)
    assert patched.metadata.annotations["linkpack.io/cordoned-gpus"].startswith("GPU-")
    assert patched.metadata.labels["linkpack.io/agent"] == "ready"
    removed = {"metadata": {"annotations": {"linkpack.io/cordoned-gpus": None}}}
    patched = core.patch_node(NODE_A, removed, _content_type=MERGE)
    assert "linkpack.io/cordoned-gpus" not in (patched.metadata.annotations or {})


@pytest.mark.timeout(120)
def test_agent_may_not_patch_another_node(cluster: Cluster) -> None:
    """The agent on node A is refused a `linkpack.io/` annotation on node B, naming both nodes."""
    body = {"metadata": {"annotations": {"linkpack.io/cordoned-gpus": ""}}}
    message = refused_by(
        AGENT_POLICY, lambda: _core(cluster.agent).patch_node(NODE_B, body, _content_type=MERGE)
    )
    assert f"on node {NODE_A} may not change Node {NODE_B}" in message
    assert "linkpack.io/cordoned-gpus" not in (
        _core(cluster.admin).read_node(NODE_B).metadata.annotations or {}
    )


@pytest.mark.timeout(120)
def test_agent_may_not_change_other_labels_annotations_or_spec_of_its_node(cluster: Cluster) -> None:
    """On its own node the agent is refused a foreign label, a foreign annotation and a spec change."""
    core = _core(cluster.agent)
    label = {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}
    message = refused_by(AGENT_POLICY, lambda: core.patch_node(NODE_A, label, _content_type=MERGE))
    assert "only labels under linkpack.io/" in message and "nvidia.com/gpu.present" in message
    annotation = {"metadata": {"annotations": {"example.com/owner": "agent"}}}
    message = refused_by(AGENT_POLICY, lambda: core.patch_node(NODE_A, annotation, _content_type=MERGE))
    assert "only annotations under linkpack.io/" in message and "example.com/owner" in message
    spec = {"spec": {"unschedulable": True}}
    message = refused_by(AGENT_POLICY, lambda: core.patch_node(NODE_A, spec, _content_type=MERGE))
    assert "may not change the spec" in message
    assert not _core(cluster.admin).read_node(NODE_A).spec.unschedulable


#: The labels outside linkpack.io/ the agent sets (node_agent/loop/node_labels.py), with values it could set.
GPU_LABELS = {
    "nvidia.com/gpu.product": "A100-SXM4-40GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/gpu.nvlink": "true",
    "nvidia.com/gpu.nvswitch": "true",
    "topology.kubernetes.io/nvidia-sxm": "true",
}


@pytest.mark.timeout(120)
def test_the_policy_allows_exactly_the_agents_gpu_labels() -> None:
    """The policy's list of GPU labels is the node agent's list of labels outside linkpack.io/."""
    assert set(GPU_LABELS) == {k for k in LABEL_KEYS if not k.startswith("linkpack.io/")}
    (policy,) = [
        o
        for o in load_manifest(MANIFESTS / "node-agent-policy.yaml")
        if o["kind"] == "ValidatingAdmissionPolicy"
    ]
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "gpuLabels"]
    listed = {item.strip().strip("'") for item in variable["expression"].strip().strip("[]").split(",")}
    assert listed == set(GPU_LABELS)


@pytest.mark.timeout(120)
def test_agent_may_set_change_and_remove_its_gpu_labels_on_its_own_node(cluster: Cluster) -> None:
    """The agent on node A may set, change and remove each GPU label and its label record on node A."""
    core = _core(cluster.agent)
    body = {
        "metadata": {
            "labels": {**GPU_LABELS, "linkpack.io/nvlink-clique": "8"},
            "annotations": {"linkpack.io/managed-labels": json.dumps(GPU_LABELS)},
        }
    }
    patched = core.patch_node(NODE_A, body, _content_type=MERGE)
    assert {k: patched.metadata.labels[k] for k in GPU_LABELS} == GPU_LABELS
    changed = {"metadata": {"labels": {"nvidia.com/gpu.count": "4", "nvidia.com/cuda.driver.rev": ""}}}
    patched = core.patch_node(NODE_A, changed, _content_type=MERGE)
    assert patched.metadata.labels["nvidia.com/gpu.count"] == "4"
    removed = {
        "metadata": {
            "labels": {k: None for k in (*GPU_LABELS, "linkpack.io/nvlink-clique")},
            "annotations": {"linkpack.io/managed-labels": None},
        }
    }
    patched = core.patch_node(NODE_A, removed, _content_type=MERGE)
    assert not set(GPU_LABELS) & set(patched.metadata.labels or {})


@pytest.mark.timeout(120)
def test_other_labels_and_other_nodes_stay_refused(cluster: Cluster) -> None:
    """Labels beyond the list (other nvidia.com/ and topology.kubernetes.io/ keys) and node B stay refused."""
    core = _core(cluster.agent)
    for key in (
        "nvidia.com/gpu.family",
        "nvidia.com/gpu.present",
        "topology.kubernetes.io/zone",
        "nvidia.com/sxm",
    ):
        body = {"metadata": {"labels": {"nvidia.com/gpu.count": "8", key: "x"}}}
        message = refused_by(
            AGENT_POLICY, lambda body=body: core.patch_node(NODE_A, body, _content_type=MERGE)
        )
        assert f"it changed {key}" in message, message
    admin = _core(cluster.admin)
    admin.patch_node(
        NODE_A, {"metadata": {"labels": {"nvidia.com/gpu.product": "set-by-gfd"}}}, _content_type=MERGE
    )
    body = {"metadata": {"labels": {"nvidia.com/gpu.product": "A100-SXM4-40GB"}}}
    core.patch_node(
        NODE_A, body, _content_type=MERGE
    )  # a listed label: the policy allows it, ownership is the agent's rule
    message = refused_by(
        AGENT_POLICY,
        lambda: core.patch_node(NODE_B, {"metadata": {"labels": GPU_LABELS}}, _content_type=MERGE),
    )
    assert f"on node {NODE_A} may not change Node {NODE_B}" in message
    assert not set(GPU_LABELS) & set(admin.read_node(NODE_B).metadata.labels or {})
    admin.patch_node(NODE_A, {"metadata": {"labels": {"nvidia.com/gpu.product": None}}}, _content_type=MERGE)


# ---------------------------------------------------------------------- GpuTopology


@pytest.mark.timeout(120)
def test_agent_may_write_its_own_gputopology_and_status(cluster: Cluster) -> None:
    """The agent on node A creates, replaces and patches the status of GpuTopology A."""
    custom = _custom(cluster.agent)
    created = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _topology(NODE_A))
    replacement = _topology(NODE_A)
    replacement["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    replacement["metadata"]["annotations"] = {"linkpack.io/topology-hash": "abc"}
    custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, NODE_A, replacement)
    status = {"status": {"gpuCount": 1, "agentVersion": "test"}}
    patched = custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, NODE_A, status)
    assert patched["status"]["gpuCount"] == 1


@pytest.mark.timeout(120)
def test_agent_may_not_write_another_nodes_gputopology(cluster: Cluster) -> None:
    """GpuTopology B can be neither created nor have its status patched by the agent on node A."""
    custom = _custom(cluster.agent)
    message = refused_by(
        AGENT_POLICY, lambda: custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _topology(NODE_B))
    )
    assert f"may not create GpuTopology {NODE_B}" in message and f"({NODE_A})" in message
    _custom(cluster.admin).create_cluster_custom_object(GROUP, VERSION, PLURAL, _topology(NODE_B))
    status = {"status": {"gpuCount": 7}}
    message = refused_by(
        AGENT_POLICY,
        lambda: custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, NODE_B, status),
    )
    assert f"may not update GpuTopology {NODE_B}" in message


# ---------------------------------------------------------------------- pods


@contextlib.contextmanager
def _workload_pod(cluster: Cluster, name: str, node: str) -> Iterator[str]:
    core = _core(cluster.admin)
    core.create_namespaced_pod(cluster.namespace, _pod(name, node))
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)


@pytest.mark.timeout(120)
def test_agent_may_annotate_pods_bound_to_its_node(cluster: Cluster) -> None:
    """The agent on node A writes `linkpack.io/consumed` and `linkpack.io/allocation` on a pod on A."""
    with _workload_pod(cluster, "on-a", NODE_A) as name:
        body = {"metadata": {"annotations": {"linkpack.io/consumed": "{}", "linkpack.io/allocation": "{}"}}}
        patched = _core(cluster.agent).patch_namespaced_pod(
            name, cluster.namespace, body, _content_type=MERGE
        )
        assert patched.metadata.annotations["linkpack.io/consumed"] == "{}"


@pytest.mark.timeout(120)
def test_agent_may_not_annotate_pods_on_another_node_or_unbound(cluster: Cluster) -> None:
    """A pod on node B, or one bound to no node, is refused to the agent on node A."""
    body = {"metadata": {"annotations": {"linkpack.io/consumed": "{}"}}}
    core = _core(cluster.agent)
    with _workload_pod(cluster, "on-b", NODE_B) as name:
        message = refused_by(
            AGENT_POLICY,
            lambda: core.patch_namespaced_pod(name, cluster.namespace, body, _content_type=MERGE),
        )
        assert f"which is bound to node {NODE_B}" in message
    with _workload_pod(cluster, "unbound", "") as name:
        message = refused_by(
            AGENT_POLICY,
            lambda: core.patch_namespaced_pod(name, cluster.namespace, body, _content_type=MERGE),
        )
        assert "not bound to a node" in message


@pytest.mark.timeout(120)
def test_agent_may_change_nothing_else_on_pods_of_its_node(cluster: Cluster) -> None:
    """On a pod on node A the agent is refused other annotations, labels, spec changes and deletion."""
    core = _core(cluster.agent)
    with _workload_pod(cluster, "on-a-strict", NODE_A) as name:

        def patch(body: dict[str, Any]) -> Callable[[], Any]:
            return lambda: core.patch_namespaced_pod(name, cluster.namespace, body, _content_type=MERGE)

        message = refused_by(AGENT_POLICY, patch({"metadata": {"annotations": {"linkpack.io/policy": "x"}}}))
        assert "linkpack.io/policy" in message
        message = refused_by(AGENT_POLICY, patch({"metadata": {"labels": {"linkpack.io/x": "y"}}}))
        assert "labels" in message
        message = refused_by(AGENT_POLICY, patch({"spec": {"activeDeadlineSeconds": 5}}))
        assert "spec" in message
        status, message = refusal(lambda: core.delete_namespaced_pod(name, cluster.namespace))
        assert status == 403, message


# ---------------------------------------------------------------------- events and identity


@pytest.mark.timeout(120)
def test_agent_may_record_events(cluster: Cluster) -> None:
    """Events are the one kind of object the agent may create anywhere."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "linkpack-agent-"},
        "involvedObject": {"kind": "Node", "name": NODE_A, "apiVersion": "v1"},
        "reason": "GpuUnhealthy",
        "message": "test event",
        "type": "Warning",
        "source": {"component": AGENT_ACCOUNT, "host": NODE_A},
    }
    created = _core(cluster.agent).create_namespaced_event("default", event)
    assert created.reason == "GpuUnhealthy"


@pytest.mark.timeout(120)
def test_token_without_a_node_name_is_refused(cluster: Cluster) -> None:
    """A token of the agent's account not bound to a pod on a node may write nothing at all."""
    unbound = cluster.cp.api_client(token=cluster.cp.service_account_token(SYSTEM_NAMESPACE, AGENT_ACCOUNT))
    body = {"metadata": {"annotations": {"linkpack.io/cordoned-gpus": ""}}}
    message = refused_by(AGENT_POLICY, lambda: _core(unbound).patch_node(NODE_A, body, _content_type=MERGE))
    assert "carries no node name" in message


@pytest.mark.timeout(120)
def test_agent_rbac_reads_what_the_agent_reads_and_no_more(cluster: Cluster) -> None:
    """The narrowed RBAC still lets the agent get its node and list and get its node's pods, not list nodes."""
    core = _core(cluster.agent)
    assert core.read_node(NODE_A).metadata.name == NODE_A
    with _workload_pod(cluster, "listed", NODE_A) as name:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE_A}").items
        assert name in {p.metadata.name for p in pods}
        assert core.read_namespaced_pod(name, cluster.namespace).spec.node_name == NODE_A
    status, message = refusal(lambda: core.list_node())
    assert status == 403 and 'cannot list resource "nodes"' in message, message


# ---------------------------------------------------------------------- ledgers


@contextlib.contextmanager
def _widened_agent_rbac(cluster: Cluster, rules: list[client.V1PolicyRule]) -> Iterator[None]:
    """The agent's account granted `rules` on top of rbac.yaml (what a careless edit could do)."""
    rbac = client.RbacAuthorizationV1Api(cluster.admin)
    name = "widened-linkpack-node-agent"
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=rules))
    subject = client.RbacV1Subject(kind="ServiceAccount", name=AGENT_ACCOUNT, namespace=SYSTEM_NAMESPACE)
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=name),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=[subject],
        )
    )
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


@pytest.mark.timeout(120)
def test_agent_may_not_write_a_ledger_even_with_widened_rbac(cluster: Cluster) -> None:
    """RBAC refuses the agent ConfigMaps; granted them, the policy still refuses a ledger."""
    core = _core(cluster.agent)

    def create() -> Any:
        return core.create_namespaced_config_map(SYSTEM_NAMESPACE, _ledger(f"linkpack-ledger-{NODE_A}"))

    status, message = refusal(create)
    assert status == 403 and 'cannot create resource "configmaps"' in message, message
    rule = client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["*"])
    with _widened_agent_rbac(cluster, [rule]):
        # A new grant reaches the authorizer a moment later: wait until the policy is what refuses.
        # Both policies refuse it (the agent's own-node policy and the ledger-writers policy);
        # which one the API server names is not defined.
        _wait_until_refused(
            (AGENT_POLICY, LEDGER_POLICY), create, "the agent creating a ledger with widened RBAC"
        )
        status, message = refusal(create)
        assert status == 403 and any(
            f"ValidatingAdmissionPolicy '{p}'" in message for p in (AGENT_POLICY, LEDGER_POLICY)
        )

        def scratch() -> Any:  # no ledger name or label: the agent's own policy alone refuses it
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "agent-scratch"},
                "data": {},
            }
            return core.create_namespaced_config_map(SYSTEM_NAMESPACE, body)

        message = refused_by(AGENT_POLICY, scratch)
        assert "may not create configmaps linkpack-system/agent-scratch" in message
        assert (
            "ConfigMaps (the linkpack-ledger-<node> allocation ledgers) are written only by the extender"
            in (message)
        )


@pytest.mark.timeout(120)
def test_agent_is_refused_node_status_deletions_and_pod_creation_even_with_widened_rbac(
    cluster: Cluster,
) -> None:
    """Granted node status, node and pod deletion and pod creation, the agent is still refused them."""
    rules = [
        client.V1PolicyRule(api_groups=[""], resources=["nodes", "nodes/status"], verbs=["*"]),
        client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["*"]),
    ]
    core = _core(cluster.agent)
    status = {"status": {"capacity": {GPU: "99"}}}
    with _widened_agent_rbac(cluster, rules):
        node_status = lambda: core.patch_node_status(  # noqa: E731
            NODE_A, status, dry_run="All", _content_type=MERGE
        )
        _wait_until_refused(AGENT_POLICY, node_status, "the agent patching its node's status")
        message = refused_by(AGENT_POLICY, node_status)
        assert f"may not update nodes/status {NODE_A}" in message
        message = refused_by(AGENT_POLICY, lambda: core.delete_node(NODE_A, dry_run="All"))
        assert f"may not delete nodes {NODE_A}" in message
        message = refused_by(
            AGENT_POLICY,
            lambda: core.create_namespaced_pod(
                cluster.namespace, _pod("made-by-agent", NODE_A), dry_run="All"
            ),
        )
        assert "may not create pods" in message
        with _workload_pod(cluster, "on-a-delete", NODE_A) as name:
            message = refused_by(
                AGENT_POLICY, lambda: core.delete_namespaced_pod(name, cluster.namespace, dry_run="All")
            )
            assert f"may not delete pods {cluster.namespace}/{name}" in message


@pytest.mark.timeout(120)
def test_only_the_extender_writes_ledgers(cluster: Cluster) -> None:
    """Even the cluster admin is refused creating, changing or deleting a ledger; the extender is not."""
    admin, extender = _core(cluster.admin), _core(cluster.extender)
    name = f"linkpack-ledger-{NODE_B}"
    message = refused_by(
        LEDGER_POLICY, lambda: admin.create_namespaced_config_map(SYSTEM_NAMESPACE, _ledger(name))
    )
    assert "only system:serviceaccount:linkpack-system:linkpack-extender may create it" in message
    assert "not linkpack-test-admin" in message
    # Unlabelled, but named like a ledger in the extender's namespace: still a ledger.
    unlabelled = {"metadata": {"name": name}, "data": {}}
    refused_by(LEDGER_POLICY, lambda: admin.create_namespaced_config_map(SYSTEM_NAMESPACE, unlabelled))
    extender.create_namespaced_config_map(SYSTEM_NAMESPACE, _ledger(name))
    relabel = {"metadata": {"labels": {"linkpack.io/ledger": None}}}
    message = refused_by(
        LEDGER_POLICY,
        lambda: admin.patch_namespaced_config_map(name, SYSTEM_NAMESPACE, relabel, _content_type=MERGE),
    )
    assert "may update it" in message
    message = refused_by(LEDGER_POLICY, lambda: admin.delete_namespaced_config_map(name, SYSTEM_NAMESPACE))
    assert "may delete it" in message
    data = {"data": {"ledger": '{"schema":"linkpack.io/ledger/v1"}'}}
    extender.patch_namespaced_config_map(name, SYSTEM_NAMESPACE, data, _content_type=MERGE)
    # Ordinary ConfigMaps are untouched by the policy.
    plain = {"metadata": {"name": "not-a-ledger"}, "data": {"a": "b"}}
    admin.create_namespaced_config_map(cluster.namespace, plain)
    admin.delete_namespaced_config_map("not-a-ledger", cluster.namespace)
