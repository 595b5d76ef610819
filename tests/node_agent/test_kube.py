"""Kubernetes translation (pure) and the adapter's error wrapping, without an API server."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contract.gpu_topology import TopologyStatus, encode_status, topology_object
from contract.keys import (
    ALLOCATION_ANNOTATION,
    GROUP,
    TOPOLOGY_HASH_ANNOTATION,
    TOPOLOGY_PLURAL,
    TOPOLOGY_VERSION,
)
from node_agent.kube.client import MERGE_PATCH, KubernetesNodeApi, kube_error
from node_agent.kube.node_api import (
    AgentEvent,
    KubeConflict,
    KubeError,
    KubeNotFound,
    event_body,
    pod_from_dict,
    rfc3339,
)
from tests.support.device_plugin import app
from tests.support.machines import catalog_machine
from tests.support.resources import GPU, MEMORY, NAMES, SHARED
from topology.codec import content_hash

POD = {
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "uid": "u-1",
        "resourceVersion": "812",
        "annotations": {ALLOCATION_ANNOTATION: "{}"},
        "creationTimestamp": "2024-05-01T10:00:00Z",
    },
    "spec": {
        "nodeName": "n1",
        "containers": [
            {
                "name": "main",
                "resources": {"requests": {GPU: "2", "cpu": "4", "memory": "8Gi"}},
            },
            {
                "name": "side",
                "resources": {"limits": {MEMORY: "1k", SHARED: "1"}},
            },
        ],
    },
    "status": {"phase": "Running"},
}


def test_pod_translation_reads_only_the_resources_asked_for():
    """A pod's containers are read for our resources only, quantities parsed by the contract."""
    pod = pod_from_dict(POD, NAMES.managed)
    assert (pod.namespace, pod.name, pod.uid, pod.resource_version, pod.node_name) == (
        "ml",
        "train-0",
        "u-1",
        "812",
        "n1",
    )
    assert pod.annotations[ALLOCATION_ANNOTATION] == "{}"
    assert pod.demands[0] == app("main", GPU, 2)
    assert [d.amounts for d in pod.demands] == [
        ((GPU, 2),),
        ((MEMORY, 1000), (SHARED, 1)),
    ]
    assert pod.created == dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)
    assert not pod.finished and pod.spec_problem == ""


def test_requests_win_over_limits_and_bad_quantities_are_a_spec_problem_not_a_crash():
    """Requests win over limits; a fractional GPU makes the pod ask for nothing, with the reason kept."""

    def pod(resources):
        return pod_from_dict({"spec": {"containers": [{"name": "c", "resources": resources}]}}, NAMES.managed)

    assert pod({"limits": {GPU: "4"}, "requests": {GPU: "2"}}).demands[0].amounts == ((GPU, 2),)
    bad = pod({"requests": {GPU: "0.5"}})
    assert bad.demands == () and GPU in bad.spec_problem
    assert pod({"requests": {"example.com/other": "0.5"}}).spec_problem == ""


def test_the_spec_is_written_as_the_contracts_object_named_after_the_node():
    """The GpuTopology written is the contract's object, named after the node, with its content hash."""
    topology = catalog_machine("dgx1-v100")
    api = _api(custom={"get_cluster_custom_object": [ApiException(status=404)]})
    api.put_topology_spec("n1", topology)
    name, args, _ = api.custom.calls[-1]
    assert name == "create_cluster_custom_object" and args[3] == topology_object("n1", topology)
    assert args[3]["metadata"]["annotations"][TOPOLOGY_HASH_ANNOTATION] == content_hash(topology)
    assert args[3]["apiVersion"] == "linkpack.io/v1alpha1" and args[3]["kind"] == "GpuTopology"


def test_event_body_is_accepted_by_the_client_model():
    """An event body is accepted by the client's model, with the involved object and type set right."""
    now = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=dt.UTC)
    body = event_body(AgentEvent("GpuUnhealthy", "GPU 3 XID 79", "Node", "n1", warning=True), "n1", now)
    assert body["type"] == "Warning" and body["metadata"]["namespace"] == "default"
    assert "namespace" not in body["involvedObject"]
    assert body["firstTimestamp"] == rfc3339(now) == "2024-05-01T10:00:00Z"
    model = client.CoreV1Event.from_dict(body)
    assert model is not None
    assert model.involved_object.name == "n1" and model.reason == "GpuUnhealthy"
    pod_event = event_body(AgentEvent("GpuMemoryOverShare", "x", "Pod", "p", "ml", "u-1", True), "n1", now)
    assert pod_event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ml",
        "uid": "u-1",
    }


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ApiException(status=409, reason="Conflict"), KubeConflict),
        (ApiException(status=404, reason="Not Found"), KubeNotFound),
        (ApiException(status=500, reason="Internal"), KubeError),
        (ConnectionRefusedError("refused"), KubeError),
    ],
)
def test_client_errors_become_ours(exc, kind):
    """Client failures become KubeConflict, KubeNotFound or KubeError by their HTTP status."""
    err = kube_error("patch node n1", exc)
    assert type(err) is kind and "patch node n1" in str(err)


class _Recorder:
    """Stands in for CoreV1Api / CustomObjectsApi: records calls, replays scripted results."""

    def __init__(self, results: dict[str, list[Any]]) -> None:
        self.results = results
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            outcome = self.results.get(name, [None]).pop(0) if self.results.get(name) else None
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return call


class _RecordedApi(KubernetesNodeApi):
    """The adapter for node n1 over recorders of its calls to the client (`core`, `custom`)."""

    def __init__(self, core: dict[str, list[Any]], custom: dict[str, list[Any]]) -> None:
        self.core = _Recorder(core)
        self.custom = _Recorder(custom)
        super().__init__(client.ApiClient(), "n1", core=self.core, custom=self.custom)


def _api(
    core: dict[str, list[Any]] | None = None, custom: dict[str, list[Any]] | None = None
) -> _RecordedApi:
    return _RecordedApi(core or {}, custom or {})


def test_put_spec_creates_then_replaces_with_the_resource_version():
    """The spec is created when absent, and replaced over the resourceVersion it was read at."""
    topology = catalog_machine("dgx1-v100")
    api = _api(custom={"get_cluster_custom_object": [ApiException(status=404)]})
    api.put_topology_spec("n1", topology)
    assert [c[0] for c in api.custom.calls] == ["get_cluster_custom_object", "create_cluster_custom_object"]
    existing = {
        "metadata": {"name": "n1", "resourceVersion": "9", "annotations": {TOPOLOGY_HASH_ANNOTATION: "h1"}},
        "spec": {"not": "a topology"},  # a malformed object is replaced all the same
    }
    api = _api(custom={"get_cluster_custom_object": [existing]})
    api.put_topology_spec("n1", topology)
    name, args, _ = api.custom.calls[-1]
    assert name == "replace_cluster_custom_object"
    assert args[:4] == (GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL, "n1")
    assert args[4]["metadata"]["resourceVersion"] == "9"


def test_put_spec_retries_on_conflict_then_gives_up():
    """Writing the spec retries on conflicts and gives up after three."""
    conflict = ApiException(status=409, reason="Conflict")
    api = _api(
        custom={
            "get_cluster_custom_object": [ApiException(status=404)] * 3,
            "create_cluster_custom_object": [conflict, conflict, conflict],
        }
    )
    with pytest.raises(KubeConflict, match="after 3 attempts"):
        api.put_topology_spec("n1", catalog_machine("dgx1-v100"))


def test_status_and_annotations_use_merge_patches():
    """The status and pod annotations are written as merge patches, the status encoded by the contract."""
    api = _api()
    status = TopologyStatus(gpu_count=8, agent_version="1.0", heartbeat="2024-05-01T10:00:00Z")
    api.patch_topology_status("n1", status)
    name, args, kwargs = api.custom.calls[0]
    assert name == "patch_cluster_custom_object_status" and args[-1] == {"status": encode_status(status)}
    assert args[-1]["status"]["gpuCount"] == 8
    assert kwargs["_content_type"] == MERGE_PATCH
    api.patch_pod_annotations("ml", "p", {"a": "1", "b": None}, "812")
    name, args, kwargs = api.core.calls[0]
    assert args[2] == {"metadata": {"resourceVersion": "812", "annotations": {"a": "1", "b": None}}}
    assert kwargs["_content_type"] == MERGE_PATCH


def test_pod_annotation_conflict_is_a_kube_conflict():
    """A conflicting pod annotation patch is a KubeConflict."""
    api = _api(core={"patch_namespaced_pod": [ApiException(status=409, reason="Conflict")]})
    with pytest.raises(KubeConflict):
        api.patch_pod_annotations("ml", "p", {"a": "1"}, "1")


def test_listing_pods_uses_the_node_field_selector_and_translates():
    """Listing pods selects this node's pods and translates them."""
    api = _api(core={"list_pod_for_all_namespaces": [{"items": [POD]}]})
    pods = api.list_node_pods("n1")
    assert pods[0].name == "train-0"
    assert api.core.calls[0][2] == {"field_selector": "spec.nodeName=n1"}


def test_missing_topology_is_none_and_other_errors_raise():
    """A missing GpuTopology is None; a forbidden or malformed one is a KubeError."""
    assert _api(custom={"get_cluster_custom_object": [ApiException(status=404)]}).get_topology("n1") is None
    with pytest.raises(KubeError, match="HTTP 403"):
        _api(
            custom={"get_cluster_custom_object": [ApiException(status=403, reason="Forbidden")]}
        ).get_topology("n1")
    malformed = {**topology_object("n1", catalog_machine("dgx1-v100")), "status": {"gpuCount": -1}}
    with pytest.raises(KubeError, match="gpuCount"):
        _api(custom={"get_cluster_custom_object": [malformed]}).get_topology("n1")


def test_an_existing_topology_is_decoded_by_the_contract():
    """The GpuTopology read back is the contract's PublishedTopology, with its status."""
    topology = catalog_machine("dgx1-v100")
    obj = {**topology_object("n1", topology, "7"), "status": encode_status(TopologyStatus(gpu_count=8))}
    found = _api(custom={"get_cluster_custom_object": [obj]}).get_topology("n1")
    assert found is not None and found.content_hash == content_hash(topology)
    assert found.status.gpu_count == 8 and found.resource_version == "7"


def test_events_are_sent_as_client_models():
    """Events are sent as client models into the default namespace."""
    api = _api()
    api.emit_event(AgentEvent("GpuRecovered", "GPU 1 back", "Node", "n1"))
    name, args, _ = api.core.calls[0]
    assert name == "create_namespaced_event" and args[0] == "default"
    assert isinstance(args[1], client.CoreV1Event)


def test_bad_kubeconfig_is_a_kube_error(tmp_path):
    """A kubeconfig that cannot be loaded is a KubeError."""
    missing = tmp_path / "nope"
    with pytest.raises(KubeError, match="cannot load Kubernetes credentials"):
        KubernetesNodeApi.from_config("n1", str(missing))


def test_get_pod_reads_one_pod_and_a_missing_one_is_none():
    """Reading one pod gives it, a missing one gives None, and other failures raise."""
    api = _api(core={"read_namespaced_pod": [POD, ApiException(status=404, reason="Not Found")]})
    pod = api.get_pod("ml", "train-0")
    assert pod is not None and pod.uid == "u-1" and pod.resource_version == "812"
    assert api.core.calls[0][:2] == ("read_namespaced_pod", ("train-0", "ml"))
    assert api.get_pod("ml", "gone") is None
    failing = _api(core={"read_namespaced_pod": [ApiException(status=403, reason="Forbidden")]})
    with pytest.raises(KubeError, match="get pod ml/p: HTTP 403"):
        failing.get_pod("ml", "p")
